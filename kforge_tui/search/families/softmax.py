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


_CUDA_BLOCK = r"""
__device__ __forceinline__ float kf_exp(float v) { return expf(v); }

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
      for (int64_t base = (int64_t)threadIdx.x * VEC; base < n; base += (int64_t)THREADS * VEC) {
        kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
        kf_pack<TO, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = kf_f(p.v[j]) - m;
          o.v[j] = kf_to<TO>(LOG ? d - ls : kf_exp(d) * inv);
        }
        kf_store<TO, VEC>(yr + base, o);
      }
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
    return cuda_head(task) + _CUDA_BLOCK + entry(task, "cuda", body)


register(Family("block_row", OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "mode": ("two_pass", "online"), "cache": ("none", "regs")},
                _block_default, _block_valid, _block_render,
                doc="one block per row, row in registers when it fits"))


_CUDA_WARP = r"""
__device__ __forceinline__ float kf_exp(float v) { return expf(v); }

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
    vec = _vec16(task)
    while vec > 1 and n % vec:
        vec //= 2
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
    return cuda_head(task) + _CUDA_WARP + entry(task, "cuda", body)


register(Family("warp_row", OPS, "cuda",
                {"warps": (1, 2, 4, 8, 16), "lanes": (4, 8, 16, 32), "vec": (1, 2, 4, 8, 16)},
                _warp_default, _warp_valid, _warp_render,
                doc="a warp (or `lanes` threads) per row, row in registers, no barriers"))


_CUDA_SPLIT = r"""
__device__ __forceinline__ float kf_exp(float v) { return expf(v); }

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
  for (int64_t base = lo + (int64_t)threadIdx.x * VEC; base < hi; base += (int64_t)THREADS * VEC) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
    kf_pack<TO, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = kf_f(p.v[j]) - m;
      o.v[j] = kf_to<TO>(LOG ? d - ls : kf_exp(d) * inv);
    }
    kf_store<TO, VEC>(yr + base, o);
  }
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
    vec = _vec16(task)
    while vec > 1 and n % vec:
        vec //= 2
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
    return cuda_head(task) + _CUDA_SPLIT + entry(task, "cuda", body)


register(Family("split_row", OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "chunks": (2, 4, 8, 16, 32, 64, 128)},
                _split_default, _split_valid, _split_render,
                doc="several blocks per long row, partial (max, sum) then combine-and-write"))


_CUDA_COLS = r"""
__device__ __forceinline__ float kf_exp(float v) { return expf(v); }

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
    return cuda_head(task) + _CUDA_COLS + entry(task, "cuda", body)


register(Family("cols", OPS, "cuda", {"threads": (64, 128, 256, 512)},
                lambda t: {"threads": 256}, lambda t, p: _dims(t)[2] > 1, _cols_render,
                doc="inner > 1: one thread per column, coalesced across inner"))


# ------------------------------------------------------------------------------- CPU

_CPU_ROWS = r"""
inline int kf_softmax_rows(const TI* x, TO* y, int64_t outer, int64_t n, int64_t inner) {
  const int64_t rows = outer * inner;
#pragma omp parallel for schedule(@SCHED@, @GRAIN@)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r / inner, i = r - o * inner;
    const TI* xr = x + o * n * inner + i;
    TO* yr = y + o * n * inner + i;
    const int64_t st = inner;
    float m = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t j = 0; j < n; ++j) { const float v = kf_in(xr[j * st]); m = v > m ? v : m; nan |= (v != v); }
    if (nan) m = NAN;
    float s = 0.f;
    if (@STORE_EXP@ && st == 1) {
      float* yf = (float*)(void*)yr;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) { const float e = @EXP@(kf_in(xr[j]) - m); yf[j] = e; s += e; }
      const float inv = 1.f / s, ls = logf(s);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yf[j] = @LOG@ ? kf_in(xr[j]) - m - ls : yf[j] * inv;
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += @EXP@(kf_in(xr[j * st]) - m);
      const float inv = 1.f / s, ls = logf(s);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float d = kf_in(xr[j * st]) - m;
        yr[j * st] = kf_out(@LOG@ ? d - ls : @EXP@(d) * inv);
      }
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
    src = fill(_CPU_ROWS, SCHED=p["sched"], GRAIN=p["grain"], STORE_EXP=store, LOG=_log(task),
               EXP="kf_exp" if p["exp"] == "poly" else "kf_exp_libm")
    body = "  return kf_softmax_rows(x, y, outer, n, inner);"
    return cpu_head(task) + src + entry(task, "cpu", body)


register(Family("rows_omp", OPS, "cpu",
                {"grain": (1, 4, 16, 64), "sched": ("static", "dynamic"), "exp": ("poly", "libm")},
                _cpu_default, lambda t, p: True, _cpu_render,
                doc="OpenMP over rows, vectorised polynomial exp"))
