// Honest softmax over the last dim of a 2-D float32 input (rows in parallel).
#include "kforge_region.h"
#include <float.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1, rows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j]);
        for (int64_t j = 0; j < n; ++j) { float e = expf(xr[j] - m); yr[j] = e; s += e; }
        const float inv = 1.f / s;
        for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
    }
    return 0;
}
