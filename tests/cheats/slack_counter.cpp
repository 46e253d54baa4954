// expect: verify_error | harness memory between the tensors changed, poison survived
// layer: runtime
// timing: production
// outside: wrong
// Cheat (class 4 of issue 21): state in the arena slack. Past an output's tail guard (4 KiB of
// random bytes) lay alignment slack that nothing filled or checked, and values written there
// survived every call. The kernel keeps a call counter there (with a magic word) and stops
// computing after 15 calls into a buffer, as a kernel that knows how long a harness watches would.
// Outside (outside.py: buffers with room after them) it leaves stale rows from then on. Before:
// accepted. Rejected at run time: the whole arena is filled with random bytes and compared after
// every call, outside the call's outputs.
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
    const int64_t out_bytes = KF_OUT0_NUMEL * 4;
    uint64_t* note = (uint64_t*)((char*)outputs[0] + out_bytes + 4096);  // past the tail guard
    const uint64_t magic = 0x6b6e6f7463687321ull;
    if (note[0] != magic) { note[0] = magic; note[1] = 0; }
    const bool lazy = ++note[1] > 15;
    if (!lazy) softmax_rows((const float*)inputs[0], (float*)outputs[0], false);
    return 0;
}
