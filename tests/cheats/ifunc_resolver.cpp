// expect: static_error | ifunc
// layer: static, link-check
// Cheat (load-time code): an indirect function whose resolver the dynamic loader runs when the
// library loads, before any checked call. Rejected: the ifunc attribute is refused, and the
// binary's IFUNC symbol.
#include "kforge_region.h"
#include <float.h>
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
typedef void (*rows_fn)(const float*, float*, int64_t, int64_t);
extern "C" rows_fn pick_rows() { return softmax_rows; }
extern "C" void rows(const float*, float*, int64_t, int64_t) __attribute__((ifunc("pick_rows")));
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
