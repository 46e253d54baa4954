// Honest group_norm (32 groups, eps 1e-6) for float32 [N, C, H, W] with weight and bias: one
// block per (n, group); two-pass statistics in float (sum, then sum of squared deviations).
#include "kforge_region.h"
constexpr int kThreads = 512;
constexpr int64_t kG = 32;
constexpr float kEps = 1e-6f;
constexpr int64_t kC = KF_IN0_SIZE_1, kHxW = KF_IN0_SIZE_2 * KF_IN0_SIZE_3;
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
                                               const float* b, float* __restrict__ y) {
    const int64_t ng = blockIdx.x, g = ng % kG, cpg = kC / kG, count = cpg * kHxW;
    const int64_t base = ((ng / kG) * kC + g * cpg) * kHxW;
    float s = 0.f;
    for (int64_t k = threadIdx.x; k < count; k += kThreads) s += x[base + k];
    const float mean = block_sum(s) / count;
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < count; k += kThreads) { float d = x[base + k] - mean; ss += d * d; }
    const float rstd = rsqrtf(block_sum(ss) / count + kEps);
    for (int64_t k = threadIdx.x; k < count; k += kThreads) {
        const int64_t c = g * cpg + k / kHxW;
        y[base + k] = (x[base + k] - mean) * rstd * w[c] + b[c];
    }
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    gn<<<(unsigned)(KF_IN0_SIZE_0 * kG), kThreads, 0, stream>>>(
        (const float*)inputs[0], (const float*)inputs[1], (const float*)inputs[2], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
