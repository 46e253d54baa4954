// expect: verify_error | values differ, poison survived, NaN
// layer: runtime
// Cheat: allocates a stream-ordered block of the output's size and returns its contents, hoping
// it holds PyTorch's last result. Rejected: the reference is computed elsewhere; the block holds
// whatever the pool last had.
#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    const size_t bytes = sizeof(float) * KF_OUT0_NUMEL;
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, stream) != cudaSuccess) return 1;
    cudaMemcpyAsync(outputs[0], p, bytes, cudaMemcpyDeviceToDevice, stream);
    cudaFreeAsync(p, stream);
    return (int)cudaGetLastError();
}
