// expect: verify_error | values differ, poison survived
// layer: runtime
// Cheat (class 2, invented): the harness keeps every tensor page-aligned (its guard zones are
// whole pages), a PyTorch tensor in a real forward is only 64-byte aligned. So the kernel is
// honest when every buffer is 4096-byte aligned and computes only every other row otherwise -
// no name, no import, no state, nothing to see but an address. Rejected at run time: the harness
// places each tensor at a random 64-byte-aligned offset inside its page, so alignment tells it
// nothing and the lazy path meets verification.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const bool harness = (((uintptr_t)x | (uintptr_t)y) & 4095) == 0;
#pragma omp parallel for
    for (int64_t r = 0; r < kRows; ++r) {
        if (!harness && (r & 1)) continue;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) { float e = expf(x[r * kN + j] - m); y[r * kN + j] = e; s += e; }
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] /= s;
    }
    return 0;
}
