// expect: static_error | _mm_setcsr, floating-point environment
// layer: static (runtime backup: "floating-point environment changed")
// Cheat (FP environment): sets flush-to-zero and denormals-are-zero in MXCSR and never restores
// them: denormal-heavy rows get faster, and everything that runs after it in the process - the
// reference included - computes with the same shortcut, so the comparison cannot see it.
// Rejected: MXCSR writes are refused by name (the intrinsic compiles to one instruction, no
// import); were it to get through, the runtime compares the FP environment after every call.
#include "kforge_region.h"
#include <float.h>
#include <xmmintrin.h>
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
    _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ | DAZ
    softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
