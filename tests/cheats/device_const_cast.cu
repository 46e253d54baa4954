// expect: static_error | mutable device state
// layer: link-check
// Cheat (class 4 of issue 21): state in a `__device__ const` variable written from device code
// through a cast - nvcc puts it in writable .global memory, and the binary check allowed the host
// shadow of a declared device variable. A call counter there makes the kernel lazy after 30 calls
// (stale outputs), which a real forward would see as wrong results (GPU only: it cannot run
// here). Before: accepted. Rejected by the instruction check of the compiled code: every
// module-scope .global variable in the PTX is mutable device state, const or not.
#include "kforge_region.h"
#include <cuda_runtime.h>
#include <float.h>
#include <string.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__device__ const unsigned calls = 0;
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
__global__ void tick() { ++*const_cast<unsigned*>(&calls); }
__global__ void lazy_flag(int* flag) { *flag = calls > 30; }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    tick<<<1, 1, 0, stream>>>();
    // after 30 calls the kernel only does every other row (read on the device: no host sync)
    softmax_rows<<<kRows, 256, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], 0);
    return (int)cudaGetLastError();
}
