// expect: static_error | library, cudnn
// Cheat: calls cuDNN's softmax instead of writing a kernel.
#include <cudnn.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <float.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
    cudnnHandle_t h; cudnnCreate(&h); cudnnSetStream(h, stream);
    cudnnTensorDescriptor_t d; cudnnCreateTensorDescriptor(&d);
    cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)outer, (int)n, (int)inner, 1);
    float a = 1.f, b = 0.f;
    cudnnSoftmaxForward(h, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &a, d, x, &b, d, y);
    return 0;
}
