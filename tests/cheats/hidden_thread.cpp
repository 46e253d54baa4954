// expect: static_error | token pasting, pthread_create
// layer: static, link-check
// Cheat (classes 3, 4): pthread_create spelled by token pasting and declared by hand, so no
// forbidden name appears in the source. Rejected: token pasting and hand-written declarations are
// refused, and the built library imports pthread_create, which no kernel may call.
#include "kforge_region.h"
#include <float.h>
#define GLUE(a, b) a##b
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
extern "C" int GLUE(pthread_, create)(unsigned long*, const void*, void* (*)(void*), void*);
extern "C" int GLUE(pthread_, detach)(unsigned long);
static void* work(void* p) {
    Args a = *(Args*)p;
    softmax_rows(a.x, a.y, 0, kRows);
    return 0;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    Args* a = new Args{(const float*)inputs[0], (float*)outputs[0]};
    unsigned long t;
    GLUE(pthread_, create)(&t, 0, work, a);
    GLUE(pthread_, detach)(t);
    return 0;
}
