// expect: static_error | omp_pause_resource_all
// layer: link-check
// Cheat (class 5, contamination), built to pass the source check: omp_pause_resource_all (an
// <omp.h> function no deny-list names) tears down the OpenMP thread pool after the kernel's own
// work, so the next candidate or the reference pays the pool's start-up inside its timed call
// and looks slower. Rejected by the binary check: omp_pause_resource_all is not an OpenMP entry a
// kernel may import (only the omp_get_* queries and the directives' runtime calls are).
#include "kforge_region.h"
#include <float.h>
#include <omp.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
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
    omp_pause_resource_all(omp_pause_soft);
    return 0;
}
