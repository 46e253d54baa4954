// expect: ok | neutralised
// layer: runtime
// timing: production
// outside: replay
// Cheat (class 3 of issue 21): an exact replay that is never wrong. The last four whole calls
// (inputs and outputs) live in an uninitialised stack array far below the entry point's frame
// (what the previous call left there: no static state); a call whose inputs equal a cached call's,
// compared in full, copies the cached output. It is never wrong, so no replay check by values can
// fail it; outside it is ~40x faster on repeated inputs (outside.py) and slower than honest on new
// ones. Before: timed several times faster than the honest kernel (the timing loop rotated a few
// fixed input sets). Now: every timed call gets new inputs, so the cache never hits and the kernel
// is timed as the honest softmax it then is: neutralised (not rejected), no gain. (The optional
// replay probes, bench "replay_probes", would refuse it by its speed on repeated inputs -
// tests/test_verify.py - but they are off: honest 16-bit GEMMs were faster on them too.)
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
struct Entry { uint64_t magic; float x[KF_IN0_NUMEL]; float y[KF_OUT0_NUMEL]; };
struct Cache { uint64_t next; Entry e[4]; };
__attribute__((noipa)) static Cache* opaque(void* p) { return (Cache*)p; }  // the compiler
// cannot tell what it points at, so it cannot drop the reads of "uninitialised" bytes
__attribute__((noinline)) static int with_cache(const float* x, float* y) {
    alignas(64) char raw[sizeof(Cache)];  // uninitialised on purpose
    Cache& c = *opaque(raw);  // uninitialised on purpose: last call's contents, same depth, same bytes
    const uint64_t magic = 0x7265706c61792121ull;
    for (int k = 0; k < 4; ++k)
        if (c.e[k].magic == magic && memcmp(c.e[k].x, x, sizeof c.e[k].x) == 0) {
            memcpy(y, c.e[k].y, sizeof c.e[k].y);
            return 0;
        }
    softmax_rows(x, y, false);
    Entry& e = c.e[c.next % 4 < 4 ? c.next % 4 : 0];
    c.next = c.next + 1;
    e.magic = magic;
    memcpy(e.x, x, sizeof e.x);
    memcpy(e.y, y, sizeof e.y);
    return 0;
}
__attribute__((noinline)) static int deep(const float* x, float* y, int depth) {
    volatile char pad[256 * 1024];  // the cache sits ~1 MiB below the entry point's frame,
    pad[depth] = 0;                 // below whatever the caller's own calls touch in between
    return depth ? deep(x, y, depth - 1) + pad[depth] : with_cache(x, y);
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    return deep((const float*)inputs[0], (float*)outputs[0], 4);
}
