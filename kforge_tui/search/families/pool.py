"""adaptive_avg_pool2d families (x as [NC, H, W]).

cuda:
  global_tile  output (1, 1): a block pulls `channels` whole consecutive channels (one contiguous
               run, so 16-byte loads work even when H*W = 49 breaks per-channel alignment) into
               shared memory, then threads/channels sub-warps reduce them.
  global_warp  output (1, 1): `lanes` threads per channel straight from global memory.
  window       any output size: one thread per output element, its window summed in f32.
cpu:
  channels_omp OpenMP over channels, `omp simd` sums.
"""
from __future__ import annotations

from kforge_tui.search.families import Family, register
from kforge_tui.search.families._common import ELEM_BYTES, cpu_head, cuda_head, entry, fill
from kforge_tui.task import Task
from kforge_tui.workload import catalogue

OPS = ("adaptive_avg_pool2d",)


def _s(task: Task) -> dict:
    return catalogue.scalar_args(task)


def _global(task: Task) -> bool:
    s = _s(task)
    return s["OH"] == 1 and s["OW"] == 1


_CUDA_TILE = r"""
template <int THREADS, int K, int VEC>
__global__ void __launch_bounds__(THREADS) kf_pool_tile(const TI* __restrict__ x, TO* __restrict__ y,
                                                       int64_t NC, int64_t hw) {
  extern __shared__ float tile[];
  constexpr int LPC = THREADS / K;  // threads per channel in the reduction
  const float inv = 1.f / (float)hw;
  for (int64_t c0 = (int64_t)blockIdx.x * K; c0 < NC; c0 += (int64_t)gridDim.x * K) {
    const int64_t nch = (NC - c0 < K) ? NC - c0 : K;
    const int64_t cnt = nch * hw;
    const TI* src = x + c0 * hw;
    __syncthreads();
    for (int64_t base = (int64_t)threadIdx.x * VEC; base < cnt; base += (int64_t)THREADS * VEC) {
      if (base + VEC <= cnt) {
        kf_pack<TI, VEC> p = kf_load<TI, VEC>(src + base);
#pragma unroll
        for (int j = 0; j < VEC; ++j) tile[base + j] = kf_f(p.v[j]);
      } else {
        for (int64_t e = base; e < cnt; ++e) tile[e] = kf_f(src[e]);
      }
    }
    __syncthreads();
    const int ch = threadIdx.x / LPC, l = threadIdx.x % LPC;
    float s = 0.f;
    if (ch < nch)
      for (int64_t e = l; e < hw; e += LPC) s += tile[ch * hw + e];
    s = kf_warp_sum(s, LPC);
    if (l == 0 && ch < nch) y[c0 + ch] = kf_to<TO>(s * inv);
  }
}
"""

_CUDA_TILE_LAUNCH = r"""
  if (NC <= 0 || H <= 0 || W <= 0) return 0;
  if (OH != 1 || OW != 1) return -1;
  const int64_t hw = H * W;
  const size_t smem = (size_t)@K@ * hw * sizeof(float);
  if (smem > 48 * 1024) return -1;
  const int64_t blocks = (NC + @K@ - 1) / @K@;
  const unsigned grid = (unsigned)(blocks < 2147483647 ? blocks : 2147483647);
  const bool fast = ((@K@ * hw) % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI));
  if (fast) kf_pool_tile<@THREADS@, @K@, @VEC@><<<grid, @THREADS@, smem, stream>>>(x, y, NC, hw);
  else kf_pool_tile<@THREADS@, @K@, 1><<<grid, @THREADS@, smem, stream>>>(x, y, NC, hw);
  return (int)cudaGetLastError();
"""


def _tile_valid(task: Task, p: dict) -> bool:
    s = _s(task)
    lpc = p["threads"] // p["channels"]
    return (_global(task) and lpc >= 1 and lpc <= 32 and p["channels"] * s["H"] * s["W"] * 4 <= 48 * 1024
            and p["vec"] * ELEM_BYTES[task.dtype] <= 16)


def _tile_default(task: Task) -> dict:
    s = _s(task)
    hw = s["H"] * s["W"]
    vec = 16 // ELEM_BYTES[task.dtype]
    k = 8
    for c in (8, 16, 32, 64, 128):
        if c * hw * 4 <= 16 * 1024 and s["NC"] // c >= 2 * 132:
            k = c
    threads = 256
    while threads // k > 32:
        threads //= 2
    while threads < k:
        threads *= 2
    return {"channels": k, "threads": min(threads, 256), "vec": vec}


def _tile_render(task: Task, p: dict) -> str:
    body = fill(_CUDA_TILE_LAUNCH, K=p["channels"], THREADS=p["threads"], VEC=p["vec"])
    return cuda_head(task) + _CUDA_TILE + entry(task, "cuda", body)


register(Family("global_tile", OPS, "cuda",
                {"channels": (8, 16, 32, 64, 128), "threads": (64, 128, 256, 512), "vec": (1, 2, 4, 8)},
                _tile_default, _tile_valid, _tile_render,
                doc="(1,1) output: contiguous channel tiles via smem, sub-warp per channel"))


_CUDA_GWARP = r"""
template <int WARPS, int LANES>
__global__ void __launch_bounds__(WARPS * 32) kf_pool_warp(const TI* __restrict__ x, TO* __restrict__ y,
                                                          int64_t NC, int64_t hw) {
  constexpr int GROUPS = WARPS * 32 / LANES;
  const int g = threadIdx.x / LANES, l = threadIdx.x % LANES;
  const float inv = 1.f / (float)hw;
  for (int64_t c0 = (int64_t)blockIdx.x * GROUPS; c0 < NC; c0 += (int64_t)gridDim.x * GROUPS) {
    const int64_t c = c0 + g;
    float s = 0.f;
    if (c < NC)
      for (int64_t e = l; e < hw; e += LANES) s += kf_f(x[c * hw + e]);
    s = kf_warp_sum(s, LANES);
    if (l == 0 && c < NC) y[c] = kf_to<TO>(s * inv);
  }
}
"""

_CUDA_GWARP_LAUNCH = r"""
  if (NC <= 0 || H <= 0 || W <= 0) return 0;
  if (OH != 1 || OW != 1) return -1;
  const int64_t groups = @WARPS@ * 32 / @LANES@;
  const int64_t blocks = (NC + groups - 1) / groups;
  const unsigned grid = (unsigned)(blocks < 2147483647 ? blocks : 2147483647);
  kf_pool_warp<@WARPS@, @LANES@><<<grid, @WARPS@ * 32, 0, stream>>>(x, y, NC, H * W);
  return (int)cudaGetLastError();
"""


def _gwarp_default(task: Task) -> dict:
    hw = _s(task)["H"] * _s(task)["W"]
    lanes = 32
    for ln in (32, 16, 8, 4):
        if hw <= ln * 2:
            lanes = ln
    return {"warps": 4, "lanes": lanes}


def _gwarp_render(task: Task, p: dict) -> str:
    body = fill(_CUDA_GWARP_LAUNCH, WARPS=p["warps"], LANES=p["lanes"])
    return cuda_head(task) + _CUDA_GWARP + entry(task, "cuda", body)


register(Family("global_warp", OPS, "cuda", {"warps": (1, 2, 4, 8), "lanes": (4, 8, 16, 32)},
                _gwarp_default, lambda t, p: _global(t), _gwarp_render,
                doc="(1,1) output: `lanes` threads per channel from global memory"))


_CUDA_WINDOW = r"""
template <int THREADS>
__global__ void __launch_bounds__(THREADS) kf_pool_window(const TI* __restrict__ x, TO* __restrict__ y,
    int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  const int64_t total = NC * OH * OW;
  for (int64_t t = (int64_t)blockIdx.x * THREADS + threadIdx.x; t < total; t += (int64_t)gridDim.x * THREADS) {
    const int64_t ow = t % OW, oh = (t / OW) % OH, c = t / (OW * OH);
    const int64_t h0 = (oh * H) / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
    const int64_t w0 = (ow * W) / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
    const TI* xc = x + c * H * W;
    float s = 0.f;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) s += kf_f(xc[h * W + w]);
    y[t] = kf_to<TO>(s / (float)((h1 - h0) * (w1 - w0)));
  }
}
"""

_CUDA_WINDOW_LAUNCH = r"""
  if (NC <= 0 || OH <= 0 || OW <= 0) return 0;
  const int64_t blocks = (NC * OH * OW + @THREADS@ - 1) / @THREADS@;
  const unsigned grid = (unsigned)(blocks < 1048576 ? blocks : 1048576);
  kf_pool_window<@THREADS@><<<grid, @THREADS@, 0, stream>>>(x, y, NC, H, W, OH, OW);
  return (int)cudaGetLastError();
"""


def _window_render(task: Task, p: dict) -> str:
    body = fill(_CUDA_WINDOW_LAUNCH, THREADS=p["threads"])
    return cuda_head(task) + _CUDA_WINDOW + entry(task, "cuda", body)


register(Family("window", OPS, "cuda", {"threads": (64, 128, 256, 512)},
                lambda t: {"threads": 256}, lambda t, p: True, _window_render,
                doc="any output size: one thread per output element"))


_CPU_POOL = r"""
inline int kf_pool(const TI* x, TO* y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  if (NC <= 0 || OH <= 0 || OW <= 0) return 0;
  const int64_t hw = H * W;
  if (OH == 1 && OW == 1) {
    // Channels are contiguous runs of hw (49 at 7x7): whole vectors over the run (unaligned
    // loads, so hw need not be a multiple of KF_W), the rest scalar, one horizontal sum.
    const int64_t nv = hw - hw % KF_W;
#pragma omp parallel for schedule(static, @GRAIN@)
    for (int64_t c = 0; c < NC; ++c) {
      const TI* xc = x + c * hw;
      kf_v acc = kf_vset(0.f);
      for (int64_t e = 0; e < nv; e += KF_W) acc = kf_vadd(acc, kf_vin(xc + e));
      float s = 0.f;
      for (int64_t e = nv; e < hw; ++e) s += kf_in(xc[e]);
      y[c] = kf_out((s + kf_vsum(acc)) / (float)hw);
    }
    return 0;
  }
#pragma omp parallel for schedule(static, @GRAIN@)
  for (int64_t c = 0; c < NC; ++c) {
    const TI* xc = x + c * hw;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const int64_t h0 = (oh * H) / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t w0 = (ow * W) / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
        float s = 0.f;
        for (int64_t h = h0; h < h1; ++h) {
#pragma omp simd reduction(+ : s)
          for (int64_t w = w0; w < w1; ++w) s += kf_in(xc[h * W + w]);
        }
        y[(c * OH + oh) * OW + ow] = kf_out(s / (float)((h1 - h0) * (w1 - w0)));
      }
    }
  }
  return 0;
}
"""


def _cpu_render(task: Task, p: dict) -> str:
    return cpu_head(task) + fill(_CPU_POOL, GRAIN=p["grain"]) + entry(
        task, "cpu", "  return kf_pool(x, y, NC, H, W, OH, OW);")


register(Family("channels_omp", OPS, "cpu", {"grain": (1, 8, 64, 256)},
                lambda t: {"grain": 8}, lambda t, p: True, _cpu_render,
                doc="OpenMP over channels, omp simd window sums"))
