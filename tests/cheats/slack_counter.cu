// expect: verify_error | harness memory between the tensors changed, poison survived
// layer: runtime
// Cheat (class 4 of issue 21, GPU run): a call counter kept by device code in the arena slack past
// its output's tail guard (never filled or checked before) - the state a lazy kernel needs (the
// CPU twin slack_counter.cpp stops computing after 15 calls and is shown to cheat by outside.py;
// this one only keeps the count, which is already the violation). Rejected
// at run time: the whole arena is random and compared after every call outside the outputs.
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
__global__ void count(unsigned long long* note, int* lazy) {
    const unsigned long long magic = 0x6b6e6f7463687321ull;
    if (note[0] != magic) { note[0] = magic; note[1] = 0; }
    *lazy = ++note[1] > 15;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    char* out = (char*)outputs[0];
    unsigned long long* note = (unsigned long long*)(out + KF_OUT0_NUMEL * 4 + 4096);
    int* lazy = (int*)(note + 2);
    count<<<1, 1, 0, stream>>>(note, lazy);
    softmax_rows<<<kRows, 256, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], 0);
    return (int)cudaGetLastError();
}
