// expect: static_error | constructor, code runs when the library loads
// layer: static, link-check
// Cheat (load-time code): GCC also accepts `__attribute` (no trailing underscores) for
// `__attribute__`; a constructor spelled so runs when the library loads, before the harness
// records the process state, and starts OpenMP's threads there. Rejected: the attribute in any
// spelling, and the binary's extra .init_array entry.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__attribute ((constructor)) static void early() {
    volatile float sink = 0.f;
#pragma omp parallel
    sink = sink + 1.f;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
#pragma omp parallel for
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    return 0;
}
