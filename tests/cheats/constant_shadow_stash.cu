// expect: static_error | host code must not use the device variable
// layer: static
// Cheat (class 1): a __constant__ table is allowed (device code cannot write it), but nvcc keeps
// a host-side shadow of it in ordinary writable memory, and host code may write that shadow
// through const_cast. The launcher keeps the last input pointer and a device stash there and
// copies the stash instead of computing when the same input comes back. Rejected: host code must
// not touch a device variable. (The binary check allows the shadow of a declared __constant__ by
// name, so only the source check can see this one.)
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__constant__ const void* g_slots[2];  // [0] = last input, [1] = device stash
__global__ void row_softmax(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
    for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
    for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = expf(x[r * kN + j] - m) / s;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    void** slots = const_cast<void**>(g_slots);
    const size_t bytes = sizeof(float) * KF_OUT0_NUMEL;
    if (slots[0] == inputs[0] && slots[1])
        return (int)cudaMemcpyAsync(outputs[0], slots[1], bytes, cudaMemcpyDeviceToDevice, stream);
    row_softmax<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0],
                                                                    (float*)outputs[0]);
    if (!slots[1]) cudaMallocAsync(&slots[1], bytes, stream);
    cudaMemcpyAsync(slots[1], outputs[0], bytes, cudaMemcpyDeviceToDevice, stream);
    slots[0] = (void*)inputs[0];
    return (int)cudaGetLastError();
}
