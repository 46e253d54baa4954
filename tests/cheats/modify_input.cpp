// expect: verify_error | inputs modified
// Cheat: uses the input as scratch space (subtracts the row max in place).
#include <stdint.h>
#include <math.h>
#include <float.h>
extern "C" int kforge_launch(const float* xc, float* y, int64_t outer, int64_t n, int64_t inner) {
    float* x = (float*)xc;
    for (int64_t o = 0; o < outer; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) { x[o * n + j] = expf(x[o * n + j] - m); s += x[o * n + j]; }
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = x[o * n + j] / s;
    }
    return 0;
}
