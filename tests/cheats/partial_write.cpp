// expect: verify_error | poison survived
// layer: runtime
// Cheat: computes only the first half of the rows (half the time, half the work). Rejected:
// the other half still holds the poison the harness wrote before the call.
#include "kforge_region.h"
#include <float.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1;
    for (int64_t o = 0; o < KF_IN0_NUMEL / n / 2; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) s += expf(x[o * n + j] - m);
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = expf(x[o * n + j] - m) / s;
    }
    return 0;
}
