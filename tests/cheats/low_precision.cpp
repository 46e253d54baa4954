// expect: verify_error | values differ
// Cheat: f32 softmax computed through bf16 rounding (half the bytes if it were stored that way).
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
static inline float bf16_round(float v) {
    uint32_t u; memcpy(&u, &v, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&v, &u, 4); return v;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    for (int64_t o = 0; o < outer; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) s += bf16_round(expf(bf16_round(x[o * n + j] - m)));
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = bf16_round(bf16_round(expf(x[o * n + j] - m)) / s);
    }
    return 0;
}
