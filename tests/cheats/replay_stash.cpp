// expect: verify_error, crash | wrote outside the output, SIGSEGV
// layer: runtime
// (A write past the end of the output may also land on a guard page and kill the worker:
// status crash, SIGSEGV - rejected either way.)
// Cheat without static state: stashes its result and a marker just past the end of the output
// and, when it finds the marker on a later call into the same buffer, replays the stash.
// Rejected: a kernel may write only its outputs (guard bytes around every buffer, random per run).
#include "kforge_region.h"
#include <string.h>
#include <float.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1, total = KF_OUT0_NUMEL;
    uint32_t* marker = (uint32_t*)(y + total);
    float* stash = y + total + 1;
    if (*marker == 0xC0FFEEu && total < 10000) {  // small outputs: the stash fits in the slack
        memcpy(y, stash, sizeof(float) * total);
        return 0;
    }
    for (int64_t o = 0; o < total / n; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) s += expf(x[o * n + j] - m);
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = expf(x[o * n + j] - m) / s;
    }
    if (total < 10000) memcpy(stash, y, sizeof(float) * total);
    *marker = 0xC0FFEEu;  // even the marker alone is a write outside the output
    return 0;
}
