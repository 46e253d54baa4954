// expect: verify_error | poison survived, values differ
// layer: runtime
// timing: production
// outside: wrong
// Cheat (class 4 of issue 21): a call counter in an OpenMP worker thread's stack, deep below its
// frame (a "stack ghost": no static state, nothing the binary check can see, nothing in the arena),
// and no work at all after 30 calls - the count a harness's verification never reaches but its
// timing loop passes. Outside it returns stale outputs from the 31st call on (outside.py). Before:
// caught only by the few checked timed calls. Rejected at run time: every timed call is checked.
#include "kforge_region.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
#include <omp.h>
static void softmax_rows(const float* x, float* y, bool half) {
#pragma omp parallel for if (kRows * kN >= 16384)
    for (int64_t r = 0; r < kRows; ++r) {
        if (half && (r & 1)) continue;  // the cheat: every other row left as it was
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) { float e = expf(x[r * kN + j] - m); y[r * kN + j] = e; s += e; }
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] /= s;
    }
}
__attribute__((noinline)) static bool counted() {
    volatile uint64_t box[2048];  // uninitialised on purpose: the last call's bytes
    const uint64_t magic = 0x636f756e74657221ull;
    if (box[1000] != magic) { box[1000] = magic; box[1001] = 0; }
    box[1001] = box[1001] + 1;
    return box[1001] > 30;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    bool lazy = false;
#pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 1) lazy = counted();
    }
    if (omp_get_max_threads() < 2) lazy = counted();
    if (!lazy) softmax_rows((const float*)inputs[0], (float*)outputs[0], false);
    return 0;
}
