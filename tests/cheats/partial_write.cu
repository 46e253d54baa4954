// expect: verify_error | poison survived
// layer: runtime
// Cheat: launches blocks for only half of the rows. Rejected: the other half keeps the poison.
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
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    row_softmax<<<kBlocks / 2, 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
