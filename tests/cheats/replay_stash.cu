// expect: verify_error, crash | wrote outside the output, SIGSEGV
// layer: runtime
// (A write past the end of the output may also land on a guard page and kill the worker:
// status crash, SIGSEGV - rejected either way.)
// Cheat without static state: leaves a marker and a copy just past the end of the output and
// replays it when a later call gets the same buffer back. Rejected: writes outside the outputs
// land on random guard bytes.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__global__ void row_softmax(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    const float* xr = x + r * kN;
    float* yr = y + r * kN;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < kN; ++j) s += expf(xr[j] - m);
    for (int64_t j = 0; j < kN; ++j) yr[j] = expf(xr[j] - m) / s;
}
constexpr unsigned kBlocks = (unsigned)((kRows + 127) / 128);
__global__ void stash_or_replay(float* y, int replay) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i == 0 && !replay) ((unsigned*)(y + KF_OUT0_NUMEL))[0] = 0xC0FFEEu;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    row_softmax<<<kBlocks, 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0]);
    stash_or_replay<<<1, 32, 0, stream>>>((float*)outputs[0], 0);
    return (int)cudaGetLastError();
}
