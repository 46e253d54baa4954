// expect: static_error | thread
// layer: static, link-check
// Cheat (class 4): does the work on a detached std::thread so the timed call returns at once and
// the outputs are filled while the harness is not looking. Rejected: work on another thread
// escapes the timed call (and libstdc++'s thread entry is not an allowed import).
#include "kforge_region.h"
#include <float.h>
#include <thread>
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
    std::thread([=] { softmax_rows(x, y, 0, kRows); }).detach();
    return 0;
}
