// Honest adaptive_avg_pool2d for float32 [N, C, H, W] -> [N, C, OH, OW]: one warp per output.
#include "kforge_region.h"
constexpr int64_t kNC = KF_IN0_SIZE_0 * KF_IN0_SIZE_1, kH = KF_IN0_SIZE_2, kW = KF_IN0_SIZE_3;
constexpr int64_t kOH = KF_OUT0_SIZE_2, kOW = KF_OUT0_SIZE_3;
__global__ void pool(const float* __restrict__ x, float* __restrict__ y) {
    const int64_t out = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (out >= kNC * kOH * kOW) return;
    const int64_t c = out / (kOH * kOW), i = (out / kOW) % kOH, j = out % kOW;
    const int64_t h0 = (i * kH) / kOH, h1 = ((i + 1) * kH + kOH - 1) / kOH;
    const int64_t w0 = (j * kW) / kOW, w1 = ((j + 1) * kW + kOW - 1) / kOW;
    const int64_t ww = w1 - w0, cnt = (h1 - h0) * ww;
    float s = 0.f;
    for (int64_t k = lane; k < cnt; k += 32) s += x[(c * kH + h0 + k / ww) * kW + w0 + k % ww];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[out] = s / (float)cnt;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
    const int64_t threads = kNC * kOH * kOW * 32;
    pool<<<(unsigned)((threads + 255) / 256), 256, 0, stream>>>((const float*)inputs[0],
                                                                (float*)outputs[0]);
    return (int)cudaGetLastError();
}
