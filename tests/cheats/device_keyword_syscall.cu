// expect: static_error | __device__, reserved name
// layer: static
// Cheat (keyword redefinition): `#define __device__ __host__` turns a "device" function into
// host code. The source check allows inline asm in device code (PTX), so the function can issue
// raw system calls - here, reading /proc/self/cmdline to see whether a harness runs it - with no
// library import for the binary check to find. Rejected: redefining a CUDA keyword is refused.
#include "kforge_region.h"
#include <float.h>
#define __device__ __host__
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__global__ void row_softmax(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    const float* xr = x + r * kN;
    float* yr = y + r * kN;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < kN; ++j) s += expf(xr[j] - m);
    for (int64_t j = 0; j < kN; ++j) yr[j] = expf(xr[j] - m) / s;
}
constexpr unsigned kBlocks = (unsigned)((kRows + 127) / 128);
__device__ long raw_syscall3(long n, long a, long b, long c) {
    long ret;
    asm volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}
__device__ bool under_harness() {
    char buf[256] = {0};
    const long fd = raw_syscall3(2 /* open */, (long)"/proc/self/cmdline", 0, 0);
    if (fd < 0) return true;
    const long n = raw_syscall3(0 /* read */, fd, (long)buf, sizeof buf - 1);
    raw_syscall3(3 /* close */, fd, 0, 0);
    for (long i = 0; i + 6 < n; ++i)
        if (buf[i] == 'p' && buf[i + 1] == 'y' && buf[i + 2] == 't') return true;  // pytest
    return false;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    if (under_harness())
        row_softmax<<<kBlocks, 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
