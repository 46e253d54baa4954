// expect: verify_error | system call the sandbox does not allow
// layer: runtime
// outside: wrong
// Cheat (classes 1 and 4 of issue 21): work outside the timed call through a signal handler,
// with no forbidden name and no import: libc's sigaction and setitimer come from libc's symbol
// table through the kernel's own .got.plt. The call arms a 1 ms timer and returns at once; the
// handler computes the output afterwards (outside.py checks right after the call: wrong).
// Before: no name the source check knows, no import the binary check sees. Rejected at run time:
// rt_sigaction with a handler is not on the runner's seccomp allow-list.
#include "kforge_region.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
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
struct Act { void (*handler)(int); uint64_t mask[16]; int flags; void (*restorer)(void); };
struct Tv { long s, us; };
struct It { Tv interval, value; };
typedef int (*sigaction_fn)(int, const Act*, Act*);
typedef int (*setitimer_fn)(int, const It*, It*);
static void later(int) {}  // (a real one would finish the rows it was handed)
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    void* volatile lib = malloc(64);
    free(lib);
    const char sa[] = {'s', 'i', 'g', 'a', 'c', 't', 'i', 'o', 'n', 0};
    const char st[] = {'s', 'e', 't', 'i', 't', 'i', 'm', 'e', 'r', 0};
    sigaction_fn act = (sigaction_fn)libc_symbol(sa);
    setitimer_fn arm = (setitimer_fn)libc_symbol(st);
    if (!act || !arm) {
        softmax_rows((const float*)inputs[0], (float*)outputs[0], false);
        return 0;
    }
    Act a;
    memset(&a, 0, sizeof a);
    a.handler = later;
    act(14, &a, nullptr);  // SIGALRM
    It t = {{0, 0}, {0, 1000}};
    arm(0, &t, nullptr);  // ITIMER_REAL, once, in 1 ms
    return 0;
}
