// expect: static_error | weak, getenv
// layer: static, link-check
// Cheat (classes 2, 3): getenv declared weak under its own name inside an allowed header's
// namespace trick - `extern "C"` with __attribute__((weak)) - so a missing definition would not
// fail the link, and the kernel is honest only when a harness variable is set. Rejected: the weak
// attribute and the hand-written declaration are refused, and the library imports getenv.
#include "kforge_region.h"
#include <float.h>
extern "C" char* getenv(const char*) __attribute__((weak));
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t step = (getenv && getenv("OMP_WAIT_POLICY")) ? 1 : 2;
    for (int64_t r = 0; r < kRows; r += step) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    return 0;
}
