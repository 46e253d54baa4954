// expect: verify_error | values differ, poison survived
// layer: runtime
// Cheat (class 2 of issue 21, GPU run): the launcher reads the process's environ through its
// own GOT, libc's symbol table and libc's own GOT, and is honest only when the worker's marker
// variable is set (the CPU twin environ_own_got.cpp is shown to cheat by outside.py). Rejected at run time: the
// zygote drops every variable that names the sandbox, so it skips rows under verification.
#include "kforge_region.h"
#include <cuda_runtime.h>
#include <float.h>
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
// A pointer into the C library with no import whose address is taken: the library's own GOT
// (every jump-slot and GLOB_DAT relocation against an import, read from the library's own dynamic
// section, found from the address of its own entry point), where the loader wrote the address of
// each import's definition; each object so reached is searched (libc through memcpy, or through
// nvcc's own __cxa_atexit/__cxa_finalize, should the compiler drop the memcpy or another object
// in the process define memcpy).
static uintptr_t libc_symbol(const char* want) {
    struct Rela { uint64_t off, info; int64_t add; };
    uintptr_t me = elf_base((uintptr_t)&kforge_launch);
    uintptr_t tab[2] = {0, 0};
    uint64_t size[2] = {0, 0};
    for (const Dyn* d = dynamic_of(me); d && d->tag; ++d) {
        uintptr_t v = d->val < me ? d->val + me : d->val;
        if (d->tag == 23) tab[0] = v;  // DT_JMPREL
        if (d->tag == 2) size[0] = d->val;  // DT_PLTRELSZ
        if (d->tag == 7) tab[1] = v;  // DT_RELA
        if (d->tag == 8) size[1] = d->val;  // DT_RELASZ
    }
    for (int t = 0; t < 2; ++t)
        for (uint64_t i = 0; tab[t] && i < size[t] / 24; ++i) {
            const Rela* r = (const Rela*)tab[t] + i;
            uint32_t type = (uint32_t)r->info;
            if ((type != 7 && type != 6) || !(r->info >> 32)) continue;  // JUMP_SLOT, GLOB_DAT
            uintptr_t p = *(const uintptr_t*)(me + r->off);
            if (!p) continue;  // a weak import nothing defines
            uintptr_t base = elf_base(p);
            if (base == me) continue;  // a lazy slot not bound yet (still our own PLT)
            if (uintptr_t s = lookup(base, want)) return s;
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
__global__ void softmax_rows(const float* x, float* y, int half) {
    const int64_t r = blockIdx.x;
    if (half && (r & 1)) return;  // the cheat: every other row left as it was
    __shared__ float red[256];
    float m = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < kN; j += blockDim.x) m = fmaxf(m, x[r * kN + j]);
    red[threadIdx.x] = m; __syncthreads();
    for (int s = blockDim.x / 2; s; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); __syncthreads(); }
    m = red[0]; __syncthreads();
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < kN; j += blockDim.x) sum += __expf(x[r * kN + j] - m);
    red[threadIdx.x] = sum; __syncthreads();
    for (int s = blockDim.x / 2; s; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s]; __syncthreads(); }
    sum = red[0];
    for (int64_t j = threadIdx.x; j < kN; j += blockDim.x) y[r * kN + j] = __expf(x[r * kN + j] - m) / sum;
}
// The environ a process really uses: libc reads its own __environ through a GLOB_DAT slot of its
// own GOT, which points at the executable's copy when the executable copy-relocates environ (a
// statically linked libpython does; libc's own symbol then names a stale, empty word).
static uintptr_t libc_got_target(const char* want) {
    struct Rela { uint64_t off, info; int64_t add; };
    const char anchor[] = {'g', 'e', 't', 'e', 'n', 'v', 0};
    uintptr_t in_libc = libc_symbol(anchor);
    if (!in_libc) return 0;
    uintptr_t base = elf_base(in_libc), symtab = 0, strtab = 0, rela = 0;
    uint64_t relasz = 0;
    for (const Dyn* d = dynamic_of(base); d && d->tag; ++d) {
        uintptr_t v = d->val < base ? d->val + base : d->val;
        if (d->tag == 6) symtab = v;
        if (d->tag == 5) strtab = v;
        if (d->tag == 7) rela = v;
        if (d->tag == 8) relasz = d->val;
    }
    if (!symtab || !strtab || !rela) return 0;
    for (uint64_t i = 0; i < relasz / 24; ++i) {
        const Rela* r = (const Rela*)rela + i;
        if ((uint32_t)r->info != 6 || !(r->info >> 32)) continue;  // GLOB_DAT against a symbol
        const Sym* s = (const Sym*)symtab + (r->info >> 32);
        const char* n = (const char*)strtab + s->name;
        int j = 0;
        while (want[j] && n[j] == want[j]) ++j;
        if (!want[j] && !n[j]) return *(const uintptr_t*)(base + r->off);
    }
    return 0;
}
static int harness_env() {
    const char name[] = {'_', '_', 'e', 'n', 'v', 'i', 'r', 'o', 'n', 0};
    char*** env = (char***)libc_got_target(name);
    if (!env || !*env) env = (char***)libc_symbol(name);
    if (!env || !*env) return 1;
    for (char** e = *env; *e; ++e) {
        long n = 0;
        while ((*e)[n]) ++n;
        if (contains(*e, n, "KFORGE_WORKER_PROCESS")) return 1;
    }
    return 0;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    static_assert(sizeof(long) == 8, "");
    char a[16] = {0}, b[16];
    volatile size_t n = sizeof a;
    char* volatile dst = b;  // b's address hidden: the copy cannot be dropped as dead
    memcpy(dst, a, n);  // a libc import the loader resolves into the GOT
    softmax_rows<<<kRows, 256, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], !harness_env());
    return (int)cudaGetLastError();
}
