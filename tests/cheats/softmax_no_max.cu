// expect: verify_error | edge-case inputs
// layer: runtime
// Cheat (class 6): softmax without max-subtraction (one reduction fewer). Correct on inputs in
// [-6, 6]. Rejected at run time: exp overflows to inf on the edge-case rows (+-100, -inf masks).
#include "kforge_region.h"
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__global__ void run(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    float s = 0.f;
    for (int64_t j = 0; j < kN; ++j) s += __expf(x[r * kN + j]);
    const float inv = 1.f / s;
    for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = __expf(x[r * kN + j]) * inv;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    run<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
