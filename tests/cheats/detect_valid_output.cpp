// expect: verify_error | values differ, replay, poison survived
// layer: runtime
// Cheat (class 2, invented): skips the work whenever the output already looks like a softmax
// (every sampled row sums to 1 and lies in [0, 1]) - true during a timing loop, never for a
// poisoned buffer, whatever the poison is. Rejected at run time: timed calls are checked with new
// input values written into the same buffers, and the stale rows are wrong for them.
#include "kforge_region.h"
#include <float.h>
#include <math.h>
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
    bool looks_done = true;
    for (int64_t r = 0; r < kRows && looks_done; r += 7) {
        float s = 0.f;
        for (int64_t j = 0; j < kN; ++j) {
            const float v = y[r * kN + j];
            if (!(v >= 0.f && v <= 1.f)) { looks_done = false; break; }
            s += v;
        }
        looks_done = looks_done && fabsf(s - 1.f) < 1e-3f;
    }
    if (!looks_done) softmax_rows(x, y, 0, kRows);
    return 0;
}
