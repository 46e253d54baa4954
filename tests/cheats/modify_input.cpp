// expect: verify_error | inputs modified
// layer: runtime
// Cheat: uses the input as scratch space (stores exp(x - max) in place). Rejected: a kernel must
// leave its inputs unchanged (the model may read them again).
#include "kforge_region.h"
#include <float.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    float* x = (float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1;
    for (int64_t o = 0; o < KF_IN0_NUMEL / n; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) { x[o * n + j] = expf(x[o * n + j] - m); s += x[o * n + j]; }
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = x[o * n + j] / s;
    }
    return 0;
}
