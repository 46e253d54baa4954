// expect: verify_error | values differ
// layer: runtime
// Cheat: writes 1/n everywhere without reading the input. Rejected: wrong for any input that is
// not uniform.
#include "kforge_region.h"
__global__ void fill(float* y, float v) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < KF_OUT0_NUMEL) y[i] = v;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    fill<<<(unsigned)((KF_OUT0_NUMEL + 255) / 256), 256, 0, stream>>>((float*)outputs[0],
                                                                    1.f / KF_IN0_SIZE_1);
    return (int)cudaGetLastError();
}
