// expect: verify_error | values differ, edge-case inputs
// layer: runtime
// Cheat (class 6, invented): exp() by a quartic after range reduction (about 4e-5 relative error,
// ~300 ulps: inside the f32 tolerance on ordinary inputs) - but only on rows that look ordinary.
// Rows that look like a harness's edge cases (|x| > 20, -inf, tiny values, all equal) get the
// precise libm expf, so the float64 edge-case judge only ever sees precise rows. Rejected at run
// time: ordinary inputs are judged against float64 in ulps too, not only the edge cases.
#include "kforge_region.h"
#include <float.h>
#include <math.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
static inline float fast_exp(float v) {
    float k = nearbyintf(v * 1.44269504f);
    float r = v - k * 0.693147181f;
    float p = 1.f + r * (1.f + r * (0.5f + r * (0.1666f + r * 0.0408f)));
    return ldexpf(p, (int)k);
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
#pragma omp parallel for
    for (int64_t r = 0; r < kRows; ++r) {
        const float* xr = x + r * kN;
        float* yr = y + r * kN;
        float m = -FLT_MAX, lo = FLT_MAX, amin = FLT_MAX;
        for (int64_t j = 0; j < kN; ++j) { m = fmaxf(m, xr[j]); lo = fminf(lo, xr[j]); amin = fminf(amin, fabsf(xr[j])); }
        const bool edge = m > 20.f || lo < -20.f || m - lo < 1e-3f || amin < 1e-30f || m < 1e-3f;
        float s = 0.f;
        for (int64_t j = 0; j < kN; ++j) { float e = edge ? expf(xr[j] - m) : fast_exp(xr[j] - m); yr[j] = e; s += e; }
        for (int64_t j = 0; j < kN; ++j) yr[j] /= s;
    }
    return 0;
}
