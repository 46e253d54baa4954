"""What every norm family shares: the op list, rows and vector-pack helpers, and the `kf_norm`
kernel template (the device code of the row designs, reused by the split and group ones)."""
from __future__ import annotations

from kforge_tui.search.families._common import ELEM_BYTES, cdiv, cuda_head, entry, fill
from kforge_tui.regions.patterns import OpTask
from kforge_tui.regions import patterns

ROW_OPS = ("layer_norm", "rms_norm")
# Bytes of row a thread may hold in registers (as loaded: 64 f32 or 128 bf16/f16 values) before
# spills cost more than a re-read.
MAX_REG_BYTES = 256
KIND = {"layer_norm": 0, "rms_norm": 1, "group_norm": 2}


def rows_n(task: OpTask) -> tuple[int, int]:
    """(rows, n) as the kernel sees them; a group is a "row" for group_norm."""
    s = patterns.scalar_args(task)
    if task.op == "group_norm":
        return s["N"] * s["G"], s["C"] // s["G"] * s["HxW"]
    return s["rows"], s["n"]


def unit(task: OpTask) -> int:
    """Elements that must share one vector pack boundary (channel length for group_norm)."""
    return patterns.scalar_args(task)["HxW"] if task.op == "group_norm" else rows_n(task)[1]


def vec16(task: OpTask) -> int:
    v = 16 // ELEM_BYTES[task.dtype]
    while v > 1 and unit(task) % v:
        v //= 2
    return v


def round2(task: OpTask) -> str:
    # Llama/Qwen round the normalised value to the input dtype before the weight multiply.
    return "true" if task.op == "rms_norm" and task.params.get("variant", "llama") == "llama" else "false"


CUDA_NORM = r"""
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
                ROUND2=round2(task), WPRE=flag(p.get("wpre")), TWOR=flag(p.get("stats") == "two"),
                PIPE=flag(p.get("pipe")), MINB=p.get("minb", 1), **names)


def norm_source(task: OpTask, threads: int, rowt: int, vec: int, cache: bool, p: dict) -> str:
    _, n = rows_n(task)
    items = cdiv(n, rowt * vec) if cache else 0
    return cuda_head(task) + CUDA_NORM + entry(task, "cuda", _norm_launch(task, threads, rowt, vec, items, p))
