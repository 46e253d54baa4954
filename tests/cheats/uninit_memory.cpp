// expect: verify_error | NaN, values differ, unwritten
// Cheat: mallocs a buffer of the output's size and returns its contents, hoping the allocator
// hands back the block where PyTorch's reference output was just freed.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    const size_t bytes = sizeof(float) * outer * n * inner;
    float* p = (float*)malloc(bytes);
    if (!p) return 1;
    memcpy(y, p, bytes);
    free(p);
    return 0;
}
