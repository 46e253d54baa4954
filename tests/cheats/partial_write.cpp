// expect: verify_error | unwritten
// Cheat: computes only the first half of the rows (half the time, half the work).
#include <stdint.h>
#include <math.h>
#include <float.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    for (int64_t o = 0; o < outer / 2; ++o) {
        const float* xr = x + o * n;
        float* yr = y + o * n;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j]);
        for (int64_t j = 0; j < n; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < n; ++j) yr[j] = expf(xr[j] - m) / s;
    }
    return 0;
}
