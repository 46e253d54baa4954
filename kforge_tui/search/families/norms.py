"""Normalisation families: layer_norm, rms_norm (incl. weight_offset / Gemma), group_norm.

All accumulate in f32 and fuse the affine. One kernel template `kf_norm` serves three designs:
a row handled by `ROWT` threads (a warp or part of one: shuffles only; or the whole block),
the row held in registers when it fits (x read once, exact two-pass statistics), else read
twice with shifted sums (shift = the row's first element, which keeps E[x^2]-E[x]^2 from
cancelling when |mean| >> std).

Few long rows (a group is a row for group_norm): `kf_norm_split` cuts each row over several
CTAs that keep their chunk in shared memory and combine shifted partial sums, either as one
thread-block cluster per row (`cluster_row`, DSMEM) or as a cooperative grid over the whole GPU
(`coop_row`, partials through scratch in y between two grid barriers); one launch either way.

group_norm adds `two_phase`: a group is one contiguous run of C/G*HxW elements, often far too
few groups (32) to fill 132 SMs with one block each, so phase 1 splits every group over many
blocks writing partial sums to stream-ordered scratch, and phase 2 (as many blocks) combines
them and applies; phase 2 can walk the data in reverse so its first reads hit what phase 1
left in L2. `cluster_group` does it in one launch with a cluster per group.

Every launcher checks sizes and alignment at run time and falls back to the generic `kf_norm`
(scalar loads, one block per row) for anything its fast path does not take.
"""
from __future__ import annotations

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import (CUDA_COOP_SPLIT, ELEM_BYTES, KEEP_KB, MAX_KEEP_KB, cdiv,
                                                cpu_head, cuda_head, entry, fill, keep_for, keep_sweeps,
                                                pow2_at_most)
from kforge_tui.regions.patterns import OpTask
from kforge_tui.regions import patterns

ROW_OPS = ("layer_norm", "rms_norm")
# Bytes of row a thread may hold in registers (as loaded: 64 f32 or 128 bf16/f16 values) before
# spills cost more than a re-read.
MAX_REG_BYTES = 256
KIND = {"layer_norm": 0, "rms_norm": 1, "group_norm": 2}


def _rows_n(task: OpTask) -> tuple[int, int]:
    """(rows, n) as the kernel sees them; a group is a "row" for group_norm."""
    s = patterns.scalar_args(task)
    if task.op == "group_norm":
        return s["N"] * s["G"], s["C"] // s["G"] * s["HxW"]
    return s["rows"], s["n"]


def _unit(task: OpTask) -> int:
    """Elements that must share one vector pack boundary (channel length for group_norm)."""
    return patterns.scalar_args(task)["HxW"] if task.op == "group_norm" else _rows_n(task)[1]


def _vec16(task: OpTask) -> int:
    v = 16 // ELEM_BYTES[task.dtype]
    while v > 1 and _unit(task) % v:
        v //= 2
    return v


def _round2(task: OpTask) -> str:
    # Llama/Qwen round the normalised value to the input dtype before the weight multiply.
    return "true" if task.op == "rms_norm" and task.params.get("variant", "llama") == "llama" else "false"


_CUDA_NORM = r"""
template <int THREADS, int ROWT> __device__ __forceinline__ float kf_row_sum(float v, float* sh) {
  if constexpr (ROWT <= 32) return kf_warp_sum(v, ROWT);
  else return kf_block_sum<THREADS / 32>(v, sh);
}

// Two sums in one shared-memory round (half the barriers of two kf_row_sum calls).
template <int THREADS, int ROWT> __device__ __forceinline__ float2 kf_row_sum2(float s, float q, float* sh) {
  s = kf_warp_sum(s, ROWT <= 32 ? ROWT : 32);
  q = kf_warp_sum(q, ROWT <= 32 ? ROWT : 32);
  if constexpr (ROWT <= 32) return make_float2(s, q);
  else {
    constexpr int NW = THREADS / 32;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { sh[threadIdx.x >> 5] = s; sh[32 + (threadIdx.x >> 5)] = q; }
    __syncthreads();
    static_assert((NW & (NW - 1)) == 0, "a power-of-two warp count");
    const int l = threadIdx.x & (NW - 1);  // log2(NW) shuffles give every lane the total
    return make_float2(kf_warp_sum(sh[l], NW), kf_warp_sum(sh[32 + l], NW));
  }
}

// KIND 0 layer_norm, 1 rms_norm, 2 group_norm (a row is one (n, group); affine per channel).
// WPRE (row in registers, layer/rms only): the thread's weight/bias packs are loaded once, before
// the first row's x, so their latency is off the path between the reduction and the write.
// TWOR (row in registers, layer/group): exact two-round statistics (mean, then the centred sum
// of squares from registers) instead of one round of shifted sums: one more barrier round.
// PIPE (row in registers): a persistent grid (as many blocks as fit) walks its rows loading the
// next row while it reduces and writes the current one: twice the bytes in flight per block.
// MINB: blocks per SM the compiler must fit (caps registers; 1 = no cap beyond THREADS).
template <int THREADS, int ROWT, int VEC, int ITEMS, int KIND, bool ROUND2, bool WPRE, bool TWOR, bool PIPE,
          int MINB = 1>
__global__ void __launch_bounds__(THREADS, MINB) kf_norm(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, int64_t rows, int64_t n, float eps, float woff,
    int64_t hw, int64_t cg, int64_t G, float inv_n) {  // inv_n = 1 / n from the host: no division per row
  __shared__ float sh[64];
  constexpr int RPB = THREADS / ROWT;
  constexpr bool PRE = WPRE && ITEMS > 0 && KIND != 2;
  const int g = threadIdx.x / ROWT, lane = threadIdx.x % ROWT;
  kf_pack<TI, VEC> wp[PRE ? ITEMS : 1], bp[PRE ? ITEMS : 1];
  if constexpr (PRE) {
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int64_t base = ((int64_t)it * ROWT + lane) * VEC;
      if (base < n) {
        if (w) wp[it] = kf_load<TI, VEC>(w + base);
        if (b) bp[it] = kf_load<TI, VEC>(b + base);
      }
    }
  }
  constexpr bool PIPE_ON = PIPE && ITEMS > 0;
  // The row is kept as loaded (raw packs: half the registers of floats for 16-bit types) and
  // converted where it is used.
  kf_pack<TI, VEC> v[ITEMS > 0 ? ITEMS : 1], vn[PIPE_ON ? ITEMS : 1];
  auto load_row = [&](int64_t r, kf_pack<TI, VEC>* dst) {
    if (r >= rows) return;
    const TI* xp = x + r * n;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int64_t base = ((int64_t)it * ROWT + lane) * VEC;
      if (base < n) dst[it] = kf_load<TI, VEC>(xp + base);
    }
  };
  if constexpr (PIPE_ON) load_row((int64_t)blockIdx.x * RPB + g, v);
  for (int64_t row0 = (int64_t)blockIdx.x * RPB; row0 < rows; row0 += (int64_t)gridDim.x * RPB) {
    const int64_t row = row0 + g;
    const bool live = row < rows;
    const TI* xr = x + (live ? row : 0) * n;
    float mean = 0.f, rstd;
    if constexpr (ITEMS > 0) {
      if constexpr (PIPE_ON) load_row(row + (int64_t)gridDim.x * RPB, vn);  // next row, in flight now
      else load_row(row, v);
      // Mean and variance from one reduction of shifted sums (shift K = the row's first element,
      // so E[d^2] - E[d]^2 does not cancel when |mean| >> std): one barrier round, not two.
      const float K = (KIND != 1 && live) ? kf_f(xr[0]) : 0.f;
      float s = 0.f, q = 0.f;
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int64_t base = ((int64_t)it * ROWT + lane) * VEC;
        if (live && base < n) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float d = kf_f(v[it].v[j]) - K;
            s += d;
            q += d * d;
          }
        }
      }
      if constexpr (KIND != 1 && TWOR) {
        mean = K + kf_row_sum<THREADS, ROWT>(s, sh) * inv_n;
        float c = 0.f;
#pragma unroll
        for (int it = 0; it < ITEMS; ++it) {
          const int64_t base = ((int64_t)it * ROWT + lane) * VEC;
          if (live && base < n) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) { const float d = kf_f(v[it].v[j]) - mean; c += d * d; }
          }
        }
        rstd = rsqrtf(kf_row_sum<THREADS, ROWT>(c, sh) * inv_n + eps);
      } else if constexpr (KIND != 1) {
        const float2 t = kf_row_sum2<THREADS, ROWT>(s, q, sh);
        const float ms = t.x * inv_n;
        mean = K + ms;
        rstd = rsqrtf(fmaxf(t.y * inv_n - ms * ms, 0.f) + eps);
      } else {
        rstd = rsqrtf(kf_row_sum<THREADS, ROWT>(q, sh) * inv_n + eps);  // K = 0: q = sum of x^2
      }
    } else {
      const float K = (KIND != 1 && live) ? kf_f(xr[0]) : 0.f;
      float s = 0.f, q = 0.f;
      for (int64_t base = (int64_t)lane * VEC; live && base < n; base += (int64_t)ROWT * VEC) {
        kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
#pragma unroll
        for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
      }
      if constexpr (KIND != 1) {
        const float ms = kf_row_sum<THREADS, ROWT>(s, sh) * inv_n;
        const float var = fmaxf(kf_row_sum<THREADS, ROWT>(q, sh) * inv_n - ms * ms, 0.f);
        mean = K + ms;
        rstd = rsqrtf(var + eps);
      } else {
        rstd = rsqrtf(kf_row_sum<THREADS, ROWT>(q, sh) * inv_n + eps);
      }
    }
    if (!live) continue;
    TO* yr = y + row * n;
    const int64_t cbase = (KIND == 2) ? (row % G) * cg : 0;
    // For a 16-bit output, (x - mean) * rstd as one fma with -mean * rstd (its rounding error,
    // 2^-24 |mean| rstd, is far below a bf16/f16 ulp); an absent weight / bias is 1 / 0, so the
    // affine is one fma with no per-element select.
    const float nmr = -mean * rstd;
    auto emit = [&](int64_t base, const kf_pack<TI, VEC>& xp, int it) {
      float wv[VEC], bv[VEC];
      if constexpr (PRE) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) { wv[j] = w ? kf_f(wp[it].v[j]) : 1.f; bv[j] = b ? kf_f(bp[it].v[j]) : 0.f; }
      } else if constexpr (KIND == 2) {
        const int64_t c = cbase + base / hw;
        const float wc = w ? kf_f(w[c]) : 1.f, bc = b ? kf_f(b[c]) : 0.f;
#pragma unroll
        for (int j = 0; j < VEC; ++j) { wv[j] = wc; bv[j] = bc; }
      } else {
        kf_pack<TI, VEC> pw, pb;
        if (w) pw = kf_load<TI, VEC>(w + base);
        if (b) pb = kf_load<TI, VEC>(b + base);
#pragma unroll
        for (int j = 0; j < VEC; ++j) { wv[j] = w ? kf_f(pw.v[j]) : 1.f; bv[j] = b ? kf_f(pb.v[j]) : 0.f; }
      }
      float r[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (KIND == 1) {
          const float h = kf_f(xp.v[j]) * rstd;
          if (ROUND2) r[j] = w ? wv[j] * kf_f(kf_to<TO>(h)) : h;
          else r[j] = w ? h * (wv[j] + woff) : h;
        } else if constexpr (sizeof(TO) == 2) {
          r[j] = fmaf(fmaf(kf_f(xp.v[j]), rstd, nmr), wv[j], bv[j]);
        } else {
          r[j] = fmaf((kf_f(xp.v[j]) - mean) * rstd, wv[j], bv[j]);
        }
      }
      // row in registers: unrolled, affine loads follow stores (see kf_store_plain); else a runtime loop
      if constexpr (ITEMS > 0) kf_store_plain<TO, VEC>(yr + base, kf_to_pack<TO, VEC>(r));
      else kf_store<TO, VEC>(yr + base, kf_to_pack<TO, VEC>(r));
    };
    if constexpr (ITEMS > 0) {
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int64_t base = ((int64_t)it * ROWT + lane) * VEC;
        if (base < n) emit(base, v[it], it);
      }
      if constexpr (PIPE_ON) {
#pragma unroll
        for (int it = 0; it < ITEMS; ++it) v[it] = vn[it];
      }
    } else {
      for (int64_t base = (int64_t)lane * VEC; base < n; base += (int64_t)ROWT * VEC) {
        emit(base, kf_load<TI, VEC>(xr + base), 0);
      }
    }
  }
}
"""

_CUDA_NORM_LAUNCH = r"""
  if (@ROWS@ <= 0 || @N@ <= 0) return 0;
  const int64_t kr = @ROWS@, nn = @N@;
  const int64_t rpb = @THREADS@ / @ROWT@;
  const int64_t blocks = (kr + rpb - 1) / rpb;
  unsigned grid = (unsigned)(blocks < 2147483647 ? blocks : 2147483647);
  const bool fast = (@UNIT@ % @VEC@ == 0) && nn <= (int64_t)@CAP@ && kf_aligned(x, @VEC@ * sizeof(TI)) &&
                    kf_aligned(y, @VEC@ * sizeof(TO)) && (!@W@ || kf_aligned(@W@, @VEC@ * sizeof(TI))) &&
                    (!@B@ || kf_aligned(@B@, @VEC@ * sizeof(TI)));
  if (fast && @PIPE@) {  // persistent: as many blocks as are resident at once (no state kept between calls)
    int dev = 0, sms = 0, occ = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &occ, kf_norm<@THREADS@, @ROWT@, @VEC@, @ITEMS@, @KIND@, @ROUND2@, @WPRE@, @TWOR@, @PIPE@, @MINB@>, @THREADS@, 0);
    const int64_t resident = (sms > 0 && occ > 0) ? (int64_t)sms * occ : 1024;
    if ((int64_t)grid > resident) grid = (unsigned)resident;
  }
  if (fast) kf_norm<@THREADS@, @ROWT@, @VEC@, @ITEMS@, @KIND@, @ROUND2@, @WPRE@, @TWOR@, @PIPE@, @MINB@><<<grid, @THREADS@, 0, stream>>>(
      x, @W@, @B@, y, kr, nn, eps, @WOFF@, @HW@, @CG@, @G@, 1.f / (float)nn);
  else kf_norm<@THREADS@, @ROWT@, 1, 0, @KIND@, @ROUND2@, false, false, false><<<grid, @THREADS@, 0, stream>>>(
      x, @W@, @B@, y, kr, nn, eps, @WOFF@, @HW@, @CG@, @G@, 1.f / (float)nn);
  return (int)cudaGetLastError();
"""


def _norm_launch(task: OpTask, threads: int, rowt: int, vec: int, items: int, p: dict) -> str:
    """The launch code; `p` carries the kernel options (wpre, stats, pipe, minb; absent = off)."""
    op = task.op
    if op == "group_norm":
        names = dict(ROWS="(N * G)", N="(C / G * HxW)", UNIT="HxW", W="weight", B="bias", WOFF="0.f",
                     HW="HxW", CG="(C / G)", G="G")
    elif op == "layer_norm":
        names = dict(ROWS="rows", N="n", UNIT="n", W="weight", B="bias", WOFF="0.f", HW="1", CG="1",
                     G="1")
    else:
        names = dict(ROWS="rows", N="n", UNIT="n", W="weight", B="(const TI*)nullptr",
                     WOFF="weight_offset", HW="1", CG="1", G="1")
    flag = lambda on: "true" if on else "false"  # noqa: E731
    return fill(_CUDA_NORM_LAUNCH, THREADS=threads, ROWT=rowt, VEC=vec, ITEMS=items,
                CAP=(items * rowt * vec) if items else "INT64_MAX", KIND=KIND[op],
                ROUND2=_round2(task), WPRE=flag(p.get("wpre")), TWOR=flag(p.get("stats") == "two"),
                PIPE=flag(p.get("pipe")), MINB=p.get("minb", 1), **names)


def _norm_source(task: OpTask, threads: int, rowt: int, vec: int, cache: bool, p: dict) -> str:
    _, n = _rows_n(task)
    items = cdiv(n, rowt * vec) if cache else 0
    return cuda_head(task) + _CUDA_NORM + entry(task, "cuda", _norm_launch(task, threads, rowt, vec, items, p))


# --- block_row (layer/rms) and block_group (group_norm): one block per row/group
def _block_default(task: OpTask) -> dict:
    _, n = _rows_n(task)
    vec = _vec16(task)
    # two 16-byte packs per thread: measured on the H200, 256 threads x 2 packs beat 512 x 1 and
    # 1024 x 1 on 4096-wide bf16 rows (fewer barrier participants, more rows in flight per SM)
    threads = 128
    for t in (128, 256, 512, 1024):
        if n >= t * vec * 2:
            threads = t
    p = {"threads": threads, "vec": vec, "cache": "regs"}
    if not _block_valid(task, p):
        p["cache"] = "none"
    if task.op in ROW_OPS:
        p.update(wpre=0, stats="one", pipe=0, minb=1)
    return p


def _block_valid(task: OpTask, p: dict) -> bool:
    _, n = _rows_n(task)
    if _unit(task) % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    if p.get("stats") == "two" and (task.op != "layer_norm" or p["cache"] != "regs"):
        return False  # rms_norm has one sum; without the row in registers there is no second pass
    if (p.get("wpre") or p.get("pipe")) and p["cache"] != "regs":
        return False
    if p.get("minb", 1) * p["threads"] > 2048:  # more threads than an SM holds
        return False
    held = 2 if p.get("pipe") else 1  # the next row is in registers too
    return p["cache"] == "none" or \
        cdiv(n, p["threads"] * p["vec"]) * p["vec"] * ELEM_BYTES[task.dtype] * held <= MAX_REG_BYTES


def _block_render(task: OpTask, p: dict) -> str:
    return _norm_source(task, p["threads"], p["threads"], p["vec"], p["cache"] == "regs", p)


_BLOCK_SPACE = {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16), "cache": ("none", "regs")}
register(Family("block_row", ROW_OPS, "cuda",
                {**_BLOCK_SPACE, "wpre": (0, 1), "stats": ("one", "two"), "pipe": (0, 1),
                 "minb": (1, 4, 5, 6, 8, 12, 16)},
                _block_default, _block_valid, _block_render,
                doc="one block per row, row in registers, f32 stats, fused affine; `wpre` loads the "
                    "affine before the row, `stats` one round of shifted sums or two exact rounds, "
                    "`pipe` a persistent grid loading the next row during this one, `minb` blocks per "
                    "SM the compiler must fit"))
register(Family("block_group", ("group_norm",), "cuda", _BLOCK_SPACE, _block_default, _block_valid,
                _block_render, doc="one block per (n, group); group in registers when it fits"))


# --- warp_row: `lanes` threads per row, shuffles only
def _warp_default(task: OpTask) -> dict:
    _, n = _rows_n(task)
    vec = _vec16(task)
    lanes = 32
    for ln in (32, 16, 8, 4):
        if n <= ln * vec * 2:
            lanes = ln
    return {"warps": 4, "lanes": lanes, "vec": vec, "pipe": 0}


def _warp_valid(task: OpTask, p: dict) -> bool:
    _, n = _rows_n(task)
    if _unit(task) % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    held = 2 if p.get("pipe") else 1  # the next row is in registers too
    return cdiv(n, p["lanes"] * p["vec"]) * p["vec"] * ELEM_BYTES[task.dtype] * held <= MAX_REG_BYTES


def _warp_render(task: OpTask, p: dict) -> str:
    return _norm_source(task, p["warps"] * 32, p["lanes"], p["vec"], True, p)


register(Family("warp_row", ROW_OPS + ("group_norm",), "cuda",
                {"warps": (1, 2, 4, 8, 16), "lanes": (4, 8, 16, 32), "vec": (1, 2, 4, 8, 16), "pipe": (0, 1)},
                _warp_default, _warp_valid, _warp_render,
                doc="a warp (or `lanes` threads) per row, row in registers; `pipe` a persistent grid "
                    "loading the next row during this one"))


# --- split rows: a row (or group) over several CTAs, for few long rows
_CUDA_NSPLIT = r"""
#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// One output pack: the normalised values with the op's affine (KIND as in kf_norm).
template <int KIND, bool ROUND2, int VEC>
__device__ __forceinline__ kf_pack<TO, VEC> kf_norm_pack(const kf_pack<TI, VEC>& xp, int64_t base, float mean,
    float rstd, const TI* __restrict__ w, const TI* __restrict__ b, float woff, int64_t cbase, int64_t hw) {
  float r[VEC];
  if constexpr (KIND == 2) {
    const int64_t c = cbase + base / hw;
    const float a = rstd * (w ? kf_f(w[c]) : 1.f);
    const float bb = (b ? kf_f(b[c]) : 0.f) - mean * a;
#pragma unroll
    for (int j = 0; j < VEC; ++j) r[j] = kf_f(xp.v[j]) * a + bb;
  } else if constexpr (KIND == 0) {
    kf_pack<TI, VEC> pw, pb;
    if (w) pw = kf_load<TI, VEC>(w + base);
    if (b) pb = kf_load<TI, VEC>(b + base);
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      r[j] = fmaf((kf_f(xp.v[j]) - mean) * rstd, w ? kf_f(pw.v[j]) : 1.f, b ? kf_f(pb.v[j]) : 0.f);
  } else {
    kf_pack<TI, VEC> pw;
    if (w) pw = kf_load<TI, VEC>(w + base);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float h = kf_f(xp.v[j]) * rstd;
      if (ROUND2) r[j] = w ? kf_f(pw.v[j]) * kf_f(kf_to<TO>(h)) : h;
      else r[j] = w ? h * (kf_f(pw.v[j]) + woff) : h;
    }
  }
  return kf_to_pack<TO, VEC>(r);
}

// (sum, sumsq) of the whole block in one shared-memory round.
template <int NW> __device__ __forceinline__ float2 kf_split_sum2(float s, float q, float2* sh) {
  s = kf_warp_sum(s, 32);
  q = kf_warp_sum(q, 32);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_float2(s, q);
  __syncthreads();
  float2 r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : make_float2(0.f, 0.f);
  r.x = kf_warp_sum(r.x, 32);
  r.y = kf_warp_sum(r.y, 32);
  return r;
}

// A row (group) split over C CTAs, each owning a chunk of `chunk` elements. Phase 1 reads the
// chunk once, keeping its first KEEPK sweeps in shared memory (each thread the packs it will
// write), and reduces it to shifted (sum, sumsq) (shift = the row's first element, the same in
// every CTA, so partials add exactly). The row's partials are combined in double:
//   COOP = false: the C CTAs are one thread-block cluster (sm_90), through distributed shared
//                 memory; CTA r of cluster q is chunk r of row q.
//   COOP = true:  a cooperative grid (every CTA resident): CTA i is chunk i % C of row i / C,
//                 partials go through the first 8 * gridDim.x bytes of y (scratch that the
//                 write phase overwrites) between two grid-wide barriers.
// Phase 2 normalises the chunk backwards (the last-read part is likeliest in L2; kept sweeps,
// the first ones, come last). One launch, no allocation.
template <int THREADS, int VEC, int UNROLL, int KEEPK, int KIND, bool ROUND2, bool COOP>
__global__ void __launch_bounds__(THREADS) kf_norm_split(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, int64_t n, int64_t C, int64_t chunk, float eps, float woff,
    int64_t hw, int64_t cg, int64_t G) {
  constexpr int NW = THREADS / 32;
  __shared__ float2 sh[32];
  __shared__ float2 part;
  __shared__ float stat[2];
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
  const float K = (KIND != 1) ? kf_f(xr[0]) : 0.f;
  float s = 0.f, q = 0.f;
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
#pragma unroll
      for (int j = 0; j < VEC; ++j) { const float d = kf_f(p[u].v[j]) - K; s += d; q += d * d; }
    }
  }
  for (; base < hi; base += STEP, ++k) {
    const kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
    if (k < KEEPK) keep[k * THREADS + threadIdx.x] = p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
  }
  const float2 t = kf_split_sum2<NW>(s, q, sh);
  double ds = 0.0, dq = 0.0;
  if constexpr (COOP) {
    if (threadIdx.x == 0) reinterpret_cast<float2*>(y)[blockIdx.x] = t;
    kf_cg::this_grid().sync();  // every chunk's partial is in the scratch
    if (threadIdx.x < 32) {
      const float2* sc = reinterpret_cast<const float2*>(y) + row * C;
      for (int64_t i = threadIdx.x; i < C; i += 32) {
        const float2 o = __ldcg(sc + i);  // written by other SMs: read at L2, not from L1
        ds += o.x;
        dq += o.y;
      }
    }
  } else {
    kf_cg::cluster_group cl = kf_cg::this_cluster();
    if (threadIdx.x == 0) part = t;
    cl.sync();  // every CTA's partial is visible cluster-wide
    if ((int64_t)threadIdx.x < C) {
      const float2 o = *cl.map_shared_rank(&part, threadIdx.x);
      ds = o.x;
      dq = o.y;
    }
  }
  if (threadIdx.x < 32) {
    for (int o = 16; o > 0; o >>= 1) { ds += __shfl_xor_sync(0xffffffffu, ds, o); dq += __shfl_xor_sync(0xffffffffu, dq, o); }
    if (threadIdx.x == 0) {
      const double ms = ds / (double)n, var = dq / (double)n - ms * ms;
      stat[0] = (float)((double)K + ms);
      stat[1] = KIND == 1 ? rsqrtf((float)(dq / (double)n) + eps) : rsqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    }
  }
  if constexpr (COOP) kf_cg::this_grid().sync();  // every CTA has read the scratch before any writes over it
  else kf_cg::this_cluster().sync();  // no CTA leaves (freeing its shared memory) while a peer may read it
  __syncthreads();
  const float mean = stat[0], rstd = stat[1];
  const int64_t cbase = (KIND == 2) ? (row % G) * cg : 0;
  TO* yr = y + row * n;
  int kk = (int)((hi - 1 - lo) / STEP);
  for (int64_t r0 = lo + (int64_t)kk * STEP; hi > lo && r0 >= lo; r0 -= STEP, --kk) {
    const int64_t bs = r0 + (int64_t)threadIdx.x * VEC;
    if (bs >= hi) continue;
    const kf_pack<TI, VEC> p = kk < KEEPK ? keep[kk * THREADS + threadIdx.x] : kf_load<TI, VEC>(xr + bs);
    kf_store<TO, VEC>(yr + bs, kf_norm_pack<KIND, ROUND2, VEC>(p, bs, mean, rstd, w, b, woff, cbase, hw));
  }
}
"""

_CUDA_NSPLIT_LAUNCH = r"""
  if (@ROWS@ <= 0 || @N@ <= 0) return 0;
  @CHECK@
  const int64_t kr = @ROWS@, nn = @N@;
  const bool fast = (@UNIT@ % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO)) &&
                    kf_aligned(y, 8) && (@KIND@ == 2 || ((!@W@ || kf_aligned(@W@, @VEC@ * sizeof(TI))) &&
                                                        (!@B@ || kf_aligned(@B@, @VEC@ * sizeof(TI)))));
  const size_t smem = (size_t)@KEEPK@ * @THREADS@ * sizeof(kf_pack<TI, @VEC@>);
  if (fast) {
@SPLIT@
  }
  // misaligned, more rows than the split takes, or no cooperative launch: one block per row
  kf_norm<@THREADS@, @THREADS@, 1, 0, @KIND@, @ROUND2@, false, false, false><<<(unsigned)(kr < 2147483647 ? kr : 2147483647), @THREADS@, 0, stream>>>(
      x, @W@, @B@, y, kr, nn, eps, @WOFF@, @HW@, @CG@, @G@, 1.f / (float)nn);
  return (int)cudaGetLastError();
"""

_COOP_SPLIT = r"""
    auto kern = kf_norm_split<@THREADS@, @VEC@, @UNROLL@, @KEEPK@, @KIND@, @ROUND2@, true>;
    const int64_t cap = kf_coop_capacity(kern, @THREADS@, smem);
    int64_t nch = 0;  // chunks per row (not `C`: group_norm's entry point has a parameter C)
    const int64_t chunk = kf_coop_chunks(kr, nn, cap, (int64_t)@THREADS@ * @VEC@, @VEC@, &nch);
    // the partials' scratch (8 bytes a CTA) must fit in y
    if (chunk > 0 && (double)kr * nch * 8 <= (double)kr * nn * sizeof(TO)) {
      const int rc = kf_launch_coop(kern, kr * nch, @THREADS@, smem, stream, x, @W@, @B@, y, nn, nch, chunk, eps,
                                    @WOFF@, (int64_t)@HW@, (int64_t)@CG@, (int64_t)@G@);
      return rc ? rc : (int)cudaGetLastError();
    }
"""

_CLUSTER_SPLIT = r"""
    const int64_t CL = @CLUSTER@;
    if (kr * CL <= 2147483647) {
      const int64_t chunk = ((nn + CL - 1) / CL + @VEC@ - 1) / @VEC@ * @VEC@;
      const int rc = kf_launch_cluster(kf_norm_split<@THREADS@, @VEC@, @UNROLL@, @KEEPK@, @KIND@, @ROUND2@, false>,
                                       kr * CL, @THREADS@, (int)CL, smem, stream, x, @W@, @B@, y, nn, CL, chunk, eps,
                                       @WOFF@, (int64_t)@HW@, (int64_t)@CG@, (int64_t)@G@);
      return rc ? rc : (int)cudaGetLastError();
    }
"""


def _split_render(task: OpTask, p: dict, coop: bool) -> str:
    op = task.op
    if op == "group_norm":
        names = dict(ROWS="(N * G)", N="(C / G * HxW)", UNIT="HxW", W="weight", B="bias", WOFF="0.f",
                     HW="HxW", CG="(C / G)", G="G", CHECK="if (G <= 0 || C % G) return -1;")
    elif op == "layer_norm":
        names = dict(ROWS="rows", N="n", UNIT="n", W="weight", B="bias", WOFF="0.f", HW="1", CG="1", G="1",
                     CHECK="")
    else:
        names = dict(ROWS="rows", N="n", UNIT="n", W="weight", B="(const TI*)nullptr", WOFF="weight_offset",
                     HW="1", CG="1", G="1", CHECK="")
    split = _COOP_SPLIT if coop else _CLUSTER_SPLIT.replace("@CLUSTER@", str(p["cluster"]))
    body = fill(_CUDA_NSPLIT_LAUNCH.replace("@SPLIT@", split.strip("\n")), THREADS=p["threads"], VEC=p["vec"],
                UNROLL=p["unroll"], KEEPK=keep_sweeps(task.dtype, p), KIND=KIND[op], ROUND2=_round2(task),
                **names)
    head = cuda_head(task) + (CUDA_COOP_SPLIT if coop else "")
    return head + _CUDA_NORM + _CUDA_NSPLIT + entry(task, "cuda", body)


def _nsplit_valid(task: OpTask, p: dict) -> bool:
    _, n = _rows_n(task)
    return (_unit(task) % p["vec"] == 0 and p["vec"] * ELEM_BYTES[task.dtype] <= 16 and n >= 2048
            and p["keep"] <= MAX_KEEP_KB and (p["keep"] == 0 or keep_sweeps(task.dtype, p) >= 1))


def _coop_default(task: OpTask) -> dict:
    """512 threads, 4 packs in flight each, up to 96 KB kept per CTA (two CTAs per SM): the whole
    chunk when the tensor fits on chip over 132 SMs x 2 CTAs, else 96 KB of each chunk."""
    rows, n = _rows_n(task)
    # unroll 4: on the H200 group_norm [1,512,128,128] f32 28.3 us, [1,512,256,512] bf16 109 us
    p = {"threads": 512, "vec": _vec16(task), "unroll": 4, "keep": 0}
    p["keep"] = keep_for(task.dtype, cdiv(rows * n, 264), 96)
    if keep_sweeps(task.dtype, p) < 1:
        p["keep"] = 0
    return p


def _coop_valid(task: OpTask, p: dict) -> bool:
    rows, _ = _rows_n(task)
    return rows <= 2048 and _nsplit_valid(task, p)


register(Family("coop_row", ROW_OPS + ("group_norm",), "cuda",
                {"threads": (256, 512, 1024), "vec": (1, 2, 4, 8), "unroll": (1, 2, 4), "keep": KEEP_KB},
                _coop_default, _coop_valid, lambda t, p: _split_render(t, p, True),
                doc="few long rows (groups) over the whole GPU: a cooperative grid, each CTA one chunk "
                    "(`keep` KB of it held in shared memory), partial sums combined between two grid "
                    "barriers through scratch in y; one launch, no allocation"))


def _ncluster_default(task: OpTask) -> dict:
    """Rows x cluster about one CTA per SM (132) for few rows; for many long rows a 16-CTA
    cluster per row whose chunks (up to 96 KB) stay on chip, so x is read from DRAM once."""
    rows, n = _rows_n(task)
    vec = _vec16(task)
    cl = 2
    for c in (4, 8, 16):
        if (rows * c <= 132 or n * ELEM_BYTES[task.dtype] >= c * 32 * 1024) and n // c >= 1024 * vec:
            cl = c
    p = {"cluster": cl, "threads": 1024 if n // cl >= 1024 * vec * 4 else 512, "vec": vec, "unroll": 2, "keep": 0}
    if rows * cl > 132:  # waves of clusters: DRAM re-reads are what keeping on chip saves
        # 512 x unroll 4: best on the H200 for layer_norm [1024, 131072] f32 and softmax
        # [2048, 262144] f32 (16-CTA clusters of 1024 threads do not all fit at once)
        p.update(threads=512, unroll=4, keep=keep_for(task.dtype, cdiv(n, cl), 96))
        if keep_sweeps(task.dtype, p) < 1 or n // cl < 512 * vec:
            p["keep"] = 0
    return p


def _ncluster_valid(task: OpTask, p: dict) -> bool:
    _, n = _rows_n(task)
    return n // p["cluster"] >= p["threads"] * p["vec"] and _nsplit_valid(task, p)


register(Family("cluster_row", ROW_OPS, "cuda",
                {"cluster": (2, 4, 8, 16), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8),
                 "unroll": (1, 2, 4), "keep": KEEP_KB},
                _ncluster_default, _ncluster_valid, lambda t, p: _split_render(t, p, False),
                doc="sm_90 thread-block cluster per long row: DSMEM exchange of partial sums, one launch; "
                    "`keep` KB of each CTA's chunk held in shared memory instead of re-read"))


# --- group_norm two_phase
_CUDA_GN2 = r"""
// Phase 1: block (s, ng) reduces split s of group ng to shifted (sum, sumsq); the shift is the
// group's first element, the same for every split so partials add up exactly.
template <int THREADS, int VEC>
__global__ void __launch_bounds__(THREADS) kf_gn_stats(const TI* __restrict__ x, float* __restrict__ part,
                                                      int64_t ge, int64_t chunk) {
  __shared__ float sh[32];
  constexpr int NW = THREADS / 32;
  const int64_t ng = blockIdx.y, lo = (int64_t)blockIdx.x * chunk;
  const int64_t hi = (lo + chunk < ge) ? lo + chunk : ge;
  const TI* xg = x + ng * ge;
  const float K = kf_f(xg[0]);
  float s = 0.f, q = 0.f;
  for (int64_t base = lo + (int64_t)threadIdx.x * VEC; base < hi; base += (int64_t)THREADS * VEC) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xg + base);
#pragma unroll
    for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
  }
  s = kf_block_sum<NW>(s, sh);
  q = kf_block_sum<NW>(q, sh);
  if (threadIdx.x == 0) {
    part[(ng * gridDim.x + blockIdx.x) * 2] = s;
    part[(ng * gridDim.x + blockIdx.x) * 2 + 1] = q;
  }
}

// Phase 2: block (s, ng) combines the group's partials (in double: they are few) and
// normalises split s with the per-channel affine folded into one multiply-add.
template <int THREADS, int VEC, bool REVERSE>
__global__ void __launch_bounds__(THREADS) kf_gn_apply(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, const float* __restrict__ part, int64_t ge, int64_t chunk,
    int64_t hw, int64_t cg, int64_t G, int splits, float eps) {
  __shared__ float stat[2];
  const int64_t nblk = (int64_t)gridDim.x * gridDim.y;
  int64_t lin = (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
  if (REVERSE) lin = nblk - 1 - lin;
  const int64_t ng = lin / gridDim.x, sidx = lin - ng * gridDim.x;
  const TI* xg = x + ng * ge;
  if (threadIdx.x < 32) {
    double s = 0.0, q = 0.0;
    for (int k = threadIdx.x; k < splits; k += 32) { s += part[(ng * splits + k) * 2]; q += part[(ng * splits + k) * 2 + 1]; }
    for (int o = 16; o > 0; o >>= 1) { s += __shfl_xor_sync(0xffffffffu, s, o); q += __shfl_xor_sync(0xffffffffu, q, o); }
    if (threadIdx.x == 0) {
      const double ms = s / (double)ge, var = q / (double)ge - ms * ms;
      stat[0] = (float)((double)kf_f(xg[0]) + ms);
      stat[1] = rsqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    }
  }
  __syncthreads();
  const float mean = stat[0], rstd = stat[1];
  const int64_t lo = sidx * chunk, hi = (lo + chunk < ge) ? lo + chunk : ge;
  const int64_t cbase = (ng % G) * cg;
  TO* yg = y + ng * ge;
  for (int64_t base = lo + (int64_t)threadIdx.x * VEC; base < hi; base += (int64_t)THREADS * VEC) {
    const int64_t c = cbase + base / hw;
    const float a = rstd * (w ? kf_f(w[c]) : 1.f);
    const float bb = (b ? kf_f(b[c]) : 0.f) - mean * a;
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xg + base);
    kf_pack<TO, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(kf_f(p.v[j]) * a + bb);
    kf_store<TO, VEC>(yg + base, o);
  }
}
"""

_CUDA_GN2_LAUNCH = r"""
  if (N <= 0 || C <= 0 || HxW <= 0) return 0;
  if (G <= 0 || C % G) return -1;
  const int64_t groups = N * G, ge = C / G * HxW;
  if (groups > 65535) {  // more groups than gridDim.y takes: one block per group
    kf_norm<@THREADS@, @THREADS@, 1, 0, 2, false, false, false, false><<<(unsigned)(groups < 2147483647 ? groups : 2147483647), @THREADS@, 0, stream>>>(
        x, weight, bias, y, groups, ge, eps, 0.f, HxW, C / G, G, 1.f / (float)ge);
    return (int)cudaGetLastError();
  }
  const int S = @SPLITS@;
  float* part = nullptr;
  cudaError_t err = cudaMallocAsync((void**)&part, (size_t)(groups * S * 2) * sizeof(float), stream);
  if (err != cudaSuccess) return (int)err;
  const dim3 grid((unsigned)S, (unsigned)groups);
  const bool fast = (HxW % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO));
  if (fast) {
    const int64_t chunk = ((ge + S - 1) / S + @VEC@ - 1) / @VEC@ * @VEC@;
    kf_gn_stats<@THREADS@, @VEC@><<<grid, @THREADS@, 0, stream>>>(x, part, ge, chunk);
    kf_gn_apply<@THREADS@, @VEC@, @REVERSE@><<<grid, @THREADS@, 0, stream>>>(x, weight, bias, y, part, ge, chunk, HxW, C / G, G, S, eps);
  } else {
    const int64_t chunk = (ge + S - 1) / S;
    kf_gn_stats<@THREADS@, 1><<<grid, @THREADS@, 0, stream>>>(x, part, ge, chunk);
    kf_gn_apply<@THREADS@, 1, @REVERSE@><<<grid, @THREADS@, 0, stream>>>(x, weight, bias, y, part, ge, chunk, HxW, C / G, G, S, eps);
  }
  cudaFreeAsync(part, stream);
  return (int)cudaGetLastError();
"""


def _gn2_default(task: OpTask) -> dict:
    groups, ge = _rows_n(task)
    vec = _vec16(task)
    splits = 1
    for s in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if groups * s <= 8 * 132 and ge // s >= 4096:
            splits = s
    return {"threads": 512 if ge // splits >= 512 * vec * 2 else 256, "vec": vec, "splits": splits,
            "reverse": 1}


def _gn2_valid(task: OpTask, p: dict) -> bool:
    groups, ge = _rows_n(task)
    return (groups <= 65535 and _unit(task) % p["vec"] == 0 and p["vec"] * ELEM_BYTES[task.dtype] <= 32
            and ge // p["splits"] >= p["threads"])


def _gn2_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_GN2_LAUNCH, SPLITS=p["splits"], VEC=p["vec"], THREADS=p["threads"],
                REVERSE="true" if p["reverse"] else "false")
    return cuda_head(task) + _CUDA_NORM + _CUDA_GN2 + entry(task, "cuda", body)


register(Family("two_phase", ("group_norm",), "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "splits": (1, 2, 4, 8, 16, 32, 64, 128, 256), "reverse": (0, 1)},
                _gn2_default, _gn2_valid, _gn2_render,
                doc="partial sums over many blocks per group, then combine-and-apply"))


# --- group_norm cluster: one thread-block cluster per group (sm_90), no scratch, one launch
_CUDA_GNC = r"""
#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// (sum, sumsq) of the whole block in one shared-memory round: half the barriers of two sums.
template <int NW> __device__ __forceinline__ float2 kf_block_sum2(float s, float q, float2* sh) {
  s = kf_warp_sum(s, 32);
  q = kf_warp_sum(q, 32);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_float2(s, q);
  __syncthreads();
  if constexpr ((NW & (NW - 1)) == 0) {  // as kf_block_sum: log2(NW) shuffles reach every lane
    const float2 r = sh[threadIdx.x & (NW - 1)];
    return make_float2(kf_warp_sum(r.x, NW), kf_warp_sum(r.y, NW));
  }
  float2 r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : make_float2(0.f, 0.f);
  r.x = kf_warp_sum(r.x, 32);
  r.y = kf_warp_sum(r.y, 32);
  return r;
}

// Cluster rank r of group ng reduces its chunk to shifted (sum, sumsq) (shift = the group's first
// element, the same in every CTA, so partials add exactly), the cluster combines the partials
// through distributed shared memory, and each CTA normalises its own chunk. The first KEEPK
// sweeps of the chunk are kept in dynamic shared memory as they are read (each thread keeps the
// packs it will write, so no barrier is needed between keep and use); the rest is re-read,
// L2-resident for chunks of a few hundred KB, so DRAM sees most of x once.
template <int THREADS, int VEC, int UNROLL, int KEEPK>
__global__ void __launch_bounds__(THREADS) kf_gn_cluster(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, int64_t ge, int64_t chunk, int64_t hw, int64_t cg, int64_t G,
    float eps) {
  constexpr int NW = THREADS / 32;
  __shared__ float2 sh[32];
  __shared__ float2 part;
  __shared__ float stat[2];
  extern __shared__ __align__(16) unsigned char kf_keep_raw[];
  kf_pack<TI, VEC>* keep = reinterpret_cast<kf_pack<TI, VEC>*>(kf_keep_raw);
  kf_cg::cluster_group cl = kf_cg::this_cluster();
  const int csize = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int64_t ng = blockIdx.x / csize;
  const int64_t lo = (int64_t)rank * chunk, hi = (lo + chunk < ge) ? lo + chunk : ge;
  const TI* xg = x + ng * ge;
  const float K = kf_f(xg[0]);
  float s = 0.f, q = 0.f;
  constexpr int64_t STEP = (int64_t)THREADS * VEC;
  int64_t base = lo + (int64_t)threadIdx.x * VEC;
  int k = 0;  // sweep index of `base` within the chunk
  for (; base + (UNROLL - 1) * STEP < hi; base += UNROLL * STEP, k += UNROLL) {
    kf_pack<TI, VEC> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) p[u] = kf_load<TI, VEC>(xg + base + u * STEP);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (k + u < KEEPK) keep[(k + u) * THREADS + threadIdx.x] = p[u];
#pragma unroll
      for (int j = 0; j < VEC; ++j) { const float d = kf_f(p[u].v[j]) - K; s += d; q += d * d; }
    }
  }
  for (; base < hi; base += STEP, ++k) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xg + base);
    if (k < KEEPK) keep[k * THREADS + threadIdx.x] = p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
  }
  const float2 t = kf_block_sum2<NW>(s, q, sh);
  if (threadIdx.x == 0) part = t;
  cl.sync();  // every CTA's partial is visible cluster-wide
  if (threadIdx.x < 32) {
    double ds = 0.0, dq = 0.0;
    if ((int)threadIdx.x < csize) {
      const float2 o = *cl.map_shared_rank(&part, (unsigned)threadIdx.x);
      ds = o.x;
      dq = o.y;
    }
    for (int o = 16; o > 0; o >>= 1) { ds += __shfl_xor_sync(0xffffffffu, ds, o); dq += __shfl_xor_sync(0xffffffffu, dq, o); }
    if (threadIdx.x == 0) {
      const double ms = ds / (double)ge, var = dq / (double)ge - ms * ms;
      stat[0] = (float)((double)K + ms);
      stat[1] = rsqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    }
  }
  cl.sync();  // no CTA leaves (freeing its shared memory) while a peer may still read it
  const float mean = stat[0], rstd = stat[1];
  const int64_t cbase = (ng % G) * cg;
  TO* yg = y + ng * ge;
  // Backwards: what this CTA read last is the part most likely still in L2, and the kept
  // sweeps (the first ones) come last, when the re-read ones have been issued.
  int kk = (int)((hi - 1 - lo) / STEP);
  for (int64_t row0 = lo + (int64_t)kk * STEP; row0 >= lo; row0 -= STEP, --kk) {
    const int64_t bs = row0 + (int64_t)threadIdx.x * VEC;
    if (bs >= hi) continue;
    const int64_t c = cbase + bs / hw;
    const float a = rstd * (w ? kf_f(w[c]) : 1.f);
    const float bb = (b ? kf_f(b[c]) : 0.f) - mean * a;
    const kf_pack<TI, VEC> p = kk < KEEPK ? keep[kk * THREADS + threadIdx.x] : kf_load<TI, VEC>(xg + bs);
    kf_pack<TO, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(kf_f(p.v[j]) * a + bb);
    kf_store<TO, VEC>(yg + bs, o);
  }
}

template <int THREADS, int VEC, int UNROLL, int KEEPK>
inline int kf_gn_cluster_launch(const TI* x, const TI* w, const TI* b, TO* y, int64_t groups, int64_t ge,
                                int64_t chunk, int64_t hw, int64_t cg, int64_t G, float eps, int cl,
                                cudaStream_t stream) {
  const size_t smem = (size_t)KEEPK * THREADS * sizeof(kf_pack<TI, VEC>);
  return kf_launch_cluster(kf_gn_cluster<THREADS, VEC, UNROLL, KEEPK>, groups * cl, THREADS, cl, smem, stream,
                           x, w, b, y, ge, chunk, hw, cg, G, eps);
}
"""

_CUDA_GNC_LAUNCH = r"""
  if (N <= 0 || C <= 0 || HxW <= 0) return 0;
  if (G <= 0 || C % G) return -1;
  const int64_t groups = N * G, ge = C / G * HxW, CL = @CLUSTER@;
  if (groups * CL > 2147483647) {  // more CTAs than one launch takes: one block per group
    kf_norm<512, 512, 1, 0, 2, false, false, false, false><<<(unsigned)(groups < 2147483647 ? groups : 2147483647), 512, 0, stream>>>(
        x, weight, bias, y, groups, ge, eps, 0.f, HxW, C / G, G, 1.f / (float)ge);
    return (int)cudaGetLastError();
  }
  int rc;
  if ((HxW % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO))) {
    const int64_t chunk = ((ge + CL - 1) / CL + @VEC@ - 1) / @VEC@ * @VEC@;
    rc = kf_gn_cluster_launch<@THREADS@, @VEC@, @UNROLL@, @KEEPK@>(x, weight, bias, y, groups, ge, chunk, HxW, C / G, G, eps, (int)CL, stream);
  } else {
    const int64_t chunk = (ge + CL - 1) / CL;
    rc = kf_gn_cluster_launch<@THREADS@, 1, 1, 0>(x, weight, bias, y, groups, ge, chunk, HxW, C / G, G, eps, (int)CL, stream);
  }
  return rc ? rc : (int)cudaGetLastError();
"""



def _gnc_chunk(task: OpTask, p: dict) -> int:
    _, ge = _rows_n(task)
    return cdiv(cdiv(ge, p["cluster"]), p["vec"]) * p["vec"]


def _gnc_keepk(task: OpTask, p: dict) -> int:
    """Sweeps (THREADS x VEC elements each) of a CTA's chunk kept in shared memory."""
    sweep = p["threads"] * p["vec"]
    return min(p["keep"] * 1024 // (sweep * ELEM_BYTES[task.dtype]), cdiv(_gnc_chunk(task, p), sweep))


def _gnc_default(task: OpTask) -> dict:
    """Enough CTAs for >= one per SM (132 on an H100/H200) with the group split evenly; the whole
    chunk kept on chip when two CTAs of it still fit on an SM (DRAM then reads x exactly once)."""
    groups, ge = _rows_n(task)
    vec = _vec16(task)
    cl = 1
    for c in (2, 4, 8):
        if groups * cl < 132 and ge // c >= 1024 * vec:
            cl = c
    cl = max(cl, 2)
    threads = 1024 if ge // cl >= 1024 * vec * 8 else 512
    if groups * ge * ELEM_BYTES[task.dtype] <= 40 * 2**20 and cl * threads > 4096:
        # H200, measured (bench/probe_clusters.py): clusters of more than 4096 threads do not all fit
        # at once (8 x 1024: 30 resident for 32 groups), so a small tensor would run in two waves
        threads = 4096 // cl
    p = {"cluster": cl, "threads": threads, "vec": vec, "unroll": 2, "keep": 0}
    need_kb = cdiv(_gnc_chunk(task, p) * ELEM_BYTES[task.dtype], 1024)
    for kb in _GNC_SPACE["keep"]:
        if need_kb <= kb <= 112:
            p["keep"] = kb
            break
    return p


def _gnc_valid(task: OpTask, p: dict) -> bool:
    groups, ge = _rows_n(task)
    return (_unit(task) % p["vec"] == 0 and p["vec"] * ELEM_BYTES[task.dtype] <= 16
            and ge // p["cluster"] >= p["threads"] * p["vec"] and groups * p["cluster"] < 2**31
            and p["keep"] <= MAX_KEEP_KB
            # a keep larger than the chunk is the same kernel as the smallest one that holds it
            and (p["keep"] == 0 or _gnc_keepk(task, {**p, "keep": _GNC_SPACE["keep"][
                _GNC_SPACE["keep"].index(p["keep"]) - 1]}) < _gnc_keepk(task, p)))


def _gnc_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_GNC_LAUNCH, CLUSTER=p["cluster"], VEC=p["vec"], THREADS=p["threads"], UNROLL=p["unroll"],
                KEEPK=_gnc_keepk(task, p))
    return cuda_head(task) + _CUDA_NORM + _CUDA_GNC + entry(task, "cuda", body)


_GNC_SPACE = {"cluster": (2, 4, 8, 16), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8),
              "unroll": (1, 2, 4), "keep": (0, 32, 64, 96, 128, 160, 192, 224)}
register(Family("cluster_group", ("group_norm",), "cuda", _GNC_SPACE, _gnc_default, _gnc_valid, _gnc_render,
                doc="sm_90 thread-block cluster per group: DSMEM stats exchange, one launch, no scratch, "
                    "`keep` KB of each CTA's chunk held in shared memory instead of re-read"))


# ------------------------------------------------------------------------------- CPU

_CPU_ROWS = r"""
inline int kf_norm_rows(const TI* x, const TI* w, const TI* b, TO* y, int64_t rows, int64_t n, float eps,
                        float woff) {
#pragma omp parallel for schedule(static, @GRAIN@) if(rows > 1 && rows * n >= kf_omp_min_work)
  for (int64_t r = 0; r < rows; ++r) {
    const TI* xr = x + r * n;
    TO* yr = y + r * n;
    float mean = 0.f, q = 0.f;
    if (@KIND@ == 0) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += kf_in(xr[j]);
      mean = s / (float)n;
#pragma omp simd reduction(+ : q)
      for (int64_t j = 0; j < n; ++j) { const float d = kf_in(xr[j]) - mean; q += d * d; }
    } else {
#pragma omp simd reduction(+ : q)
      for (int64_t j = 0; j < n; ++j) { const float v = kf_in(xr[j]); q += v * v; }
    }
    const float rstd = 1.f / sqrtf(q / (float)n + eps);
    if (@KIND@ == 0) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        float o = (kf_in(xr[j]) - mean) * rstd;
        if (w) o *= kf_in(w[j]);
        if (b) o += kf_in(b[j]);
        yr[j] = kf_out(o);
      }
    } else if (w && @ROUND2@) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = kf_out(kf_in(w[j]) * kf_in(kf_round(kf_in(xr[j]) * rstd)));
    } else if (w) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = kf_out(kf_in(xr[j]) * rstd * (kf_in(w[j]) + woff));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = kf_out(kf_in(xr[j]) * rstd);
    }
  }
  return 0;
}
"""


def _cpu_rows_render(task: OpTask, p: dict) -> str:
    src = fill(_CPU_ROWS, GRAIN=p["grain"], KIND=KIND[task.op], ROUND2="1" if _round2(task) == "true" else "0")
    call = ("kf_norm_rows(x, weight, bias, y, rows, n, eps, 0.f)" if task.op == "layer_norm"
            else "kf_norm_rows(x, weight, (const TI*)0, y, rows, n, eps, weight_offset)")
    return cpu_head(task) + src + entry(task, "cpu", f"  return {call};")


def _cpu_rows_default(task: OpTask) -> dict:
    rows, _ = _rows_n(task)
    return {"grain": pow2_at_most(max(1, rows // 64), (1, 4, 16, 64))}


register(Family("rows_omp", ROW_OPS, "cpu", {"grain": (1, 4, 16, 64)}, _cpu_rows_default,
                lambda t, p: True, _cpu_rows_render, doc="OpenMP over rows, omp simd passes"))


_CPU_GROUPS = r"""
inline int kf_group_norm(const TI* x, const TI* w, const TI* b, TO* y, int64_t N, int64_t C, int64_t HxW,
                         int64_t G, float eps) {
  if (N <= 0 || C <= 0 || HxW <= 0) return 0;
  if (G <= 0 || C % G) return -1;
  const int64_t cg = C / G, ge = cg * HxW;
#pragma omp parallel for schedule(dynamic, 1) if(N * G > 1 && N * C * HxW >= kf_omp_min_work)
  for (int64_t ng = 0; ng < N * G; ++ng) {
    const TI* xg = x + ng * ge;
    TO* yg = y + ng * ge;
    const float K = kf_in(xg[0]);
    double s = 0.0, q = 0.0;
    for (int64_t c0 = 0; c0 < ge; c0 += @TILE@) {
      const int64_t c1 = c0 + @TILE@ < ge ? c0 + @TILE@ : ge;
      float fs = 0.f, fq = 0.f;
#pragma omp simd reduction(+ : fs, fq)
      for (int64_t j = c0; j < c1; ++j) { const float d = kf_in(xg[j]) - K; fs += d; fq += d * d; }
      s += fs;
      q += fq;
    }
    const double ms = s / (double)ge, var = q / (double)ge - ms * ms;
    const float mean = (float)(K + ms), rstd = 1.f / sqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    for (int64_t c = 0; c < cg; ++c) {
      const int64_t ch = (ng % G) * cg + c;
      const float a = rstd * (w ? kf_in(w[ch]) : 1.f), bb = (b ? kf_in(b[ch]) : 0.f) - mean * a;
      const TI* xc = xg + c * HxW;
      TO* yc = yg + c * HxW;
#pragma omp simd
      for (int64_t j = 0; j < HxW; ++j) yc[j] = kf_out(kf_in(xc[j]) * a + bb);
    }
  }
  return 0;
}
"""


def _cpu_groups_render(task: OpTask, p: dict) -> str:
    src = fill(_CPU_GROUPS, TILE=p["tile"])
    return cpu_head(task) + src + entry(task, "cpu", "  return kf_group_norm(x, weight, bias, y, N, C, HxW, G, eps);")


register(Family("groups_omp", ("group_norm",), "cpu", {"tile": (256, 1024, 4096, 16384)},
                lambda t: {"tile": 1024}, lambda t, p: True, _cpu_groups_render,
                doc="OpenMP over (n, group): shifted f32 tiles summed in double, then apply"))
