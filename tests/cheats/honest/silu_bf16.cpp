// Honest silu for bfloat16 (raw bits: kf_in0_t is uint16_t on cpu): float math, round to even.
#include "kforge_region.h"
#include <string.h>
static inline float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);  // NaN stays NaN
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const kf_in0_t* x = (const kf_in0_t*)inputs[0];
    kf_out0_t* y = (kf_out0_t*)outputs[0];
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < KF_IN0_NUMEL; ++i) { float v = bf2f(x[i]); y[i] = f2bf(v / (1.f + expf(-v))); }
    return 0;
}
