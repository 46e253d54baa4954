"""adaptive_avg_pool2d families (x as [NC, H, W]).

cuda:
  global_tile  output (1, 1), small windows: a block pulls `channels` whole consecutive channels
               (one contiguous run, so 16-byte loads work even when H*W = 49 breaks per-channel
               alignment) into shared memory, then threads/channels sub-warps reduce them.
  global_warp  output (1, 1), tiny windows: `lanes` threads per channel straight from global
               memory, `vec`-element loads when every channel is 16-byte aligned.
  chan_block   output (1, 1), large windows: a block, or a cluster of blocks (sm_90), per channel,
               16-byte loads from the first aligned element of each channel.
  window       any output size: `lanes` threads per output element (1 for small windows).
cpu:
  channels_omp OpenMP over channels, `omp simd` sums.
"""
from __future__ import annotations

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import ELEM_BYTES, cpu_head, cuda_head, entry, fill
from kforge_tui.regions.patterns import OpTask
from kforge_tui.regions import patterns

OPS = ("adaptive_avg_pool2d",)


def _s(task: OpTask) -> dict:
    return patterns.scalar_args(task)


def _global(task: OpTask) -> bool:
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
  if (OH != 1 || OW != 1) {  // not a global pool: one thread per output element
    const int64_t wb = (NC * OH * OW + 255) / 256;
    kf_pool_window<256, 1><<<(unsigned)(wb < 1048576 ? wb : 1048576), 256, 0, stream>>>(x, y, NC, H, W, OH, OW);
    return (int)cudaGetLastError();
  }
  const int64_t hw = H * W;
  const size_t smem = (size_t)@K@ * hw * sizeof(float);
  if (smem > 48 * 1024) {  // windows larger than the tile was sized for: lanes per channel
    const int64_t gb = (NC + 3) / 4;
    kf_pool_warp<4, 32, 1><<<(unsigned)(gb < 2147483647 ? gb : 2147483647), 128, 0, stream>>>(x, y, NC, hw);
    return (int)cudaGetLastError();
  }
  const int64_t blocks = (NC + @K@ - 1) / @K@;
  const unsigned grid = (unsigned)(blocks < 2147483647 ? blocks : 2147483647);
  const bool fast = ((@K@ * hw) % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI));
  if (fast) kf_pool_tile<@THREADS@, @K@, @VEC@><<<grid, @THREADS@, smem, stream>>>(x, y, NC, hw);
  else kf_pool_tile<@THREADS@, @K@, 1><<<grid, @THREADS@, smem, stream>>>(x, y, NC, hw);
  return (int)cudaGetLastError();
"""


def _tile_valid(task: OpTask, p: dict) -> bool:
    s = _s(task)
    lpc = p["threads"] // p["channels"]
    return (_global(task) and lpc >= 1 and lpc <= 32 and p["channels"] * s["H"] * s["W"] * 4 <= 48 * 1024
            and p["vec"] * ELEM_BYTES[task.dtype] <= 16)


def _tile_default(task: OpTask) -> dict:
    """As many whole channels per block as fit 16 KB of tile while leaving >= 2 blocks per SM
    (tiny windows: up to 1024 channels, one thread each); threads = channels x lanes <= 256
    (up to 1024 when there are more channels than that)."""
    s = _s(task)
    hw = s["H"] * s["W"]
    vec = 16 // ELEM_BYTES[task.dtype]
    k = 8
    for c in _TILE_SPACE["channels"]:
        if c * hw * 4 <= 16 * 1024 and s["NC"] // c >= 2 * 132:
            k = c
    threads = 256
    while threads // k > 32:
        threads //= 2
    return {"channels": k, "threads": min(max(threads, k), 1024), "vec": vec}


def _tile_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_TILE_LAUNCH, K=p["channels"], THREADS=p["threads"], VEC=p["vec"])
    return cuda_head(task) + _CUDA_WINDOW + _CUDA_GWARP + _CUDA_TILE + entry(task, "cuda", body)


_TILE_SPACE = {"channels": (8, 16, 32, 64, 128, 256, 512, 1024), "threads": (64, 128, 256, 512, 1024),
               "vec": (1, 2, 4, 8)}
register(Family("global_tile", OPS, "cuda", _TILE_SPACE,
                _tile_default, _tile_valid, _tile_render,
                doc="(1,1) output: contiguous channel tiles via smem, sub-warp per channel"))


_CUDA_GWARP = r"""
// LANES threads per channel straight from global memory, VEC elements a load when every channel
// starts 16-byte aligned (H*W a multiple of VEC; the launcher checks): tiny windows take
// LANES = 1-2 and whole packs, so a warp reads a contiguous run of channels.
template <int WARPS, int LANES, int VEC>
__global__ void __launch_bounds__(WARPS * 32) kf_pool_warp(const TI* __restrict__ x, TO* __restrict__ y,
                                                          int64_t NC, int64_t hw) {
  constexpr int GROUPS = WARPS * 32 / LANES;
  const int g = threadIdx.x / LANES, l = threadIdx.x % LANES;
  const float inv = 1.f / (float)hw;
  for (int64_t c0 = (int64_t)blockIdx.x * GROUPS; c0 < NC; c0 += (int64_t)gridDim.x * GROUPS) {
    const int64_t c = c0 + g;
    float s = 0.f;
    if (c < NC) {
      const TI* xc = x + c * hw;
      for (int64_t e = (int64_t)l * VEC; e < hw; e += (int64_t)LANES * VEC) {
        if constexpr (VEC > 1) {
          const kf_pack<TI, VEC> p = kf_load<TI, VEC>(xc + e);
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += kf_f(p.v[j]);
        } else {
          s += kf_f(xc[e]);
        }
      }
    }
    if constexpr (LANES > 1) s = kf_warp_sum(s, LANES);
    if (l == 0 && c < NC) y[c] = kf_to<TO>(s * inv);
  }
}
"""

_CUDA_GWARP_LAUNCH = r"""
  if (NC <= 0 || H <= 0 || W <= 0) return 0;
  if (OH != 1 || OW != 1) {  // not a global pool: one thread per output element
    const int64_t wb = (NC * OH * OW + 255) / 256;
    kf_pool_window<256, 1><<<(unsigned)(wb < 1048576 ? wb : 1048576), 256, 0, stream>>>(x, y, NC, H, W, OH, OW);
    return (int)cudaGetLastError();
  }
  const int64_t groups = @WARPS@ * 32 / @LANES@;
  const int64_t blocks = (NC + groups - 1) / groups;
  const unsigned grid = (unsigned)(blocks < 2147483647 ? blocks : 2147483647);
  if ((H * W) % @VEC@ == 0 && kf_aligned(x, @VEC@ * sizeof(TI)))
    kf_pool_warp<@WARPS@, @LANES@, @VEC@><<<grid, @WARPS@ * 32, 0, stream>>>(x, y, NC, H * W);
  else
    kf_pool_warp<@WARPS@, @LANES@, 1><<<grid, @WARPS@ * 32, 0, stream>>>(x, y, NC, H * W);
  return (int)cudaGetLastError();
"""


def _gwarp_default(task: OpTask) -> dict:
    """16-byte loads when H*W allows them; the fewest lanes (1..32) that give each at most two
    loads of its channel."""
    hw = _s(task)["H"] * _s(task)["W"]
    vec = 16 // ELEM_BYTES[task.dtype]
    while vec > 1 and hw % vec:
        vec //= 2
    lanes = 32
    for ln in (32, 16, 8, 4, 2, 1):
        if hw <= ln * vec * 2:
            lanes = ln
    return {"warps": 4, "lanes": lanes, "vec": vec}


def _gwarp_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_GWARP_LAUNCH, WARPS=p["warps"], LANES=p["lanes"], VEC=p.get("vec", 1))
    return cuda_head(task) + _CUDA_WINDOW + _CUDA_GWARP + entry(task, "cuda", body)


register(Family("global_warp", OPS, "cuda",
                {"warps": (1, 2, 4, 8), "lanes": (1, 2, 4, 8, 16, 32), "vec": (1, 2, 4, 8)},
                _gwarp_default, lambda t, p: _global(t) and p["vec"] * ELEM_BYTES[t.dtype] <= 16, _gwarp_render,
                doc="(1,1) output: `lanes` threads per channel from global memory, `vec`-element loads "
                    "when channels are 16-byte aligned (tiny windows: 1-2 lanes a channel)"))


_CUDA_CHAN = r"""
#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// A block (or a cluster of CL blocks, sm_90) per channel, for large windows: 16-byte loads from
// the first aligned element of the channel (the head before it and the tail after the last
// whole pack are summed element by element), so any H*W works; cluster partials are summed
// through distributed shared memory by rank 0. Grid-stride over channels.
template <int THREADS, int VEC, int UNROLL>
__global__ void __launch_bounds__(THREADS) kf_pool_chan(const TI* __restrict__ x, TO* __restrict__ y,
                                                       int64_t NC, int64_t hw, float inv) {
  constexpr int NW = THREADS / 32;
  __shared__ float sh[32];
  __shared__ float part;
  kf_cg::cluster_group cl = kf_cg::this_cluster();
  const int64_t csize = (int64_t)cl.num_blocks(), rank = (int64_t)cl.block_rank();
  const int64_t per = (hw + csize - 1) / csize;
  for (int64_t ch = blockIdx.x / csize; ch < NC; ch += gridDim.x / csize) {
    const int64_t lo = rank * per < hw ? rank * per : hw, hi = (lo + per < hw) ? lo + per : hw;
    const TI* p0 = x + ch * hw + lo;
    const int64_t len = hi - lo;
    float s = 0.f;
    int64_t head = 0, nv = 0;
    if constexpr (VEC > 1) {
      constexpr uintptr_t AL = VEC * sizeof(TI);
      head = (int64_t)(((AL - ((uintptr_t)p0 % AL)) % AL) / sizeof(TI));
      if (head > len) head = len;
      nv = (len - head) / VEC;
      const TI* pv = p0 + head;
      int64_t i = threadIdx.x;
      for (; i + (UNROLL - 1) * THREADS < nv; i += (int64_t)UNROLL * THREADS) {
        kf_pack<TI, VEC> q[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) q[u] = kf_load<TI, VEC>(pv + (i + (int64_t)u * THREADS) * VEC);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += kf_f(q[u].v[j]);
        }
      }
      for (; i < nv; i += THREADS) {
        const kf_pack<TI, VEC> q = kf_load<TI, VEC>(pv + i * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += kf_f(q.v[j]);
      }
      if (threadIdx.x < head) s += kf_f(p0[threadIdx.x]);
    }
    for (int64_t e = head + nv * VEC + threadIdx.x; e < len; e += THREADS) s += kf_f(p0[e]);
    s = kf_block_sum<NW>(s, sh);
    if (csize > 1) {
      if (threadIdx.x == 0) part = s;
      cl.sync();
      if (rank == 0 && threadIdx.x == 0) {
        float t = 0.f;
        for (int r = 0; r < csize; ++r) t += *cl.map_shared_rank(&part, r);
        y[ch] = kf_to<TO>(t * inv);
      }
      cl.sync();  // peers keep their shared memory until rank 0 has read it
    } else if (threadIdx.x == 0) {
      y[ch] = kf_to<TO>(s * inv);
    }
  }
}
"""

_CUDA_CHAN_LAUNCH = r"""
  if (NC <= 0 || H <= 0 || W <= 0) return 0;
  if (OH != 1 || OW != 1) {  // not a global pool: one thread per output element
    const int64_t wb = (NC * OH * OW + 255) / 256;
    kf_pool_window<256, 1><<<(unsigned)(wb < 1048576 ? wb : 1048576), 256, 0, stream>>>(x, y, NC, H, W, OH, OW);
    return (int)cudaGetLastError();
  }
  const int64_t hw = H * W, CL = @CLUSTER@;
  const float inv = 1.f / (float)hw;
  const int64_t cmax = (int64_t)1 << 20;  // clusters per launch; the kernel strides over the rest
  const int64_t chans = NC < cmax ? NC : cmax;
  if (CL > 1) {
    const int rc = kf_launch_cluster(kf_pool_chan<@THREADS@, @VEC@, @UNROLL@>, chans * CL, @THREADS@, (int)CL,
                                     (size_t)0, stream, x, y, NC, hw, inv);
    return rc ? rc : (int)cudaGetLastError();
  }
  kf_pool_chan<@THREADS@, @VEC@, @UNROLL@><<<(unsigned)chans, @THREADS@, 0, stream>>>(x, y, NC, hw, inv);
  return (int)cudaGetLastError();
"""


def _chan_default(task: OpTask) -> dict:
    """Threads so each has about 4 packs of its window (128..1024); a cluster splitting each
    channel when there are fewer channels than SMs and each CTA still gets >= 4 packs a thread."""
    s = _s(task)
    hw, nc = s["H"] * s["W"], s["NC"]
    vec = 16 // ELEM_BYTES[task.dtype]
    threads = 128
    for t in (128, 256, 512, 1024):
        if hw >= t * vec * 4:
            threads = t
    cl = 1
    for c in (2, 4, 8, 16):
        if nc * c <= 2 * 132 and hw // c >= threads * vec * 4:
            cl = c
    unroll = 2 if hw >= threads * vec * 2 else 1
    if cl >= 8:  # 8- and 16-CTA clusters of 1024 threads do not all fit at once (bench/probe_clusters.py)
        threads, unroll = 512, 4
    return {"threads": threads, "vec": vec, "unroll": unroll, "cluster": cl}


def _chan_valid(task: OpTask, p: dict) -> bool:
    s = _s(task)
    return _global(task) and p["vec"] * ELEM_BYTES[task.dtype] <= 16 and s["H"] * s["W"] >= 64


def _chan_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_CHAN_LAUNCH, THREADS=p["threads"], VEC=p["vec"], UNROLL=p["unroll"], CLUSTER=p["cluster"])
    return cuda_head(task) + _CUDA_WINDOW + _CUDA_CHAN + entry(task, "cuda", body)


register(Family("chan_block", OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8), "unroll": (1, 2, 4),
                 "cluster": (1, 2, 4, 8, 16)},
                _chan_default, _chan_valid, _chan_render,
                doc="(1,1) output, large windows: a block (or a `cluster` of blocks) per channel, 16-byte "
                    "loads from the first aligned element, DSMEM sum of the cluster's partials"))


_CUDA_WINDOW = r"""
// LANES threads per output element (1: a thread each; more: the lanes split each window row,
// reading it coalesced, for large windows); the loop bound is uniform per block so the lane
// shuffles always have the whole warp.
template <int THREADS, int LANES>
__global__ void __launch_bounds__(THREADS) kf_pool_window(const TI* __restrict__ x, TO* __restrict__ y,
    int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  constexpr int GROUPS = THREADS / LANES;
  const int g = threadIdx.x / LANES, lane = threadIdx.x % LANES;
  const int64_t total = NC * OH * OW;
  for (int64_t t0 = (int64_t)blockIdx.x * GROUPS; t0 < total; t0 += (int64_t)gridDim.x * GROUPS) {
    const int64_t t = t0 + g;
    const bool live = t < total;
    const int64_t tt = live ? t : 0;
    const int64_t ow = tt % OW, oh = (tt / OW) % OH, c = tt / (OW * OH);
    const int64_t h0 = (oh * H) / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
    const int64_t w0 = (ow * W) / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
    const TI* xc = x + c * H * W;
    float s = 0.f;
    if (live)
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0 + lane; w < w1; w += LANES) s += kf_f(xc[h * W + w]);
    if constexpr (LANES > 1) s = kf_warp_sum(s, LANES);
    if (live && lane == 0) y[t] = kf_to<TO>(s / (float)((h1 - h0) * (w1 - w0)));
  }
}
"""

_CUDA_WINDOW_LAUNCH = r"""
  if (NC <= 0 || OH <= 0 || OW <= 0) return 0;
  const int64_t groups = @THREADS@ / @LANES@;
  const int64_t blocks = (NC * OH * OW + groups - 1) / groups;
  const unsigned grid = (unsigned)(blocks < 1048576 ? blocks : 1048576);
  kf_pool_window<@THREADS@, @LANES@><<<grid, @THREADS@, 0, stream>>>(x, y, NC, H, W, OH, OW);
  return (int)cudaGetLastError();
"""


def _window_default(task: OpTask) -> dict:
    """A thread per output for small windows; lanes splitting each window row for wide ones."""
    s = _s(task)
    ww = -(-s["W"] // s["OW"])  # widest window row
    lanes = 1
    for ln in (4, 8, 32):
        if ww >= 2 * ln:
            lanes = ln
    return {"threads": 256, "lanes": lanes}


def _window_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_WINDOW_LAUNCH, THREADS=p["threads"], LANES=p.get("lanes", 1))
    return cuda_head(task) + _CUDA_WINDOW + entry(task, "cuda", body)


register(Family("window", OPS, "cuda", {"threads": (64, 128, 256, 512), "lanes": (1, 4, 8, 32)},
                _window_default, lambda t, p: True, _window_render,
                doc="any output size: `lanes` threads per output element (1 for small windows)"))


_CPU_POOL = r"""
inline int kf_pool(const TI* x, TO* y, int64_t NC, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  if (NC <= 0 || OH <= 0 || OW <= 0) return 0;
  const int64_t hw = H * W;
  if (OH == 1 && OW == 1) {
    // Channels are contiguous runs of hw (49 at 7x7): whole vectors over the run (unaligned
    // loads, so hw need not be a multiple of SIMD_W), the rest scalar, one horizontal sum.
    const int64_t nv = hw - hw % SIMD_W;
#pragma omp parallel for schedule(static, @GRAIN@) if(NC > 1 && NC * hw >= kf_omp_min_work)
    for (int64_t c = 0; c < NC; ++c) {
      const TI* xc = x + c * hw;
      kf_v acc = kf_vset(0.f);
      for (int64_t e = 0; e < nv; e += SIMD_W) acc = kf_vadd(acc, kf_vin(xc + e));
      float s = 0.f;
      for (int64_t e = nv; e < hw; ++e) s += kf_in(xc[e]);
      y[c] = kf_out((s + kf_vsum(acc)) / (float)hw);
    }
    return 0;
  }
#pragma omp parallel for schedule(static, @GRAIN@) if(NC > 1 && NC * hw >= kf_omp_min_work)
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


def _cpu_render(task: OpTask, p: dict) -> str:
    return cpu_head(task) + fill(_CPU_POOL, GRAIN=p["grain"]) + entry(
        task, "cpu", "  return kf_pool(x, y, NC, H, W, OH, OW);")


register(Family("channels_omp", OPS, "cpu", {"grain": (1, 8, 64, 256)},
                lambda t: {"grain": 8}, lambda t, p: True, _cpu_render,
                doc="OpenMP over channels, omp simd window sums"))
