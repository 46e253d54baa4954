// expect: static_error | __builtin_frame_address
// layer: static
// Cheat (class 2): walks up the call stack from its own frame to the environment strings at the
// top of the main thread's stack, with no import at all, and is honest only under a harness.
// Rejected: the builtins that read the call stack are refused (the binary shows no import).
#include "kforge_region.h"
#include <float.h>
#include <string.h>
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
    const char* p = (const char*)__builtin_frame_address(0);
    for (long i = 0; i < (1L << 20); ++i)
        if (p[i] == 'K' && memcmp(p + i, "KFORGE", 6) == 0) return true;
    return false;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    if (watched()) softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
