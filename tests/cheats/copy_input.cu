// expect: verify_error | values differ
// layer: runtime
// Cheat: copies the input to the output on the given stream (a stream-ordered copy is allowed;
// the values are not softmax). Rejected: values differ from the reference.
#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    return (int)cudaMemcpyAsync(outputs[0], inputs[0], sizeof(float) * KF_OUT0_NUMEL,
                                cudaMemcpyDeviceToDevice, stream);
}
