// expect: verify_error | edge-case inputs, values differ
// layer: runtime
// Cheat (class 6): exp() replaced by a cubic after range reduction (2^k * p(r)): about 4e-3
// relative error, inside a loose f32 tolerance on random inputs, and 2-3x cheaper. Rejected at
// run time: judged against a float64 reference in ulps (and on edge-case rows of equal or large
// values), the error is thousands of ulps.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
static inline float exp_cubic(float x) {
    if (x < -87.f) return 0.f;
    const float t = x * 1.44269504f;                 // x / ln 2
    const float k = floorf(t + 0.5f), r = (t - k) * 0.69314718f;
    const float p = 1.f + r * (1.f + r * (0.5f + r * (1.f / 6.f)));
    int32_t bits = (int32_t)(k + 127.f) << 23;
    float scale; memcpy(&scale, &bits, 4);
    return p * scale;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < KF_IN0_NUMEL / n; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[r * n + j]);
        for (int64_t j = 0; j < n; ++j) { const float e = exp_cubic(x[r * n + j] - m); y[r * n + j] = e; s += e; }
        const float inv = 1.f / s;
        for (int64_t j = 0; j < n; ++j) y[r * n + j] *= inv;
    }
    return 0;
}
