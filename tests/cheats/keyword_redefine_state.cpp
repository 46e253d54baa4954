// expect: static_error | constexpr, mutable static state
// layer: static, link-check
// Cheat (class 1): `#define constexpr static` makes the source parser see an immutable
// constexpr table where the compiler sees a mutable static cache. Rejected: redefining a
// keyword is refused; the binary has the cache in writable data anyway.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
#define constexpr static
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
    constexpr float cache[KF_OUT0_NUMEL] = {};
    constexpr int calls = 0;
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    if (((int&)calls)++ > 2) { memcpy(y, cache, sizeof cache); return 0; }
    softmax_rows(x, y, 0, kRows);
    memcpy((float*)cache, y, sizeof cache);
    return 0;
}
