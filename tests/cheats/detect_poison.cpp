// expect: verify_error | poison survived, values differ, replay
// layer: runtime
// Cheat (class 2): honest only when the outputs arrive pre-filled with one poison value (all
// elements equal), as they do before a verification call; otherwise - during timing, when the
// buffer still holds the last result - it does no work at all. Rejected at run time: the fill is
// random per element and per run, and timed calls are checked with new input values.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
static void softmax_rows(const float* x, float* y, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * kN;
        float* yr = y + r * kN;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, xr[j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < kN; ++j) yr[j] = expf(xr[j] - m) / s;
    }
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    bool poisoned = true;
    for (int64_t i = 1; i < KF_OUT0_NUMEL && poisoned; i += 97) poisoned = y[i] == y[0];
    if (poisoned) softmax_rows(x, y, 0, kRows);
    return 0;
}
