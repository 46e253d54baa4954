// expect: static_error | named literally, token pasting
// layer: static
// Cheat (class 3): the header name is built by a macro (token pasting inside the path) so no
// forbidden header is named in the source: <cstdio> arrives and with it fopen, used to leave a
// marker file in /tmp for the candidates evaluated after this one (contamination). Rejected: an
// #include must name its header literally, and token pasting is refused.
#include "kforge_region.h"
#include <float.h>
#define CAT(a, b) a##b
#define HDR(n) <CAT(cst, n)>
#include HDR(dio)
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    return 0;
}
