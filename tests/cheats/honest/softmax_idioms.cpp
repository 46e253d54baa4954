// Honest softmax over the last dim (float32) for the cpu backend, written with the idioms real
// kernels use, so the source and binary checks are tested against them: AVX2 intrinsics behind a
// runtime-free #ifdef, OpenMP parallel/for/simd with reductions, #pragma GCC unroll/ivdep,
// std::vector and malloc scratch, const-all-the-way tables, templates, lambdas, a namespace.
#include "kforge_region.h"
#include <float.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>
#include <immintrin.h>

namespace detail {
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
static const float kOne[2] = {1.f, 1.f};
static const char* const kName = "softmax_idioms";

template <typename T>
inline T row_max(const T* xr) {
    T m = -FLT_MAX;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < kN; ++j) m = std::max(m, xr[j]);
    return m;
}

inline float hsum(const float* v, int64_t n) {
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(v + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    float s = 0.f;
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) s += lanes[k];
    for (; j < n; ++j) s += v[j];
    return s;
#else
    float s = 0.f;
    for (int64_t j = 0; j < n; ++j) s += v[j];
    return s;
#endif
}
}  // namespace detail

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    using namespace detail;
    (void)kName;
    const float* x = static_cast<const float*>(inputs[0]);
    float* y = static_cast<float*>(outputs[0]);
    float* scratch = static_cast<float*>(malloc(sizeof(float) * kRows));
    if (!scratch) return 1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < kRows; ++r) {
        std::vector<float> e(kN);
        const float m = row_max(x + r * kN);
        auto expm = [m](float v) { return expf(v - m); };
#pragma GCC ivdep
        for (int64_t j = 0; j < kN; ++j) e[j] = expm(x[r * kN + j]);
        scratch[r] = kOne[0] / hsum(e.data(), kN);
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = e[j] * scratch[r];
    }
    free(scratch);
    return 0;
}
