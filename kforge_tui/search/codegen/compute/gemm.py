"""The GEMM core and the matmul designs (mm / addmm / bmm / baddbmm, Linear as permute+addmm).

`Gemm` is C[b, m, n] = sum_k A[b, m, k] * B[b, k, n] plus an epilogue per element, with the
operands read through accessors; conv.py builds its implicit GEMMs on the same three kernels:

  gen_gemm_omp    cpu: BLIS-style packed GEMM, OpenMP over (batch, M tile, N tile), an MR x NR
                  register micro-kernel on GCC vector types, f32 accumulate (f64 for f64);
                  16-bit operands are widened while packing.
  gen_gemm_simt   cuda: shared-memory tiled GEMM with TM x TN register blocking and optional
                  vector loads (f32/f64 and 16-bit; never TF32).
  gen_gemm_wmma   cuda, bf16/f16: tensor cores (nvcuda::wmma 16x16x16, f32 accumulate), cp.async
                  multi-stage pipeline when strides and alignment allow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from kforge_tui.search.codegen.compute.base import (ESIZE, FLOATS, HALVES, Operand, analyze, bcast_strides,
                                                    cdiv, compute_design, entry_fill, fill, flit, load,
                                                    off_expr, otype, prelude, raw_zero, store, usable)


# =============================================================================== GEMM core

@dataclass
class Gemm:
    """C[b, m, n] = sum_k A[b, m, k] * B[b, k, n], then an epilogue per element.

    The accessors are C snippets (bodies of KF_DEV functions of (P, b, m, k) / (P, b, k, n))
    returning the *stored* element (16-bit raw on cpu); indices are always in range when called.
    `a_vec` / `b_vec` describe a plain strided operand for vector loads (None: gather only)."""

    batch: int
    M: int
    N: int
    K: int
    a_dtype: str
    b_dtype: str
    acc: str  # "float" | "double"
    a_raw: str  # body of kf_a_raw
    b_raw: str
    epi: Callable[[str], str]  # backend -> body of kf_epi(P, b, m, n, v)
    a_fast: str  # "k" | "m": which tile dim consecutive threads walk
    b_fast: str  # "n" | "k"
    a_vec: dict | None = None  # {"ptr": expr(P,b,m,k) pointer, "fast", "ok": {V: bool}, "base": expr}
    b_vec: dict | None = None
    kind: str = "matmul"
    flops: float = 0.0


def _gemm_accessors(g: Gemm, backend: str) -> str:
    ta = "kf_a_t"
    tb = "kf_b_t"
    s = (f"typedef {g.acc} acc_t;\n"
         f"KF_DEV {ta} kf_a_raw(const kf_ptrs& P, int64_t b, int64_t m, int64_t k) {{ {g.a_raw} }}\n"
         f"KF_DEV {tb} kf_b_raw(const kf_ptrs& P, int64_t b, int64_t k, int64_t n) {{ {g.b_raw} }}\n"
         f"KF_DEV acc_t kf_a(const kf_ptrs& P, int64_t b, int64_t m, int64_t k) "
         f"{{ return {load(g.a_dtype, backend, 'kf_a_raw(P, b, m, k)', 'acc_t')}; }}\n"
         f"KF_DEV acc_t kf_b(const kf_ptrs& P, int64_t b, int64_t k, int64_t n) "
         f"{{ return {load(g.b_dtype, backend, 'kf_b_raw(P, b, k, n)', 'acc_t')}; }}\n"
         f"KF_DEV void kf_epi(const kf_ptrs& P, int64_t b, int64_t m, int64_t n, acc_t v) "
         f"{{ {g.epi(backend)} }}\n")
    for nm, vec in (("a", g.a_vec), ("b", g.b_vec)):
        t = ta if nm == "a" else tb
        if vec is not None:
            s += (f"KF_DEV const {t}* kf_{nm}_ptr(const kf_ptrs& P, int64_t b, int64_t i, int64_t j) "
                  f"{{ return {vec['ptr']}; }}\n")
        else:
            s += (f"KF_DEV const {t}* kf_{nm}_ptr(const kf_ptrs& P, int64_t b, int64_t i, int64_t j) "
                  f"{{ return ({t}*)0; }}\n")
    return s


def _gemm_types(g: Gemm, backend: str, a_in: int, b_in: int) -> str:
    return f"typedef kf_in{a_in}_t kf_a_t;\ntypedef kf_in{b_in}_t kf_b_t;\n"


def _vec_base(vec: dict | None) -> str:
    return vec["base"] if vec else "(const void*)0"


# ---------------------------------------------------------------------- cpu: packed GEMM

_CPU_GEMM = r"""
#define CG_BT @BT@LL
#define CG_M @M@LL
#define CG_N @N@LL
#define CG_K @K@LL
#define MR @MR@
#define NR @NR@
#define KC @KC@
#define MC @MC@
#define NC @NC@
#define VW ((int)(32 / sizeof(acc_t)))
#define NV (NR / VW)
typedef acc_t kf_vec __attribute__((vector_size(32)));
typedef acc_t kf_vecu __attribute__((vector_size(32), aligned(sizeof(acc_t))));

// C[MR x NR] (leading dim ldc) += Ap[kc x MR] * Bp[kc x NR]; accumulators live in registers.
inline void kf_micro(int64_t kc, const acc_t* __restrict__ ap, const acc_t* __restrict__ bp,
                     acc_t* __restrict__ c, int64_t ldc) {
  kf_vec acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = *(const kf_vecu*)(c + r * ldc + v * VW);
  }
  for (int64_t k = 0; k < kc; ++k) {
    kf_vec bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = *(const kf_vec*)(bp + k * NR + v * VW);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const acc_t a = ap[k * MR + r];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] += a * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) *(kf_vecu*)(c + r * ldc + v * VW) = acc[r][v];
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
@FILL@
  if (CG_BT == 0 || CG_M == 0 || CG_N == 0) return 0;
  const int64_t MT = (CG_M + MC - 1) / MC, NT = (CG_N + NC - 1) / NC;
  const int64_t LDC = ((NC + NR - 1) / NR) * NR, MCP = ((MC + MR - 1) / MR) * MR;
  int failed = 0;
#pragma omp parallel
  {
    const size_t ab = (size_t)MCP * KC * sizeof(acc_t), bb = (size_t)LDC * KC * sizeof(acc_t),
                 cbytes = (size_t)MCP * LDC * sizeof(acc_t);
    acc_t* ap = (acc_t*)aligned_alloc(64, (ab + 63) / 64 * 64);
    acc_t* bp = (acc_t*)aligned_alloc(64, (bb + 63) / 64 * 64);
    acc_t* cb = (acc_t*)aligned_alloc(64, (cbytes + 63) / 64 * 64);
    const bool ok = ap && bp && cb;
    if (!ok) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < CG_BT; ++b)
      for (int64_t mt = 0; mt < MT; ++mt)
        for (int64_t nt = 0; nt < NT; ++nt) {
          if (!ok) continue;
          const int64_t m0 = mt * MC, n0 = nt * NC;
          const int64_t mc = CG_M - m0 < MC ? CG_M - m0 : MC, nc = CG_N - n0 < NC ? CG_N - n0 : NC;
          const int64_t ms = (mc + MR - 1) / MR, ns = (nc + NR - 1) / NR;
          memset(cb, 0, cbytes);
          for (int64_t k0 = 0; k0 < CG_K; k0 += KC) {
            const int64_t kc = CG_K - k0 < KC ? CG_K - k0 : KC;
            for (int64_t s = 0; s < ms; ++s) {
              acc_t* dst = ap + s * kc * MR;
              for (int r = 0; r < MR; ++r) {
                const int64_t m = m0 + s * MR + r;
                if (m < CG_M) {
                  for (int64_t k = 0; k < kc; ++k) dst[k * MR + r] = kf_a(P, b, m, k0 + k);
                } else {
                  for (int64_t k = 0; k < kc; ++k) dst[k * MR + r] = 0;
                }
              }
            }
            for (int64_t t = 0; t < ns; ++t) {
              acc_t* dst = bp + t * kc * NR;
@PACKB@
            }
            for (int64_t t = 0; t < ns; ++t)
              for (int64_t s = 0; s < ms; ++s)
                kf_micro(kc, ap + s * kc * MR, bp + t * kc * NR, cb + s * MR * LDC + t * NR, LDC);
          }
          for (int64_t i = 0; i < mc; ++i)
            for (int64_t j = 0; j < nc; ++j) kf_epi(P, b, m0 + i, n0 + j, cb[i * LDC + j]);
        }
    free(ap);
    free(bp);
    free(cb);
  }
  return failed ? 1 : 0;
}
"""

_PACKB_NFAST = r"""              for (int64_t k = 0; k < kc; ++k)
                for (int c = 0; c < NR; ++c) {
                  const int64_t n = n0 + t * NR + c;
                  dst[k * NR + c] = n < CG_N ? kf_b(P, b, k0 + k, n) : (acc_t)0;
                }"""
_PACKB_KFAST = r"""              for (int c = 0; c < NR; ++c) {
                const int64_t n = n0 + t * NR + c;
                if (n < CG_N) {
                  for (int64_t k = 0; k < kc; ++k) dst[k * NR + c] = kf_b(P, b, k0 + k, n);
                } else {
                  for (int64_t k = 0; k < kc; ++k) dst[k * NR + c] = 0;
                }
              }"""


def cpu_gemm_space():
    return {"mr": (2, 4, 6, 8), "nr": (8, 16, 32), "kc": (64, 128, 256, 512),
            "mc": (16, 32, 64, 128, 256), "nc": (32, 64, 128, 256, 512)}


def cpu_gemm_valid(g: Gemm, p: dict) -> bool:
    vw = 8 if g.acc == "float" else 4
    if p["nr"] % vw or p["nc"] < p["nr"] or p["mc"] < p["mr"]:
        return False
    regs = p["mr"] * (p["nr"] // vw) + p["nr"] // vw
    if regs > 32:
        return False
    return True


def cpu_gemm_default(g: Gemm) -> dict:
    vw = 8 if g.acc == "float" else 4
    nr = 16 if g.N >= 16 else 8
    mr = 6 if nr // vw <= 2 else 4
    if g.M < 6:
        mr = 2 if g.M <= 2 else 4
    kc = 256 if g.K >= 256 else (128 if g.K >= 128 else 64)
    mc = 64 if g.M > 32 else (32 if g.M > 16 else 16)
    nc = 256 if g.N > 256 else (128 if g.N > 64 else 64 if g.N > 32 else 32)
    return {"mr": mr, "nr": nr, "kc": kc, "mc": mc, "nc": nc}


def render_cpu_gemm(g: Gemm, p: dict, a_in: int, b_in: int) -> str:
    src = prelude("cpu") + _gemm_types(g, "cpu", a_in, b_in) + _gemm_accessors(g, "cpu")
    src += fill(_CPU_GEMM, BT=g.batch, M=g.M, N=g.N, K=g.K, MR=p["mr"], NR=p["nr"], KC=p["kc"],
                MC=p["mc"], NC=p["nc"], FILL=entry_fill("cpu"),
                PACKB=_PACKB_KFAST if g.b_fast == "k" else _PACKB_NFAST)
    return src


# ---------------------------------------------------------------------- cuda: SIMT GEMM

_SIMT_GEMM = r"""
#define CG_BT @BT@LL
#define CG_M @M@LL
#define CG_N @N@LL
#define CG_K @K@LL
#define BM @BM@
#define BN @BN@
#define BK @BK@
#define TM @TM@
#define TN @TN@
#define THREADS ((BM / TM) * (BN / TN))

template <int VA, int VB>
__global__ void __launch_bounds__(THREADS) kf_gemm_simt(kf_ptrs P) {
  __shared__ acc_t As[BK][BM + @PAD@];
  __shared__ acc_t Bs[BK][BN + @PAD@];
  const int tid = threadIdx.x;
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);
  const int64_t b = blockIdx.z;
  const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
  acc_t acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0;
  }
  for (int64_t k0 = 0; k0 < CG_K; k0 += BK) {
@LOADA@
@LOADB@
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      acc_t a[TM], bb[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) bb[j] = Bs[kk][tx + j * (BN / TN)];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * bb[j];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t m = m0 + ty + i * (BM / TM);
    if (m >= CG_M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int64_t n = n0 + tx + j * (BN / TN);
      if (n < CG_N) kf_epi(P, b, m, n, acc[i][j]);
    }
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  if (CG_BT == 0 || CG_M == 0 || CG_N == 0) return 0;
  dim3 grid((unsigned)((CG_N + BN - 1) / BN), (unsigned)((CG_M + BM - 1) / BM), (unsigned)CG_BT);
  const bool va = @VA_OK@ && kf_aligned(@VA_BASE@, @VA@ * (int)sizeof(kf_a_t));
  const bool vb = @VB_OK@ && kf_aligned(@VB_BASE@, @VB@ * (int)sizeof(kf_b_t));
  if (va && vb) kf_gemm_simt<@VA@, @VB@><<<grid, THREADS, 0, stream>>>(P);
  else if (va) kf_gemm_simt<@VA@, 1><<<grid, THREADS, 0, stream>>>(P);
  else if (vb) kf_gemm_simt<1, @VB@><<<grid, THREADS, 0, stream>>>(P);
  else kf_gemm_simt<1, 1><<<grid, THREADS, 0, stream>>>(P);
  return (int)cudaGetLastError();
}
"""


def _simt_load(which: str, fast: str) -> str:
    """Tile loader (A: As[kk][mm] from (m, k); B: Bs[kk][nn] from (k, n)) for SIMT GEMMs."""
    if which == "a":
        rows, R, T, V, ptr = "BM", "CG_M", "As", "VA", "kf_a_ptr"
        if fast == "k":  # consecutive threads walk k
            return rf"""    if constexpr (VA > 1) {{
      for (int e = tid; e < BM * (BK / VA); e += THREADS) {{
        const int kk = (e % (BK / VA)) * VA, mm = e / (BK / VA);
        const int64_t m = m0 + mm, k = k0 + kk;
        if (m < CG_M && k < CG_K) {{
          const kf_pk<kf_a_t, VA> v = *reinterpret_cast<const kf_pk<kf_a_t, VA>*>(kf_a_ptr(P, b, m, k));
#pragma unroll
          for (int q = 0; q < VA; ++q) As[kk + q][mm] = @LDA@;
        }} else {{
#pragma unroll
          for (int q = 0; q < VA; ++q) As[kk + q][mm] = 0;
        }}
      }}
    }} else {{
      for (int e = tid; e < BM * BK; e += THREADS) {{
        const int kk = e % BK, mm = e / BK;
        const int64_t m = m0 + mm, k = k0 + kk;
        As[kk][mm] = (m < CG_M && k < CG_K) ? kf_a(P, b, m, k) : (acc_t)0;
      }}
    }}"""
        return rf"""    if constexpr (VA > 1) {{
      for (int e = tid; e < (BM / VA) * BK; e += THREADS) {{
        const int mm = (e % (BM / VA)) * VA, kk = e / (BM / VA);
        const int64_t m = m0 + mm, k = k0 + kk;
        if (m < CG_M && k < CG_K) {{
          const kf_pk<kf_a_t, VA> v = *reinterpret_cast<const kf_pk<kf_a_t, VA>*>(kf_a_ptr(P, b, m, k));
#pragma unroll
          for (int q = 0; q < VA; ++q) As[kk][mm + q] = @LDA@;
        }} else {{
#pragma unroll
          for (int q = 0; q < VA; ++q) As[kk][mm + q] = 0;
        }}
      }}
    }} else {{
      for (int e = tid; e < BM * BK; e += THREADS) {{
        const int mm = e % BM, kk = e / BM;
        const int64_t m = m0 + mm, k = k0 + kk;
        As[kk][mm] = (m < CG_M && k < CG_K) ? kf_a(P, b, m, k) : (acc_t)0;
      }}
    }}"""
    if fast == "n":
        return rf"""    if constexpr (VB > 1) {{
      for (int e = tid; e < (BN / VB) * BK; e += THREADS) {{
        const int nn = (e % (BN / VB)) * VB, kk = e / (BN / VB);
        const int64_t n = n0 + nn, k = k0 + kk;
        if (n < CG_N && k < CG_K) {{
          const kf_pk<kf_b_t, VB> v = *reinterpret_cast<const kf_pk<kf_b_t, VB>*>(kf_b_ptr(P, b, k, n));
#pragma unroll
          for (int q = 0; q < VB; ++q) Bs[kk][nn + q] = @LDB@;
        }} else {{
#pragma unroll
          for (int q = 0; q < VB; ++q) Bs[kk][nn + q] = 0;
        }}
      }}
    }} else {{
      for (int e = tid; e < BN * BK; e += THREADS) {{
        const int nn = e % BN, kk = e / BN;
        const int64_t n = n0 + nn, k = k0 + kk;
        Bs[kk][nn] = (n < CG_N && k < CG_K) ? kf_b(P, b, k, n) : (acc_t)0;
      }}
    }}"""
    return rf"""    if constexpr (VB > 1) {{
      for (int e = tid; e < BN * (BK / VB); e += THREADS) {{
        const int kk = (e % (BK / VB)) * VB, nn = e / (BK / VB);
        const int64_t n = n0 + nn, k = k0 + kk;
        if (n < CG_N && k < CG_K) {{
          const kf_pk<kf_b_t, VB> v = *reinterpret_cast<const kf_pk<kf_b_t, VB>*>(kf_b_ptr(P, b, k, n));
#pragma unroll
          for (int q = 0; q < VB; ++q) Bs[kk + q][nn] = @LDB@;
        }} else {{
#pragma unroll
          for (int q = 0; q < VB; ++q) Bs[kk + q][nn] = 0;
        }}
      }}
    }} else {{
      for (int e = tid; e < BN * BK; e += THREADS) {{
        const int kk = e % BK, nn = e / BK;
        const int64_t n = n0 + nn, k = k0 + kk;
        Bs[kk][nn] = (n < CG_N && k < CG_K) ? kf_b(P, b, k, n) : (acc_t)0;
      }}
    }}"""


def simt_space():
    return {"bm": (32, 64, 128), "bn": (32, 64, 128), "bk": (8, 16, 32), "tm": (2, 4, 8),
            "tn": (2, 4, 8), "vec": (1, 2, 4, 8)}


def simt_valid(g: Gemm, p: dict) -> bool:
    threads = (p["bm"] // p["tm"]) * (p["bn"] // p["tn"])
    if threads not in (64, 128, 256, 512):
        return False
    es = 8 if g.acc == "double" else 4
    if p["bk"] * (p["bm"] + p["bn"] + 8) * es > 48 * 1024:
        return False
    if cdiv(g.M, p["bm"]) > 65535 or g.batch > 65535:
        return False
    if p["vec"] > 1:
        va = bool(g.a_vec and g.a_vec["ok"].get(p["vec"]))
        vb = bool(g.b_vec and g.b_vec["ok"].get(p["vec"]))
        if not (va or vb):
            return False
        tile = {"k": p["bk"], "m": p["bm"], "n": p["bn"]}
        if va and tile[g.a_vec["fast"]] % p["vec"]:
            return False
        if vb and tile[g.b_vec["fast"]] % p["vec"]:
            return False
        if p["vec"] * ESIZE[g.a_dtype] > 16 or p["vec"] * ESIZE[g.b_dtype] > 16:
            return False
    return p["tm"] * p["tn"] <= 64


def simt_default(g: Gemm) -> dict:
    big = g.M * g.N * g.batch >= 128 * 128 * 64
    p = {"bm": 128 if big else 64, "bn": 128 if big else 64, "bk": 8 if big else 16,
         "tm": 8 if big else 4, "tn": 8 if big else 4, "vec": 1}
    for v in (4, 2):
        q = dict(p, vec=v)
        if simt_valid(g, q):
            return q
    return p


def render_simt_gemm(g: Gemm, p: dict, a_in: int, b_in: int) -> str:
    va = p["vec"] if (g.a_vec and g.a_vec["ok"].get(p["vec"])) else 1
    vb = p["vec"] if (g.b_vec and g.b_vec["ok"].get(p["vec"])) else 1
    src = prelude("cuda") + _gemm_types(g, "cuda", a_in, b_in) + _gemm_accessors(g, "cuda")
    la = fill(_simt_load("a", g.a_vec["fast"] if (g.a_vec and va > 1) else g.a_fast),
              LDA=load(g.a_dtype, "cuda", "v.v[q]", "acc_t"))
    lb = fill(_simt_load("b", g.b_vec["fast"] if (g.b_vec and vb > 1) else g.b_fast),
              LDB=load(g.b_dtype, "cuda", "v.v[q]", "acc_t"))
    src += fill(_SIMT_GEMM, BT=g.batch, M=g.M, N=g.N, K=g.K, BM=p["bm"], BN=p["bn"], BK=p["bk"],
                TM=p["tm"], TN=p["tn"], PAD=4 if g.acc == "float" else 1, LOADA=la, LOADB=lb,
                FILL=entry_fill("cuda"), VA=va, VB=vb,
                VA_OK="true" if va > 1 else "false", VB_OK="true" if vb > 1 else "false",
                VA_BASE=_vec_base(g.a_vec), VB_BASE=_vec_base(g.b_vec))
    return src


# ---------------------------------------------------------------------- cuda: WMMA GEMM

_WMMA_GEMM = r"""#include <mma.h>
#define CG_BT @BT@LL
#define CG_M @M@LL
#define CG_N @N@LL
#define CG_K @K@LL
#define BM @BM@
#define BN @BN@
#define BK @BK@
#define WM @WM@
#define WN @WN@
#define STAGES @STAGES@
#define WTM (BM / WM)
#define WTN (BN / WN)
#define FM (WTM / 16)
#define FN (WTN / 16)
#define THREADS (WM * WN * 32)
// shared-memory tiles (16-bit), padded by 8 elements (16 bytes) per row
#define A_KF @A_KF@
#define B_NF @B_NF@
#define LDA (A_KF ? (BK + 8) : (BM + 8))
#define LDB (B_NF ? (BN + 8) : (BK + 8))
#define A_STAGE (A_KF ? BM * (BK + 8) : BK * (BM + 8))
#define B_STAGE (B_NF ? BK * (BN + 8) : BN * (BK + 8))
#define A_IDX(mm, kk) (A_KF ? (mm) * LDA + (kk) : (kk) * LDA + (mm))
#define B_IDX(kk, nn) (B_NF ? (kk) * LDB + (nn) : (nn) * LDB + (kk))
#define EPI_LD 20
typedef kf_a_t T;

KF_DEV void kf_cp16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
KF_DEV void kf_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> KF_DEV void kf_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <bool VA, bool VB>
KF_DEV void kf_load_tile(const kf_ptrs& P, T* As, T* Bs, int64_t b, int64_t m0, int64_t n0, int64_t k0) {
  const int tid = threadIdx.x;
  if constexpr (VA) {  // 16-byte chunks along A's contiguous dim, zero-filled past the edges
    for (int c = tid; c < BM * BK / 8; c += THREADS) {
      int mm, kk;
      if (A_KF) { mm = c / (BK / 8); kk = (c % (BK / 8)) * 8; }
      else { kk = c / (BM / 8); mm = (c % (BM / 8)) * 8; }
      const int64_t m = m0 + mm, k = k0 + kk;
      const bool in = m < CG_M && k < CG_K;
      const T* src = in ? kf_a_ptr(P, b, m, k) : (const T*)@A_BASE@;
      kf_cp16(As + A_IDX(mm, kk), src, in ? 16 : 0);
    }
  } else {
    for (int e = tid; e < BM * BK; e += THREADS) {
      int mm, kk;
      if (A_KF) { mm = e / BK; kk = e % BK; }
      else { kk = e / BM; mm = e % BM; }
      const int64_t m = m0 + mm, k = k0 + kk;
      As[A_IDX(mm, kk)] = (m < CG_M && k < CG_K) ? kf_a_raw(P, b, m, k) : @ZERO@;
    }
  }
  if constexpr (VB) {
    for (int c = tid; c < BN * BK / 8; c += THREADS) {
      int nn, kk;
      if (B_NF) { kk = c / (BN / 8); nn = (c % (BN / 8)) * 8; }
      else { nn = c / (BK / 8); kk = (c % (BK / 8)) * 8; }
      const int64_t n = n0 + nn, k = k0 + kk;
      const bool in = n < CG_N && k < CG_K;
      const T* src = in ? kf_b_ptr(P, b, k, n) : (const T*)@B_BASE@;
      kf_cp16(Bs + B_IDX(kk, nn), src, in ? 16 : 0);
    }
  } else {
    for (int e = tid; e < BN * BK; e += THREADS) {
      int nn, kk;
      if (B_NF) { kk = e / BN; nn = e % BN; }
      else { nn = e / BK; kk = e % BK; }
      const int64_t n = n0 + nn, k = k0 + kk;
      Bs[B_IDX(kk, nn)] = (n < CG_N && k < CG_K) ? kf_b_raw(P, b, k, n) : @ZERO@;
    }
  }
}

template <bool VA, bool VB>
__global__ void __launch_bounds__(THREADS) kf_gemm_wmma(kf_ptrs P) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char kf_smem[];
  T* As = reinterpret_cast<T*>(kf_smem);
  T* Bs = As + STAGES * A_STAGE;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WN, wn = warp % WN;
  const int64_t b = blockIdx.z;
  const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i) {
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  const int KT = (int)((CG_K + BK - 1) / BK);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) kf_load_tile<VA, VB>(P, As + s * A_STAGE, Bs + s * B_STAGE, b, m0, n0, (int64_t)s * BK);
    kf_cp_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    kf_cp_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) {
        const int st = nk % STAGES;
        kf_load_tile<VA, VB>(P, As + st * A_STAGE, Bs + st * B_STAGE, b, m0, n0, (int64_t)nk * BK);
      }
      kf_cp_commit();
    }
    const T* a_s = As + (kt % STAGES) * A_STAGE;
    const T* b_s = Bs + (kt % STAGES) * B_STAGE;
#pragma unroll
    for (int k16 = 0; k16 < BK; k16 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, @A_LAYOUT@> fa[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, @B_LAYOUT@> fb[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], a_s + A_IDX(wm * WTM + i * 16, k16), LDA);
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], b_s + B_IDX(k16, wn * WTN + j * 16), LDB);
#pragma unroll
      for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
  }
  kf_cp_wait<0>();
  __syncthreads();
  // epilogue: each warp stages one 16x16 fragment at a time in its own scratch
  float* scratch = reinterpret_cast<float*>(kf_smem) + warp * 16 * EPI_LD;
#pragma unroll
  for (int i = 0; i < FM; ++i) {
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(scratch, acc[i][j], EPI_LD, wmma::mem_row_major);
      __syncwarp();
      const int64_t mb = m0 + wm * WTM + i * 16, nb = n0 + wn * WTN + j * 16;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int e = q * 32 + lane;
        const int r = @EPI_R@, c = @EPI_C@;
        const int64_t m = mb + r, n = nb + c;
        if (m < CG_M && n < CG_N) kf_epi(P, b, m, n, (acc_t)scratch[r * EPI_LD + c]);
      }
      __syncwarp();
    }
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  if (CG_BT == 0 || CG_M == 0 || CG_N == 0) return 0;
  dim3 grid((unsigned)((CG_N + BN - 1) / BN), (unsigned)((CG_M + BM - 1) / BM), (unsigned)CG_BT);
  const size_t pipe = (size_t)STAGES * (A_STAGE + B_STAGE) * sizeof(T);
  const size_t epi = (size_t)WM * WN * 16 * EPI_LD * sizeof(float);
  const size_t smem = pipe > epi ? pipe : epi;
  const bool va = @VA_OK@ && kf_aligned(@A_BASE@, 16);
  const bool vb = @VB_OK@ && kf_aligned(@B_BASE@, 16);
  cudaError_t e = cudaSuccess;
#define CG_GO(X, Y)                                                                              \
  do {                                                                                           \
    if (smem > 48 * 1024) e = cudaFuncSetAttribute(kf_gemm_wmma<X, Y>,                           \
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem); \
    if (e == cudaSuccess) kf_gemm_wmma<X, Y><<<grid, THREADS, smem, stream>>>(P);                \
  } while (0)
  if (va && vb) CG_GO(true, true);
  else if (va) CG_GO(true, false);
  else if (vb) CG_GO(false, true);
  else CG_GO(false, false);
#undef CG_GO
  if (e != cudaSuccess) return (int)e;
  return (int)cudaGetLastError();
}
"""


def wmma_space():
    return {"bm": (32, 64, 128), "bn": (32, 64, 128, 256), "bk": (16, 32, 64), "warps": (2, 4, 8),
            "stages": (2, 3, 4)}


def _wmma_layout(p: dict) -> tuple[int, int]:
    w = p["warps"]
    if w == 2:
        return (2, 1) if p["bm"] >= p["bn"] else (1, 2)
    if w == 4:
        return (2, 2)
    return (2, 4) if p["bn"] >= p["bm"] else (4, 2)


def wmma_valid(g: Gemm, p: dict) -> bool:
    if g.a_dtype not in HALVES or g.a_dtype != g.b_dtype:
        return False
    wm, wn = _wmma_layout(p)
    wtm, wtn = p["bm"] // wm, p["bn"] // wn
    if wtm < 16 or wtn < 16 or wtm % 16 or wtn % 16:
        return False
    fm, fn = wtm // 16, wtn // 16
    if fm * fn > 16:
        return False
    a_kf = _a_kfast(g)
    b_nf = _b_nfast(g)
    a_st = p["bm"] * (p["bk"] + 8) if a_kf else p["bk"] * (p["bm"] + 8)
    b_st = p["bk"] * (p["bn"] + 8) if b_nf else p["bn"] * (p["bk"] + 8)
    smem = max(p["stages"] * (a_st + b_st) * 2, wm * wn * 16 * 20 * 4)
    if smem > 200 * 1024:
        return False
    if cdiv(g.M, p["bm"]) > 65535 or g.batch > 65535:
        return False
    return True


def _a_kfast(g: Gemm) -> bool:
    return (g.a_vec["fast"] == "k") if g.a_vec else g.a_fast == "k"


def _b_nfast(g: Gemm) -> bool:
    return (g.b_vec["fast"] == "n") if g.b_vec else g.b_fast == "n"


def wmma_default(g: Gemm) -> dict:
    if g.M * g.N * g.batch >= 128 * 128 * 132:
        p = {"bm": 128, "bn": 128, "bk": 32, "warps": 8, "stages": 3}
    elif g.M >= 64 and g.N >= 64:
        p = {"bm": 64, "bn": 64, "bk": 32, "warps": 4, "stages": 3}
    else:
        p = {"bm": 32, "bn": 32, "bk": 32, "warps": 2, "stages": 2}
    return p


def render_wmma_gemm(g: Gemm, p: dict, a_in: int, b_in: int) -> str:
    wm, wn = _wmma_layout(p)
    a_kf, b_nf = _a_kfast(g), _b_nfast(g)
    va = bool(g.a_vec and g.a_vec["ok"].get(8))
    vb = bool(g.b_vec and g.b_vec["ok"].get(8))
    src = prelude("cuda") + _gemm_types(g, "cuda", a_in, b_in) + _gemm_accessors(g, "cuda")
    # epilogue element order inside a 16x16 fragment: walk the output's contiguous dim
    out_nfast = getattr(g, "out_nfast", True)
    src += fill(_WMMA_GEMM, BT=g.batch, M=g.M, N=g.N, K=g.K, BM=p["bm"], BN=p["bn"], BK=p["bk"],
                WM=wm, WN=wn, STAGES=p["stages"], A_KF=1 if a_kf else 0, B_NF=1 if b_nf else 0,
                A_LAYOUT="wmma::row_major" if a_kf else "wmma::col_major",
                B_LAYOUT="wmma::row_major" if b_nf else "wmma::col_major",
                ZERO=raw_zero(g.a_dtype, "cuda"), FILL=entry_fill("cuda"),
                VA_OK="true" if va else "false", VB_OK="true" if vb else "false",
                A_BASE=_vec_base(g.a_vec), B_BASE=_vec_base(g.b_vec),
                EPI_R="e / 16" if out_nfast else "e % 16", EPI_C="e % 16" if out_nfast else "e / 16")
    return src


# =============================================================================== matmul

MM_TARGETS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default")


@dataclass
class _MMInfo:
    gemm: Gemm
    a_in: int
    b_in: int


def _vec_info(op: Operand, strides3: tuple, sizes3: tuple, fast_names: tuple) -> dict | None:
    """Vector-load facts for a (batch, i, j) strided operand: its contiguous dim and for which
    widths V every vector is aligned and either wholly in range or wholly out."""
    sb, si, sj = strides3
    B, I, J = sizes3
    fast = None
    if sj == 1 and J > 1:
        fast = fast_names[1]
        others = [(si, I), (sb, B)]
        fsize = J
    elif si == 1 and I > 1:
        fast = fast_names[0]
        others = [(sj, J), (sb, B)]
        fsize = I
    if fast is None:
        return None
    ok = {}
    for v in (2, 4, 8):
        ok[v] = (fsize % v == 0 and op.offset % v == 0
                 and all(st % v == 0 for st, sz in others if sz > 1))
    return {"fast": fast, "ok": ok, "base": f"(const void*){op.ptr()}",
            "ptr": ""}


def matmul_info(task) -> _MMInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None or R.target not in MM_TARGETS or len(R.outs) != 1 or R.outs[0].item != 0:
        return None
    a_ = R.args
    t = R.target
    if t in ("aten.mm.default", "aten.bmm.default"):
        A, B, bias, alpha, beta = a_["self"], a_["mat2"], None, 1, 0
    elif t == "aten.addmm.default":
        A, B, bias = a_["mat1"], a_["mat2"], a_["self"]
        alpha, beta = a_.get("alpha", 1), a_.get("beta", 1)
    else:
        A, B, bias = a_["batch1"], a_["batch2"], a_["self"]
        alpha, beta = a_.get("alpha", 1), a_.get("beta", 1)
    if not isinstance(A, Operand) or not isinstance(B, Operand):
        return None
    if A.dtype not in FLOATS or B.dtype != A.dtype:
        return None
    o = R.outs[0]
    if o.dtype != A.dtype:
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for x in (alpha, beta)):
        return None
    batched = A.ndim == 3
    if batched:
        if B.ndim != 3 or len(o.shape) != 3:
            return None
        Bt, M, K = A.shape
        if B.shape[0] != Bt or B.shape[1] != K:
            return None
        N = B.shape[2]
        sa = A.strides
        sb = B.strides
        so = o.strides
    else:
        if A.ndim != 2 or B.ndim != 2 or len(o.shape) != 2:
            return None
        Bt = 1
        M, K = A.shape
        if B.shape[0] != K:
            return None
        N = B.shape[1]
        sa = (0,) + A.strides
        sb = (0,) + B.strides
        so = (0,) + o.strides
    if tuple(o.shape) != ((Bt, M, N) if batched else (M, N)):
        return None
    sa = tuple(0 if sz == 1 else st for st, sz in zip(sa, (Bt, M, K)))
    sb = tuple(0 if sz == 1 else st for st, sz in zip(sb, (Bt, K, N)))
    if bias is not None and beta != 0:
        if not isinstance(bias, Operand) or bias.dtype not in FLOATS:
            return None
        bst = bcast_strides(bias, (Bt, M, N))
        if bst is None:
            return None
    else:
        bias, bst = None, None
    acc = "double" if A.dtype == "float64" else "float"
    a_raw = f"return {A.ptr()}[{off_expr([('b', sa[0]), ('m', sa[1]), ('k', sa[2])])}];"
    b_raw = f"return {B.ptr()}[{off_expr([('b', sb[0]), ('k', sb[1]), ('n', sb[2])])}];"
    a_fast = "k" if abs(sa[2]) <= abs(sa[1]) or sa[1] == 0 else "m"
    if sa[2] == 0:
        a_fast = "m"
    b_fast = "n" if abs(sb[2]) <= abs(sb[1]) or sb[1] == 0 else "k"
    if sb[2] == 0:
        b_fast = "k"
    out_ptr = f"(({otype(o.index)}*)P.out[{o.index}])"
    o_off = off_expr([("b", so[0]), ("m", so[1]), ("n", so[2])])
    odt = o.dtype
    alpha_s = "v" if alpha == 1 else f"(acc_t){flit(alpha)} * v"

    def value(backend: str) -> str:  # the op's result at (b, m, n): alpha v + beta bias
        val = alpha_s
        if bias is not None:
            bexpr = f"{bias.ptr()}[{off_expr([('b', bst[0]), ('m', bst[1]), ('n', bst[2])])}]"
            bl = load(bias.dtype, backend, bexpr, "acc_t")
            val += " + " + (bl if beta == 1 else f"(acc_t){flit(beta)} * {bl}")
        return val

    def epi(backend: str) -> str:
        return f"{out_ptr}[{o_off}] = {store(odt, backend, value(backend))};"

    av = _vec_info(A, (sa[0], sa[1], sa[2]), (Bt, M, K), ("m", "k"))
    if av is not None:
        av["ptr"] = f"{A.ptr()} + " + off_expr([("b", sa[0]), ("i", sa[1]), ("j", sa[2])])
    bv = _vec_info(B, (sb[0], sb[1], sb[2]), (Bt, K, N), ("k", "n"))
    if bv is not None:
        bv["ptr"] = f"{B.ptr()} + " + off_expr([("b", sb[0]), ("i", sb[1]), ("j", sb[2])])
    g = Gemm(Bt, M, N, K, A.dtype, B.dtype, acc, a_raw, b_raw, epi, a_fast, b_fast, av, bv,
             "matmul", 2.0 * Bt * M * N * K)
    g.out_nfast = abs(so[2]) <= abs(so[1]) or so[1] == 0
    g.value = value
    return _MMInfo(g, A.index, B.index)



# (design, backend, space, default, valid, render, what it is): one table for plain GEMMs and
# GEMMs with a fused epilogue (epilogue.py), so that a design added here serves both
_GEMM_DESIGNS = (
    ("gen_gemm_omp", "cpu", cpu_gemm_space, cpu_gemm_default, cpu_gemm_valid, render_cpu_gemm,
     "packed OpenMP GEMM with a register micro-kernel"),
    ("gen_gemm_simt", "cuda", simt_space, simt_default, simt_valid, render_simt_gemm,
     "shared-memory tiled GEMM, register blocking, fp32/fp64 FMA"),
    ("gen_gemm_wmma", "cuda", wmma_space, wmma_default, wmma_valid, render_wmma_gemm,
     "tensor cores (wmma 16x16x16, f32 accumulate), cp.async pipeline"),
)


def gemm_designs(task, info_of=None, finish=None, also: str = "") -> list:
    """The GEMM designs for `task`'s backend (wmma only for 16-bit operands). Each reads its Gemm
    through `info_of(task)` (default matmul_info; epilogue.epilogue_info for a fused epilogue),
    passes its source through `finish(src, backend)` when given, and says `also` after what it is."""
    info_of = info_of or matmul_info
    info = info_of(task)
    if info is None:
        return []
    out = []
    for name, backend, space, default, valid, render, what in _GEMM_DESIGNS:
        if backend != task.backend or (name == "gen_gemm_wmma" and info.gemm.a_dtype not in HALVES):
            continue

        def rendered(t, p, render=render, backend=backend):
            i = info_of(t)
            src = render(i.gemm, p, i.a_in, i.b_in)
            return finish(src, backend) if finish else src

        out.append(compute_design(
            name, backend, space(), "matmul",
            lambda t, default=default: default(info_of(t).gemm),
            lambda t, p, valid=valid: valid(info_of(t).gemm, p), rendered,
            lambda t: (info_of(t).gemm.batch * info_of(t).gemm.M, info_of(t).gemm.N), what + also))
    return [d for d in out if usable(d, task)]


def matmul_designs(task) -> list:
    return gemm_designs(task)
