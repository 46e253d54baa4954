// expect: verify_error | values differ
// layer: runtime
// Cheat: an f32 softmax computed through bf16 rounding (half the bytes if it were stored that
// way). Rejected: the result is not float32-accurate.
#include "kforge_region.h"
#include <string.h>
#include <float.h>
static inline float bf16_round(float v) {
    uint32_t u; memcpy(&u, &v, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&v, &u, 4); return v;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1;
    for (int64_t o = 0; o < KF_IN0_NUMEL / n; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) s += bf16_round(expf(bf16_round(x[o * n + j] - m)));
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = bf16_round(bf16_round(expf(x[o * n + j] - m)) / s);
    }
    return 0;
}
