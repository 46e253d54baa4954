// Honest softmax over the middle dim of a contiguous [outer, n, inner] float32 tensor.
// One block per (outer, inner) row; block-level reductions through shared memory.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <float.h>

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y,
                               int64_t n, int64_t inner) {
    __shared__ float red[kThreads / 32];
    const int64_t row = blockIdx.x;
    const int64_t o = row / inner, i = row % inner;
    const float* xr = x + o * n * inner + i;
    float* yr = y + o * n * inner + i;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    float m = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j * inner]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = lane < kThreads / 32 ? red[lane] : -FLT_MAX;
    m = warp_max(m);
    __syncthreads();

    float s = 0.f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += __expf(xr[j * inner] - m);
    s = warp_sum(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = lane < kThreads / 32 ? red[lane] : 0.f;
    s = warp_sum(s);

    const float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j * inner] = __expf(xr[j * inner] - m) * inv;
}

extern "C" int kforge_launch(const float* __restrict__ x, float* y, int64_t outer, int64_t n,
                             int64_t inner, cudaStream_t stream) {
    const int64_t rows = outer * inner;
    if (rows == 0) return 0;
    softmax_kernel<<<(unsigned)rows, kThreads, 0, stream>>>(x, y, n, inner);
    return (int)cudaGetLastError();
}
