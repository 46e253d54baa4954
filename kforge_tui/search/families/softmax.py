"""softmax / log_softmax families (x viewed as [outer, n, inner], reduce over n).

cuda (which one a shape wants: the proposer's priors, search/proposers/builtin.py):
  block_row    one block per row; the row is cached in registers when it fits (read once), else
               re-read with a single-pass online (max, sum) or a two-pass max-then-sum.
  warp_row     `lanes` threads per row (a warp or part of one), row in registers, shuffles only:
               no barriers, for short rows (n <= 64 * lanes); `rows` rows per lane group at a
               time for many short rows (more loads in flight).
  split_row    several blocks per row for very long rows with few rows: partial (max, sum) per
               chunk into stream-ordered scratch, then a second kernel combines and writes.
  cluster_row  a thread-block cluster (sm_90) per row, pairs merged through distributed shared
               memory, one launch; `keep` KB of each CTA's chunk held in shared memory, so many
               long rows (waves of clusters) read x from DRAM once.
  coop_row     few long rows over the whole GPU: a cooperative grid of resident CTAs, each one
               chunk of a row (kept in shared memory when it fits), pairs combined through
               scratch in y between two grid barriers; one launch, no allocation.
  cols         inner > 1 (softmax over a non-last dim): one thread per (outer, inner) column,
               coalesced across inner.
Every launcher checks sizes and alignment at run time and falls back to a generic kernel
(scalar loads, one block per row) for anything its fast path does not take.
cpu:
  rows_omp     OpenMP over rows, explicit-SIMD passes with a polynomial exp.
"""
from __future__ import annotations

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import (CUDA_COOP_SPLIT, ELEM_BYTES, KEEP_KB, MAX_KEEP_KB, cdiv,
                                                cpu_head, cuda_head, entry, fill, keep_for, keep_sweeps,
                                                pow2_at_most)
from kforge_tui.regions.patterns import OpTask
from kforge_tui.regions import patterns

OPS = ("softmax", "log_softmax")
MAX_REG_VALUES = 64  # floats a thread may cache before spills cost more than a re-read


def _dims(task: OpTask) -> tuple[int, int, int]:
    s = patterns.scalar_args(task)
    return s["outer"], s["n"], s["inner"]


def _log(task: OpTask) -> str:
    return "true" if task.op == "log_softmax" else "false"


def _vec16(task: OpTask) -> int:
    return 16 // ELEM_BYTES[task.dtype]


def _row_vec(task: OpTask, n: int) -> int:
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
          const float ms = (m == -INFINITY) ? 0.f : m;  // -inf so far: add exp(-inf) = 0, not NaN
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p.v[j]) - ms);
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
  if (inner != 1) {  // softmax over a non-last dim: one thread per (outer, inner) column
    const int64_t cb = (outer * inner + 255) / 256;
    kf_softmax_cols<256, @LOG@><<<(unsigned)(cb < 1048576 ? cb : 1048576), 256, 0, stream>>>(x, y, outer, n, inner);
    return (int)cudaGetLastError();
  }
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


def _block_default(task: OpTask) -> dict:
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


def _block_valid(task: OpTask, p: dict) -> bool:
    outer, n, inner = _dims(task)
    if inner != 1 or n % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    if p["cache"] == "regs":
        return _block_items(task, p) * p["vec"] <= MAX_REG_VALUES and p["mode"] == "online"
    return True


def _block_render(task: OpTask, p: dict) -> str:
    items = _block_items(task, p)
    body = fill(_CUDA_BLOCK_LAUNCH, VEC=p["vec"], THREADS=p["threads"], ITEMS=items,
                CAP=(items * p["threads"] * p["vec"]) if items else "INT64_MAX",
                ONLINE="true" if p["mode"] == "online" else "false", LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_COLS + _CUDA_BLOCK + entry(task, "cuda", body)


register(Family("block_row", OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "mode": ("two_pass", "online"), "cache": ("none", "regs")},
                _block_default, _block_valid, _block_render,
                doc="one block per row, row in registers when it fits"))


_CUDA_WARP = r"""

// LANES threads per row, ROWS rows per lane group at a time: every row's loads are issued before
// the first reduction, so short rows keep ROWS x ITEMS packs in flight per thread. Row slot r of
// group g is row row0 + r * GROUPS + g: each slot's loads from one warp are one contiguous run.
template <int WARPS, int LANES, int VEC, int ITEMS, int ROWS, bool LOG>
__global__ void __launch_bounds__(WARPS * 32) kf_softmax_warp(const TI* __restrict__ x, TO* __restrict__ y,
                                                             int64_t rows, int64_t n) {
  constexpr int GROUPS = WARPS * 32 / LANES;
  const int g = threadIdx.x / LANES, lane = threadIdx.x % LANES;
  for (int64_t row0 = (int64_t)blockIdx.x * GROUPS * ROWS; row0 < rows; row0 += (int64_t)gridDim.x * GROUPS * ROWS) {
    float v[ROWS][ITEMS * VEC];
    float m[ROWS], s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + (int64_t)r * GROUPS + g;
      const bool live = row < rows;
      const TI* xr = x + (live ? row : 0) * n;
      m[r] = -INFINITY;
      s[r] = 0.f;
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int64_t base = ((int64_t)it * LANES + lane) * VEC;
        if (live && base < n) {
          kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
#pragma unroll
          for (int j = 0; j < VEC; ++j) { v[r][it * VEC + j] = kf_f(p.v[j]); m[r] = fmaxf(m[r], v[r][it * VEC + j]); }
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) v[r][it * VEC + j] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) m[r] = kf_warp_max(m[r], LANES);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float mr = (m[r] == -INFINITY) ? 0.f : m[r];  // a dead or all -inf row: no NaN from -inf + inf
#pragma unroll
      for (int k = 0; k < ITEMS * VEC; ++k) { const float e = kf_exp(v[r][k] - mr); s[r] += e; if (!LOG) v[r][k] = e; }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) s[r] = kf_warp_sum(s[r], LANES);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t row = row0 + (int64_t)r * GROUPS + g;
      if (row >= rows) continue;
      const float inv = 1.f / s[r], ls = logf(s[r]);
      TO* yr = y + row * n;
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int64_t base = ((int64_t)it * LANES + lane) * VEC;
        if (base < n) {
          kf_pack<TO, VEC> o;
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(LOG ? v[r][it * VEC + j] - m[r] - ls : v[r][it * VEC + j] * inv);
          kf_store<TO, VEC>(yr + base, o);
        }
      }
    }
  }
}
"""

_CUDA_WARP_LAUNCH = r"""
  if (outer <= 0 || n <= 0) return 0;
  if (inner != 1) {  // softmax over a non-last dim: one thread per (outer, inner) column
    const int64_t cb = (outer * inner + 255) / 256;
    kf_softmax_cols<256, @LOG@><<<(unsigned)(cb < 1048576 ? cb : 1048576), 256, 0, stream>>>(x, y, outer, n, inner);
    return (int)cudaGetLastError();
  }
  const unsigned og = (unsigned)(outer < 2147483647 ? outer : 2147483647);
  if (n > (int64_t)@CAP@) {  // longer rows than the registers were sized for: one block per row
    kf_softmax_block<128, 1, 0, true, @LOG@><<<og, 128, 0, stream>>>(x, y, outer, n);
    return (int)cudaGetLastError();
  }
  const int64_t groups = (int64_t)@WARPS@ * 32 / @LANES@;
  const bool fast = (n % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO));
  const int64_t per = fast ? groups * @ROWS@ : groups;
  const int64_t blocks = (outer + per - 1) / per;
  const unsigned grid = (unsigned)(blocks < 2147483647 ? blocks : 2147483647);
  if (fast) kf_softmax_warp<@WARPS@, @LANES@, @VEC@, @ITEMS@, @ROWS@, @LOG@><<<grid, @WARPS@ * 32, 0, stream>>>(x, y, outer, n);
  else kf_softmax_warp<@WARPS@, @LANES@, 1, @ITEMS1@, 1, @LOG@><<<grid, @WARPS@ * 32, 0, stream>>>(x, y, outer, n);
  return (int)cudaGetLastError();
"""


def _warp_default(task: OpTask) -> dict:
    """The fewest lanes that hold a row in at most two packs each; rows of at most 4 packs per
    thread take 2 rows per lane group (twice the loads in flight for short rows)."""
    outer, n, _ = _dims(task)
    vec = _row_vec(task, n)
    lanes = 32
    for ln in (32, 16, 8, 4):
        if n <= ln * vec * 2:
            lanes = ln
    rows = 2 if cdiv(n, lanes * vec) * vec * 2 <= 32 and outer >= 4096 else 1
    return {"warps": 4, "lanes": lanes, "vec": vec, "rows": rows}


def _warp_valid(task: OpTask, p: dict) -> bool:
    _, n, inner = _dims(task)
    if inner != 1 or n % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    return cdiv(n, p["lanes"] * p["vec"]) * p["vec"] * p.get("rows", 1) <= MAX_REG_VALUES


def _warp_render(task: OpTask, p: dict) -> str:
    _, n, _ = _dims(task)
    items = cdiv(n, p["lanes"] * p["vec"])
    body = fill(_CUDA_WARP_LAUNCH, WARPS=p["warps"], LANES=p["lanes"], VEC=p["vec"], ITEMS=items,
                ITEMS1=cdiv(n, p["lanes"]), CAP=items * p["lanes"] * p["vec"], ROWS=p.get("rows", 1),
                LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_COLS + _CUDA_BLOCK + _CUDA_WARP + entry(task, "cuda", body)


register(Family("warp_row", OPS, "cuda",
                {"warps": (1, 2, 4, 8, 16), "lanes": (4, 8, 16, 32), "vec": (1, 2, 4, 8, 16), "rows": (1, 2, 4)},
                _warp_default, _warp_valid, _warp_render,
                doc="a warp (or `lanes` threads) per row, row in registers, no barriers; `rows` rows per lane "
                    "group at a time (more loads in flight for short rows)"))


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
    const float ms = (m == -INFINITY) ? 0.f : m;  // -inf so far: add exp(-inf) = 0, not NaN
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p.v[j]) - ms);
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
  if (inner != 1) {  // softmax over a non-last dim: one thread per (outer, inner) column
    const int64_t cb = (outer * inner + 255) / 256;
    kf_softmax_cols<256, @LOG@><<<(unsigned)(cb < 1048576 ? cb : 1048576), 256, 0, stream>>>(x, y, outer, n, inner);
    return (int)cudaGetLastError();
  }
  if (outer > 65535) {  // more rows than gridDim.y takes: one block per row
    kf_softmax_block<@THREADS@, 1, 0, true, @LOG@><<<(unsigned)(outer < 2147483647 ? outer : 2147483647), @THREADS@, 0, stream>>>(
        x, y, outer, n);
    return (int)cudaGetLastError();
  }
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


def _split_default(task: OpTask) -> dict:
    outer, n, _ = _dims(task)
    vec = _row_vec(task, n)
    chunks = 2
    for c in (2, 4, 8, 16, 32, 64, 128):
        if outer * c <= 4 * 132 and n // c >= 512 * vec:
            chunks = c
    return {"threads": 512 if n // chunks >= 512 * vec * 2 else 256, "vec": vec, "chunks": chunks}


def _split_valid(task: OpTask, p: dict) -> bool:
    outer, n, inner = _dims(task)
    return (inner == 1 and outer <= 65535 and n % p["vec"] == 0 and n >= 4096
            and p["vec"] * ELEM_BYTES[task.dtype] <= 32 and n // p["chunks"] >= p["threads"])


def _split_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_SPLIT_LAUNCH, CHUNKS=p["chunks"], VEC=p["vec"], THREADS=p["threads"], LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_COLS + _CUDA_BLOCK + _CUDA_SPLIT + entry(task, "cuda", body)


register(Family("split_row", OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "chunks": (2, 4, 8, 16, 32, 64, 128)},
                _split_default, _split_valid, _split_render,
                doc="several blocks per long row, partial (max, sum) then combine-and-write"))


_CUDA_SPLITK = r"""
#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// Online (max, sum) merge: the pair with the larger max keeps its sum, the other is rescaled.
__device__ __forceinline__ void kf_ms_merge(float& m, float& s, float om, float os) {
  const float M = fmaxf(m, om);
  s = (m == M ? s : s * kf_exp(m - M)) + (om == M ? os : os * kf_exp(om - M));
  m = M;
}
// Fold a pack into the running (max, sum); a max still at -inf (all -inf so far) exponentiates
// against 0, so -inf entries (masks) add 0 instead of exp(-inf + inf) = NaN.
template <int VEC> __device__ __forceinline__ void kf_ms_pack(float& m, float& s, const kf_pack<TI, VEC>& p) {
  float pm = m;
#pragma unroll
  for (int j = 0; j < VEC; ++j) pm = fmaxf(pm, kf_f(p.v[j]));
  if (pm != m) { s *= kf_exp(m - pm); m = pm; }
  const float ms = (m == -INFINITY) ? 0.f : m;
#pragma unroll
  for (int j = 0; j < VEC; ++j) s += kf_exp(kf_f(p.v[j]) - ms);
}

// A row split over C CTAs, each owning one chunk of `chunk` elements. Phase 1 reads the chunk
// once (keeping its first KEEPK sweeps in shared memory, each thread the packs it will write, so
// no barrier is needed between keeping and using them) and reduces it to an online (max, sum).
// The row's pairs are then combined:
//   COOP = false: the C CTAs are one thread-block cluster (sm_90), pairs exchanged through
//                 distributed shared memory; CTA r of cluster q is chunk r of row q.
//   COOP = true:  the grid is cooperative (every CTA resident), CTA i is chunk i % C of row
//                 i / C; pairs go through the first 8 * gridDim.x bytes of y (scratch that the
//                 write phase overwrites), between two grid-wide barriers.
// Phase 2 writes the chunk backwards: what was read last is most likely still in L2, and the
// kept sweeps (the first ones) come last. One launch, no allocation.
template <int THREADS, int VEC, int UNROLL, int KEEPK, bool LOG, bool COOP>
__global__ void __launch_bounds__(THREADS) kf_softmax_split(const TI* __restrict__ x, TO* __restrict__ y,
                                                           int64_t n, int64_t C, int64_t chunk) {
  constexpr int NW = THREADS / 32;
  __shared__ float2 sh[NW];
  __shared__ float2 part;
  __shared__ float2 tot;
  extern __shared__ __align__(16) unsigned char kf_keep_raw[];
  kf_pack<TI, VEC>* keep = reinterpret_cast<kf_pack<TI, VEC>*>(kf_keep_raw);
  int64_t c;
  if constexpr (COOP) {
    c = blockIdx.x % C;
  } else {
    kf_cg::cluster_group cl = kf_cg::this_cluster();
    C = (int64_t)cl.num_blocks();
    c = (int64_t)cl.block_rank();
  }
  const int64_t row = blockIdx.x / C;
  const int64_t lo = c * chunk, hi = (lo + chunk < n) ? lo + chunk : n;
  const TI* xr = x + row * n;
  float m = -INFINITY, s = 0.f;
  constexpr int64_t STEP = (int64_t)THREADS * VEC;
  int64_t base = lo + (int64_t)threadIdx.x * VEC;
  int k = 0;  // sweep index of `base` within the chunk
  for (; base + (UNROLL - 1) * STEP < hi; base += UNROLL * STEP, k += UNROLL) {
    kf_pack<TI, VEC> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) p[u] = kf_load<TI, VEC>(xr + base + u * STEP);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (k + u < KEEPK) keep[(k + u) * THREADS + threadIdx.x] = p[u];
      kf_ms_pack<VEC>(m, s, p[u]);
    }
  }
  for (; base < hi; base += STEP, ++k) {
    const kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
    if (k < KEEPK) keep[k * THREADS + threadIdx.x] = p;
    kf_ms_pack<VEC>(m, s, p);
  }
  for (int o = 16; o > 0; o >>= 1) kf_ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_float2(m, s);
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 t = sh[0];
    for (int w = 1; w < NW; ++w) kf_ms_merge(t.x, t.y, sh[w].x, sh[w].y);
    part = t;
    if constexpr (COOP) reinterpret_cast<float2*>(y)[blockIdx.x] = t;
  }
  if constexpr (COOP) {
    kf_cg::this_grid().sync();  // every chunk's pair is in the scratch
    if (threadIdx.x < 32) {
      const float2* sc = reinterpret_cast<const float2*>(y) + row * C;
      m = -INFINITY;
      s = 0.f;
      for (int64_t q = threadIdx.x; q < C; q += 32) {
        const float2 o = __ldcg(sc + q);  // written by other SMs: read at L2, not from L1
        kf_ms_merge(m, s, o.x, o.y);
      }
      for (int o = 16; o > 0; o >>= 1) kf_ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
      if (threadIdx.x == 0) tot = make_float2(m, s);
    }
    kf_cg::this_grid().sync();  // every CTA has read the scratch before any CTA writes over it
  } else {
    kf_cg::cluster_group cl = kf_cg::this_cluster();
    cl.sync();  // every CTA's pair is visible cluster-wide
    if (threadIdx.x < 32) {
      m = -INFINITY;
      s = 0.f;
      if ((int64_t)threadIdx.x < C) {
        const float2 o = *cl.map_shared_rank(&part, threadIdx.x);
        m = o.x;
        s = o.y;
      }
      for (int o = 16; o > 0; o >>= 1) kf_ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
      if (threadIdx.x == 0) tot = make_float2(m, s);
    }
    cl.sync();  // no CTA leaves (freeing its shared memory) while a peer may still read it
  }
  __syncthreads();
  m = tot.x;
  s = tot.y;
  const float inv = 1.f / s, ls = logf(s);
  TO* yr = y + row * n;
  int kk = (int)((hi - 1 - lo) / STEP);
  for (int64_t row0 = lo + (int64_t)kk * STEP; hi > lo && row0 >= lo; row0 -= STEP, --kk) {
    const int64_t bs = row0 + (int64_t)threadIdx.x * VEC;
    if (bs >= hi) continue;
    const kf_pack<TI, VEC> p = kk < KEEPK ? keep[kk * THREADS + threadIdx.x] : kf_load<TI, VEC>(xr + bs);
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

_CUDA_CLUSTER_LAUNCH = r"""
  if (outer <= 0 || n <= 0) return 0;
  const int64_t CL = @CLUSTER@;
  if (inner != 1) {  // softmax over a non-last dim: one thread per (outer, inner) column
    const int64_t cb = (outer * inner + 255) / 256;
    kf_softmax_cols<256, @LOG@><<<(unsigned)(cb < 1048576 ? cb : 1048576), 256, 0, stream>>>(x, y, outer, n, inner);
    return (int)cudaGetLastError();
  }
  if (outer * CL > 2147483647) {  // more CTAs than one launch takes: one block per row
    kf_softmax_block<256, 1, 0, true, @LOG@><<<(unsigned)(outer < 2147483647 ? outer : 2147483647), 256, 0, stream>>>(
        x, y, outer, n);
    return (int)cudaGetLastError();
  }
  int rc;
  if ((n % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO))) {
    const int64_t chunk = ((n + CL - 1) / CL + @VEC@ - 1) / @VEC@ * @VEC@;
    const size_t smem = (size_t)@KEEPK@ * @THREADS@ * sizeof(kf_pack<TI, @VEC@>);
    rc = kf_launch_cluster(kf_softmax_split<@THREADS@, @VEC@, @UNROLL@, @KEEPK@, @LOG@, false>, outer * CL,
                           @THREADS@, (int)CL, smem, stream, x, y, n, CL, chunk);
  } else {
    const int64_t chunk = (n + CL - 1) / CL;
    rc = kf_launch_cluster(kf_softmax_split<@THREADS@, 1, 1, 0, @LOG@, false>, outer * CL, @THREADS@, (int)CL,
                           (size_t)0, stream, x, y, n, CL, chunk);
  }
  return rc ? rc : (int)cudaGetLastError();
"""

def _cluster_default(task: OpTask) -> dict:
    """Split each row over a cluster so that rows x cluster gives about one CTA per SM (132); when
    rows alone fill the GPU, a 16-CTA cluster per row whose chunks (up to 96 KB) stay on chip."""
    outer, n, _ = _dims(task)
    vec = _row_vec(task, n)
    cl = 2
    for c in (4, 8, 16):
        if (outer * c <= 132 or n * ELEM_BYTES[task.dtype] >= c * 32 * 1024) and n // c >= 1024 * vec:
            cl = c
    threads = 1024 if n // cl >= 1024 * vec * 4 else 512
    p = {"cluster": cl, "threads": threads, "vec": vec, "unroll": 2, "keep": 0}
    chunk = cdiv(n, cl)
    if outer * cl > 132:  # waves of clusters: DRAM re-reads are what keeping on chip saves
        # H200, [2048, 262144] f32: 512 threads x unroll 4 ran 1349 us, 1024 x 2 1864 (16-CTA
        # clusters of 1024 threads do not all fit at once)
        p.update(threads=512, unroll=4, keep=keep_for(task.dtype, chunk, 96))
        if keep_sweeps(task.dtype, p) < 1 or n // cl < 512 * vec:
            p["keep"] = 0
    return p


def _cluster_valid(task: OpTask, p: dict) -> bool:
    outer, n, inner = _dims(task)
    return (inner == 1 and n % p["vec"] == 0 and n >= 4096 and p["vec"] * ELEM_BYTES[task.dtype] <= 16
            and n // p["cluster"] >= p["threads"] * p["vec"] and p["keep"] <= MAX_KEEP_KB
            and (p["keep"] == 0 or keep_sweeps(task.dtype, p) >= 1))


def _cluster_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_CLUSTER_LAUNCH, CLUSTER=p["cluster"], VEC=p["vec"], THREADS=p["threads"],
                UNROLL=p["unroll"], KEEPK=keep_sweeps(task.dtype, p), LOG=_log(task))
    return cuda_head(task) + _CUDA_SOFTMAX_COMMON + _CUDA_COLS + _CUDA_BLOCK + _CUDA_SPLITK + entry(task, "cuda", body)


register(Family("cluster_row", OPS, "cuda",
                {"cluster": (2, 4, 8, 16), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8),
                 "unroll": (1, 2, 4), "keep": KEEP_KB},
                _cluster_default, _cluster_valid, _cluster_render,
                doc="sm_90 thread-block cluster per long row: DSMEM (max, sum) merge, one launch; `keep` KB "
                    "of each CTA's chunk held in shared memory instead of re-read"))


_CUDA_COOP_LAUNCH = r"""
  if (outer <= 0 || n <= 0) return 0;
  if (inner != 1) {  // softmax over a non-last dim: one thread per (outer, inner) column
    const int64_t cb = (outer * inner + 255) / 256;
    kf_softmax_cols<256, @LOG@><<<(unsigned)(cb < 1048576 ? cb : 1048576), 256, 0, stream>>>(x, y, outer, n, inner);
    return (int)cudaGetLastError();
  }
  if ((n % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO)) &&
      kf_aligned(y, 8)) {
    auto kern = kf_softmax_split<@THREADS@, @VEC@, @UNROLL@, @KEEPK@, @LOG@, true>;
    const size_t smem = (size_t)@KEEPK@ * @THREADS@ * sizeof(kf_pack<TI, @VEC@>);
    const int64_t cap = kf_coop_capacity(kern, @THREADS@, smem);
    int64_t nch = 0;  // chunks per row
    const int64_t chunk = kf_coop_chunks(outer, n, cap, (int64_t)@THREADS@ * @VEC@, @VEC@, &nch);
    // the pairs' scratch (8 bytes a CTA) must fit in y
    if (chunk > 0 && (double)outer * nch * 8 <= (double)outer * n * sizeof(TO)) {
      const int rc = kf_launch_coop(kern, outer * nch, @THREADS@, smem, stream, x, y, n, nch, chunk);
      return rc ? rc : (int)cudaGetLastError();
    }
  }
  // more rows than resident CTAs, misaligned, or no cooperative launch: one block per row
  const unsigned grid = (unsigned)(outer < 2147483647 ? outer : 2147483647);
  kf_softmax_block<@THREADS@, 1, 0, true, @LOG@><<<grid, @THREADS@, 0, stream>>>(x, y, outer, n);
  return (int)cudaGetLastError();
"""


def _coop_default(task: OpTask) -> dict:
    """512 threads, 4 packs in flight each, up to 96 KB kept per CTA (two CTAs per SM); the whole
    chunk kept when the tensor fits on chip over 132 SMs x 2 CTAs, else 96 KB of each chunk."""
    outer, n, _ = _dims(task)
    vec = _row_vec(task, n)
    # unroll 4: on the H200 [1, 10^7] f32 ran 35.0 us against 39.4 with 2 (more bytes in flight)
    p = {"threads": 512, "vec": vec, "unroll": 4, "keep": 0}
    per_cta = cdiv(outer * n, 264)
    p["keep"] = keep_for(task.dtype, per_cta, 96)
    if keep_sweeps(task.dtype, p) < 1:
        p["keep"] = 0
    return p


def _coop_valid(task: OpTask, p: dict) -> bool:
    outer, n, inner = _dims(task)
    return (inner == 1 and n % p["vec"] == 0 and n >= 2048 and outer <= 2048
            and p["vec"] * ELEM_BYTES[task.dtype] <= 16 and p["keep"] <= MAX_KEEP_KB
            and (p["keep"] == 0 or keep_sweeps(task.dtype, p) >= 1))


def _coop_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_COOP_LAUNCH, VEC=p["vec"], THREADS=p["threads"], UNROLL=p["unroll"],
                KEEPK=keep_sweeps(task.dtype, p), LOG=_log(task))
    return (cuda_head(task) + CUDA_COOP_SPLIT + _CUDA_SOFTMAX_COMMON + _CUDA_COLS + _CUDA_BLOCK + _CUDA_SPLITK
            + entry(task, "cuda", body))


register(Family("coop_row", OPS, "cuda",
                {"threads": (256, 512, 1024), "vec": (1, 2, 4, 8), "unroll": (1, 2, 4), "keep": KEEP_KB},
                _coop_default, _coop_valid, _coop_render,
                doc="few long rows over the whole GPU: a cooperative grid, each CTA one chunk of a row "
                    "(`keep` KB of it held in shared memory), (max, sum) pairs combined between two "
                    "grid barriers through scratch in y; one launch, no allocation"))


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


def _cols_render(task: OpTask, p: dict) -> str:
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
  const int64_t nv = n - n % SIMD_W;
  kf_v vm = kf_vset(-INFINITY);
  for (int64_t j = 0; j < nv; j += SIMD_W) vm = kf_vmax(kf_vin(xr + j), vm);  // NaN reaches s below
  float m = kf_vhmax(vm);
  for (int64_t j = nv; j < n; ++j) { const float v = kf_in(xr[j]); m = v > m ? v : m; }
  const kf_v vmx = kf_vset(m);
  kf_v vs = kf_vset(0.f);
  float s = 0.f;
  if (@STORE_EXP@ && !@LOG@) {
    float* yf = (float*)(void*)yr;
    for (int64_t j = 0; j < nv; j += SIMD_W) {
      const kf_v e = kf_vexp(kf_vsub(kf_vin(xr + j), vmx));
      kf_vst_f32(yf + j, e);
      vs = kf_vadd(vs, e);
    }
    for (int64_t j = nv; j < n; ++j) { const float e = kf_exp(kf_in(xr[j]) - m); yf[j] = e; s += e; }
    s += kf_vsum(vs);
    const float inv = 1.f / s;
    const kf_v vinv = kf_vset(inv);
    for (int64_t j = 0; j < nv; j += SIMD_W) kf_vst_f32(yf + j, kf_vmul(kf_vld_f32(yf + j), vinv));
    for (int64_t j = nv; j < n; ++j) yf[j] = yf[j] * inv;
    return;
  }
  for (int64_t j = 0; j < nv; j += SIMD_W) vs = kf_vadd(vs, kf_vexp(kf_vsub(kf_vin(xr + j), vmx)));
  for (int64_t j = nv; j < n; ++j) s += kf_exp(kf_in(xr[j]) - m);
  s += kf_vsum(vs);
  const float inv = 1.f / s, ls = logf(s);
  const kf_v vinv = kf_vset(inv), vls = kf_vset(m + ls);
  for (int64_t j = 0; j < nv; j += SIMD_W) {
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
#pragma omp parallel for schedule(@SCHED@, @GRAIN@) if(rows > 1 && rows * n >= kf_omp_min_work)
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


def _cpu_default(task: OpTask) -> dict:
    outer, n, inner = _dims(task)
    grain = pow2_at_most(max(1, (outer * inner) // 64), (1, 4, 16, 64))
    return {"grain": grain, "sched": "static", "exp": "poly"}


def _cpu_render(task: OpTask, p: dict) -> str:
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
