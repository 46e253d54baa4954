// expect: verify_error | replay, values differ, NaN, poison survived, edge-case inputs
// layer: runtime
// Cheat (class 1, invented): the stack ghost of stack_ghost_replay.cpp, keyed on a few sampled
// input elements instead of the buffer's address. Wholly fresh inputs change the samples, so it
// recomputes and passes a fresh-input re-check. Rejected at run time: the verifier also changes
// only a few elements in place, which leaves the samples alone and exposes the replay.
#include "kforge_region.h"
#include <float.h>
#include <omp.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ghost { uint64_t magic; float sample[4]; int64_t r0, r1; float y[KF_OUT0_NUMEL]; };
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
        const float sample[4] = {x[0], x[KF_IN0_NUMEL / 3], x[KF_IN0_NUMEL / 2], x[KF_IN0_NUMEL - 1]};
        bool same = g->magic == 0x5A4D504C45444B59ull && g->r0 == r0 && g->r1 == r1;
        for (int k = 0; k < 4; ++k) same = same && g->sample[k] == sample[k];
        if (same) {
            for (int64_t i = r0 * kN; i < r1 * kN; ++i) y[i] = g->y[i];
        } else {
            rows(x, y, r0, r1);
            for (int64_t i = r0 * kN; i < r1 * kN; ++i) g->y[i] = y[i];  // volatile: not a dead store
            g->magic = 0x5A4D504C45444B59ull; g->r0 = r0; g->r1 = r1;
            for (int k = 0; k < 4; ++k) g->sample[k] = sample[k];
        }
    }
    return 0;
}
