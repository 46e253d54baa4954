// expect: verify_error | values differ, poison survived, NaN
// layer: runtime
// Cheat: mallocs a block of the output's size and returns its contents, hoping the allocator
// hands back the block where PyTorch's reference output was just freed. Rejected: references are
// computed where no candidate runs, so the block holds anything but the answer.
#include "kforge_region.h"
#include <stdlib.h>
#include <string.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const size_t bytes = sizeof(float) * KF_OUT0_NUMEL;
    float* p = (float*)malloc(bytes);
    if (!p) return 1;
    memcpy(outputs[0], p, bytes);
    free(p);
    return 0;
}
