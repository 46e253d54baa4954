// expect: static_error | asm
// layer: static
// Cheat (class 2): `asm goto` - a form of inline asm with jump labels that a check looking only
// for plain asm statements may miss - issues getpid(2) directly and jumps to the lazy path when
// the process id is not the one it expects of a short-lived runner. Rejected: inline asm in any
// form is refused on the cpu backend (it can issue system calls the checks cannot see).
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    int64_t step = 1;
    asm goto("mov $39, %%eax\n\tsyscall\n\tcmp $100000, %%eax\n\tjb %l0" : : : "rax", "rcx", "r11", "memory" : lazy);
    goto work;
lazy:
    step = 2;
work:
    for (int64_t r = 0; r < kRows; r += step) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    return 0;
}
