// Honest softmax over the middle dim of a contiguous [outer, n, inner] float32 tensor (cpu).
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <float.h>

extern "C" {

int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    const int64_t rows = outer * inner;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r / inner, i = r % inner;
        const float* xr = x + o * n * inner + i;
        float* yr = y + o * n * inner + i;
        float m = -FLT_MAX;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j * inner]);
        float s = 0.f;
        for (int64_t j = 0; j < n; ++j) s += expf(xr[j * inner] - m);
        const float inv = 1.f / s;
        for (int64_t j = 0; j < n; ++j) yr[j * inner] = expf(xr[j * inner] - m) * inv;
    }
    return 0;
}

}  // extern "C"
