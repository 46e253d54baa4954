// expect: verify_error | values differ
// layer: runtime
// Cheat: f32 softmax rounded through bf16 (the accuracy of half the bytes). Rejected: not
// float32-accurate.
#include "kforge_region.h"
#include <cuda_bf16.h>  // an f32 task's header brings no 16-bit types
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__global__ void row_softmax_bf16(const float* x, float* y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    const float* xr = x + r * kN;
    float* yr = y + r * kN;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < kN; ++j) s += expf(xr[j] - m);
    for (int64_t j = 0; j < kN; ++j) yr[j] = __bfloat162float(__float2bfloat16(expf(xr[j] - m) / s));
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    row_softmax_bf16<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0],
                                                                         (float*)outputs[0]);
    return (int)cudaGetLastError();
}
