// expect: verify_error | values differ, poison survived
// layer: runtime
// Cheat (class 2 of issue 21, GPU run): harness detection from the distance between its input and
// output pointers (the old arena's slot layout), with no name, state or system call; honest only
// at the arena's distance, every other row skipped elsewhere (a caching allocator's blocks are at
// unrelated distances: the CPU twin distance_detect.cpp is shown to cheat by outside.py). Rejected
// at run time: every timed call's tensors are placed anew at random distances.
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
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    const long long in_bytes = KF_IN0_NUMEL * 4;
    const long long slot = (in_bytes + 3 * 4096 + 4095) / 4096 * 4096;
    const long long d = (const char*)outputs[0] - (const char*)inputs[0];
    const int harness = d > slot - 4096 && d < slot + 4096;
    softmax_rows<<<kRows, 256, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], !harness);
    return (int)cudaGetLastError();
}
