// expect: verify_error | values differ
// Cheat: returns a constant (the mean softmax value) without reading x.
#include <stdint.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    for (int64_t i = 0; i < outer * n * inner; ++i) y[i] = 1.0f / (float)n;
    return 0;
}
