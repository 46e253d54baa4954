// expect: static_error | PyTorch
// layer: static
// Cheat: calls the reference library (torch) instead of writing the kernel. Rejected: calling
// back into PyTorch is not a kernel (and torch/extension.h makes one compile take ~47 s).
#include "kforge_region.h"
#include <torch/extension.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    auto xt = torch::from_blob((void*)inputs[0], {KF_IN0_SIZE_0, KF_IN0_SIZE_1});
    auto yt = torch::from_blob(outputs[0], {KF_OUT0_SIZE_0, KF_OUT0_SIZE_1});
    yt.copy_(torch::softmax(xt, 1));
    return 0;
}
