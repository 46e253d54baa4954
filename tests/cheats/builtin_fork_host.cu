// expect: static_error | __builtin_fork, fork
// layer: static, link-check
// Cheat (classes 4, 5): GCC's __builtin_fork in the host launcher - a builtin that reaches the OS
// under a name a deny-list of plain names (fork) misses - forks a child that outlives the timed
// call (and the candidate). Rejected: to the source check __builtin_X is X, and the built
// library imports fork.
#include "kforge_region.h"
#include <cuda_runtime.h>
__global__ void softmax_rows(const float* x, float* y, int64_t rows, int64_t n) {
    int64_t r = blockIdx.x;
    if (r >= rows || threadIdx.x) return;
    const float* xr = x + r * n;
    float m = -1e30f, s = 0.f;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < n; ++j) s += __expf(xr[j] - m);
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = __expf(xr[j] - m) / s;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    const int64_t n = KF_IN0_SIZE_1, rows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
    if (__builtin_fork() == 0) { for (;;) {} }  // a child left behind
    softmax_rows<<<rows, 32, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], rows, n);
    return (int)cudaGetLastError();
}
