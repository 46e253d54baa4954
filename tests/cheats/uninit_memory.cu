// expect: verify_error | NaN, values differ, unwritten
// Cheat: allocates a stream-ordered buffer of the output's size and returns its contents, hoping it holds PyTorch's last result.
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    size_t bytes = sizeof(float) * outer * n * inner;
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, stream) != cudaSuccess) return 1;
    cudaMemcpyAsync(y, p, bytes, cudaMemcpyDeviceToDevice, stream);
    cudaFreeAsync(p, stream);
    return (int)cudaGetLastError();
}
