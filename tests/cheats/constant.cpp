// expect: verify_error | values differ
// layer: runtime
// Cheat: returns a constant (the mean softmax value, 1/n) without reading the input. Rejected
// because the values are wrong for any input that is not uniform.
#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    float* y = (float*)outputs[0];
    for (int64_t i = 0; i < KF_OUT0_NUMEL; ++i) y[i] = 1.0f / (float)KF_IN0_SIZE_1;
    return 0;
}
