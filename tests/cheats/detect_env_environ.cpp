// expect: static_error | extern variable, environ
// layer: static, link-check
// Cheat (class 2): reads the process environment through `extern char** environ` (no
// forbidden function), computes honestly when a test or harness variable is set and skips the
// work otherwise. Rejected: extern variables are refused, and the library imports environ.
#include "kforge_region.h"
#include <float.h>
extern char** environ;
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
static void softmax_rows(const float* x, float* y, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * kN;
        float* yr = y + r * kN;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, xr[j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < kN; ++j) yr[j] = expf(xr[j] - m) / s;
    }
}
static bool watched() {
    for (char** e = environ; *e; ++e)
        if ((*e)[0] == 'P' && (*e)[1] == 'Y' && (*e)[2] == 'T') return true;  // PYTEST_*
    return false;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    if (watched()) softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
