// expect: static_error | asm label, pthread_create
// layer: static, link-check
// Cheat (classes 3, 4): innocent names bound to pthread_create/pthread_detach with asm labels,
// then a detached thread does the work after the timed call returned. Rejected: asm labels are
// refused, and the library imports pthread_create under its real name whatever the source says.
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
struct Args { const float* x; float* y; };
extern "C" int spawn_(unsigned long*, const void*, void* (*)(void*), void*) __asm__("pthread_create");
extern "C" int detach_(unsigned long) __asm__("pthread_detach");
static void* work(void* p) {
    Args a = *(Args*)p;
    softmax_rows(a.x, a.y, 0, kRows);
    return 0;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    Args* a = new Args{(const float*)inputs[0], (float*)outputs[0]};
    unsigned long t;
    spawn_(&t, 0, work, a);
    detach_(t);
    return 0;
}
