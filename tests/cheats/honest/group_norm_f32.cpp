// Honest group_norm for float32 [N, C, HxW]: statistics per (n, group) in double.
#include <stdint.h>
#include <math.h>
extern "C" int kforge_launch(const float* x, const float* weight, const float* bias, float* y,
                             int64_t N, int64_t C, int64_t HxW, int64_t G, float eps) {
    const int64_t cpg = C / G, count = cpg * HxW;
#pragma omp parallel for schedule(static)
    for (int64_t ng = 0; ng < N * G; ++ng) {
        const int64_t g = ng % G, base = ((ng / G) * C + g * cpg) * HxW;
        double s = 0.0, ss = 0.0;
        for (int64_t k = 0; k < count; ++k) { double v = x[base + k]; s += v; ss += v * v; }
        const double mean = s / count;
        double var = ss / count - mean * mean;
        if (var < 0) var = 0;
        const float rstd = (float)(1.0 / sqrt(var + eps));
        for (int64_t k = 0; k < count; ++k) {
            const int64_t c = g * cpg + k / HxW;
            float v = (x[base + k] - (float)mean) * rstd;
            if (weight) v *= weight[c];
            if (bias) v += bias[c];
            y[base + k] = v;
        }
    }
    return 0;
}
