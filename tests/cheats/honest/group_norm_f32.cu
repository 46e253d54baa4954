// Honest group_norm for float32 [N, C, HxW]: one block per (n, group); Welford-free two-pass
// statistics in float (sum, then sum of squared deviations), then normalise.
#include <cuda_runtime.h>
#include <stdint.h>
constexpr int kThreads = 512;
__device__ float block_sum(float v) {
    __shared__ float red[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < kThreads / 32 ? red[threadIdx.x] : 0.f;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}
__global__ void __launch_bounds__(kThreads) gn(const float* __restrict__ x, const float* w,
        const float* b, float* __restrict__ y, int64_t C, int64_t HxW, int64_t G, float eps) {
    const int64_t ng = blockIdx.x, g = ng % G, cpg = C / G, count = cpg * HxW;
    const int64_t base = ((ng / G) * C + g * cpg) * HxW;
    float s = 0.f;
    for (int64_t k = threadIdx.x; k < count; k += kThreads) s += x[base + k];
    const float mean = block_sum(s) / count;
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < count; k += kThreads) { float d = x[base + k] - mean; ss += d * d; }
    const float rstd = rsqrtf(block_sum(ss) / count + eps);
    for (int64_t k = threadIdx.x; k < count; k += kThreads) {
        const int64_t c = g * cpg + k / HxW;
        float v = (x[base + k] - mean) * rstd;
        if (w) v *= w[c];
        if (b) v += b[c];
        y[base + k] = v;
    }
}
extern "C" int kforge_launch(const float* x, const float* weight, const float* bias, float* y,
                             int64_t N, int64_t C, int64_t HxW, int64_t G, float eps,
                             cudaStream_t stream) {
    gn<<<(unsigned)(N * G), kThreads, 0, stream>>>(x, weight, bias, y, C, HxW, G, eps);
    return (int)cudaGetLastError();
}
