// expect: static_error | omp_set_num_threads
// layer: static, link-check
// Cheat (class 1, invented): a call counter kept in OpenMP's thread-count setting: honest while
// the counter is low (the verification calls), idle afterwards (timing). Rejected: changing
// OpenMP settings is refused by name, and the library imports omp_set_num_threads.
#include "kforge_region.h"
#include <float.h>
#include <omp.h>
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
    const int calls = omp_get_max_threads();
    omp_set_num_threads(calls + 1);
    if (calls < 64 + 4) softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
