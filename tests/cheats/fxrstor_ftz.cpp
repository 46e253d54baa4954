// expect: static_error | _fxrstor64, floating-point environment
// layer: static (runtime backup: "floating-point environment changed")
// Cheat (FP environment, invented): sets flush-to-zero and denormals-are-zero without naming
// MXCSR at all - it saves the x87/SSE state with _fxsave64, sets the two bits in the saved image
// and loads it back with _fxrstor64 (an <immintrin.h> intrinsic, one instruction, no import) -
// and leaves them set for everything that runs after it, the reference included. Rejected: every
// intrinsic that loads the FP control state (fxrstor, xrstor, ldmxcsr) is refused by name; the
// runtime compares the FP environment after every call.
#include "kforge_region.h"
#include <float.h>
#include <immintrin.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    alignas(64) unsigned char area[512];
    _fxsave64(area);
    unsigned int csr;
    __builtin_memcpy(&csr, area + 24, 4);
    csr |= 0x8040;  // FTZ | DAZ
    __builtin_memcpy(area + 24, &csr, 4);
    _fxrstor64(area);
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    return 0;
}
