"""softmax / log_softmax families (x viewed as [outer, n, inner], reduce over n).

cuda:
  block_row  one block per row; the row is cached in registers when it fits (read once), else
             re-read with a single-pass online (max, sum) or a two-pass max-then-sum.
  warp_row   `lanes` threads per row (a warp or part of one), row in registers, shuffles only:
             no barriers, for short rows (n <= 64 * lanes).
  split_row  several blocks per row for very long rows with few rows (a 262144-wide logits row
             on one SM would leave 131 idle): partial (max, sum) per chunk into stream-ordered
             scratch, then a second kernel combines them and writes (the chunk re-read hits L2).
  cols       inner > 1 (softmax over a non-last dim): one thread per (outer, inner) column,
             coalesced across inner.
cpu:
  rows_omp   OpenMP over rows, `omp simd` inner loops with a polynomial exp that vectorises.
"""
from __future__ import annotations

from kforge_tui.search.families import Family, register
from kforge_tui.search.families._common import (ELEM_BYTES, cdiv, cpu_head, cuda_head, entry, fill,
                                                pow2_at_most)
from kforge_tui.task import Task
from kforge_tui.workload import catalogue

OPS = ("softmax", "log_softmax")
MAX_REG_VALUES = 64  # floats a thread may cache before spills cost more than a re-read


def _dims(task: Task) -> tuple[int, int, int]:
    s = catalogue.scalar_args(task)
    return s["outer"], s["n"], s["inner"]


def _log(task: Task) -> str:
    return "true" if task.op == "log_softmax" else "false"


def _vec16(task: Task) -> int:
    return 16 // ELEM_BYTES[task.dtype]


def _row_vec(task: Task, n: int) -> int:
    """The widest pack (at most 16 bytes) that divides a row of n elements."""
    vec = _vec16(task)
    while vec > 1 and n % vec:
        vec //= 2
    return vec


_CUDA_SOFTMAX_COMMON = r"""
__device__ __forceinline__ float kf_exp(float v) { return expf(v); }
// Second half of every row softmax: y = exp(x - m) / s (or x - m - log s) over [lo, hi).
template <int VEC, bool LOG>
__device__ __forceinline__ void kf_softmax_write(const TI* xr, TO* yr, int64_t lo, int64_t hi,
                                                 int64_t step, float m, float inv, float ls) {
  for (int64_t bs = lo + (int64_t)threadIdx.x * VEC; bs < hi; bs += step) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + bs);
    kf_pack<TO, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = kf_f(p.v[j]) - m;
      o.v[j] = kf_to<TO>(LOG ? d - ls : kf_exp(d) * inv);
    }
    kf_store<TO, VEC>(yr + bs, o);
  }
}
"""

_CUDA_BLOCK = r"""

template <int THREADS, int VEC, int ITEMS, bool ONLINE, bool LOG>
__global__ void __launch_bounds__(THREADS) kf_softmax_block(const TI* __restrict__ x, TO* __restrict__ y,
                                                           int64_t rows, int64_t n) {
  __shared__ float sh[32];
  constexpr int NW = THREADS / 32;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const TI* xr = x + row * n;
    TO* yr = y + row * n;
    float m = -INFINITY, s = 0.f;
    if constexpr (ITEMS > 0) {
      float v[ITEMS * VEC];
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int64_t base = ((int64_t)it * THREADS + threadIdx.x) * VEC;
        if (base < n) {
          kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
#pragma unroll
          for (int j = 0; j < VEC; ++j) { v[it * VEC + j] = kf_f(p.v[j]); m = fmaxf(m, v[it * VEC + j]); }
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) v[it * VEC + j] = -INFINITY;
        }
      }
      m = kf_block_max<NW>(m, sh);
#pragma unroll
      for (int k = 0; k < ITEMS * VEC; ++k) { const float e = kf_exp(v[k] - m); s += e; if (!LOG) v[k] = e; }
      s = kf_block_sum<NW>(s, sh);
      const float inv = 1.f / s, ls = logf(s);
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int64_t base = ((int64_t)it * THREADS + threadIdx.x) * VEC;
        if (base < n) {
          kf_pack<TO, VEC> o;
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(LOG ? v[it * VEC + j] - m - ls : v[it * VEC + j] * inv);
          kf_store<TO, VEC>(yr + base, o);
        }
      }
    } else {
      for (int64_t base = (int64_t)threadIdx.x * VEC; base < n; base += (int64_t)THREADS * VEC) {
        kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
        if constexpr (ONLINE) {
          float pm = m;
#pragma unroll
          for (int j = 0; j < VEC; ++j) pm = fmaxf(pm, kf_f(p.v[j]));
          if (pm != m) { s *= kf_exp(m - pm); m = pm; }
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p.v[j]) - m);
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) m = fmaxf(m, kf_f(p.v[j]));
        }
      }
      if constexpr (ONLINE) {
        const float M = kf_block_max<NW>(m, sh);
        s = (m == M) ? s : s * kf_exp(m - M);
        m = M;
        s = kf_block_sum<NW>(s, sh);
      } else {
        m = kf_block_max<NW>(m, sh);
        for (int64_t base = (int64_t)threadIdx.x * VEC; base < n; base += (int64_t)THREADS * VEC) {
          kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p.v[j]) - m);
        }
        s = kf_block_sum<NW>(s, sh);
      }
      const float inv = 1.f / s, ls = logf(s);
      kf_softmax_write<VEC, LOG>(xr, yr, 0, n, (int64_t)THREADS * VEC, m, inv, ls);
    }
  }
}
"""

_CUDA_BLOCK_LAUNCH = r"""
  if (outer <= 0 || n <= 0) return 0;
  if (inner != 1) return -1;
  const unsigned grid = (unsigned)(outer < 2147483647 ? outer : 2147483647);
  const bool fast = (n % @VEC@ == 0) && n <= (int64_t)@CAP@ && kf_aligned(x, @VEC@ * sizeof(TI)) &&
                    kf_aligned(y, @VEC@ * sizeof(TO));
  if (fast) kf_softmax_block<@THREADS@, @VEC@, @ITEMS@, @ONLINE@, @LOG@><<<grid, @THREADS@, 0, stream>>>(x, y, outer, n);
  else kf_softmax_block<@THREADS@, 1, 0, true, @LOG@><<<grid, @THREADS@, 0, stream>>>(x, y, outer, n);
  return (int)cudaGetLastError();
"""


def _block_items(task, p) -> int:
    _, n, _ = _dims(task)
    return cdiv(n, p["threads"] * p["vec"]) if p["cache"] == "regs" else 0


def _block_default(task: Task) -> dict:
    outer, n, _ = _dims(task)
    vec = pow2_at_most(max(1, n // 32), (1, 2, 4, 8)) if n % _vec16(task) else _vec16(task)
    while n % vec:
        vec //= 2
    threads = 128
    for t in (128, 256, 512, 1024):
        if n >= t * vec * 2:
            threads = t
    p = {"threads": threads, "vec": vec, "mode": "online", "cache": "regs"}
    if not _block_valid(task, p):
        p["cache"] = "none"
    return p


def _block_valid(task: Task, p: dict) -> bool:
    outer, n, inner = _dims(task)
    if inner != 1 or n % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    if p["cache"] == "regs":
        return _block_items(task, p) * p["vec"] <= MAX_REG_VALUES and p["mode"] == "online"
    return True


def _block_render(task: Task, p: dict) -> str:
    items = _block_items(task, p)
    body = fill(_CUDA_BLOCK_LAUNCH, VEC=p["vec"], THREADS=p["threads"], ITEMS=items,
                CAP=(items * p["threads"] * p["vec"]) if items else "INT64_MAX",
                ONLINE="true" if p["mode"] == "online" else "false", LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_BLOCK + entry(task, "cuda", body)


register(Family("block_row", OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "mode": ("two_pass", "online"), "cache": ("none", "regs")},
                _block_default, _block_valid, _block_render,
                doc="one block per row, row in registers when it fits"))


_CUDA_WARP = r"""

template <int WARPS, int LANES, int VEC, int ITEMS, bool LOG>
__global__ void __launch_bounds__(WARPS * 32) kf_softmax_warp(const TI* __restrict__ x, TO* __restrict__ y,
                                                             int64_t rows, int64_t n) {
  constexpr int GROUPS = WARPS * 32 / LANES;
  const int g = threadIdx.x / LANES, lane = threadIdx.x % LANES;
  for (int64_t row0 = (int64_t)blockIdx.x * GROUPS; row0 < rows; row0 += (int64_t)gridDim.x * GROUPS) {
    const int64_t row = row0 + g;
    const bool live = row < rows;
    const TI* xr = x + (live ? row : 0) * n;
    float v[ITEMS * VEC];
    float m = -INFINITY, s = 0.f;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int64_t base = ((int64_t)it * LANES + lane) * VEC;
      if (live && base < n) {
        kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
#pragma unroll
        for (int j = 0; j < VEC; ++j) { v[it * VEC + j] = kf_f(p.v[j]); m = fmaxf(m, v[it * VEC + j]); }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[it * VEC + j] = -INFINITY;
      }
    }
    m = kf_warp_max(m, LANES);
#pragma unroll
    for (int k = 0; k < ITEMS * VEC; ++k) { const float e = kf_exp(v[k] - m); s += e; if (!LOG) v[k] = e; }
    s = kf_warp_sum(s, LANES);
    const float inv = 1.f / s, ls = logf(s);
    if (live) {
      TO* yr = y + row * n;
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int64_t base = ((int64_t)it * LANES + lane) * VEC;
        if (base < n) {
          kf_pack<TO, VEC> o;
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(LOG ? v[it * VEC + j] - m - ls : v[it * VEC + j] * inv);
          kf_store<TO, VEC>(yr + base, o);
        }
      }
    }
  }
}
"""

_CUDA_WARP_LAUNCH = r"""
  if (outer <= 0 || n <= 0) return 0;
  if (inner != 1 || n > (int64_t)@CAP@) return -1;
  const int64_t groups = (int64_t)@WARPS@ * 32 / @LANES@;
  const int64_t blocks = (outer + groups - 1) / groups;
  const unsigned grid = (unsigned)(blocks < 2147483647 ? blocks : 2147483647);
  const bool fast = (n % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO));
  if (fast) kf_softmax_warp<@WARPS@, @LANES@, @VEC@, @ITEMS@, @LOG@><<<grid, @WARPS@ * 32, 0, stream>>>(x, y, outer, n);
  else kf_softmax_warp<@WARPS@, @LANES@, 1, @ITEMS1@, @LOG@><<<grid, @WARPS@ * 32, 0, stream>>>(x, y, outer, n);
  return (int)cudaGetLastError();
"""


def _warp_default(task: Task) -> dict:
    _, n, _ = _dims(task)
    vec = _row_vec(task, n)
    lanes = 32
    for ln in (32, 16, 8, 4):
        if n <= ln * vec * 2:
            lanes = ln
    return {"warps": 4, "lanes": lanes, "vec": vec}


def _warp_valid(task: Task, p: dict) -> bool:
    _, n, inner = _dims(task)
    if inner != 1 or n % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    return cdiv(n, p["lanes"] * p["vec"]) * p["vec"] <= MAX_REG_VALUES


def _warp_render(task: Task, p: dict) -> str:
    _, n, _ = _dims(task)
    items = cdiv(n, p["lanes"] * p["vec"])
    body = fill(_CUDA_WARP_LAUNCH, WARPS=p["warps"], LANES=p["lanes"], VEC=p["vec"], ITEMS=items,
                ITEMS1=cdiv(n, p["lanes"]), CAP=items * p["lanes"] * p["vec"], LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_WARP + entry(task, "cuda", body)


register(Family("warp_row", OPS, "cuda",
                {"warps": (1, 2, 4, 8, 16), "lanes": (4, 8, 16, 32), "vec": (1, 2, 4, 8, 16)},
                _warp_default, _warp_valid, _warp_render,
                doc="a warp (or `lanes` threads) per row, row in registers, no barriers"))


_CUDA_SPLIT = r"""

// Phase 1: block (c, row) reduces chunk c of its row to an online (max, sum) pair.
template <int THREADS, int VEC>
__global__ void __launch_bounds__(THREADS) kf_softmax_part(const TI* __restrict__ x, float* __restrict__ part,
                                                          int64_t n, int64_t chunk) {
  __shared__ float sh[32];
  constexpr int NW = THREADS / 32;
  const int64_t row = blockIdx.y, lo = (int64_t)blockIdx.x * chunk;
  const int64_t hi = (lo + chunk < n) ? lo + chunk : n;
  const TI* xr = x + row * n;
  float m = -INFINITY, s = 0.f;
  for (int64_t base = lo + (int64_t)threadIdx.x * VEC; base < hi; base += (int64_t)THREADS * VEC) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
    float pm = m;
#pragma unroll
    for (int j = 0; j < VEC; ++j) pm = fmaxf(pm, kf_f(p.v[j]));
    if (pm != m) { s *= kf_exp(m - pm); m = pm; }
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p.v[j]) - m);
  }
  const float M = kf_block_max<NW>(m, sh);
  s = (m == M) ? s : s * kf_exp(m - M);
  s = kf_block_sum<NW>(s, sh);
  if (threadIdx.x == 0) {
    part[(row * gridDim.x + blockIdx.x) * 2] = M;
    part[(row * gridDim.x + blockIdx.x) * 2 + 1] = s;
  }
}

// Phase 2: every block combines its row's pairs (few), then normalises its own chunk.
template <int THREADS, int VEC, bool LOG>
__global__ void __launch_bounds__(THREADS) kf_softmax_apply(const TI* __restrict__ x, TO* __restrict__ y,
                                                           const float* __restrict__ part, int64_t n, int64_t chunk) {
  __shared__ float sh[32];
  constexpr int NW = THREADS / 32;
  const int64_t row = blockIdx.y, lo = (int64_t)blockIdx.x * chunk;
  const int64_t hi = (lo + chunk < n) ? lo + chunk : n;
  const int C = gridDim.x;
  const float* pr = part + row * C * 2;
  float m = -INFINITY;
  for (int k = threadIdx.x; k < C; k += THREADS) m = fmaxf(m, pr[2 * k]);
  m = kf_block_max<NW>(m, sh);
  float s = 0.f;
  for (int k = threadIdx.x; k < C; k += THREADS) s += (pr[2 * k] == m) ? pr[2 * k + 1] : pr[2 * k + 1] * kf_exp(pr[2 * k] - m);
  s = kf_block_sum<NW>(s, sh);
  const float inv = 1.f / s, ls = logf(s);
  const TI* xr = x + row * n;
  TO* yr = y + row * n;
  kf_softmax_write<VEC, LOG>(xr, yr, lo, hi, (int64_t)THREADS * VEC, m, inv, ls);
}
"""

_CUDA_SPLIT_LAUNCH = r"""
  if (outer <= 0 || n <= 0) return 0;
  if (inner != 1 || outer > 65535) return -1;
  const int64_t C = @CHUNKS@;
  float* part = nullptr;
  cudaError_t err = cudaMallocAsync((void**)&part, (size_t)(outer * C * 2) * sizeof(float), stream);
  if (err != cudaSuccess) return (int)err;
  const dim3 grid((unsigned)C, (unsigned)outer);
  const bool fast = (n % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO));
  if (fast) {
    const int64_t chunk = ((n + C - 1) / C + @VEC@ - 1) / @VEC@ * @VEC@;
    kf_softmax_part<@THREADS@, @VEC@><<<grid, @THREADS@, 0, stream>>>(x, part, n, chunk);
    kf_softmax_apply<@THREADS@, @VEC@, @LOG@><<<grid, @THREADS@, 0, stream>>>(x, y, part, n, chunk);
  } else {
    const int64_t chunk = (n + C - 1) / C;
    kf_softmax_part<@THREADS@, 1><<<grid, @THREADS@, 0, stream>>>(x, part, n, chunk);
    kf_softmax_apply<@THREADS@, 1, @LOG@><<<grid, @THREADS@, 0, stream>>>(x, y, part, n, chunk);
  }
  cudaFreeAsync(part, stream);
  return (int)cudaGetLastError();
"""


def _split_default(task: Task) -> dict:
    outer, n, _ = _dims(task)
    vec = _row_vec(task, n)
    chunks = 2
    for c in (2, 4, 8, 16, 32, 64, 128):
        if outer * c <= 4 * 132 and n // c >= 512 * vec:
            chunks = c
    return {"threads": 512 if n // chunks >= 512 * vec * 2 else 256, "vec": vec, "chunks": chunks}


def _split_valid(task: Task, p: dict) -> bool:
    outer, n, inner = _dims(task)
    return (inner == 1 and outer <= 65535 and n % p["vec"] == 0 and n >= 4096
            and p["vec"] * ELEM_BYTES[task.dtype] <= 32 and n // p["chunks"] >= p["threads"])


def _split_render(task: Task, p: dict) -> str:
    body = fill(_CUDA_SPLIT_LAUNCH, CHUNKS=p["chunks"], VEC=p["vec"], THREADS=p["threads"], LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_SPLIT + entry(task, "cuda", body)


register(Family("split_row", OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "chunks": (2, 4, 8, 16, 32, 64, 128)},
                _split_default, _split_valid, _split_render,
                doc="several blocks per long row, partial (max, sum) then combine-and-write"))


_CUDA_CLUSTER = r"""
#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// Online (max, sum) merge: the pair with the larger max keeps its sum, the other is rescaled.
__device__ __forceinline__ void kf_ms_merge(float& m, float& s, float om, float os) {
  const float M = fmaxf(m, om);
  s = (m == M ? s : s * kf_exp(m - M)) + (om == M ? os : os * kf_exp(om - M));
  m = M;
}

// One thread-block cluster per row (sm_90): rank r reduces chunk r to an online (max, sum), the
// cluster merges the pairs through distributed shared memory, and every CTA writes its chunk,
// re-reading what it just read (L1/L2-resident). One launch, no scratch allocation.
template <int THREADS, int VEC, int UNROLL, bool LOG>
__global__ void __launch_bounds__(THREADS) kf_softmax_cluster(const TI* __restrict__ x, TO* __restrict__ y,
                                                             int64_t n, int64_t chunk) {
  constexpr int NW = THREADS / 32;
  __shared__ float2 sh[NW];
  __shared__ float2 part;
  kf_cg::cluster_group cl = kf_cg::this_cluster();
  const int csize = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int64_t row = blockIdx.x / csize;
  const int64_t lo = (int64_t)rank * chunk, hi = (lo + chunk < n) ? lo + chunk : n;
  const TI* xr = x + row * n;
  float m = -INFINITY, s = 0.f;
  constexpr int64_t STEP = (int64_t)THREADS * VEC;
  int64_t base = lo + (int64_t)threadIdx.x * VEC;
  for (; base + (UNROLL - 1) * STEP < hi; base += UNROLL * STEP) {
    kf_pack<TI, VEC> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) p[u] = kf_load<TI, VEC>(xr + base + u * STEP);
    float pm = m;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) pm = fmaxf(pm, kf_f(p[u].v[j]));
    }
    if (pm != m) { s *= kf_exp(m - pm); m = pm; }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p[u].v[j]) - m);
    }
  }
  for (; base < hi; base += STEP) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
    float pm = m;
#pragma unroll
    for (int j = 0; j < VEC; ++j) pm = fmaxf(pm, kf_f(p.v[j]));
    if (pm != m) { s *= kf_exp(m - pm); m = pm; }
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p.v[j]) - m);
  }
  for (int o = 16; o > 0; o >>= 1) kf_ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_float2(m, s);
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 t = sh[0];
    for (int k = 1; k < NW; ++k) kf_ms_merge(t.x, t.y, sh[k].x, sh[k].y);
    part = t;
  }
  cl.sync();  // every CTA's pair is visible cluster-wide
  m = -INFINITY;
  s = 0.f;
  if ((int)(threadIdx.x & 31) < csize) {
    const float2 o = *cl.map_shared_rank(&part, threadIdx.x & 31);
    m = o.x;
    s = o.y;
  }
  for (int o = 16; o > 0; o >>= 1) kf_ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  cl.sync();  // no CTA leaves (freeing its shared memory) while a peer may still read it
  const float inv = 1.f / s, ls = logf(s);
  TO* yr = y + row * n;
  kf_softmax_write<VEC, LOG>(xr, yr, lo, hi, STEP, m, inv, ls);
}

template <int THREADS, int VEC, int UNROLL, bool LOG>
inline int kf_softmax_cluster_launch(const TI* x, TO* y, int64_t rows, int64_t n, int64_t chunk, int cl,
                                     cudaStream_t stream) {
  return kf_launch_cluster(kf_softmax_cluster<THREADS, VEC, UNROLL, LOG>, rows * cl, THREADS, cl, 0, stream,
                           x, y, n, chunk);
}
"""

_CUDA_CLUSTER_LAUNCH = r"""
  if (outer <= 0 || n <= 0) return 0;
  const int64_t CL = @CLUSTER@;
  if (inner != 1 || outer * CL > 2147483647) return -1;
  int rc;
  if ((n % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO))) {
    const int64_t chunk = ((n + CL - 1) / CL + @VEC@ - 1) / @VEC@ * @VEC@;
    rc = kf_softmax_cluster_launch<@THREADS@, @VEC@, @UNROLL@, @LOG@>(x, y, outer, n, chunk, (int)CL, stream);
  } else {
    const int64_t chunk = (n + CL - 1) / CL;
    rc = kf_softmax_cluster_launch<@THREADS@, 1, 1, @LOG@>(x, y, outer, n, chunk, (int)CL, stream);
  }
  return rc ? rc : (int)cudaGetLastError();
"""


def _cluster_default(task: Task) -> dict:
    """Split each row over a cluster so that rows x cluster gives about one CTA per SM (132)."""
    outer, n, _ = _dims(task)
    vec = _row_vec(task, n)
    cl = 2
    for c in (4, 8, 16):
        if outer * c <= 132 and n // c >= 1024 * vec:
            cl = c
    return {"cluster": cl, "threads": 1024 if n // cl >= 1024 * vec * 4 else 512, "vec": vec, "unroll": 2}


def _cluster_valid(task: Task, p: dict) -> bool:
    outer, n, inner = _dims(task)
    return (inner == 1 and n % p["vec"] == 0 and n >= 4096 and p["vec"] * ELEM_BYTES[task.dtype] <= 16
            and n // p["cluster"] >= p["threads"] * p["vec"] and outer * p["cluster"] < 2**31)


def _cluster_render(task: Task, p: dict) -> str:
    body = fill(_CUDA_CLUSTER_LAUNCH, CLUSTER=p["cluster"], VEC=p["vec"], THREADS=p["threads"],
                UNROLL=p["unroll"], LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_CLUSTER + entry(task, "cuda", body)


register(Family("cluster_row", OPS, "cuda",
                {"cluster": (2, 4, 8, 16), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8),
                 "unroll": (1, 2, 4)},
                _cluster_default, _cluster_valid, _cluster_render,
                doc="sm_90 thread-block cluster per long row: DSMEM (max, sum) merge, one launch"))


_CUDA_COLS = r"""

template <int THREADS, bool LOG>
__global__ void __launch_bounds__(THREADS) kf_softmax_cols(const TI* __restrict__ x, TO* __restrict__ y,
                                                          int64_t outer, int64_t n, int64_t inner) {
  const int64_t total = outer * inner;
  for (int64_t t = (int64_t)blockIdx.x * THREADS + threadIdx.x; t < total; t += (int64_t)gridDim.x * THREADS) {
    const int64_t o = t / inner, i = t - o * inner;
    const TI* xp = x + o * n * inner + i;
    TO* yp = y + o * n * inner + i;
    float m = -INFINITY, s = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      const float v = kf_f(xp[j * inner]);
      if (v > m) { s *= kf_exp(m - v); m = v; }
      s += kf_exp(v - m);
    }
    const float inv = 1.f / s, ls = logf(s);
    for (int64_t j = 0; j < n; ++j) {
      const float d = kf_f(xp[j * inner]) - m;
      yp[j * inner] = kf_to<TO>(LOG ? d - ls : kf_exp(d) * inv);
    }
  }
}
"""

_CUDA_COLS_LAUNCH = r"""
  if (outer <= 0 || n <= 0 || inner <= 0) return 0;
  const int64_t blocks = (outer * inner + @THREADS@ - 1) / @THREADS@;
  const unsigned grid = (unsigned)(blocks < 1048576 ? blocks : 1048576);
  kf_softmax_cols<@THREADS@, @LOG@><<<grid, @THREADS@, 0, stream>>>(x, y, outer, n, inner);
  return (int)cudaGetLastError();
"""


def _cols_render(task: Task, p: dict) -> str:
    body = fill(_CUDA_COLS_LAUNCH, THREADS=p["threads"], LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_COLS + entry(task, "cuda", body)


register(Family("cols", OPS, "cuda", {"threads": (64, 128, 256, 512)},
                lambda t: {"threads": 256}, lambda t, p: _dims(t)[2] > 1, _cols_render,
                doc="inner > 1: one thread per column, coalesced across inner"))


# ------------------------------------------------------------------------------- CPU

_CPU_ROWS = r"""
// Contiguous rows (inner == 1): explicit-SIMD passes (max; exp and sum; scale or shift), the
// exp recomputed in pass 3 rather than stored when the output is narrower than f32.
inline void kf_softmax_row_vec(const TI* xr, TO* yr, int64_t n) {
  const int64_t nv = n - n % KF_W;
  kf_v vm = kf_vset(-INFINITY);
  for (int64_t j = 0; j < nv; j += KF_W) vm = kf_vmax(kf_vin(xr + j), vm);  // NaN reaches s below
  float m = kf_vhmax(vm);
  for (int64_t j = nv; j < n; ++j) { const float v = kf_in(xr[j]); m = v > m ? v : m; }
  const kf_v vmx = kf_vset(m);
  kf_v vs = kf_vset(0.f);
  float s = 0.f;
  if (@STORE_EXP@ && !@LOG@) {
    float* yf = (float*)(void*)yr;
    for (int64_t j = 0; j < nv; j += KF_W) {
      const kf_v e = kf_vexp(kf_vsub(kf_vin(xr + j), vmx));
      kf_vst_f32(yf + j, e);
      vs = kf_vadd(vs, e);
    }
    for (int64_t j = nv; j < n; ++j) { const float e = kf_exp(kf_in(xr[j]) - m); yf[j] = e; s += e; }
    s += kf_vsum(vs);
    const float inv = 1.f / s;
    const kf_v vinv = kf_vset(inv);
    for (int64_t j = 0; j < nv; j += KF_W) kf_vst_f32(yf + j, kf_vmul(kf_vld_f32(yf + j), vinv));
    for (int64_t j = nv; j < n; ++j) yf[j] = yf[j] * inv;
    return;
  }
  for (int64_t j = 0; j < nv; j += KF_W) vs = kf_vadd(vs, kf_vexp(kf_vsub(kf_vin(xr + j), vmx)));
  for (int64_t j = nv; j < n; ++j) s += kf_exp(kf_in(xr[j]) - m);
  s += kf_vsum(vs);
  const float inv = 1.f / s, ls = logf(s);
  const kf_v vinv = kf_vset(inv), vls = kf_vset(m + ls);
  for (int64_t j = 0; j < nv; j += KF_W) {
    const kf_v v = kf_vin(xr + j);
    kf_vout(yr + j, @LOG@ ? kf_vsub(v, vls) : kf_vmul(kf_vexp(kf_vsub(v, vmx)), vinv));
  }
  for (int64_t j = nv; j < n; ++j) {
    const float d = kf_in(xr[j]) - m;
    yr[j] = kf_out(@LOG@ ? d - ls : kf_exp(d) * inv);
  }
}

inline int kf_softmax_rows(const TI* x, TO* y, int64_t outer, int64_t n, int64_t inner) {
  const int64_t rows = outer * inner;
#pragma omp parallel for schedule(@SCHED@, @GRAIN@)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r / inner, i = r - o * inner;
    const TI* xr = x + o * n * inner + i;
    TO* yr = y + o * n * inner + i;
    const int64_t st = inner;
    if (@VEC@ && st == 1) { kf_softmax_row_vec(xr, yr, n); continue; }
    float m = -INFINITY;
    int nan = 0;
    for (int64_t j = 0; j < n; ++j) { const float v = kf_in(xr[j * st]); m = v > m ? v : m; nan |= (v != v); }
    if (nan) m = NAN;
    float s = 0.f;
    for (int64_t j = 0; j < n; ++j) s += @EXP@(kf_in(xr[j * st]) - m);
    const float inv = 1.f / s, ls = logf(s);
    for (int64_t j = 0; j < n; ++j) {
      const float d = kf_in(xr[j * st]) - m;
      yr[j * st] = kf_out(@LOG@ ? d - ls : @EXP@(d) * inv);
    }
  }
  return 0;
}
"""


def _cpu_default(task: Task) -> dict:
    outer, n, inner = _dims(task)
    grain = pow2_at_most(max(1, (outer * inner) // 64), (1, 4, 16, 64))
    return {"grain": grain, "sched": "static", "exp": "poly"}


def _cpu_render(task: Task, p: dict) -> str:
    store = "1" if task.output.dtype == "float32" else "0"
    # exp=poly: explicit-SIMD passes with the polynomial exp; libm: scalar loops calling expf.
    src = fill(_CPU_ROWS, SCHED=p["sched"], GRAIN=p["grain"], STORE_EXP=store, LOG=_log(task),
               EXP="kf_exp" if p["exp"] == "poly" else "kf_exp_libm", VEC="1" if p["exp"] == "poly" else "0")
    body = "  return kf_softmax_rows(x, y, outer, n, inner);"
    return cpu_head(task) + src + entry(task, "cpu", body)


register(Family("rows_omp", OPS, "cpu",
                {"grain": (1, 4, 16, 64), "sched": ("static", "dynamic"), "exp": ("poly", "libm")},
                _cpu_default, lambda t, p: True, _cpu_render,
                doc="OpenMP over rows, explicit-SIMD passes with a polynomial exp (or scalar libm expf)"))
