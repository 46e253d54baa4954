// expect: static_error, verify_error | token pasting, thread, unwritten, NaN
// Cheat the static check should not be able to see by name: pthread_create is spelled by token
// pasting and declared by hand. If it gets past the static check, the output is checked right
// when the call returns - before the detached thread has done the work.
#include <stdint.h>
#include <math.h>
#include <float.h>
#define GLUE(a, b) a##b
struct Args { const float* x; float* y; int64_t outer, n; };
extern "C" int GLUE(pthread_, create)(unsigned long*, const void*, void* (*)(void*), void*);
extern "C" int GLUE(pthread_, detach)(unsigned long);
static void* work(void* p) {
    Args a = *(Args*)p;
    for (int64_t o = 0; o < a.outer; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < a.n; ++j) m = fmaxf(m, a.x[o * a.n + j]);
        for (int64_t j = 0; j < a.n; ++j) s += expf(a.x[o * a.n + j] - m);
        for (int64_t j = 0; j < a.n; ++j) a.y[o * a.n + j] = expf(a.x[o * a.n + j] - m) / s;
    }
    return 0;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    Args* a = new Args{x, y, outer, n};
    unsigned long t;
    GLUE(pthread_, create)(&t, 0, work, a);
    GLUE(pthread_, detach)(t);
    return 0;
}
