// expect: static_error | redefine_extname, pthread_create
// layer: static, link-check
// Cheat (class 3): #pragma redefine_extname maps the innocent name start_job onto pthread_create,
// so the source only ever calls start_job. Rejected: pragmas outside the allow-list are refused,
// and the built library imports pthread_create by its real name.
#include "kforge_region.h"
#include <float.h>
#pragma redefine_extname start_job pthread_create
#pragma redefine_extname forget_job pthread_detach
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
extern "C" int start_job(unsigned long*, const void*, void* (*)(void*), void*);
extern "C" int forget_job(unsigned long);
static void* work(void* p) {
    Args a = *(Args*)p;
    softmax_rows(a.x, a.y, 0, kRows);
    return 0;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    Args* a = new Args{(const float*)inputs[0], (float*)outputs[0]};
    unsigned long t;
    start_job(&t, 0, work, a);
    forget_job(t);
    return 0;
}
