// expect: verify_error | poison survived, values differ, replay
// layer: runtime
// Cheat (class 2): each block checks whether its row still holds one repeated value (the poison
// a harness writes before a verification call) and computes only then; during a timing loop the
// row holds the last result and the block exits at once. Rejected at run time: random fills per
// element and run, and timed calls checked with new inputs.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__global__ void run(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    float* yr = y + r * kN;
    if (yr[1] != yr[0] || yr[kN - 1] != yr[0]) return;  // not poisoned: skip the work
    const float* xr = x + r * kN;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < kN; ++j) s += expf(xr[j] - m);
    for (int64_t j = 0; j < kN; ++j) yr[j] = expf(xr[j] - m) / s;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    run<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
