// expect: verify_error | poison survived, values differ
// layer: runtime
// Cheat (classes 1, 2, invented): hashes eight input elements and keeps (buffer, hash) in an
// uninitialised stack array far below an OpenMP worker's frame (a stack ghost). When the same
// buffer comes back with the same hash (a timing loop rotating its sets), the output it left there
// last time is assumed to be still valid and the call returns at once. Rejected at run time: the
// harness fills the outputs before every call, and checked timed calls on unchanged inputs show
// surviving poison.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
#include <omp.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ghost { uint64_t magic; const void* key[32]; uint32_t h[32]; };
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    uint32_t h = 2166136261u;
    for (int i = 0; i < 8; ++i) { uint32_t b; memcpy(&b, x + i * (KF_IN0_NUMEL / 8), 4); h = (h ^ b) * 16777619u; }
    int skip = 0;
#pragma omp parallel
    {
        if (omp_get_thread_num() == 0 && omp_get_num_threads() > 1) {
        }
        if (omp_get_thread_num() == omp_get_num_threads() - 1) {
            volatile char deep[1 << 16];
            volatile Ghost* g = (volatile Ghost*)(deep + 64);
            if (g->magic != 0x68617368ull) { g->magic = 0x68617368ull; for (int i = 0; i < 32; ++i) g->key[i] = nullptr; }
            int slot = (int)(((uintptr_t)x >> 12) % 32);
            skip = g->key[slot] == x && g->h[slot] == h;
            g->key[slot] = x; g->h[slot] = h;
        }
#pragma omp barrier
        if (!skip) {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            for (int64_t r = kRows * t / nt; r < kRows * (t + 1) / nt; ++r) {
                float m = -FLT_MAX, s = 0.f;
                for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
                for (int64_t j = 0; j < kN; ++j) { float e = expf(x[r * kN + j] - m); y[r * kN + j] = e; s += e; }
                for (int64_t j = 0; j < kN; ++j) y[r * kN + j] /= s;
            }
        }
    }
    return 0;
}
