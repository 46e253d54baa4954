// expect: verify_error | outside the output
// Cheat without static state: stashes its result (and a marker) just past the end of the output
// and, when it finds the marker on a later call into the same buffer, replays the stash.
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
    const int64_t total = outer * n * inner;
    uint32_t* marker = (uint32_t*)(y + total);
    float* stash = y + total + 1;
    if (*marker == 0xC0FFEEu && total < 1000) {  // tiny outputs: the stash fits in the slack
        memcpy(y, stash, sizeof(float) * total);
        return 0;
    }
    for (int64_t o = 0; o < outer; ++o) {
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[o * n + j]);
        for (int64_t j = 0; j < n; ++j) s += expf(x[o * n + j] - m);
        for (int64_t j = 0; j < n; ++j) y[o * n + j] = expf(x[o * n + j] - m) / s;
    }
    if (total < 1000) memcpy(stash, y, sizeof(float) * total);
    *marker = 0xC0FFEEu;  // even the marker alone is a write outside the output
    return 0;
}
