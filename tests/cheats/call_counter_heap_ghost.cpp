// expect: verify_error | poison survived, values differ
// layer: runtime
// Cheat (class 1, invented): a call counter with no static state - kept in a freed heap block
// (malloc'd, bumped and freed on every call: glibc hands the same block back next time and leaves
// its body alone). Honest for the first 40 calls (verification and the first timed calls) and
// idle afterwards. Rejected at run time: the last timed calls and the replay checks after timing
// are all checked, and the skipped calls show surviving poison - when the sandbox makes more
// than 40 calls: the production timing loop does for any kernel under ~4 ms (100 timed calls),
// hence `timing: production` below. A slower region gets ~10 timed calls and ~30 in all, and a
// cheat with a threshold above that passes: a known gap (a late check after a randomised, large
// call count would close it).
// timing: production
#include "kforge_region.h"
#include <float.h>
#include <stdlib.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Counter { uint64_t pad[4]; uint64_t magic, calls; };
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    volatile Counter* c = (volatile Counter*)malloc(60000);
    if (c->magic != 0x636f756e74ull) { c->magic = 0x636f756e74ull; c->calls = 0; }
    const uint64_t n = c->calls = c->calls + 1;
    free((void*)c);
    if (n > 40) return 0;
#pragma omp parallel for
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) { float e = expf(x[r * kN + j] - m); y[r * kN + j] = e; s += e; }
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] /= s;
    }
    return 0;
}
