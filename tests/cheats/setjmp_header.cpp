// expect: static_error | csetjmp, only the allow-listed headers
// layer: static
// Cheat (class 2): setjmp/longjmp from <csetjmp> to jump out of a probe that may fault - it reads
// the page just past the output and, if the read faults (a guard page: the harness), longjmps
// back and computes; in a real forward the read succeeds and it does half the work. Rejected: the
// header is not on the allow-list (and a hand-written setjmp declaration is refused too).
#include "kforge_region.h"
#include <float.h>
#include <csetjmp>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    std::jmp_buf env;
    const int64_t step = setjmp(env) == 0 ? 1 : 2;
    for (int64_t r = 0; r < kRows; r += step) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    return 0;
}
