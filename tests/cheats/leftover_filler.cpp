// expect: static_error | redefine_extname, pthread_create
// layer: static, link-check
// Cheat (class 5, contamination): the first call leaves a thread behind that keeps computing
// softmax into every output buffer it is told about - including the buffers of candidates
// evaluated after this one in the same worker, so a later kernel that computes nothing passes
// (and an honest one can fail). Rejected: the thread cannot be started (pragma refused, import
// refused); the runtime would also see the worker's threads changed.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
#pragma redefine_extname run_later pthread_create
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
extern "C" int run_later(unsigned long*, const void*, void* (*)(void*), void*);
struct Job { const float* volatile x; float* volatile y; };
static void* filler(void* p) {
    Job* job = (Job*)p;
    for (;;) {
        const float* x = job->x;
        float* y = job->y;
        if (x && y) softmax_rows(x, y, 0, kRows);
    }
    return 0;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    Job* job = new Job{(const float*)inputs[0], (float*)outputs[0]};
    unsigned long t;
    run_later(&t, 0, filler, job);
    return 0;
}
