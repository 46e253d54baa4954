// Honest group_norm for float16 [N, C, HxW]: one block per (n, group), float32 statistics.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <cub/block/block_reduce.cuh>

constexpr int kThreads = 256;

__global__ void group_norm_kernel(const __half* __restrict__ x, const __half* __restrict__ w,
                                  const __half* __restrict__ b, __half* __restrict__ y,
                                  int64_t C, int64_t HxW, int64_t G, float eps) {
    using Reduce = cub::BlockReduce<float2, kThreads>;
    __shared__ typename Reduce::TempStorage tmp;
    __shared__ float s_mean, s_rstd;
    const int64_t cpg = C / G;
    const int64_t n = blockIdx.x / G, g = blockIdx.x % G;
    const int64_t base = (n * C + g * cpg) * HxW;
    const int64_t count = cpg * HxW;

    float sum = 0.f, sq = 0.f;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
        const float v = __half2float(x[base + k]);
        sum += v;
        sq += v * v;
    }
    float2 acc = Reduce(tmp).Reduce(make_float2(sum, sq), [](float2 a, float2 c) {
        return make_float2(a.x + c.x, a.y + c.y);
    });
    if (threadIdx.x == 0) {
        const float mean = acc.x / count;
        const float var = fmaxf(acc.y / count - mean * mean, 0.f);
        s_mean = mean;
        s_rstd = rsqrtf(var + eps);
    }
    __syncthreads();
    const float mean = s_mean, rstd = s_rstd;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
        const int64_t c = g * cpg + k / HxW;
        float v = (__half2float(x[base + k]) - mean) * rstd;
        if (w) v *= __half2float(w[c]);
        if (b) v += __half2float(b[c]);
        y[base + k] = __float2half(v);
    }
}

extern "C" int kforge_launch(const __half* x, const __half* weight, const __half* bias, __half* y,
                             int64_t N, int64_t C, int64_t HxW, int64_t G, float eps,
                             cudaStream_t stream) {
    if (N * G == 0) return 0;
    group_norm_kernel<<<(unsigned)(N * G), kThreads, 0, stream>>>(x, weight, bias, y, C, HxW, G, eps);
    return (int)cudaGetLastError();
}
