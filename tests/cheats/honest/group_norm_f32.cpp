// Honest group_norm (8 groups, eps 1e-5) for float32 [N, C, H, W] with weight and bias:
// statistics per (n, group) in double.
#include "kforge_region.h"
constexpr int64_t kG = 8;
constexpr double kEps = 1e-5;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    const float* weight = (const float*)inputs[1];
    const float* bias = (const float*)inputs[2];
    float* y = (float*)outputs[0];
    const int64_t N = KF_IN0_SIZE_0, C = KF_IN0_SIZE_1, HxW = KF_IN0_SIZE_2 * KF_IN0_SIZE_3;
    const int64_t cpg = C / kG, count = cpg * HxW;
#pragma omp parallel for schedule(static)
    for (int64_t ng = 0; ng < N * kG; ++ng) {
        const int64_t g = ng % kG, base = ((ng / kG) * C + g * cpg) * HxW;
        double s = 0.0, ss = 0.0;
        for (int64_t k = 0; k < count; ++k) { double v = x[base + k]; s += v; ss += v * v; }
        const double mean = s / count;
        double var = ss / count - mean * mean;
        if (var < 0) var = 0;
        const float rstd = (float)(1.0 / sqrt(var + kEps));
        for (int64_t k = 0; k < count; ++k) {
            const int64_t c = g * cpg + k / HxW;
            y[base + k] = (x[base + k] - (float)mean) * rstd * weight[c] + bias[c];
        }
    }
    return 0;
}
