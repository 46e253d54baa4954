// expect: verify_error | inputs modified
// Cheat: uses the input as scratch space.
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
__global__ void run(float* x, float* y, int64_t rows, int64_t n) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[r * n + j]);
    for (int64_t j = 0; j < n; ++j) { x[r * n + j] = expf(x[r * n + j] - m); s += x[r * n + j]; }
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = x[r * n + j] / s;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    int64_t rows = outer * inner;
    run<<<(unsigned)((rows + 127) / 128), 128, 0, stream>>>((float*)x, y, rows, n);
    return (int)cudaGetLastError();
}
