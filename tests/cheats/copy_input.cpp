// expect: verify_error | values differ
// layer: runtime
// Cheat: copies the input to the output (the cheapest kernel that writes every element).
// Rejected: the values are not the softmax of the input.
#include "kforge_region.h"
#include <string.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    memcpy(outputs[0], inputs[0], sizeof(float) * KF_OUT0_NUMEL);
    return 0;
}
