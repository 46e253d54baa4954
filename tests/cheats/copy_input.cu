// expect: verify_error | values differ
// Cheat: copies the input to the output.
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    return (int)cudaMemcpyAsync(y, x, sizeof(float) * outer * n * inner, cudaMemcpyDeviceToDevice, stream);
}
