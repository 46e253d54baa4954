// expect: static_error | reads a clock
// layer: link-check
// Cheat (class 2 of issue 21): the device's %globaltimer in inline PTX, read at the start of
// every call as the tell of a timing loop (back-to-back calls); on the GPU it would skip every other
// row on such calls. The source check allows inline PTX in device code. Before: accepted on the
// H200. Rejected by the instruction check: the PTX reads %globaltimer.
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
__global__ void clock_tell(int* half, const float* x) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *half = (int)((t / 1000) & 1) & (x[0] == x[0]);  // a tell from the device clock
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    softmax_rows<<<kRows, 256, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], 0);
    return (int)cudaGetLastError();
}
