// expect: static_error | PyTorch
// Cheat: calls the reference library (torch) instead of writing the kernel.
#include <torch/extension.h>
#include <stdint.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    auto xt = torch::from_blob((void*)x, {outer, n, inner});
    auto yt = torch::from_blob((void*)y, {outer, n, inner});
    yt.copy_(torch::softmax(xt, 1));
    return 0;
}
