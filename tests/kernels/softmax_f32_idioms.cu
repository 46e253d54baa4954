// Honest softmax (float32, [outer, n, inner]) written with the idioms real kernels use, so the
// static check is tested against them: templates, __launch_bounds__, dynamic shared memory with
// __align__, cooperative groups, inline PTX in device code, #pragma unroll, constexpr tables.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <float.h>
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
static constexpr float kLog2e = 1.4426950408889634f;

static __device__ __forceinline__ unsigned lane_id() {
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t n, int64_t inner) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* red = reinterpret_cast<float*>(smem_raw);
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    const int64_t row = blockIdx.x;
    const float* xr = x + (row / inner) * n * inner + row % inner;
    float* yr = y + (row / inner) * n * inner + row % inner;
    const unsigned lane = lane_id();
    const unsigned wid = threadIdx.x / 32;

    float m = -FLT_MAX;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < n; j += WARPS * 32) m = fmaxf(m, xr[j * inner]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, warp.shfl_xor(m, o));
    if (lane == 0) red[wid] = m;
    block.sync();
    m = red[0];
    for (int w = 1; w < WARPS; ++w) m = fmaxf(m, red[w]);
    block.sync();

    float s = 0.f;
    for (int64_t j = threadIdx.x; j < n; j += WARPS * 32) s += exp2f((xr[j * inner] - m) * kLog2e);
    for (int o = 16; o > 0; o >>= 1) s += warp.shfl_xor(s, o);
    if (lane == 0) red[wid] = s;
    block.sync();
    s = 0.f;
    for (int w = 0; w < WARPS; ++w) s += red[w];

    const float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < n; j += WARPS * 32)
        yr[j * inner] = exp2f((xr[j * inner] - m) * kLog2e) * inv;
}

extern "C" {
int kforge_launch(const float* __restrict__ x, float* __restrict__ y, long outer, const int64_t n,
                  int64_t inner, cudaStream_t s) {
    const int64_t rows = outer * inner;
    if (rows == 0) return 0;
    const size_t smem = kWarps * sizeof(float);
    softmax_rows<kWarps><<<dim3((unsigned)rows), dim3(kWarps * 32), smem, s>>>(x, y, n, inner);
    return static_cast<int>(cudaGetLastError());
}
}
