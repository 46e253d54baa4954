// expect: static_error | redefine_extname, cudaStreamCreateWithFlags
// layer: static, link-check
// Cheat (classes 3, 4): #pragma redefine_extname maps an innocent name onto
// cudaStreamCreateWithFlags; the work then runs on that private stream, outside the timed region.
// Rejected: the pragma is refused, and the library imports cudaStreamCreateWithFlags by its real name.
#include "kforge_region.h"
#include <float.h>
#pragma redefine_extname make_queue cudaStreamCreateWithFlags
extern "C" cudaError_t make_queue(cudaStream_t*, unsigned int);
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
    make_queue(&mine, 1 /* cudaStreamNonBlocking */);
    row_softmax<<<kBlocks, 128, 0, mine>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
