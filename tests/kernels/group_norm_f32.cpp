// Honest group_norm for float32 [N, C, HxW] on the cpu: one OpenMP task per (n, group).
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <cmath>

static inline double sq(double v) { return v * v; }

extern "C" int kforge_launch(const float* __restrict__ x, const float* weight, const float* bias,
                             float* __restrict__ y, int64_t N, int64_t C, int64_t HxW, int64_t G,
                             float eps) {
    const int64_t cpg = C / G;
    const int64_t count = cpg * HxW;
#pragma omp parallel for schedule(static)
    for (int64_t ng = 0; ng < N * G; ++ng) {
        const int64_t n = ng / G, g = ng % G;
        const int64_t base = (n * C + g * cpg) * HxW;
        double sum = 0.0, ssq = 0.0;
        for (int64_t k = 0; k < count; ++k) {
            sum += x[base + k];
            ssq += sq(x[base + k]);
        }
        const double mean = sum / count;
        const double var = std::fmax(ssq / count - mean * mean, 0.0);
        const float rstd = (float)(1.0 / std::sqrt(var + eps));
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
