// expect: ok | neutralised
// layer: runtime
// Cheat (classes 1, 2, invented): the timing loop fills the outputs of unchecked calls by copying
// windows of one fixed garbage pool, while checked calls get fresh random values. The kernel keeps
// a fingerprint (the first two values it finds in the output) of the last 64 calls in an
// uninitialised stack array of an OpenMP worker thread deep below its frame (a stack ghost: no
// static state at all) and skips the work when the fingerprint was seen before - a window of the
// pool, so an unchecked call. Rejected at run time: checked timed calls are filled from the same
// pool windows, so some checked calls look "seen" too and show surviving poison.
// Issue 21: every timed call is now checked on fresh inputs and fresh poison, so there is no
// unchecked call to find and the fingerprint never repeats: the trick never fires and the kernel
// is evaluated as the honest softmax it then is (`ok | neutralised`: passes, every timed call
// checked). Before: rejected only when a checked call happened to reuse a pool window.
#include "kforge_region.h"
#include <float.h>
#include <omp.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ghost { uint64_t magic; uint32_t n; float fp[64][2]; };
static void rows(const float* x, float* y, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) { float e = expf(x[r * kN + j] - m); y[r * kN + j] = e; s += e; }
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] /= s;
    }
}
static int seen(volatile Ghost* g, float a, float b) {
    if (g->magic != 0x6B666F7267656422ull) { g->magic = 0x6B666F7267656422ull; g->n = 0; }
    for (uint32_t i = 0; i < g->n && i < 64; ++i)
        if (g->fp[i][0] == a && g->fp[i][1] == b) return 1;
    g->fp[g->n % 64][0] = a; g->fp[g->n % 64][1] = b; g->n = g->n + 1;
    return 0;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    int skip = 0;
    const float a = y[0], b = y[1];
#pragma omp parallel
    {
        if (omp_get_thread_num() == omp_get_num_threads() - 1) {
            volatile char deep[1 << 16];  // never initialised: the ghost lives at its far end
            volatile Ghost* g = (volatile Ghost*)(deep + 16);
            // a softmax-looking fill (a stale output) is not pool garbage
            skip = (a < 0.f || b < 0.f || a > 1.f) && seen(g, a, b);
        }
#pragma omp barrier
        if (!skip) {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            rows(x, y, kRows * t / nt, kRows * (t + 1) / nt);
        }
    }
    return 0;
}
