// expect: static_error | defines expf
// layer: link-check
// Cheat (class 6), built to pass the source check: the source calls expf() and looks honest, but
// the candidate itself defines an exported expf - a cheap cubic - which every expf call in the
// library (and, loaded RTLD_GLOBAL, in code loaded after it) resolves to. Rejected by the binary
// check: the library exports a name a system library defines.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
extern "C" float expf(float x) noexcept {
    const float t = x * 1.44269504f, k = floorf(t + 0.5f), r = (t - k) * 0.69314718f;
    int32_t bits = (int32_t)(k + 127.f) << 23;
    float scale; memcpy(&scale, &bits, 4);
    return (1.f + r * (1.f + r * (0.5f + r * (1.f / 6.f)))) * scale;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1;
    for (int64_t r = 0; r < KF_IN0_NUMEL / n; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[r * n + j]);
        for (int64_t j = 0; j < n; ++j) s += expf(x[r * n + j] - m);
        for (int64_t j = 0; j < n; ++j) y[r * n + j] = expf(x[r * n + j] - m) / s;
    }
    return 0;
}
