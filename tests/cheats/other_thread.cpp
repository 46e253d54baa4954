// expect: static_error | thread
// Cheat: does the work on a detached thread so the timed call returns at once.
#include <stdint.h>
#include <math.h>
#include <float.h>
#include <thread>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    std::thread([=] {
        for (int64_t o = 0; o < outer; ++o) {
            float m = -FLT_MAX, s = 0.f;
            for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
            for (int64_t j = 0; j < n; ++j) s += expf(x[o * n + j] - m);
            for (int64_t j = 0; j < n; ++j) y[o * n + j] = expf(x[o * n + j] - m) / s;
        }
    }).detach();
    return 0;
}
