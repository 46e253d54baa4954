// expect: verify_error | poison survived, values differ, writable memory
// layer: runtime
// Cheat (classes 1, 2, 4, invented): tells checked calls from unchecked ones in the timing loop
// and does no work at all on the unchecked ones (whose outputs nobody reads). The state: a small
// table in the unused tail of the library's own last writable page, found at run time from its
// own ELF header (the page that holds .bss is writable to its end, and no symbol covers the tail,
// so the binary check sees no static state). The tell: the harness writes fresh random guard
// bytes around an output only before a checked call, so when the 16 bytes just past the output
// are the same as on the last call into that buffer, the call is not checked (before the fix it
// was timed 8-12x faster than the honest kernel). Rejected at run time: the timing loop makes
// checked calls look exactly like unchecked ones (the same garbage-pool windows, guard bytes left
// as they are), so a skipped checked call shows surviving poison.
// Now also caught where the note lives: the runner compares the library's own writable pages
// after every call (issue 21).
#include "kforge_region.h"
#include <float.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ph { uint32_t type, flags; uint64_t off, vaddr, paddr, filesz, memsz, align; };
struct Entry { const void* key; unsigned char guard[16]; };
static Entry* table() {  // the slack after .bss in the library's last writable page
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
    return (4096 - (end & 4095)) >= 100 * sizeof(Entry) ? (Entry*)end : nullptr;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const unsigned char* guard = (const unsigned char*)(y + KF_OUT0_NUMEL);
    Entry* t = table();
    if (t) {
        for (int i = 0; i < 100; ++i)
            if (t[i].key == y) {
                if (memcmp(t[i].guard, guard, 16) == 0) return 0;  // not checked: skip the work
                memcpy(t[i].guard, guard, 16);
                t = nullptr;
                break;
            }
        for (int i = 0; t && i < 100; ++i)
            if (!t[i].key) { t[i].key = y; memcpy(t[i].guard, guard, 16); break; }
    }
#pragma omp parallel for
    for (int64_t r = 0; r < kRows; ++r) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) { float e = expf(x[r * kN + j] - m); y[r * kN + j] = e; s += e; }
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] /= s;
    }
    return 0;
}
