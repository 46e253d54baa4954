// expect: static_error | reserved for code the compiler generates
// layer: static
// Cheat (class 1): a host function named like nvcc's launch stubs, with a static local named like
// the stubs' kernel-handle cache, so its state would pass for the compiler's own in the binary
// check's writable-data list. Rejected: names reserved for generated code are refused.
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__global__ void row_softmax(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    const float* xr = x + r * kN;
    float* yr = y + r * kN;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, xr[j]);
    for (int64_t j = 0; j < kN; ++j) s += expf(xr[j] - m);
    for (int64_t j = 0; j < kN; ++j) yr[j] = expf(xr[j] - m) / s;
}
constexpr unsigned kBlocks = (unsigned)((kRows + 127) / 128);
static void* __device_stub__cache(const void* key) {
    static const void* __handle[2];
    if (__handle[0] == key) return (void*)__handle[1];
    __handle[0] = key;
    return nullptr;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    if (__device_stub__cache(inputs[0]) == nullptr)
        row_softmax<<<kBlocks, 128, 0, stream>>>((const float*)inputs[0], (float*)outputs[0]);
    return (int)cudaGetLastError();
}
