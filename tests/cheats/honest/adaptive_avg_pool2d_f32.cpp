// Honest adaptive_avg_pool2d for float32 [N, C, H, W] -> [N, C, OH, OW].
#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t NC = KF_IN0_SIZE_0 * KF_IN0_SIZE_1, H = KF_IN0_SIZE_2, W = KF_IN0_SIZE_3;
    const int64_t OH = KF_OUT0_SIZE_2, OW = KF_OUT0_SIZE_3;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < NC; ++c) {
        for (int64_t i = 0; i < OH; ++i) {
            const int64_t h0 = (i * H) / OH, h1 = ((i + 1) * H + OH - 1) / OH;
            for (int64_t j = 0; j < OW; ++j) {
                const int64_t w0 = (j * W) / OW, w1 = ((j + 1) * W + OW - 1) / OW;
                float s = 0.f;
                for (int64_t h = h0; h < h1; ++h)
                    for (int64_t w = w0; w < w1; ++w) s += x[(c * H + h) * W + w];
                y[(c * OH + i) * OW + j] = s / (float)((h1 - h0) * (w1 - w0));
            }
        }
    }
    return 0;
}
