// expect: static_error, verify_error, impossible_timing | stream, unwritten, NaN, floor
// Cheat: launches on the per-thread default stream (no stream is created) so the work is not ordered with the harness stream.
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
    int64_t rows = outer * inner;
    (void)stream;
    row_softmax<<<(unsigned)((rows + 127) / 128), 128, 0, cudaStreamPerThread>>>(x, y, rows, n, 0);
    return (int)cudaGetLastError();
}
