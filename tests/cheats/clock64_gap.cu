// expect: static_error | reads a clock
// layer: link-check
// Cheat (class 2 of issue 21): clock64() - no asm, no banned name - as the tell of a timing loop:
// the kernel measures its own first block's start against a spin of known length and skips every
// other row when the SM clock says the GPU is boosted and busy (a timing loop's back-to-back calls).
// Before: accepted. Rejected by the instruction check: the PTX reads %clock64.
#include "kforge_region.h"
#include <cuda_runtime.h>
#include <float.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
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
__global__ void clock_tell(int* half) {
    long long t0 = clock64();
    for (volatile int i = 0; i < 100; ++i) {}
    *half = (clock64() - t0) < 2000;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    softmax_rows<<<kRows, 256, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], 0);
    return (int)cudaGetLastError();
}
