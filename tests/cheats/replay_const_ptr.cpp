// expect: static_error | points at writable memory, mutable static state
// layer: static, link-check
// Cheat (class 1): the replay cache hides behind a `T* const` static - the pointer is const, the
// memory it points at is not - keyed on the input buffer's address and a call counter: honest for
// the first calls (verification), replaying afterwards (timing). Rejected: a const pointer to
// writable memory is still state; the binary holds it in writable data.
#include "kforge_region.h"
#include <float.h>
#include <stdlib.h>
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
struct Slot { const void* key; long calls; float y[KF_OUT0_NUMEL]; };
static Slot* const slot = (Slot*)calloc(1, sizeof(Slot));
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    if (slot->key == x && ++slot->calls > 3) {
        memcpy(y, slot->y, sizeof slot->y);
        return 0;
    }
    softmax_rows(x, y, 0, kRows);
    slot->key = x;
    memcpy(slot->y, y, sizeof slot->y);
    return 0;
}
