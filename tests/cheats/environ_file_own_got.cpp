// expect: verify_error | system call the sandbox does not allow
// layer: runtime
// outside: wrong
// Cheat (classes 1 and 2 of issue 21): reads /proc/self/environ with libc's open() and read(),
// both found in libc's symbol table through the kernel's own .got.plt (no import, no forbidden
// name), and is honest only when the worker's marker variable is there; every other row is
// skipped elsewhere (outside.py). Before: accepted. Rejected at run time: open is openat to the
// kernel, which the runner's seccomp filter refuses; the runner is killed and the number reported.
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
typedef int (*open_fn)(const char*, int, ...);
typedef long (*read_fn)(int, void*, unsigned long);
static bool harness_env_file() {
    const char o[] = {'o', 'p', 'e', 'n', 0}, r[] = {'r', 'e', 'a', 'd', 0};
    open_fn op = (open_fn)libc_symbol(o);
    read_fn rd = (read_fn)libc_symbol(r);
    if (!op || !rd) return true;
    int fd = op("/proc/self/environ", 0);
    if (fd < 0) return true;
    static_assert(sizeof(long) == 8, "");
    char* buf = (char*)malloc(1 << 16);
    long n = rd(fd, buf, 1 << 16);
    bool found = n <= 0 || contains(buf, n, "KFORGE_WORKER_PROCESS");
    free(buf);
    return found;  // (the descriptor is left open: it will not matter to the cheat)
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    softmax_rows((const float*)inputs[0], (float*)outputs[0], !harness_env_file());
    return 0;
}
