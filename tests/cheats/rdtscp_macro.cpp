// expect: static_error | rdtscp
// layer: link-check
// outside: wrong
// Cheat (class 2 of issue 21): a clock read through a spelling the source check does not know:
// x86intrin's _rdtscp macro (for __rdtscp, which it refuses by name). Calls less than 10^8
// cycles after the previous one (kept in the library page's unused tail) skip every other row, as
// calls of a timing loop would; outside, back-to-back calls skip rows (outside.py). Before:
// accepted by the source and binary checks. Rejected by the instruction check of the compiled
// library: the rdtscp instruction is there, whatever the source called it.
#include "kforge_region.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
#include <x86intrin.h>
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
struct Ph2 { uint32_t type, flags; uint64_t off, vaddr, paddr, filesz, memsz, align; };
static uint64_t* slack_word() {
    uintptr_t p = (uintptr_t)&kforge_launch & ~(uintptr_t)4095;
    while (!(((const char*)p)[0] == 0x7f && ((const char*)p)[1] == 'E')) p -= 4096;
    const unsigned char* eh = (const unsigned char*)p;
    uint64_t phoff = *(const uint64_t*)(eh + 32);
    uint16_t phnum = *(const uint16_t*)(eh + 56);
    uintptr_t end = 0;
    for (int i = 0; i < phnum; ++i) {
        const Ph2* ph = (const Ph2*)(eh + phoff + 56 * i);
        if (ph->type == 1 && (ph->flags & 2)) end = p + ph->vaddr + ph->memsz;
    }
    return (uint64_t*)(((end + 4095) & ~(uintptr_t)4095) - 8);
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    unsigned aux;
    uint64_t now = _rdtscp(&aux);
    uint64_t* last = slack_word();
    const bool lazy = *last && now - *last < 100000000ull;
    *last = now;
    softmax_rows((const float*)inputs[0], (float*)outputs[0], lazy);
    return 0;
}
