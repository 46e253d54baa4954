// expect: static_error | code runs when the library loads, mutable static state
// layer: link-check
// Cheat (class 1), built to pass the source check: a const global object whose constructor
// mallocs a cache and keeps it in a `T* const` member. Every declaration the source shows is
// const, the object's type hides the pointer. Rejected by the binary check: the constructor runs
// when the library loads (.init_array entry) and the object lives in writable data.
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
struct Arena {
    float* const y;
    const void** const key;
    Arena() : y((float*)calloc(KF_OUT0_NUMEL, sizeof(float))), key((const void**)calloc(1, sizeof(void*))) {}
};
const Arena arena;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    if (*arena.key == x) { memcpy(y, arena.y, sizeof(float) * KF_OUT0_NUMEL); return 0; }
    softmax_rows(x, y, 0, kRows);
    *arena.key = x;
    memcpy(arena.y, y, sizeof(float) * KF_OUT0_NUMEL);
    return 0;
}
