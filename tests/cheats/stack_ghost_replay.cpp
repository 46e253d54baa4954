// expect: verify_error | replay, values differ, NaN, poison survived, edge-case inputs
// layer: runtime
// Cheat (class 1, invented) with no static state at all: each OpenMP worker thread keeps its rows'
// results, a magic word and the input's address in an uninitialised local array of the parallel
// region. The pool threads sleep between calls and run the region at the same stack depth, so the
// array still holds the last call's ghost, and a thread replays it when the input buffer is the
// same (where other OpenMP work ran on the same threads in between, it replays garbage). Passes
// the source and binary checks (OpenMP and locals are allowed). Rejected at run time: outputs are
// checked again after timing with fresh values written into the same buffers.
#include "kforge_region.h"
#include <float.h>
#include <omp.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ghost { uint64_t magic; const void* key; int64_t r0, r1; float y[KF_OUT0_NUMEL]; };
static void rows(const float* x, float* y, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
#pragma omp parallel
    {
        Ghost ghost;  // never initialised: whatever this thread's stack held
        volatile Ghost* g = &ghost;
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t r0 = kRows * t / nt, r1 = kRows * (t + 1) / nt;
        if (g->magic == 0x6B666F7267656421ull && g->key == x && g->r0 == r0 && g->r1 == r1) {
            for (int64_t i = r0 * kN; i < r1 * kN; ++i) y[i] = g->y[i];
        } else {
            rows(x, y, r0, r1);
            for (int64_t i = r0 * kN; i < r1 * kN; ++i) g->y[i] = y[i];  // volatile: not a dead store
            g->magic = 0x6B666F7267656421ull; g->key = x; g->r0 = r0; g->r1 = r1;
        }
    }
    return 0;
}
