"""Attention designs for the sdpa ops (causal, masks, GQA, any input layout).

  gen_flash_omp   cpu: flash-style, OpenMP over (batch, head, query block), K/V blocks widened
                  once per block, online softmax.
  gen_flash_simt  cuda: one warp per query row, K/V tiles in shared memory, a lane per key for
                  scores and a lane per head-dim slice for the output.
  gen_flash_mma   cuda, bf16/f16: FlashAttention-2 style, mma.sync m16n8k16 (inline PTX) for
                  Q K^T and P V, 16 query rows per warp, online softmax in registers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kforge_tui.search.codegen.compute.base import (FLOATS, HALVES, Operand, OutRef, analyze, bcast_strides,
                                                    cdiv, compute_design, entry_fill, fill, flit, load,
                                                    off_expr, prelude, raw_zero, store, usable)


# =============================================================================== attention

SDPA = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "cpu_flash",
    "aten._scaled_dot_product_flash_attention.default": "flash",
    "aten._scaled_dot_product_efficient_attention.default": "efficient",
    "aten._scaled_dot_product_cudnn_attention.default": "cudnn",
}


@dataclass
class AttnInfo:
    B: int
    H: int
    Hk: int
    L: int
    S: int
    E: int
    Ev: int
    q: Operand
    k: Operand
    v: Operand
    mask: Operand | None
    mask_strides: tuple | None  # (B, H, L, S) broadcast strides
    scale: float
    causal: bool
    out: OutRef
    lse: OutRef | None
    dtype: str


def attn_info(task) -> AttnInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None or R.target not in SDPA:
        return None
    kind = SDPA[R.target]
    a = R.args
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    if not all(isinstance(x, Operand) for x in (q, k, v)):
        return None
    if float(a.get("dropout_p", 0.0) or 0.0) != 0.0:
        return None
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return None
    if q.dtype not in FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    B, H, L, E = q.shape
    Bk, Hk, S, Ek = k.shape
    if v.shape[:3] != (Bk, Hk, S) or Bk != B or Ek != E or Hk == 0 or H % Hk:
        return None
    Ev = v.shape[3]
    causal = bool(a.get("is_causal", False))
    mask = a.get("attn_mask") if kind == "cpu_flash" else a.get("attn_bias")
    if kind in ("flash", "cudnn") and causal and L != S:
        return None  # these kernels align a non-square causal mask differently: leave it alone
    mst = None
    if mask is not None:
        if not isinstance(mask, Operand) or mask.dtype not in FLOATS + ("bool",):
            return None
        mst = bcast_strides(mask, (B, H, L, S))
        if mst is None:
            return None
    scale = a.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(E)
    out = lse = None
    for o in R.outs:
        if o.item == 0:
            if tuple(o.shape) != (B, H, L, Ev) or o.dtype != q.dtype:
                return None
            out = o
        elif o.item == 1:
            if tuple(o.shape) == (B, H, L) and o.dtype == "float32":
                lse = o
            elif math.prod(o.shape) != 0:
                return None
        elif math.prod(o.shape) != 0:
            return None
    if out is None:
        return None
    return AttnInfo(B, H, Hk, L, S, E, Ev, q, k, v, mask, mst, scale, causal, out, lse, q.dtype)


def _attn_common_defs(ai: AttnInfo, backend: str) -> str:
    """Accessor functions shared by every attention kernel."""
    q, k, v = ai.q, ai.k, ai.v
    acc = "float" if ai.dtype != "float64" else "double"
    s = f"typedef {acc} acc_t;\n"
    s += (f"KF_DEV acc_t kf_q(const kf_ptrs& P, int64_t b, int64_t h, int64_t i, int64_t d) {{ return "
          f"{load(q.dtype, backend, q.ptr() + '[' + off_expr([('b', q.strides[0]), ('h', q.strides[1]), ('i', q.strides[2]), ('d', q.strides[3])]) + ']', 'acc_t')}; }}\n")
    s += (f"KF_DEV acc_t kf_k(const kf_ptrs& P, int64_t b, int64_t h, int64_t j, int64_t d) {{ return "
          f"{load(k.dtype, backend, k.ptr() + '[' + off_expr([('b', k.strides[0]), ('h', k.strides[1]), ('j', k.strides[2]), ('d', k.strides[3])]) + ']', 'acc_t')}; }}\n")
    s += (f"KF_DEV acc_t kf_v(const kf_ptrs& P, int64_t b, int64_t h, int64_t j, int64_t d) {{ return "
          f"{load(v.dtype, backend, v.ptr() + '[' + off_expr([('b', v.strides[0]), ('h', v.strides[1]), ('j', v.strides[2]), ('d', v.strides[3])]) + ']', 'acc_t')}; }}\n")
    # raw element pointers (16-bit staging in the tensor-core kernel)
    for nm, op, ix in (("q", q, "i"), ("k", k, "j"), ("v", v, "j")):
        s += (f"KF_DEV const kf_in{op.index}_t* kf_{nm}_p(const kf_ptrs& P, int64_t b, int64_t h, int64_t {ix}, int64_t d) "
              f"{{ return {op.ptr()} + {off_expr([('b', op.strides[0]), ('h', op.strides[1]), (ix, op.strides[2]), ('d', op.strides[3])])}; }}\n")
    if ai.mask is not None:
        m, st = ai.mask, ai.mask_strides
        e = f"{m.ptr()}[{off_expr([('b', st[0]), ('h', st[1]), ('i', st[2]), ('j', st[3])])}]"
        if m.dtype == "bool":
            body = f"return ({e}) ? (acc_t)0 : (acc_t)(-INFINITY);"
        else:
            body = f"return {load(m.dtype, backend, e, 'acc_t')};"
        s += f"KF_DEV acc_t kf_mask(const kf_ptrs& P, int64_t b, int64_t h, int64_t i, int64_t j) {{ {body} }}\n"
        s += "#define CG_HAS_MASK 1\n"
    else:
        s += ("KF_DEV acc_t kf_mask(const kf_ptrs& P, int64_t b, int64_t h, int64_t i, int64_t j) "
              "{ return (acc_t)0; }\n#define CG_HAS_MASK 0\n")
    o = ai.out
    s += (f"KF_DEV void kf_out(const kf_ptrs& P, int64_t b, int64_t h, int64_t i, int64_t d, acc_t x) {{ "
          f"((kf_out{o.index}_t*)P.out[{o.index}])[{off_expr([('b', o.strides[0]), ('h', o.strides[1]), ('i', o.strides[2]), ('d', o.strides[3])])}] = "
          f"{store(o.dtype, backend, 'x')}; }}\n")
    if ai.lse is not None:
        lo = ai.lse
        s += (f"KF_DEV void kf_lse(const kf_ptrs& P, int64_t b, int64_t h, int64_t i, acc_t x) {{ "
              f"((float*)P.out[{lo.index}])[{off_expr([('b', lo.strides[0]), ('h', lo.strides[1]), ('i', lo.strides[2])])}] = (float)x; }}\n"
              "#define CG_HAS_LSE 1\n")
    else:
        s += "KF_DEV void kf_lse(const kf_ptrs& P, int64_t b, int64_t h, int64_t i, acc_t x) {}\n#define CG_HAS_LSE 0\n"
    s += (f"#define CG_B {ai.B}LL\n#define CG_H {ai.H}LL\n#define CG_GQ {ai.H // ai.Hk}LL\n"
          f"#define CG_L {ai.L}LL\n#define CG_S {ai.S}LL\n#define CG_E {ai.E}\n#define CG_EV {ai.Ev}\n"
          f"#define CG_CAUSAL {1 if ai.causal else 0}\n#define CG_SCALE ((acc_t){flit(ai.scale)})\n")
    return s


# ---------------------------------------------------------------------- cpu flash

_CPU_FLASH = r"""
#define QB @QB@
#define KB @KB@
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
@FILL@
  if (CG_B == 0 || CG_H == 0 || CG_L == 0) return 0;
  const int64_t QT = (CG_L + QB - 1) / QB;
  int failed = 0;
#pragma omp parallel
  {
    acc_t* qf = (acc_t*)malloc(sizeof(acc_t) * (QB * CG_E + 1));
    acc_t* ac = (acc_t*)malloc(sizeof(acc_t) * (QB * CG_EV + 1));
    acc_t* sc = (acc_t*)malloc(sizeof(acc_t) * (QB * KB));
    acc_t* kf = (acc_t*)malloc(sizeof(acc_t) * (KB * CG_E + 1));
    acc_t* vf = (acc_t*)malloc(sizeof(acc_t) * (KB * CG_EV + 1));
    acc_t mx[QB], sm[QB];
    const bool ok = qf && ac && sc && kf && vf;
    if (!ok) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < CG_B; ++b)
      for (int64_t h = 0; h < CG_H; ++h)
        for (int64_t qt = 0; qt < QT; ++qt) {
          if (!ok) continue;
          const int64_t i0 = qt * QB, nq = CG_L - i0 < QB ? CG_L - i0 : QB, hk = h / CG_GQ;
          for (int64_t r = 0; r < nq; ++r) {
            for (int64_t d = 0; d < CG_E; ++d) qf[r * CG_E + d] = kf_q(P, b, h, i0 + r, d);
            for (int64_t d = 0; d < CG_EV; ++d) ac[r * CG_EV + d] = 0;
            mx[r] = -INFINITY;
            sm[r] = 0;
          }
          const int64_t kend = CG_CAUSAL ? (CG_S < i0 + nq ? CG_S : i0 + nq) : CG_S;
          for (int64_t j0 = 0; j0 < kend; j0 += KB) {
            const int64_t nk = kend - j0 < KB ? kend - j0 : KB;
            for (int64_t c = 0; c < nk; ++c) {
              for (int64_t d = 0; d < CG_E; ++d) kf[c * CG_E + d] = kf_k(P, b, hk, j0 + c, d);
              for (int64_t d = 0; d < CG_EV; ++d) vf[c * CG_EV + d] = kf_v(P, b, hk, j0 + c, d);
            }
            for (int64_t r = 0; r < nq; ++r) {
              const int64_t i = i0 + r;
              const acc_t* qr = qf + r * CG_E;
              acc_t* sr = sc + r * KB;
              acc_t rmax = -INFINITY;
              for (int64_t c = 0; c < nk; ++c) {
                const acc_t* kc = kf + c * CG_E;
                acc_t s = 0;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < CG_E; ++d) s += qr[d] * kc[d];
                s *= CG_SCALE;
                if (CG_HAS_MASK) s += kf_mask(P, b, h, i, j0 + c);
                if (CG_CAUSAL && j0 + c > i) s = -INFINITY;
                sr[c] = s;
                rmax = s > rmax ? s : rmax;
              }
              const acc_t mnew = mx[r] > rmax ? mx[r] : rmax;
              if (mnew == -INFINITY) continue;
              const acc_t corr = exp(mx[r] - mnew);
              acc_t psum = 0;
              for (int64_t c = 0; c < nk; ++c) {
                const acc_t p = exp(sr[c] - mnew);
                sr[c] = p;
                psum += p;
              }
              sm[r] = sm[r] * corr + psum;
              acc_t* ar = ac + r * CG_EV;
              if (corr != (acc_t)1) {
#pragma omp simd
                for (int64_t d = 0; d < CG_EV; ++d) ar[d] *= corr;
              }
              for (int64_t c = 0; c < nk; ++c) {
                const acc_t p = sr[c];
                if (p == (acc_t)0) continue;
                const acc_t* vc = vf + c * CG_EV;
#pragma omp simd
                for (int64_t d = 0; d < CG_EV; ++d) ar[d] += p * vc[d];
              }
              mx[r] = mnew;
            }
          }
          for (int64_t r = 0; r < nq; ++r) {
            const acc_t inv = sm[r] > 0 ? (acc_t)1 / sm[r] : (acc_t)0;
            for (int64_t d = 0; d < CG_EV; ++d) kf_out(P, b, h, i0 + r, d, ac[r * CG_EV + d] * inv);
            if (CG_HAS_LSE) kf_lse(P, b, h, i0 + r, sm[r] > 0 ? mx[r] + log(sm[r]) : (acc_t)@FM_LSE@);
          }
        }
    free(qf);
    free(ac);
    free(sc);
    free(kf);
    free(vf);
  }
  return failed ? 1 : 0;
}
"""


def _flash_omp_space():
    return {"qb": (1, 2, 4, 8, 16, 32, 64), "kb": (16, 32, 64, 128, 256, 512)}


def _flash_omp_default(ai: AttnInfo) -> dict:
    qb = 16
    while qb > 1 and (qb // 2 >= ai.L or ai.B * ai.H * cdiv(ai.L, qb) < 8):
        qb //= 2
    kb = 128 if ai.S >= 128 else 64 if ai.S >= 64 else 32 if ai.S >= 32 else 16
    return {"qb": qb, "kb": kb}


def render_flash_omp(task, p: dict) -> str:
    ai = attn_info(task)
    src = prelude("cpu") + _attn_common_defs(ai, "cpu")
    return src + fill(_CPU_FLASH, QB=p["qb"], KB=p["kb"], FILL=entry_fill("cpu"), FM_LSE="0")


# ---------------------------------------------------------------------- cuda flash (SIMT)

_SIMT_FLASH = r"""
#define WARPS @WARPS@
#define RPW @RPW@
#define KT @KT@
#define KPL (KT / 32)
#define DV ((CG_EV + 31) / 32)
#define BQ (WARPS * RPW)
#define THREADS (WARPS * 32)

__global__ void __launch_bounds__(THREADS) kf_flash_simt(kf_ptrs P) {
  extern __shared__ __align__(16) unsigned char kf_smem_raw[];
  acc_t* Qs = reinterpret_cast<acc_t*>(kf_smem_raw);  // BQ x E (scaled queries)
  acc_t* Ks = Qs + BQ * CG_E;                          // KT x (E + 1)
  acc_t* Vs = Ks + KT * (CG_E + 1);                    // KT x EV
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t bh = blockIdx.y, b = bh / CG_H, h = bh % CG_H, hk = h / CG_GQ;
  const int64_t q0 = (int64_t)blockIdx.x * BQ;
  for (int e = tid; e < BQ * CG_E; e += THREADS) {
    const int r = e / CG_E, d = e % CG_E;
    const int64_t i = q0 + r;
    Qs[e] = i < CG_L ? kf_q(P, b, h, i, d) : (acc_t)0;
  }
  acc_t m[RPW], l[RPW], acc[RPW][DV];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    m[r] = -INFINITY;
    l[r] = 0;
#pragma unroll
    for (int t = 0; t < DV; ++t) acc[r][t] = 0;
  }
  const int64_t qlast = (q0 + BQ < CG_L ? q0 + BQ : CG_L) - 1;
  const int64_t kend = CG_CAUSAL ? (CG_S < qlast + 1 ? CG_S : qlast + 1) : CG_S;
  for (int64_t j0 = 0; j0 < kend; j0 += KT) {
    __syncthreads();
    for (int e = tid; e < KT * CG_E; e += THREADS) {
      const int c = e / CG_E, d = e % CG_E;
      const int64_t j = j0 + c;
      Ks[c * (CG_E + 1) + d] = j < CG_S ? kf_k(P, b, hk, j, d) : (acc_t)0;
    }
    for (int e = tid; e < KT * CG_EV; e += THREADS) {
      const int c = e / CG_EV, d = e % CG_EV;
      const int64_t j = j0 + c;
      Vs[c * CG_EV + d] = j < CG_S ? kf_v(P, b, hk, j, d) : (acc_t)0;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int rr = warp * RPW + r;
      const int64_t i = q0 + rr;
      if (i >= CG_L) continue;
      if (CG_CAUSAL && j0 > i) continue;
      acc_t s[KPL];
      acc_t tmax = -INFINITY;
#pragma unroll
      for (int t = 0; t < KPL; ++t) {
        const int c = lane + 32 * t;
        const int64_t j = j0 + c;
        const acc_t* qr = Qs + rr * CG_E;
        const acc_t* kc = Ks + c * (CG_E + 1);
        acc_t dot = 0;
#pragma unroll 8
        for (int d = 0; d < CG_E; ++d) dot += qr[d] * kc[d];
        dot *= CG_SCALE;
        const bool valid = j < CG_S && (!CG_CAUSAL || j <= i);
        if (CG_HAS_MASK && valid) dot += kf_mask(P, b, h, i, j);
        s[t] = valid ? dot : (acc_t)(-INFINITY);
        tmax = s[t] > tmax ? s[t] : tmax;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const acc_t y = __shfl_xor_sync(0xffffffffu, tmax, o);
        tmax = y > tmax ? y : tmax;
      }
      const acc_t mnew = m[r] > tmax ? m[r] : tmax;
      if (mnew == -INFINITY) continue;
      const acc_t corr = exp(m[r] - mnew);
      acc_t psum = 0;
#pragma unroll
      for (int t = 0; t < KPL; ++t) {
        s[t] = exp(s[t] - mnew);
        psum += s[t];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l[r] = l[r] * corr + psum;
#pragma unroll
      for (int t = 0; t < DV; ++t) acc[r][t] *= corr;
#pragma unroll
      for (int t = 0; t < KPL; ++t) {
#pragma unroll 4
        for (int c2 = 0; c2 < 32; ++c2) {
          const acc_t p = __shfl_sync(0xffffffffu, s[t], c2);
          const acc_t* vr = Vs + (t * 32 + c2) * CG_EV;
#pragma unroll
          for (int u = 0; u < DV; ++u) {
            const int d = lane + 32 * u;
            if (d < CG_EV) acc[r][u] += p * vr[d];
          }
        }
      }
      m[r] = mnew;
    }
  }
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int64_t i = q0 + warp * RPW + r;
    if (i >= CG_L) continue;
    const acc_t inv = l[r] > 0 ? (acc_t)1 / l[r] : (acc_t)0;
#pragma unroll
    for (int u = 0; u < DV; ++u) {
      const int d = lane + 32 * u;
      if (d < CG_EV) kf_out(P, b, h, i, d, acc[r][u] * inv);
    }
    if (CG_HAS_LSE && lane == 0) kf_lse(P, b, h, i, l[r] > 0 ? m[r] + log(l[r]) : (acc_t)INFINITY);
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  if (CG_B == 0 || CG_H == 0 || CG_L == 0) return 0;
  // scale folded into the queries' dot products at score time; queries staged as read
  const size_t smem = sizeof(acc_t) * ((size_t)BQ * CG_E + (size_t)KT * (CG_E + 1) + (size_t)KT * CG_EV);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kf_flash_simt, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
  }
  dim3 grid((unsigned)((CG_L + BQ - 1) / BQ), (unsigned)(CG_B * CG_H));
  kf_flash_simt<<<grid, THREADS, smem, stream>>>(P);
  return (int)cudaGetLastError();
}
"""


def _flash_simt_space():
    return {"warps": (2, 4, 8, 16), "rpw": (1, 2, 4), "kt": (32, 64)}


def _flash_simt_valid(ai: AttnInfo, p: dict) -> bool:
    es = 8 if ai.dtype == "float64" else 4
    smem = es * (p["warps"] * p["rpw"] * ai.E + p["kt"] * (ai.E + 1) + p["kt"] * ai.Ev)
    if smem > 200 * 1024:
        return False
    if ai.B * ai.H > 65535:
        return False
    if p["rpw"] * cdiv(ai.Ev, 32) > 32:
        return False
    return True


def _flash_simt_default(ai: AttnInfo) -> dict:
    rows = ai.B * ai.H * ai.L
    warps = 4
    rpw = 2 if rows >= 132 * 4 * 2 * 4 else 1
    return {"warps": warps, "rpw": rpw, "kt": 32}


def render_flash_simt(task, p: dict) -> str:
    ai = attn_info(task)
    src = prelude("cuda") + _attn_common_defs(ai, "cuda")
    return src + fill(_SIMT_FLASH, WARPS=p["warps"], RPW=p["rpw"], KT=p["kt"], FILL=entry_fill("cuda"))


# ---------------------------------------------------------------------- cuda flash (mma.sync)

_MMA_FLASH = r"""
#define WARPS @WARPS@
#define KT @KT@
#define BQ (16 * WARPS)
#define THREADS (WARPS * 32)
#define LDQ (CG_E + 8)
#define LDK (CG_E + 8)
#define LDV (CG_EV + 8)
#define VEC_Q @VEC_Q@
#define VEC_K @VEC_K@
#define VEC_V @VEC_V@
typedef kf_in@QIN@_t T;
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

KF_DEV uint32_t kf_pack2(float a, float b) {
  @PACK2@
}
KF_DEV uint32_t kf_pack_raw(T a, T b) {
  uint32_t r;
  unsigned short x, y;
  memcpy(&x, &a, 2);
  memcpy(&y, &b, 2);
  r = (uint32_t)x | ((uint32_t)y << 16);
  return r;
}
KF_DEV void kf_mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.@MMA_T@.@MMA_T@.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// rows x cols tile of a [.., rows, cols] operand into shared memory (row stride ld), zero past `lim`
template <int WHICH>
KF_DEV const T* kf_at(const kf_ptrs& P, int64_t b, int64_t h, int64_t r, int64_t c) {
  if constexpr (WHICH == 0) return kf_q_p(P, b, h, r, c);
  else if constexpr (WHICH == 1) return kf_k_p(P, b, h, r, c);
  else return kf_v_p(P, b, h, r, c);
}
template <bool VEC, int WHICH>
KF_DEV void kf_stage(T* dst, int ld, int rows, int cols, int64_t r0, int64_t lim,
                     const kf_ptrs& P, int64_t b, int64_t h) {
  const T zero = @ZERO@;
  if constexpr (VEC) {
    for (int e = threadIdx.x; e < rows * (cols / 8); e += THREADS) {
      const int r = e / (cols / 8), c = (e % (cols / 8)) * 8;
      const int64_t gr = r0 + r;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (gr < lim) v = *reinterpret_cast<const uint4*>(kf_at<WHICH>(P, b, h, gr, c));
      *reinterpret_cast<uint4*>(dst + r * ld + c) = v;
    }
  } else {
    for (int e = threadIdx.x; e < rows * cols; e += THREADS) {
      const int r = e / cols, c = e % cols;
      const int64_t gr = r0 + r;
      dst[r * ld + c] = gr < lim ? *kf_at<WHICH>(P, b, h, gr, c) : zero;
    }
  }
}

template <bool VQ, bool VK, bool VV>
__global__ void __launch_bounds__(THREADS) kf_flash_mma(kf_ptrs P) {
  extern __shared__ __align__(16) unsigned char kf_smem_raw[];
  T* Qs = reinterpret_cast<T*>(kf_smem_raw);
  T* Ks = Qs + BQ * LDQ;
  T* Vs = Ks + KT * LDK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const int64_t bh = blockIdx.y, b = bh / CG_H, h = bh % CG_H, hk = h / CG_GQ;
  const int64_t q0 = (int64_t)blockIdx.x * BQ;
  kf_stage<VQ, 0>(Qs, LDQ, BQ, CG_E, q0, CG_L, P, b, h);
  __syncthreads();
  uint32_t qa[CG_E / 16][4];
  const int rw = warp * 16;
#pragma unroll
  for (int ks = 0; ks < CG_E / 16; ++ks) {
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(Qs + (rw + g) * LDQ + ks * 16 + 2 * t4);
    qa[ks][1] = *reinterpret_cast<const uint32_t*>(Qs + (rw + g + 8) * LDQ + ks * 16 + 2 * t4);
    qa[ks][2] = *reinterpret_cast<const uint32_t*>(Qs + (rw + g) * LDQ + ks * 16 + 2 * t4 + 8);
    qa[ks][3] = *reinterpret_cast<const uint32_t*>(Qs + (rw + g + 8) * LDQ + ks * 16 + 2 * t4 + 8);
  }
  float o[CG_EV / 8][4];
#pragma unroll
  for (int n = 0; n < CG_EV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int64_t i0 = q0 + rw + g, i1 = i0 + 8;
  const float sl2 = (float)CG_SCALE * LOG2E;
  const int64_t qend = q0 + BQ < CG_L ? q0 + BQ : CG_L;
  const int64_t kend = CG_CAUSAL ? (CG_S < qend ? CG_S : qend) : CG_S;
  for (int64_t j0 = 0; j0 < kend; j0 += KT) {
    __syncthreads();
    kf_stage<VK, 1>(Ks, LDK, KT, CG_E, j0, CG_S, P, b, hk);
    kf_stage<VV, 2>(Vs, LDV, KT, CG_EV, j0, CG_S, P, b, hk);
    __syncthreads();
    if (CG_CAUSAL && j0 > q0 + rw + 15) continue;  // this warp's rows see none of these keys
    float s[KT / 8][4];
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      const T* kr = Ks + (nt * 8 + g) * LDK + 2 * t4;
#pragma unroll
      for (int ks = 0; ks < CG_E / 16; ++ks) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + ks * 16);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + ks * 16 + 8);
        kf_mma(s[nt], qa[ks], b0, b1);
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = e < 2 ? i0 : i1;
        const int64_t j = j0 + nt * 8 + 2 * t4 + (e & 1);
        const bool valid = j < CG_S && (!CG_CAUSAL || j <= row);
        float x = s[nt][e] * sl2;
        if (CG_HAS_MASK && valid && row < CG_L) x += (float)kf_mask(P, b, h, row, j) * LOG2E;
        x = valid ? x : -INFINITY;
        s[nt][e] = x;
        if (e < 2) mx0 = fmaxf(mx0, x);
        else mx1 = fmaxf(mx1, x);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
    const float c0 = exp2f(m0 - u0), c1 = exp2f(m1 - u1);
    float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < KT / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - u0);
      s[nt][1] = exp2f(s[nt][1] - u0);
      s[nt][2] = exp2f(s[nt][2] - u1);
      s[nt][3] = exp2f(s[nt][3] - u1);
      ls0 += s[nt][0] + s[nt][1];
      ls1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * c0 + ls0;
    l1 = l1 * c1 + ls1;
    m0 = n0;
    m1 = n1;
#pragma unroll
    for (int n = 0; n < CG_EV / 8; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
      o[n][2] *= c1;
      o[n][3] *= c1;
    }
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = kf_pack2(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = kf_pack2(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = kf_pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = kf_pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      const T* v0 = Vs + (kk * 16 + 2 * t4) * LDV + g;
#pragma unroll
      for (int n = 0; n < CG_EV / 8; ++n) {
        const T* vp = v0 + n * 8;
        const uint32_t b0 = kf_pack_raw(vp[0], vp[LDV]);
        const uint32_t b1 = kf_pack_raw(vp[8 * LDV], vp[9 * LDV]);
        kf_mma(o[n], pa, b0, b1);
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int n = 0; n < CG_EV / 8; ++n) {
    const int d = n * 8 + 2 * t4;
    if (i0 < CG_L) {
      kf_out(P, b, h, i0, d, o[n][0] * inv0);
      kf_out(P, b, h, i0, d + 1, o[n][1] * inv0);
    }
    if (i1 < CG_L) {
      kf_out(P, b, h, i1, d, o[n][2] * inv1);
      kf_out(P, b, h, i1, d + 1, o[n][3] * inv1);
    }
  }
  if (CG_HAS_LSE && t4 == 0) {
    if (i0 < CG_L) kf_lse(P, b, h, i0, l0 > 0.f ? m0 * LN2 + logf(l0) : INFINITY);
    if (i1 < CG_L) kf_lse(P, b, h, i1, l1 > 0.f ? m1 * LN2 + logf(l1) : INFINITY);
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  if (CG_B == 0 || CG_H == 0 || CG_L == 0) return 0;
  const size_t smem = sizeof(T) * ((size_t)BQ * LDQ + (size_t)KT * LDK + (size_t)KT * LDV);
  const bool vq = VEC_Q && kf_aligned(P.in[@QIN@], 16);
  const bool vk = VEC_K && kf_aligned(P.in[@KIN@], 16);
  const bool vv = VEC_V && kf_aligned(P.in[@VIN@], 16);
  dim3 grid((unsigned)((CG_L + BQ - 1) / BQ), (unsigned)(CG_B * CG_H));
  cudaError_t e = cudaSuccess;
#define CG_GO(A, B_, C)                                                                            \
  do {                                                                                             \
    if (smem > 48 * 1024) e = cudaFuncSetAttribute(kf_flash_mma<A, B_, C>,                         \
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem); \
    if (e == cudaSuccess) kf_flash_mma<A, B_, C><<<grid, THREADS, smem, stream>>>(P);              \
  } while (0)
  if (vq && vk && vv) CG_GO(true, true, true);
  else CG_GO(false, false, false);
#undef CG_GO
  if (e != cudaSuccess) return (int)e;
  return (int)cudaGetLastError();
}
"""


def _vec8(op: Operand) -> bool:
    """16-byte staging of a [B, H, rows, dim] 16-bit operand: dim contiguous, the rest aligned."""
    if op.strides[3] != 1 or op.shape[3] % 8 or op.offset % 8:
        return False
    return all(st % 8 == 0 for st, sz in zip(op.strides[:3], op.shape[:3]) if sz > 1)


def _flash_mma_space():
    return {"warps": (2, 4, 8), "kt": (16, 32, 64, 128)}


def _flash_mma_valid(ai: AttnInfo, p: dict) -> bool:
    if ai.dtype not in HALVES or ai.E % 16 or ai.Ev % 16 or ai.E > 256 or ai.Ev > 256:
        return False
    regs = p["kt"] // 2 + ai.Ev // 2 + ai.E // 4
    if regs > 168:
        return False
    smem = 2 * (16 * p["warps"] * (ai.E + 8) + p["kt"] * (ai.E + 8) + p["kt"] * (ai.Ev + 8))
    if smem > 200 * 1024:
        return False
    return ai.B * ai.H <= 65535


def _flash_mma_default(ai: AttnInfo) -> dict:
    kt = 64 if max(ai.E, ai.Ev) <= 128 else 32
    warps = 4 if ai.L > 32 else 2
    return {"warps": warps, "kt": kt}


def render_flash_mma(task, p: dict) -> str:
    ai = attn_info(task)
    src = prelude("cuda") + _attn_common_defs(ai, "cuda")
    if ai.dtype == "bfloat16":
        pack = ("const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);\n  uint32_t r;\n"
                "  memcpy(&r, &v, 4);\n  return r;")
        mt = "bf16"
    else:
        pack = ("const __half2 v = __floats2half2_rn(a, b);\n  uint32_t r;\n"
                "  memcpy(&r, &v, 4);\n  return r;")
        mt = "f16"
    return src + fill(_MMA_FLASH, WARPS=p["warps"], KT=p["kt"], FILL=entry_fill("cuda"), PACK2=pack,
                      MMA_T=mt, ZERO=raw_zero(ai.dtype, "cuda"), QIN=ai.q.index, KIN=ai.k.index,
                      VIN=ai.v.index, VEC_Q=1 if _vec8(ai.q) else 0, VEC_K=1 if _vec8(ai.k) else 0,
                      VEC_V=1 if _vec8(ai.v) else 0)


def _attn_extent(task):
    ai = attn_info(task)
    return (ai.B * ai.H * ai.L, ai.S)


def attention_designs(task) -> list:
    ai = attn_info(task)
    if ai is None:
        return []
    out = []
    if task.backend == "cpu":
        out.append(compute_design("gen_flash_omp", "cpu", _flash_omp_space(), "attention",
                             lambda t: _flash_omp_default(attn_info(t)),
                             lambda t, p: attn_info(t) is not None, render_flash_omp, _attn_extent,
                             "flash attention on the cpu: OpenMP over (batch, head, query block)"))
    elif task.backend == "cuda":
        out.append(compute_design("gen_flash_simt", "cuda", _flash_simt_space(), "attention",
                             lambda t: _flash_simt_default(attn_info(t)),
                             lambda t, p: _flash_simt_valid(attn_info(t), p), render_flash_simt,
                             _attn_extent, "flash attention, a warp per query row, K/V tiles in smem"))
        if ai.dtype in HALVES:
            out.append(compute_design("gen_flash_mma", "cuda", _flash_mma_space(), "attention",
                                 lambda t: _flash_mma_default(attn_info(t)),
                                 lambda t, p: _flash_mma_valid(attn_info(t), p), render_flash_mma,
                                 _attn_extent, "FlashAttention-2 style, mma.sync m16n8k16"))
    return [d for d in out if usable(d, task)]
