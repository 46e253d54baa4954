// expect: static_error | stream
// Cheat: does the work on its own stream so the timed region is empty.
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
#include <cuda_bf16.h>
__global__ void row_softmax(const float* x, float* y, int64_t rows, int64_t n, int lowp) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * n; float* yr = y + r * n;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < n; ++j) s += expf(xr[j] - m);
    for (int64_t j = 0; j < n; ++j) {
        float v = expf(xr[j] - m) / s;
        yr[j] = lowp ? __bfloat162float(__float2bfloat16(v)) : v;
    }
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    cudaStream_t s2;
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    int64_t rows = outer * inner;
    row_softmax<<<(unsigned)((rows + 127) / 128), 128, 0, s2>>>(x, y, rows, n, 0);
    return (int)cudaGetLastError();
}
