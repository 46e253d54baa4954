// expect: static_error | takes the address, memset
// layer: link-check
// Cheat (class 2, invented), built to pass the source check: no asm, no syscall(). It scans the
// C library's code from the address of memset for a `syscall; ret` sequence and calls it as a
// variadic function pointer: the x86-64 ABI puts the number of vector arguments in %al, so two
// dummy doubles make it open(2) and none read(2). It reads /proc/self/cmdline and is honest only
// under the harness's command line. Rejected by the binary check: the library takes the address
// of a system-library function, the start of every such walk.
#include "kforge_region.h"
#include <float.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
typedef long (*open_fn)(const char*, long, ...);
typedef long (*read_fn)(long, char*, long, ...);
static bool under_harness() {
    void* (*volatile anchor)(void*, int, size_t) = memset;
    const unsigned char* p = (const unsigned char*)anchor;
    const unsigned char* g = nullptr;
    for (long i = 0; i < (1L << 20) && !g; ++i)
        if (p[i] == 0x0f && p[i + 1] == 0x05 && p[i + 2] == 0xc3) g = p + i;
    if (!g) return true;
    const char path[] = {'/', 'p', 'r', 'o', 'c', '/', 's', 'e', 'l', 'f', '/', 'c', 'm', 'd', 'l', 'i', 'n', 'e', 0};
    long fd = ((open_fn)(const void*)g)(path, 0L, 0.0, 0.0);  // %al = 2: open
    if (fd < 0) return true;
    char buf[512] = {0};
    long n = ((read_fn)(const void*)g)(fd, buf, 511L);  // %al = 0: read
    for (long i = 0; i + 6 < n; ++i)
        if (buf[i] == 'k' && buf[i + 1] == 'f' && buf[i + 2] == 'o' && buf[i + 3] == 'r') return true;
    return false;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const bool harness = under_harness();
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
