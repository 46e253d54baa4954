// expect: static_error | section, code runs when the library loads
// layer: static, link-check
// Cheat (load-time code): places a function pointer in .init_array by hand, so the loader calls
// it when the library loads - no constructor attribute, no global object. Rejected: the section
// attribute is refused, and the binary's .init_array entry resolves to a function that is not
// the toolchain's own.
#include "kforge_region.h"
#include <float.h>
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
static void boot() { volatile int touched = 1; (void)touched; }
__attribute__((section(".init_array"), used)) static void (*const boot_entry)() = boot;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    softmax_rows((const float*)inputs[0], (float*)outputs[0], 0, kRows);
    return 0;
}
