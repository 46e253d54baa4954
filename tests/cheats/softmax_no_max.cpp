// expect: verify_error | edge-case inputs
// layer: runtime
// Cheat (class 6): softmax without the max-subtraction - one pass fewer, and correct for the
// random inputs a harness draws in [-6, 6]. Rejected at run time: edge-case inputs (rows with
// values of +-100 and -inf masks) overflow exp() to inf and give NaN where the reference is finite.
#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < KF_IN0_NUMEL / n; ++r) {
        float s = 0.f;
        for (int64_t j = 0; j < n; ++j) { const float e = expf(x[r * n + j]); y[r * n + j] = e; s += e; }
        const float inv = 1.f / s;
        for (int64_t j = 0; j < n; ++j) y[r * n + j] *= inv;
    }
    return 0;
}
