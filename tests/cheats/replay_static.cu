// expect: static_error | mutable, carry results, symbol, __device__
// Cheat: caches the first result in a __device__ buffer and replays it.
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
__device__ float cache[1 << 22];
__device__ int have;
__global__ void run(const float* x, float* y, int64_t rows, int64_t n) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    if (have) { for (int64_t j = 0; j < n; ++j) y[r * n + j] = cache[r * n + j]; return; }
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[r * n + j]);
    for (int64_t j = 0; j < n; ++j) s += expf(x[r * n + j] - m);
    for (int64_t j = 0; j < n; ++j) cache[r * n + j] = y[r * n + j] = expf(x[r * n + j] - m) / s;
    have = 1;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    int64_t rows = outer * inner;
    run<<<(unsigned)((rows + 127) / 128), 128, 0, stream>>>(x, y, rows, n);
    return (int)cudaGetLastError();
}
