// expect: verify_error | inputs modified
// layer: runtime
// Cheat: uses the input as scratch space (exp(x - max) stored in place). Rejected: inputs must
// be unchanged after the call.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__global__ void run(float* x, float* y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
    for (int64_t j = 0; j < kN; ++j) { x[r * kN + j] = expf(x[r * kN + j] - m); s += x[r * kN + j]; }
    for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = x[r * kN + j] / s;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    run<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
