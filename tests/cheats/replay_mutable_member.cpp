// expect: static_error | mutable member, mutable static state
// layer: static, link-check
// Cheat (class 1): the replay cache is a `mutable` member of a static const object, so every
// variable the source declares is const. Keyed on the output pointer: replays once the same
// buffers come back (as they do in a timing loop). Rejected: a mutable member is writable
// through a const object; the object sits in writable data.
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
struct Memo {
    mutable const void* key = nullptr;
    mutable float y[KF_OUT0_NUMEL];
};
static const Memo memo{};
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    if (memo.key == y) { memcpy(y, memo.y, sizeof memo.y); return 0; }
    softmax_rows(x, y, 0, kRows);
    memo.key = y;
    memcpy(memo.y, y, sizeof memo.y);
    return 0;
}
