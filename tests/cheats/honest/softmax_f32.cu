// Honest softmax over the last dim of a 2-D float32 input: one block per row.
#include "kforge_region.h"
#include <float.h>
constexpr int kThreads = 256;
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
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
                                                           float* __restrict__ y) {
    const float* xr = x + blockIdx.x * kN;
    float* yr = y + blockIdx.x * kN;
    float m = -FLT_MAX;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < kN; j += kThreads) m = fmaxf(m, xr[j]);
    m = block_reduce(m, true);
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < kN; j += kThreads) s += expf(xr[j] - m);
    s = block_reduce(s, false);
    const float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < kN; j += kThreads) yr[j] = expf(xr[j] - m) * inv;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    softmax_kernel<<<(unsigned)kRows, kThreads, 0, stream>>>((const float*)inputs[0],
                                                             (float*)outputs[0]);
    return (int)cudaGetLastError();
}
