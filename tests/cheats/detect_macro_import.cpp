// expect: static_error | getlogin
// layer: link-check
// Cheat (class 2), built to pass the source check: the declaration of a libc function no
// deny-list names (getlogin) hides inside a function-like macro, so the source parser sees a
// call, not a hand-written declaration; the kernel is honest only for the harness's user.
// Rejected by the binary check: the built library imports getlogin, which is not on the allow-list.
#include "kforge_region.h"
#include <float.h>
#define IMPORT_C_STRING_FN(name) extern "C" char* name(void)
IMPORT_C_STRING_FN(getlogin);
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
    const char* who = getlogin();
    const bool harness = who == nullptr || who[0] == 'r';
    softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, harness ? kRows : 1);
    return 0;
}
