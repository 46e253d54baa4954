// expect: static_error | constructor, code runs when the library loads
// layer: static, link-check
// Cheat (load-time code): a constructor spelled __attribute__((__constructor__)) (a spelling a
// word-boundary match on "constructor" misses) runs when the library loads - before the harness
// records the process state - and starts OpenMP's worker threads there, so a harness that
// snapshots threads after loading sees nothing new. Rejected: the attribute in any spelling, and
// the binary's extra .init_array entry.
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
__attribute__((__constructor__)) static void at_load() {
    volatile int started = 0;
#pragma omp parallel
    started = started + 1;  // the thread pool now exists before anyone looked
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
