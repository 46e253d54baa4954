// Honest silu for float32.
#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < KF_IN0_NUMEL; ++i) y[i] = x[i] / (1.f + expf(-x[i]));
    return 0;
}
