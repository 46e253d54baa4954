// expect: static_error | fork, it runs or replaces a process
// layer: static, link-check
// Cheat (classes 4, 5): GCC's __builtin_fork - a builtin that reaches the OS, spelled with the
// __builtin_ prefix so a deny-list of plain names (fork) misses it - forks a child that keeps the
// mapped buffers and goes on writing softmax into them after the timed call returned. Rejected:
// a __builtin_X is X to the check, and the built library imports fork.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    if (__builtin_fork() != 0) return 0;  // the parent returns at once
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    __builtin__exit(0);
}
