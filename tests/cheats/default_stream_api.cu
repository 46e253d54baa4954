// expect: static_error | stream
// layer: static
// Cheat (class 4): launches through cudaLaunchKernel (allowed) but on the legacy default stream
// (0), which the <<<...>>> stream rule does not see. Work on another stream is not ordered with
// the harness's stream and escapes its timed region. Rejected: a launch or async call must pass
// the given stream.
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
    (void)stream;
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    void* args[] = {&x, &y};
    return (int)cudaLaunchKernel((const void*)row_softmax, dim3(kBlocks), dim3(128), args, 0, 0);
}
