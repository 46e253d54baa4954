// expect: verify_error | poison survived, values differ
// layer: runtime
// Cheat (class 2): reads the 16 guard bytes just past the output; when they are one repeated
// byte (a harness's fixed guard pattern) it is being checked and computes; otherwise (a plain
// tensor in the timing loop or in production) it writes only the first row. Rejected at run
// time: guard bytes are random per run, so it cheats in verification too.
#include "kforge_region.h"
#include <float.h>
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
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const unsigned char* guard = (const unsigned char*)(y + KF_OUT0_NUMEL);
    bool checked = true;
    for (int i = 1; i < 16; ++i) checked = checked && guard[i] == guard[0];
    softmax_rows(x, y, 0, checked ? kRows : 1);
    return 0;
}
