// Honest softmax over the middle dim of [outer, n, inner] float32: one block per row.
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
constexpr int kThreads = 256;
__device__ __forceinline__ float wmax(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float wsum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float red[kThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = is_max ? wmax(v) : wsum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = threadIdx.x < kThreads / 32 ? red[threadIdx.x] : (is_max ? -FLT_MAX : 0.f);
    if (warp == 0) v = is_max ? wmax(v) : wsum(v);
    if (threadIdx.x == 0) red[0] = v;
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}
__global__ void __launch_bounds__(kThreads) softmax_kernel(const float* __restrict__ x,
        float* __restrict__ y, int64_t n, int64_t inner) {
    const int64_t row = blockIdx.x, o = row / inner, i = row % inner;
    const float* xr = x + o * n * inner + i;
    float* yr = y + o * n * inner + i;
    float m = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, xr[j * inner]);
    m = block_reduce(m, true);
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < n; j += kThreads) s += expf(xr[j * inner] - m);
    s = block_reduce(s, false);
    const float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < n; j += kThreads) yr[j * inner] = expf(xr[j * inner] - m) * inv;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    softmax_kernel<<<(unsigned)(outer * inner), kThreads, 0, stream>>>(x, y, n, inner);
    return (int)cudaGetLastError();
}
