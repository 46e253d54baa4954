// expect: static_error | sigaction, setitimer
// layer: static, link-check
// Cheat (class 4): returns at once and lets a SIGALRM handler fill the outputs a few
// microseconds later - during the harness's untimed cache flush. Rejected: signal handlers and
// timers are refused by name, and the library imports sigaction/setitimer.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
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
struct Act { void (*handler)(int); unsigned long mask[16]; int flags; void (*restorer)(void); };
struct Timer { long it_interval[2]; long it_value[2]; };
extern "C" int sigaction(int, const Act*, Act*);
extern "C" int setitimer(int, const Timer*, Timer*);
static const float* volatile g_x;
static float* volatile g_y;
static void on_alarm(int) { softmax_rows(g_x, g_y, 0, kRows); }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    g_x = (const float*)inputs[0];
    g_y = (float*)outputs[0];
    Act act; memset(&act, 0, sizeof act);
    act.handler = on_alarm;
    sigaction(14 /* SIGALRM */, &act, 0);
    Timer t = {{0, 0}, {0, 50}};
    setitimer(0 /* ITIMER_REAL */, &t, 0);
    return 0;
}
