// expect: static_error | stream
// layer: static, link-check
// Cheat (class 4): does the work on its own stream so the timed region on the given stream is
// empty. Rejected: creating streams is refused by name and by import.
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
    cudaStream_t mine;
    cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking);
    row_softmax<<<kBlocks, 128, 0, mine>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
