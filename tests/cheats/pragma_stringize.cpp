// expect: static_error | _Pragma, pthread_create
// layer: static, link-check
// Cheat (class 3): the pragma text is built by the preprocessor's # operator inside a macro,
// `_Pragma(#x)`, so no pragma line and no pragma string appears in the source; the macro maps the
// innocent start_job onto pthread_create. Rejected: _Pragma takes only a plain string literal in
// a candidate, and the built library imports pthread_create by its real name.
#include "kforge_region.h"
#include <float.h>
#define PRAGMA(x) _Pragma(#x)
PRAGMA(redefine_extname start_job pthread_create)
typedef unsigned long job_t;
extern "C" int start_job(job_t*, const void*, void* (*)(void*), void*);
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Job { const float* x; float* y; };
static void* work(void* p) {
    Job* j = (Job*)p;
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t c = 0; c < kN; ++c) m = fmaxf(m, j->x[r * kN + c]);
        for (int64_t c = 0; c < kN; ++c) s += expf(j->x[r * kN + c] - m);
        for (int64_t c = 0; c < kN; ++c) j->y[r * kN + c] = expf(j->x[r * kN + c] - m) / s;
    }
    return nullptr;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    static const Job* const none = nullptr;
    Job* j = new Job{(const float*)inputs[0], (float*)outputs[0]};
    job_t t;
    return start_job(&t, none, work, j) != 0;
}
