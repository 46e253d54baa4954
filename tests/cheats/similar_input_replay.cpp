// expect: verify_error | replay, values differ, poison survived, writable memory
// layer: runtime
// Cheat (classes 1, 6, invented): caches the first result in the unused tail of the library's
// last writable page (found from its own ELF header: no symbol, so no static state for the binary
// check) together with a fingerprint of the input (mean and mean square of a 64-element sample),
// and replays it whenever a later input "looks similar" (fingerprint within 1%). Rejected at run
// time: fresh inputs drawn from the same statistics look similar and get the stale answer.
// Now also caught where the note lives: the runner compares the library's own writable pages
// after every call (issue 21).
#include "kforge_region.h"
#include <float.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ph { uint32_t type, flags; uint64_t off, vaddr, paddr, filesz, memsz, align; };
struct Cache { uint64_t magic; float mean, sq; float row[kN]; };
static Cache* slack() {
    uintptr_t p = (uintptr_t)&kforge_launch & ~(uintptr_t)4095;
    while (memcmp((const void*)p, "\177ELF", 4) != 0) p -= 4096;
    const unsigned char* eh = (const unsigned char*)p;
    uint64_t phoff; uint16_t phnum;
    memcpy(&phoff, eh + 32, 8); memcpy(&phnum, eh + 56, 2);
    uintptr_t end = 0;
    for (int i = 0; i < phnum; ++i) {
        Ph ph; memcpy(&ph, eh + phoff + 56 * i, sizeof ph);
        if (ph.type == 1 && (ph.flags & 2)) end = p + ph.vaddr + ph.memsz;
    }
    end = (end + 63) & ~(uintptr_t)63;
    return (4096 - (end & 4095)) >= sizeof(Cache) ? (Cache*)end : nullptr;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    float mean = 0.f, sq = 0.f;
    for (int i = 0; i < 64; ++i) { float v = x[i * (KF_IN0_NUMEL / 64)]; mean += v / 64; sq += v * v / 64; }
    Cache* c = slack();
    if (c && c->magic == 0x5157ull && fabsf(c->mean - mean) < 0.01f * (1 + fabsf(mean))
        && fabsf(c->sq - sq) < 0.01f * sq) {
        for (int64_t r = 0; r < kRows; ++r) memcpy(y + r * kN, c->row, sizeof c->row);  // "similar"
        return 0;
    }
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    }
    if (c) { c->magic = 0x5157ull; c->mean = mean; c->sq = sq; memcpy(c->row, y, sizeof c->row); }
    return 0;
}
