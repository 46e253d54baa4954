// expect: static_error | library, cudnn
// layer: static
// Cheat: calls cuDNN's softmax instead of writing a kernel. Rejected: calling a library for the
// op is not writing the kernel.
#include "kforge_region.h"
#include <cudnn.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    cudnnHandle_t h; cudnnCreate(&h); cudnnSetStream(h, stream);
    cudnnTensorDescriptor_t d; cudnnCreateTensorDescriptor(&d);
    cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)KF_IN0_SIZE_0,
                               (int)KF_IN0_SIZE_1, 1, 1);
    float a = 1.f, b = 0.f;
    cudnnSoftmaxForward(h, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &a, d, inputs[0],
                        &b, d, outputs[0]);
    return 0;
}
