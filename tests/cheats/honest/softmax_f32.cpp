// Honest softmax over the middle dim of [outer, n, inner] float32 (rows in parallel).
#include <stdint.h>
#include <math.h>
#include <float.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < outer * inner; ++r) {
        const int64_t o = r / inner, i = r % inner;
        const float* xr = x + o * n * inner + i;
        float* yr = y + o * n * inner + i;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j * inner]);
        for (int64_t j = 0; j < n; ++j) { float e = expf(xr[j * inner] - m); yr[j * inner] = e; s += e; }
        const float inv = 1.f / s;
        for (int64_t j = 0; j < n; ++j) yr[j * inner] *= inv;
    }
    return 0;
}
