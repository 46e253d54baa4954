// Honest adaptive_avg_pool2d for float32 [NC, H, W] -> [NC, OH, OW]: one warp per output.
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void pool(const float* __restrict__ x, float* __restrict__ y, int64_t NC, int64_t H,
                     int64_t W, int64_t OH, int64_t OW) {
    const int64_t out = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (out >= NC * OH * OW) return;
    const int64_t c = out / (OH * OW), i = (out / OW) % OH, j = out % OW;
    const int64_t h0 = (i * H) / OH, h1 = ((i + 1) * H + OH - 1) / OH;
    const int64_t w0 = (j * W) / OW, w1 = ((j + 1) * W + OW - 1) / OW;
    const int64_t ww = w1 - w0, cnt = (h1 - h0) * ww;
    float s = 0.f;
    for (int64_t k = lane; k < cnt; k += 32) s += x[(c * H + h0 + k / ww) * W + w0 + k % ww];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[out] = s / (float)cnt;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t NC, int64_t H, int64_t W,
                             int64_t OH, int64_t OW, cudaStream_t stream) {
    const int64_t threads = NC * OH * OW * 32;
    pool<<<(unsigned)((threads + 255) / 256), 256, 0, stream>>>(x, y, NC, H, W, OH, OW);
    return (int)cudaGetLastError();
}
