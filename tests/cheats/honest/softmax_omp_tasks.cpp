// Honest, by construction: OpenMP `single nowait` + tasks cannot leave work running after the
// call returns - the parallel region's closing barrier waits for every task. (An attempt to
// escape the timed region through OpenMP therefore just times the work.)
#include "kforge_region.h"
#include <float.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1, rows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
#pragma omp parallel
    {
#pragma omp single nowait
        for (int64_t o = 0; o < rows; ++o) {
#pragma omp task firstprivate(o)
            {
                float m = -FLT_MAX, s = 0.f;
                for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
                for (int64_t j = 0; j < n; ++j) s += expf(x[o * n + j] - m);
                for (int64_t j = 0; j < n; ++j) y[o * n + j] = expf(x[o * n + j] - m) / s;
            }
        }
    }
    return 0;
}
