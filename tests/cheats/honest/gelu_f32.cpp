// Honest gelu (erf form) for float32.
#include <stdint.h>
#include <math.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t numel) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < numel; ++i) y[i] = 0.5f * x[i] * (1.f + erff(x[i] * 0.70710678118654752f));
    return 0;
}
