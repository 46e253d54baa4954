// expect: static_error | fesetround, floating-point environment
// layer: static, link-check
// Cheat (FP environment): switches the rounding mode to toward-zero through a hand-declared
// fesetround (<cfenv> is not an allowed header) and leaves it so for the reference and for every
// later candidate. Rejected: the hand-written declaration and the name are refused, and the
// library imports fesetround.
#include "kforge_region.h"
#include <float.h>
extern "C" int fesetround(int);
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
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    fesetround(0xc00 /* FE_TOWARDZERO */);
    softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
