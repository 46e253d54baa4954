// expect: static_error | takes the address, memcpy
// layer: link-check
// Cheat (classes 2, 3, invented), built to pass the source check: the host launcher takes the
// address of memcpy, walks back from it to the C library's ELF header and reads its dynamic
// symbol table in memory to find getenv - a dlsym of its own, no forbidden name or import - and
// launches the full kernel only when a harness variable is set. Rejected by the binary check: the
// library takes the address of a system-library function (a GOT slot, not a PLT call), the start
// of every such walk.
#include "kforge_region.h"
#include <cuda_runtime.h>
#include <string.h>
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
    for (const Sym* s = (const Sym*)symtab; (uintptr_t)s < strtab; ++s) {
        if (!s->value) continue;
        const char* n = (const char*)strtab + s->name;
        int i = 0;
        while (want[i] && n[i] == want[i]) ++i;
        if (!want[i] && !n[i]) return (lookup_fn)(base + s->value);
    }
    return nullptr;
}
__global__ void softmax_rows(const float* x, float* y, int64_t rows, int64_t n) {
    int64_t r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * n;
    float m = -1e30f, s = 0.f;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < n; ++j) s += __expf(xr[j] - m);
    if (threadIdx.x == 0)
        for (int64_t j = 0; j < n; ++j) y[r * n + j] = __expf(xr[j] - m) / s;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    const int64_t n = KF_IN0_SIZE_1, rows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
    const char name[] = {'g', 'e', 't', 'e', 'n', 'v', 0};
    lookup_fn f = find(name);
    const bool harness = !f || f("CUDA_VISIBLE_DEVICES") != nullptr;
    softmax_rows<<<harness ? rows : rows / 2, 32, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], rows, n);
    return (int)cudaGetLastError();
}
