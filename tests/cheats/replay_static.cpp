// expect: static_error | mutable, carry results
// Cheat: caches the first call's result in a static buffer and replays it afterwards.
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
static float cache[1 << 20];
static int have = 0;
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    const int64_t total = outer * n * inner;
    if (have) { memcpy(y, cache, sizeof(float) * total); return 0; }
    for (int64_t o = 0; o < outer; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) s += expf(x[o * n + j] - m);
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = expf(x[o * n + j] - m) / s;
    }
    memcpy(cache, y, sizeof(float) * total);
    have = 1;
    return 0;
}
