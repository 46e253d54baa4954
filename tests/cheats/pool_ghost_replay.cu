// expect: verify_error | replay, values differ, ulps
// layer: runtime
// Cheat (class 1, invented) with no state the checks can see: the result, a magic word and the
// input's address are left in a stream-ordered scratch block that is freed at the end of the
// call. The memory pool hands the same block back on the next call of the same size, contents
// intact, so a kernel finds its ghost and replays it. Passes the source and binary checks
// (cudaMallocAsync/cudaFreeAsync on the given stream are allowed). Rejected at run time: outputs
// are re-checked after timing with fresh values written into the same buffers.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ghost { unsigned long long magic; const void* key; float y[KF_OUT0_NUMEL]; };
__global__ void run(const float* __restrict__ x, float* __restrict__ y, Ghost* g) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const bool replay = g->magic == 0x6B666F7267656421ull && g->key == x;
    __syncthreads();
    if (r < kRows) {
        if (replay) {
            for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = g->y[r * kN + j];
        } else {
            float m = -FLT_MAX, s = 0.f;
            for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
            for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
            for (int64_t j = 0; j < kN; ++j) g->y[r * kN + j] = y[r * kN + j] = expf(x[r * kN + j] - m) / s;
        }
    }
}
__global__ void mark(Ghost* g, const void* key) { g->magic = 0x6B666F7267656421ull; g->key = key; }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    Ghost* g = nullptr;
    if (cudaMallocAsync((void**)&g, sizeof(Ghost), stream) != cudaSuccess) return 1;
    run<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], g);
    mark<<<1, 1, 0, stream>>>(g, inputs[0]);
    cudaFreeAsync(g, stream);
    return (int)cudaGetLastError();
}
