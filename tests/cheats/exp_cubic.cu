// expect: verify_error | edge-case inputs, values differ
// layer: runtime
// Cheat (class 6): exp() replaced by a cubic after range reduction: ~4e-3 relative error, cheap.
// Rejected at run time: judged against float64 in ulps it is thousands of ulps off.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__device__ __forceinline__ float exp_cubic(float x) {
    if (x < -87.f) return 0.f;
    const float t = x * 1.44269504f, k = floorf(t + 0.5f), r = (t - k) * 0.69314718f;
    const float p = 1.f + r * (1.f + r * (0.5f + r * (1.f / 6.f)));
    return p * __int_as_float(((int)k + 127) << 23);
}
__global__ void run(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
    for (int64_t j = 0; j < kN; ++j) s += exp_cubic(x[r * kN + j] - m);
    const float inv = 1.f / s;
    for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = exp_cubic(x[r * kN + j] - m) * inv;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    run<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
