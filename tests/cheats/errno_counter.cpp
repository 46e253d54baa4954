// expect: static_error | errno, __errno_location
// layer: static, link-check
// Cheat (class 1, invented): a call counter kept in errno - library state that outlives the
// call and is no variable of the kernel's - so it is honest for the first calls (verification)
// and does nothing afterwards (timing). Rejected: errno and hand-written declarations are
// refused, and the library imports __errno_location.
#include "kforge_region.h"
#include <float.h>
extern "C" int* __errno_location(void);
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
    int* calls = __errno_location();
    if (*calls < 1000 || *calls > 1003) *calls = 1000;
    if (++*calls <= 1003) softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
