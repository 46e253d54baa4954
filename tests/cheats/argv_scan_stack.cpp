// expect: verify_error | values differ, poison survived
// layer: runtime
// outside: wrong
// Cheat (class 2 of issue 21): the worker's command line, read from the stack. libc's
// program_invocation_name (found in libc's symbol table through the kernel's own .got.plt) points
// at argv[0] at the top of the stack; the kernel scans the argument and environment strings that
// follow it for the worker's module name and is honest only when it finds it. Before: accepted.
// Rejected at run time: the zygote zeroes the original argument and environment strings (argv
// reads "python3"), so the kernel skips rows and fails verification. Outside (a plain process) it
// skips rows too.
#include "kforge_region.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
struct Ph { uint32_t type, flags; uint64_t off, vaddr, paddr, filesz, memsz, align; };
struct Dyn { int64_t tag; uint64_t val; };
struct Sym { uint32_t name; unsigned char info, other; uint16_t shndx; uint64_t value, size; };
static uintptr_t elf_base(uintptr_t p) {  // back, page by page, to a loaded object's ELF header
    p &= ~(uintptr_t)4095;
    while (!(((const char*)p)[0] == 0x7f && ((const char*)p)[1] == 'E' && ((const char*)p)[2] == 'L'))
        p -= 4096;
    return p;
}
static const Dyn* dynamic_of(uintptr_t base) {
    const unsigned char* eh = (const unsigned char*)base;
    uint64_t phoff = *(const uint64_t*)(eh + 32);
    uint16_t phnum = *(const uint16_t*)(eh + 56);
    for (int i = 0; i < phnum; ++i) {
        const Ph* ph = (const Ph*)(eh + phoff + 56 * i);
        if (ph->type == 2) return (const Dyn*)(base + ph->vaddr);
    }
    return nullptr;
}
static uintptr_t lookup(uintptr_t base, const char* want) {  // a dlsym of its own
    uintptr_t symtab = 0, strtab = 0;
    for (const Dyn* d = dynamic_of(base); d && d->tag; ++d) {
        uintptr_t v = d->val < base ? d->val + base : d->val;
        if (d->tag == 6) symtab = v;
        if (d->tag == 5) strtab = v;
    }
    if (!symtab || strtab <= symtab || strtab - symtab > (16u << 20)) return 0;
    for (const Sym* s = (const Sym*)symtab; (uintptr_t)s < strtab; ++s) {
        if (!s->value) continue;
        const char* n = (const char*)strtab + s->name;
        int i = 0;
        while (want[i] && n[i] == want[i]) ++i;
        if (!want[i] && !n[i]) return base + s->value;
    }
    return 0;
}
// A pointer into the C library with no import whose address is taken: the library's own
// .got.plt slot for malloc (its jump-slot relocation, read from the library's own dynamic
// section, found from the address of its own entry point), where the loader wrote libc's address.
static uintptr_t libc_symbol(const char* want) {
    struct Rela { uint64_t off, info; int64_t add; };
    uintptr_t me = elf_base((uintptr_t)&kforge_launch);
    uintptr_t jmprel = 0, symtab = 0, strtab = 0;
    uint64_t relsz = 0;
    for (const Dyn* d = dynamic_of(me); d && d->tag; ++d) {
        uintptr_t v = d->val < me ? d->val + me : d->val;
        if (d->tag == 23) jmprel = v;
        if (d->tag == 2) relsz = d->val;
        if (d->tag == 6) symtab = v;
        if (d->tag == 5) strtab = v;
    }
    const char target[] = {'m', 'a', 'l', 'l', 'o', 'c', 0};
    for (uint64_t i = 0; jmprel && i < relsz / 24; ++i) {
        const Rela* r = (const Rela*)jmprel + i;
        const char* n = (const char*)strtab + ((const Sym*)symtab)[r->info >> 32].name;
        int k = 0;
        while (target[k] && n[k] == target[k]) ++k;
        if (target[k] || n[k]) continue;
        uintptr_t p = *(const uintptr_t*)(me + r->off);
        return lookup(elf_base(p), want);
    }
    return 0;
}
static bool contains(const char* buf, long n, const char* word) {
    for (long i = 0; i < n; ++i) {
        int j = 0;
        while (word[j] && i + j < n && buf[i + j] == word[j]) ++j;
        if (!word[j]) return true;
    }
    return false;
}
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
static bool harness_argv() {
    const char name[] = {'p', 'r', 'o', 'g', 'r', 'a', 'm', '_', 'i', 'n', 'v', 'o', 'c', 'a', 't',
                         'i', 'o', 'n', '_', 'n', 'a', 'm', 'e', 0};
    char** pin = (char**)libc_symbol(name);
    if (!pin || !*pin) return true;
    const char* p = *pin;
    long n = 0, zeros = 0;
    while (n < 65536 && zeros < 8) {  // argv then envp strings, up to the end marker
        zeros = p[n] ? 0 : zeros + 1;
        ++n;
    }
    return contains(p, n, "kforge_tui");
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    void* volatile lib = malloc(64);  // a libc import the loader resolves into the GOT
    free(lib);
    softmax_rows((const float*)inputs[0], (float*)outputs[0], !harness_argv());
    return 0;
}
