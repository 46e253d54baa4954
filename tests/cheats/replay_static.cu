// expect: static_error | mutable, carry results
// layer: static
// Cheat (class 1): keeps the first result in a __device__ buffer and replays it on later calls.
// Rejected: mutable __device__ state carries results from one call to the next (it lives in
// device memory, so the host binary check cannot see it: the source check must).
#include "kforge_region.h"
#include <float.h>
constexpr int64_t kN = KF_IN0_SIZE_1, kRows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
__device__ float g_cache[KF_OUT0_NUMEL];
__device__ int g_calls;
__global__ void run(const float* __restrict__ x, float* __restrict__ y, int replay) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= kRows) return;
    if (replay) {
        for (int64_t j = 0; j < kN; ++j) y[r * kN + j] = g_cache[r * kN + j];
        return;
    }
    float m = -FLT_MAX, s = 0.f;
    for (int64_t j = 0; j < kN; ++j) m = fmaxf(m, x[r * kN + j]);
    for (int64_t j = 0; j < kN; ++j) s += expf(x[r * kN + j] - m);
    for (int64_t j = 0; j < kN; ++j) g_cache[r * kN + j] = y[r * kN + j] = expf(x[r * kN + j] - m) / s;
    if (r == 0) ++g_calls;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    int calls = 0;
    cudaMemcpyFromSymbolAsync(&calls, g_calls, sizeof calls, 0, cudaMemcpyDeviceToHost, stream);
    run<<<(unsigned)((kRows + 127) / 128), 128, 0, stream>>>((const float*)inputs[0],
                                                            (float*)outputs[0], calls > 3);
    return (int)cudaGetLastError();
}
