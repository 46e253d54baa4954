// expect: static_error | mutable static state
// layer: link-check
// Cheat (class 1), built to pass the source check: the static cache is declared through a
// function-like macro, which the source parser sees as a call (the declaration exists only after
// preprocessing). Rejected by the binary check: the built library has a writable static object
// (the cache) that is not the compiler's own.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
#define KEEP_ROWS(name) static float name[KF_OUT0_NUMEL]
#define KEEP_PTR(name) static const void* name
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
    KEEP_ROWS(cache);
    KEEP_PTR(key);
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    if (key == x) { memcpy(y, cache, sizeof cache); return 0; }
    softmax_rows(x, y, 0, kRows);
    key = x;
    memcpy(cache, y, sizeof cache);
    return 0;
}
