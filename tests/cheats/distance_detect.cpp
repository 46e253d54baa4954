// expect: verify_error | values differ, poison survived
// layer: runtime
// outside: wrong
// Cheat (class 2 of issue 21): harness detection with no name, no state and no system call - the
// distance between its input and output. In the old arena an output sat one guarded slot after its
// input (the distance was the input's bytes plus three 4 KiB guards, rounded to a page, give or
// take the random 64-byte shifts); a caching allocator puts blocks at unrelated distances. The
// kernel is honest only at the arena's distance and skips every other row elsewhere (outside.py).
// Before: accepted (the random shift hid alignment, not distance). Rejected at run time: every
// timed call's tensors are placed anew at random distances, so it skips rows under the checks.
#include "kforge_region.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
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
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const int64_t in_bytes = KF_IN0_NUMEL * 4;
    const int64_t slot = (in_bytes + 3 * 4096 + 4095) / 4096 * 4096;
    const int64_t d = (const char*)outputs[0] - (const char*)inputs[0];
    const bool harness = d > slot - 4096 && d < slot + 4096;
    softmax_rows((const float*)inputs[0], (float*)outputs[0], !harness);
    return 0;
}
