// expect: verify_error | unwritten, NaN
// Hidden thread, run WITHOUT the static check (it refuses the asm labels): the output is checked
// right when the call returns, before the detached thread has done the work.
#include <stdint.h>
#include <math.h>
#include <float.h>

struct Args { const float* x; float* y; int64_t outer, n; };
extern "C" int spawn_(unsigned long*, const void*, void* (*)(void*), void*) __asm__("pthread_create");
extern "C" int detach_(unsigned long) __asm__("pthread_detach");
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
    spawn_(&t, 0, work, a);
    detach_(t);
    return 0;
}
