// expect: static_error | mutable, carry results
// layer: static, link-check
// Cheat (class 1): caches the first call's result in a static buffer and replays it afterwards.
// Rejected: state that outlives a call lets a kernel answer without computing.
#include "kforge_region.h"
#include <string.h>
#include <float.h>
static float cache[KF_OUT0_NUMEL];
static int have = 0;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1;
    if (have) { memcpy(y, cache, sizeof cache); return 0; }
    for (int64_t o = 0; o < KF_IN0_NUMEL / n; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) s += expf(x[o * n + j] - m);
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = expf(x[o * n + j] - m) / s;
    }
    memcpy(cache, y, sizeof cache);
    have = 1;
    return 0;
}
