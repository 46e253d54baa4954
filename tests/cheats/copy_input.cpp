// expect: verify_error | values differ
// Cheat: copies the input to the output.
#include <stdint.h>
#include <string.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    memcpy(y, x, sizeof(float) * outer * n * inner);
    return 0;
}
