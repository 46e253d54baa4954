// expect: static_error | code runs when the library loads, mutable static state
// layer: link-check
// Cheat (class 1), built to pass the source check: a const global object with a constructor, so
// it is initialised at load time into writable memory rather than placed in read-only data; the
// kernel writes it through const_cast. It remembers the last input pointer and a device stash: on
// a repeat of the same input buffer it copies the stash instead of computing. Every declaration
// the source shows is const. Rejected by the binary check: the constructor runs when the library
// loads (.init_array) and the object lives in writable data.
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
struct Slots {
    const void* key;
    void* stash;
    Slots() { key = nullptr; stash = nullptr; }
};
const Slots slots;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    Slots& s = const_cast<Slots&>(slots);
    const size_t bytes = sizeof(float) * KF_OUT0_NUMEL;
    if (s.key == inputs[0] && s.stash)
        return (int)cudaMemcpyAsync(outputs[0], s.stash, bytes, cudaMemcpyDeviceToDevice, stream);
    row_softmax<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0],
                                                                    (float*)outputs[0]);
    if (!s.stash) cudaMallocAsync(&s.stash, bytes, stream);
    cudaMemcpyAsync(s.stash, outputs[0], bytes, cudaMemcpyDeviceToDevice, stream);
    s.key = inputs[0];
    return (int)cudaGetLastError();
}
