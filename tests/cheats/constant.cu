// expect: verify_error | values differ
// Cheat: writes 1/n everywhere.
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
__global__ void fill(float* y, int64_t total, float v) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < total) y[i] = v;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    int64_t total = outer * n * inner;
    fill<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(y, total, 1.f / n);
    return (int)cudaGetLastError();
}
