// expect: static_error | takes the address, memcpy
// layer: link-check
// Cheat (classes 2, 3, invented), built to pass the source check: a dlsym of its own. It takes
// the address of memcpy (an allowed function), walks back from there to the C library's ELF
// header, reads its dynamic symbol table in memory and calls getenv through the pointer it finds -
// no forbidden name, no forbidden import. Honest only when the harness's variables are set (the
// evaluation), lazy in a real forward. Rejected by the binary check: the library takes the
// address of a system-library function (a GOT entry, not a call through the PLT), which is how
// any walk of another library's code or tables starts.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ph { uint32_t type, flags; uint64_t off, vaddr, paddr, filesz, memsz, align; };
struct Dyn { int64_t tag; uint64_t val; };
struct Sym { uint32_t name; unsigned char info, other; uint16_t shndx; uint64_t value, size; };
typedef char* (*lookup_fn)(const char*);
static lookup_fn find(const char* want) {
    void* (*volatile anchor)(void*, const void*, size_t) = memcpy;
    uintptr_t base = (uintptr_t)anchor & ~(uintptr_t)4095;
    while (memcmp((const void*)base, "\177ELF", 4) != 0) base -= 4096;
    const unsigned char* eh = (const unsigned char*)base;
    uint64_t phoff; uint16_t phnum;
    memcpy(&phoff, eh + 32, 8); memcpy(&phnum, eh + 56, 2);
    const Dyn* dyn = nullptr;
    for (int i = 0; i < phnum; ++i) {
        const Ph* ph = (const Ph*)(eh + phoff + 56 * i);
        if (ph->type == 2) dyn = (const Dyn*)(base + ph->vaddr);
    }
    uintptr_t symtab = 0, strtab = 0;
    for (; dyn && dyn->tag; ++dyn) {
        uintptr_t v = dyn->val < base ? dyn->val + base : dyn->val;
        if (dyn->tag == 6) symtab = v;
        if (dyn->tag == 5) strtab = v;
    }
    for (const Sym* s = (const Sym*)symtab; (uintptr_t)s < strtab; ++s)
        if (s->value) {
            const char* n = (const char*)strtab + s->name;
            int i = 0;
            while (want[i] && n[i] == want[i]) ++i;
            if (!want[i] && !n[i]) return (lookup_fn)(base + s->value);
        }
    return nullptr;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const char name[] = {'g', 'e', 't', 'e', 'n', 'v', 0};
    lookup_fn f = find(name);
    const bool harness = !f || f("OMP_WAIT_POLICY") != nullptr;
#pragma omp parallel for
    for (int64_t r = 0; r < kRows; ++r) {
        if (!harness && (r & 1)) continue;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
        for (int64_t j = 0; j < kN; ++j) { float e = expf(x[r * kN + j] - m); y[r * kN + j] = e; s += e; }
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] /= s;
    }
    return 0;
}
