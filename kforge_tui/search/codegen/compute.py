"""Generated kernels for *compute* regions: matmul (mm/addmm/bmm/baddbmm, Linear as
permute+addmm), attention (the sdpa ops) and convolution (1d/2d/3d, groups, depthwise).

A compute region is one compute op plus the pure views that only feed it (partition.py).
The views are folded into index arithmetic: `analyze` walks the region graph on meta tensors
(`as_strided` over a storage of the input's span) and records, for every tensor argument of
the compute op, which region input it reads and with which shape, strides and storage offset.
Every kernel then reads its operands through those strides and writes every output element at
the output's own strides, so any layout (transposed weights, channels_last, the [B, L, H, E]
memory of an sdpa output) is served by the same source.

Designs (`generate`, listed in codegen/__init__.py):

  matmul    gen_gemm_omp    cpu: BLIS-style packed GEMM, OpenMP over (batch, M tile, N tile), an
                            MR x NR register micro-kernel on GCC vector types, f32 accumulate
                            (f64 for f64); 16-bit operands are widened while packing.
            gen_gemm_simt   cuda: shared-memory tiled GEMM with TM x TN register blocking and
                            optional vector loads (f32/f64 and 16-bit; never TF32).
            gen_gemm_wmma   cuda, bf16/f16: tensor cores (nvcuda::wmma 16x16x16, f32 accumulate),
                            cp.async multi-stage pipeline when strides and alignment allow.
  conv      gen_conv_omp / gen_conv_simt / gen_conv_wmma: the same three GEMMs as an implicit
                            GEMM per group (M = out channels, N = batch x output positions,
                            K = in channels x taps), the im2col done on the fly in the loaders.
            gen_conv_direct cuda: one thread per OCPT output channels of one position (depthwise).
            gen_conv_dw_omp cpu: direct convolution, OpenMP over output rows (depthwise / few
                            channels per group, where a GEMM has nothing to block).
  attention gen_flash_omp   cpu: flash-style, OpenMP over (batch, head, query block), K/V blocks
                            widened once per block, online softmax.
            gen_flash_simt  cuda: one warp per query row, K/V tiles in shared memory, a lane per
                            key for scores and a lane per head-dim slice for the output.
            gen_flash_mma   cuda, bf16/f16: FlashAttention-2 style, mma.sync m16n8k16 (inline PTX)
                            for Q K^T and P V, 16 query rows per warp, online softmax in registers.

Sources are complete candidates: `#include "kforge_region.h"` then the kernel and the generic
entry point. No library calls, no `static` state. The pooling and gather ops live in pool.py,
which reuses the analysis and the dtype helpers below.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

from kforge_tui.regions.abi import INCLUDE_LINE
from kforge_tui.regions.graph import GETITEM, resolve_target
from kforge_tui.search.codegen.kbuild import GenDesign, points
from kforge_tui.search.csrc import CPU_HALF_CONVERSIONS

FLOATS = ("float32", "float16", "bfloat16", "float64")
HALVES = ("float16", "bfloat16")
ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
         "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


# =============================================================================== analysis

@dataclass(frozen=True)
class Operand:
    """A region input as the compute op sees it, through the region's views."""

    index: int  # region input index (inputs[index] in the ABI)
    shape: tuple
    strides: tuple
    offset: int  # storage offset in elements from the input's data pointer
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def ptr(self, backend: str = "") -> str:
        """C expression: typed pointer to element (0, ..., 0)."""
        off = f" + {self.offset}" if self.offset else ""
        return f"((const kf_in{self.index}_t*)P.in[{self.index}]{off})"


@dataclass(frozen=True)
class OutRef:
    """A region output: which result of the compute op it is, and its meta."""

    index: int  # region output index
    item: int  # result index of the compute op (0 for single-result ops)
    shape: tuple
    strides: tuple
    dtype: str


@dataclass
class Region:
    target: str
    args: dict  # bound by the op's schema: Operand for tensors, lists of Operand/None, values
    outs: list  # OutRef per region output (ABI order)

    def out(self, item: int) -> OutRef | None:
        return next((o for o in self.outs if o.item == item), None)


_cache: dict = {}
_cache_lock = threading.Lock()


def _is_view_target(op) -> bool:
    try:
        from kforge_tui.regions.partition import _is_view
        return bool(_is_view(op))
    except Exception:  # pragma: no cover - partition always importable in practice
        rets = getattr(getattr(op, "_schema", None), "returns", None)
        return bool(rets) and rets[0].alias_info is not None


def bind(target: str, args: list, kwargs: dict) -> dict:
    """The op's arguments by schema name (defaults filled in)."""
    op = resolve_target(target)
    schema = op._schema
    out = {}
    pos = list(args)
    for i, a in enumerate(schema.arguments):
        if a.kwarg_only:
            if a.name in kwargs:
                out[a.name] = kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            continue
        if i < len(pos):
            out[a.name] = pos[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            raise ValueError(f"{target}: missing argument {a.name}")
    return out


def analyze(task) -> Region | None:
    """The region's one compute op with its operands seen through the views (None: not a
    single-op region this module can read). Cached per task key."""
    key = task.key
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    try:
        r = _analyze(task)
    except Exception:
        r = None
    with _cache_lock:
        if len(_cache) > 512:
            _cache.clear()
        _cache[key] = r
    return r


def _ensure_prims() -> None:
    try:  # Inductor's prims (the low-memory max pool) resolve only once Inductor registered them
        import torch._inductor.inductor_prims  # noqa: F401
    except Exception:
        pass


def _analyze(task) -> Region | None:
    import torch

    if any(n["target"].startswith("prims.") for n in task.graph["nodes"]):
        _ensure_prims()

    g = task.graph
    env: dict = {}
    metas: dict = {}  # name -> (meta tensor, root input index, root base tensor)
    for i, name in enumerate(g["inputs"]):
        m = task.inputs[i]
        if not m.present:
            env[name] = None
            continue
        span = 1 + sum((s - 1) * st for s, st in zip(m.shape, m.strides)) if all(m.shape) else 1
        base = torch.empty(max(span, 1), dtype=getattr(torch, m.dtype), device="meta")
        t = base.as_strided(tuple(m.shape), tuple(m.strides), 0)
        env[name] = Operand(i, tuple(m.shape), tuple(m.strides), 0, m.dtype)
        metas[name] = (t, i, base)
    main = None
    items: dict = {}
    for n in g["nodes"]:
        tgt = n["target"]
        if tgt == GETITEM:
            src = n["args"][0]["ref"]
            if main is None or src != main["name"]:
                return None
            items[n["name"]] = int(n["args"][1])
            continue
        op = resolve_target(tgt)
        if _is_view_target(op) or tgt in ("aten._unsafe_view.default", "aten.reshape.default"):
            refs = _refs(n["args"]) + _refs(list(n["kwargs"].values()))
            if len(refs) != 1 or refs[0] not in metas:
                return None
            t, root, base = metas[refs[0]]

            def dec(a):
                if isinstance(a, dict) and "ref" in a:
                    return t
                if isinstance(a, list):
                    return [dec(x) for x in a]
                if isinstance(a, dict) and "tuple" in a:
                    return tuple(dec(x) for x in a["tuple"])
                if isinstance(a, dict) and "float" in a:
                    return float(a["float"])
                if isinstance(a, dict):
                    raise ValueError("tagged argument in a view")
                return a

            r = op(*dec(n["args"]), **{k: dec(v) for k, v in n["kwargs"].items()})
            if not isinstance(r, torch.Tensor) or not torch._C._is_alias_of(r, base):
                return None
            metas[n["name"]] = (r, root, base)
            env[n["name"]] = Operand(root, tuple(int(s) for s in r.shape),
                                     tuple(int(s) for s in r.stride()), int(r.storage_offset()),
                                     str(r.dtype).replace("torch.", ""))
            continue
        if main is not None:
            return None
        main = n
    if main is None:
        return None

    def dec2(a):
        if isinstance(a, dict) and "ref" in a:
            v = env.get(a["ref"], "missing")
            if v == "missing":
                raise ValueError("argument is not an input or a view of one")
            return v
        if isinstance(a, list):
            return [dec2(x) for x in a]
        if isinstance(a, dict) and "tuple" in a:
            return tuple(dec2(x) for x in a["tuple"])
        if isinstance(a, dict) and "float" in a:
            return float(a["float"])
        if isinstance(a, dict) and "dtype" in a:
            return a["dtype"]
        if isinstance(a, dict):
            return None
        return a

    args = bind(main["target"], dec2(main["args"]), {k: dec2(v) for k, v in main["kwargs"].items()})
    outs = []
    for j, o in enumerate(g["outputs"]):
        ref = o.get("ref") if isinstance(o, dict) else None
        if ref == main["name"]:
            item = 0
        elif ref in items:
            item = items[ref]
        else:
            return None
        m = task.outputs[j]
        outs.append(OutRef(j, item, tuple(m.shape), tuple(m.strides), m.dtype))
    return Region(main["target"], args, outs)


def _refs(a) -> list:
    if isinstance(a, dict) and "ref" in a:
        return [a["ref"]]
    if isinstance(a, list):
        return [r for x in a for r in _refs(x)]
    if isinstance(a, dict) and "tuple" in a:
        return _refs(a["tuple"])
    return []


def bcast_strides(op: Operand, shape: tuple) -> tuple | None:
    """Strides that read `op` broadcast to `shape` (numpy rules; 0 on broadcast dims)."""
    if op.ndim > len(shape):
        return None
    pad = len(shape) - op.ndim
    st = [0] * pad
    for d in range(op.ndim):
        s, want = op.shape[d], shape[pad + d]
        if s == want:
            st.append(op.strides[d] if want != 1 else 0)
        elif s == 1:
            st.append(0)
        else:
            return None
    return tuple(st)


# =============================================================================== C helpers

_CPU_CVT = r"""#include <string.h>
#include <stdlib.h>
#include <math.h>
// 16-bit floats arrive as raw bits (uint16_t); conversions round to nearest even, NaN kept.
""" + CPU_HALF_CONVERSIONS

_CUDA_CVT = r"""template <typename T, int V> struct alignas(sizeof(T) * V) kf_pk { T v[V]; };
inline bool kf_aligned(const void* p, int bytes) { return ((uintptr_t)p % (uintptr_t)bytes) == 0; }
"""


def ptrs_struct() -> str:
    return ("struct kf_ptrs { const void* in[KF_NUM_INPUTS > 0 ? KF_NUM_INPUTS : 1]; "
            "void* out[KF_NUM_OUTPUTS]; };\n")


def entry_fill(backend: str) -> str:
    """Entry-point lines that copy the pointer arrays into a kf_ptrs P."""
    return ("  kf_ptrs P;\n"
            "  for (int i = 0; i < KF_NUM_INPUTS; ++i) P.in[i] = inputs[i];\n"
            "  for (int i = 0; i < KF_NUM_OUTPUTS; ++i) P.out[i] = outputs[i];\n")


def finish(src: str, backend: str) -> str:
    """Final spelling: `KF_DEV` (the templates' device-function marker) becomes the backend's
    qualifiers. Written out rather than #defined: the static check parses the source as it
    stands, and macros named KF_* belong to the ABI header."""
    return src.replace("KF_DEV", "__device__ __forceinline__" if backend == "cuda" else "inline")


def prelude(backend: str) -> str:
    head = INCLUDE_LINE + "\n"
    if backend == "cuda":
        return head + _CUDA_CVT + ptrs_struct()
    return head + _CPU_CVT + ptrs_struct()


def load(dtype: str, backend: str, expr: str, acc: str = "float") -> str:
    """C expression converting one stored element `expr` to the accumulator type."""
    if dtype == "bfloat16":
        f = f"__bfloat162float({expr})" if backend == "cuda" else f"kf_bf2f({expr})"
    elif dtype == "float16":
        f = f"__half2float({expr})" if backend == "cuda" else f"kf_h2f({expr})"
    elif dtype == "bool":
        f = f"(({expr}) ? 1.0f : 0.0f)"
    else:
        f = f"({expr})"
    return f"(({acc}){f})"


def store(dtype: str, backend: str, expr: str) -> str:
    """C expression converting an accumulator value to the stored type of `dtype`."""
    if dtype == "bfloat16":
        return f"__float2bfloat16_rn((float)({expr}))" if backend == "cuda" else f"kf_f2bf((float)({expr}))"
    if dtype == "float16":
        return f"__float2half_rn((float)({expr}))" if backend == "cuda" else f"kf_f2h((float)({expr}))"
    if dtype == "float32":
        return f"((float)({expr}))"
    if dtype == "float64":
        return f"((double)({expr}))"
    if dtype == "bool":
        return f"(({expr}) != 0)"
    ct = {"int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
          "uint8": "uint8_t"}[dtype]
    return f"(({ct})({expr}))"


def raw_zero(dtype: str, backend: str) -> str:
    if backend == "cuda" and dtype == "bfloat16":
        return "__ushort_as_bfloat16((unsigned short)0)"
    if backend == "cuda" and dtype == "float16":
        return "__ushort_as_half((unsigned short)0)"
    if dtype in HALVES:
        return "((uint16_t)0)"
    return "0"


def flit(x) -> str:
    """A float literal for C (double precision text; finite values only)."""
    x = float(x)
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    if math.isnan(x):
        return "NAN"
    return repr(x)


def fill(src: str, **kw) -> str:
    for k, v in kw.items():
        src = src.replace(f"@{k}@", str(v))
    if "@" in src.replace("@@", ""):
        i = src.find("@")
        raise ValueError(f"unfilled placeholder near {src[max(0, i - 40): i + 40]!r}")
    return src


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def off_expr(terms) -> str:
    """`a*b + c*d` from (index expression, stride) pairs; zero strides dropped."""
    parts = [f"({i}) * {s}LL" if s != 1 else f"({i})" for i, s in terms if s != 0]
    return " + ".join(parts) if parts else "0"


# =============================================================================== designs

def compute_design(*args, **kwargs) -> GenDesign:
    """A shared GenDesign (kbuild.py) whose renders get this module's `finish` step."""
    return GenDesign(*args, finish=finish, **kwargs)



def usable(d: GenDesign, task) -> bool:
    try:
        return d.valid(task, d.default(task))
    except Exception:
        return False


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


def _cpu_gemm_space():
    return {"mr": (2, 4, 6, 8), "nr": (8, 16, 32), "kc": (64, 128, 256, 512),
            "mc": (16, 32, 64, 128, 256), "nc": (32, 64, 128, 256, 512)}


def _cpu_gemm_valid(g: Gemm, p: dict) -> bool:
    vw = 8 if g.acc == "float" else 4
    if p["nr"] % vw or p["nc"] < p["nr"] or p["mc"] < p["mr"]:
        return False
    regs = p["mr"] * (p["nr"] // vw) + p["nr"] // vw
    if regs > 32:
        return False
    return True


def _cpu_gemm_default(g: Gemm) -> dict:
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


def _simt_space():
    return {"bm": (32, 64, 128), "bn": (32, 64, 128), "bk": (8, 16, 32), "tm": (2, 4, 8),
            "tn": (2, 4, 8), "vec": (1, 2, 4, 8)}


def _simt_valid(g: Gemm, p: dict) -> bool:
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


def _simt_default(g: Gemm) -> dict:
    big = g.M * g.N * g.batch >= 128 * 128 * 64
    p = {"bm": 128 if big else 64, "bn": 128 if big else 64, "bk": 8 if big else 16,
         "tm": 8 if big else 4, "tn": 8 if big else 4, "vec": 1}
    for v in (4, 2):
        q = dict(p, vec=v)
        if _simt_valid(g, q):
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


def _wmma_space():
    return {"bm": (32, 64, 128), "bn": (32, 64, 128, 256), "bk": (16, 32, 64), "warps": (2, 4, 8),
            "stages": (2, 3, 4)}


def _wmma_layout(p: dict) -> tuple[int, int]:
    w = p["warps"]
    if w == 2:
        return (2, 1) if p["bm"] >= p["bn"] else (1, 2)
    if w == 4:
        return (2, 2)
    return (2, 4) if p["bn"] >= p["bm"] else (4, 2)


def _wmma_valid(g: Gemm, p: dict) -> bool:
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


def _wmma_default(g: Gemm) -> dict:
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

_MM_TARGETS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default")


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
    if R is None or R.target not in _MM_TARGETS or len(R.outs) != 1 or R.outs[0].item != 0:
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
    out_ptr = f"(({_otype(o.index)}*)P.out[{o.index}])"
    o_off = off_expr([("b", so[0]), ("m", so[1]), ("n", so[2])])
    odt = o.dtype
    alpha_s = "v" if alpha == 1 else f"(acc_t){flit(alpha)} * v"

    def epi(backend: str) -> str:
        val = alpha_s
        if bias is not None:
            bexpr = f"{bias.ptr()}[{off_expr([('b', bst[0]), ('m', bst[1]), ('n', bst[2])])}]"
            bl = load(bias.dtype, backend, bexpr, "acc_t")
            val += " + " + (bl if beta == 1 else f"(acc_t){flit(beta)} * {bl}")
        return f"{out_ptr}[{o_off}] = {store(odt, backend, val)};"

    av = _vec_info(A, (sa[0], sa[1], sa[2]), (Bt, M, K), ("m", "k"))
    if av is not None:
        av["ptr"] = f"{A.ptr()} + " + off_expr([("b", sa[0]), ("i", sa[1]), ("j", sa[2])])
    bv = _vec_info(B, (sb[0], sb[1], sb[2]), (Bt, K, N), ("k", "n"))
    if bv is not None:
        bv["ptr"] = f"{B.ptr()} + " + off_expr([("b", sb[0]), ("i", sb[1]), ("j", sb[2])])
    g = Gemm(Bt, M, N, K, A.dtype, B.dtype, acc, a_raw, b_raw, epi, a_fast, b_fast, av, bv,
             "matmul", 2.0 * Bt * M * N * K)
    g.out_nfast = abs(so[2]) <= abs(so[1]) or so[1] == 0
    return _MMInfo(g, A.index, B.index)


def _otype(j: int) -> str:
    return f"kf_out{j}_t"


def _mm_extent(task):
    i = matmul_info(task)
    return (i.gemm.batch * i.gemm.M, i.gemm.N)


def _matmul_designs(task) -> list:
    info = matmul_info(task)
    if info is None:
        return []
    g = info.gemm
    out = []
    if task.backend == "cpu":
        out.append(compute_design(
            "gen_gemm_omp", "cpu", _cpu_gemm_space(), "matmul",
            lambda t: _cpu_gemm_default(matmul_info(t).gemm),
            lambda t, p: _cpu_gemm_valid(matmul_info(t).gemm, p),
            lambda t, p: render_cpu_gemm(matmul_info(t).gemm, p, matmul_info(t).a_in, matmul_info(t).b_in),
            _mm_extent, "packed OpenMP GEMM with a register micro-kernel"))
    elif task.backend == "cuda":
        out.append(compute_design(
            "gen_gemm_simt", "cuda", _simt_space(), "matmul",
            lambda t: _simt_default(matmul_info(t).gemm),
            lambda t, p: _simt_valid(matmul_info(t).gemm, p),
            lambda t, p: render_simt_gemm(matmul_info(t).gemm, p, matmul_info(t).a_in, matmul_info(t).b_in),
            _mm_extent, "shared-memory tiled GEMM, register blocking, fp32/fp64 FMA"))
        if g.a_dtype in HALVES:
            out.append(compute_design(
                "gen_gemm_wmma", "cuda", _wmma_space(), "matmul",
                lambda t: _wmma_default(matmul_info(t).gemm),
                lambda t, p: _wmma_valid(matmul_info(t).gemm, p),
                lambda t, p: render_wmma_gemm(matmul_info(t).gemm, p, matmul_info(t).a_in, matmul_info(t).b_in),
                _mm_extent, "tensor cores (wmma 16x16x16, f32 accumulate), cp.async pipeline"))
    return [d for d in out if usable(d, task)]


# =============================================================================== attention

_SDPA = {
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
    if R is None or R.target not in _SDPA:
        return None
    kind = _SDPA[R.target]
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


def _attention_designs(task) -> list:
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


# =============================================================================== convolution

@dataclass
class ConvInfo:
    N: int
    C: int
    OC: int
    G: int
    sp: tuple  # input spatial (D, H, W)
    osp: tuple  # output spatial (OD, OH, OW)
    ker: tuple  # (KD, KH, KW)
    stride: tuple
    pad: tuple
    dil: tuple
    x: Operand
    xs: tuple  # strides (n, c, d, h, w)
    w: Operand
    ws: tuple  # strides (oc, ic, kd, kh, kw)
    bias: Operand | None
    out: OutRef
    os: tuple  # strides (n, oc, od, oh, ow)
    dtype: str
    nd: int
    transposed: bool = False  # weight [C_in, OC/G, k...]; out[o] gathers x[(o + p - k*d) / s]

    @property
    def ICg(self) -> int:
        return self.C // self.G

    @property
    def OCg(self) -> int:
        return self.OC // self.G

    @property
    def taps(self) -> int:
        return self.ker[0] * self.ker[1] * self.ker[2]

    @property
    def P(self) -> int:
        return self.N * self.osp[0] * self.osp[1] * self.osp[2]


def _pad3(v: tuple, fill_value: int) -> tuple:
    return (fill_value,) * (3 - len(v)) + tuple(v)


def conv_info(task) -> ConvInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None or R.target != "aten.convolution.default" or len(R.outs) != 1:
        return None
    a = R.args
    x, w, bias = a["input"], a["weight"], a.get("bias")
    if not isinstance(x, Operand) or not isinstance(w, Operand):
        return None
    transposed = bool(a.get("transposed"))
    if x.dtype not in FLOATS or w.dtype != x.dtype:
        return None
    nd = x.ndim - 2
    if nd not in (1, 2, 3) or w.ndim != x.ndim:
        return None
    G = int(a["groups"])
    N, C = x.shape[:2]
    if G <= 0:
        return None
    if transposed:
        if w.shape[0] != C:
            return None
        OC, ICg = w.shape[1] * G, C // G
    else:
        OC, ICg = w.shape[:2]
    if C % G or OC % G or ICg != C // G:
        return None
    o = R.outs[0]
    if o.item != 0 or len(o.shape) != x.ndim or o.dtype != x.dtype or o.shape[:2] != (N, OC):
        return None
    stride, pad, dil = (list(a[k]) for k in ("stride", "padding", "dilation"))
    if len(stride) == 1 and nd > 1:
        stride = stride * nd
    if len(pad) == 1 and nd > 1:
        pad = pad * nd
    if len(dil) == 1 and nd > 1:
        dil = dil * nd
    if len(stride) != nd or len(pad) != nd or len(dil) != nd:
        return None
    if bias is not None:
        if not isinstance(bias, Operand) or bias.shape != (OC,) or bias.dtype not in FLOATS:
            return None
    sp = _pad3(x.shape[2:], 1)
    osp = _pad3(o.shape[2:], 1)
    ker = _pad3(w.shape[2:], 1)
    xs = tuple(x.strides[:2]) + _pad3(x.strides[2:], 0)
    ws = tuple(w.strides[:2]) + _pad3(w.strides[2:], 0)
    os_ = tuple(o.strides[:2]) + _pad3(o.strides[2:], 0)
    st3, pd3, dl3 = _pad3(stride, 1), _pad3(pad, 0), _pad3(dil, 1)
    if transposed:
        opad = list(a.get("output_padding") or [0] * nd)
        if len(opad) == 1 and nd > 1:
            opad = opad * nd
        if len(opad) != nd:
            return None
        op3 = _pad3(opad, 0)
    for i in range(3):  # the output size the op defines
        if transposed:
            want = (sp[i] - 1) * st3[i] - 2 * pd3[i] + dl3[i] * (ker[i] - 1) + op3[i] + 1
        else:
            want = (sp[i] + 2 * pd3[i] - dl3[i] * (ker[i] - 1) - 1) // st3[i] + 1
        if want != osp[i]:
            return None
    return ConvInfo(N, C, OC, G, sp, osp, ker, st3, pd3, dl3, x, xs, w, ws,
                    bias if isinstance(bias, Operand) else None, o, os_, x.dtype, nd, transposed)


def _in_coord(ci: ConvInfo, axis: int, o: str, k: str, i: str, on_bad: str) -> str:
    """C lines computing input coordinate `i` of output coordinate `o` and tap `k` on one
    spatial axis (0: d, 1: h, 2: w), running `on_bad` when that tap reads padding."""
    s, p, d, n = ci.stride[axis], ci.pad[axis], ci.dil[axis], ci.sp[axis]
    if not ci.transposed:
        return (f"const int64_t {i} = {o} * {s} - {p} + {k} * {d}; "
                f"if ((uint64_t){i} >= (uint64_t){n}) {on_bad}")
    t = f"t{i}_"
    if s == 1:
        return (f"const int64_t {i} = {o} + {p} - {k} * {d}; "
                f"if ((uint64_t){i} >= (uint64_t){n}) {on_bad}")
    return (f"const int64_t {t} = {o} + {p} - {k} * {d}; if ({t} < 0 || {t} % {s}) {on_bad} "
            f"const int64_t {i} = {t} / {s}; if ({i} >= {n}) {on_bad}")


def _conv_cl(ci: ConvInfo) -> bool:
    """Channels-last input: ic is the fastest digit of the reduction index."""
    return ci.xs[1] == 1 and ci.ICg > 1


def _conv_gemm(ci: ConvInfo) -> Gemm:
    KD, KH, KW = ci.ker
    OD, OH, OW = ci.osp
    ICg, OCg = ci.ICg, ci.OCg
    cl = _conv_cl(ci)
    if cl:
        rdec = (f"const int64_t ic = k % {ICg}; const int64_t t_ = k / {ICg}; "
                f"const int64_t kw = t_ % {KW}, kh = (t_ / {KW}) % {KH}, kd = t_ / {KW * KH};")
    else:
        rdec = (f"const int64_t ic = k / {ci.taps}; const int64_t t_ = k % {ci.taps}; "
                f"const int64_t kw = t_ % {KW}, kh = (t_ / {KW}) % {KH}, kd = t_ / {KW * KH};")
    pdec = (f"const int64_t ow = n % {OW}, oh = (n / {OW}) % {OH}, od = (n / {OW * OH}) % {OD}, "
            f"nb = n / {OW * OH * OD};")
    if ci.transposed:
        w_off = off_expr([(f"b * {ICg} + ic", ci.ws[0]), ("m", ci.ws[1]), ("kd", ci.ws[2]),
                          ("kh", ci.ws[3]), ("kw", ci.ws[4])])
    else:
        w_off = off_expr([(f"b * {OCg} + m", ci.ws[0]), ("ic", ci.ws[1]), ("kd", ci.ws[2]),
                          ("kh", ci.ws[3]), ("kw", ci.ws[4])])
    a_raw = f"{rdec} return {ci.w.ptr()}[{w_off}];"
    sd, sh, sw = ci.stride
    pd, ph, pw = ci.pad
    dd, dh, dw = ci.dil
    D, H, W = ci.sp
    x_off = off_expr([("nb", ci.xs[0]), (f"b * {ICg} + ic", ci.xs[1]), ("id", ci.xs[2]),
                      ("ih", ci.xs[3]), ("iw", ci.xs[4])])
    zero = "return @ZERO@;"
    b_body = (f"{rdec} {pdec} " + _in_coord(ci, 0, "od", "kd", "id", zero) + " "
              + _in_coord(ci, 1, "oh", "kh", "ih", zero) + " " + _in_coord(ci, 2, "ow", "kw", "iw", zero)
              + f" return {ci.x.ptr()}[{x_off}];")
    o = ci.out
    o_off = off_expr([("nb", ci.os[0]), (f"b * {OCg} + m", ci.os[1]), ("od", ci.os[2]),
                      ("oh", ci.os[3]), ("ow", ci.os[4])])
    bias = ci.bias
    pdec_n = pdec

    def epi(backend: str) -> str:
        val = "v"
        if bias is not None:
            val += " + " + load(bias.dtype, backend,
                                f"{bias.ptr()}[(b * {OCg} + m){'' if bias.strides[0] == 1 else ' * ' + str(bias.strides[0]) + 'LL'}]",
                                "acc_t")
        return (f"{pdec_n} (({_otype(o.index)}*)P.out[{o.index}])[{o_off}] = "
                f"{store(o.dtype, backend, val)};")

    acc = "double" if ci.dtype == "float64" else "float"
    g = Gemm(ci.G, OCg, ci.P, ICg * ci.taps, ci.dtype, ci.dtype, acc, a_raw, b_body, epi, "k",
             "k" if cl else "n", None, None, "conv", 2.0 * ci.P * ci.OC * ICg * ci.taps)
    g.out_nfast = not (ci.os[1] == 1)
    return g


def _conv_gemm_backend(g: Gemm, backend: str) -> Gemm:
    """The GEMM with backend-specific zero literals filled in."""
    from dataclasses import replace
    return replace(g, b_raw=g.b_raw.replace("@ZERO@", raw_zero(g.b_dtype, backend)))


def _cg(task) -> Gemm:
    return _conv_gemm_backend(_conv_gemm(conv_info(task)), task.backend)


def _conv_ins(task) -> tuple[int, int]:
    ci = conv_info(task)
    return ci.w.index, ci.x.index


# ---------------------------------------------------------------------- cpu direct conv

_CPU_CONV_DIRECT = r"""
#define CG_N @N@LL
#define CG_G @G@LL
#define ICG @ICG@LL
#define OCG @OCG@LL
#define OCB @OCB@
#define D_ @D@LL
#define H_ @H@LL
#define W_ @W@LL
#define OD @OD@LL
#define OH @OH@LL
#define OW @OW@LL
#define KD @KD@
#define KH @KH@
#define KW @KW@
typedef @ACC@ acc_t;
KF_DEV acc_t kf_x(const kf_ptrs& P, int64_t off) { return @LDX@; }
KF_DEV acc_t kf_w(const kf_ptrs& P, int64_t oc, int64_t ic, int64_t kd, int64_t kh, int64_t kw) { return @LDW@; }
KF_DEV acc_t kf_bias(const kf_ptrs& P, int64_t oc) { return @LDBIAS@; }
KF_DEV void kf_o(const kf_ptrs& P, int64_t n, int64_t oc, int64_t od, int64_t oh, int64_t ow, acc_t v) { @STO@ }

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
@FILL@
  if (CG_N == 0 || OD * OH * OW == 0) return 0;
  int failed = 0;
#pragma omp parallel
  {
    acc_t* row = (acc_t*)malloc(sizeof(acc_t) * OCB * OW);
    if (!row) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(3) schedule(static)
    for (int64_t n = 0; n < CG_N; ++n)
      for (int64_t ocb = 0; ocb < CG_G * OCG / OCB; ++ocb)
        for (int64_t r = 0; r < OD * OH; ++r) {
          if (!row) continue;
          const int64_t oc0 = ocb * OCB, g = oc0 / OCG, od = r / OH, oh = r % OH;
          for (int64_t e = 0; e < OCB * OW; ++e) row[e] = 0;
          for (int64_t ic = 0; ic < ICG; ++ic)
            for (int kd = 0; kd < KD; ++kd) {
              const int64_t id = od * @SD@ - @PD@ + kd * @DD@;
              if (id < 0 || id >= D_) continue;
              for (int kh = 0; kh < KH; ++kh) {
                const int64_t ih = oh * @SH@ - @PH@ + kh * @DH@;
                if (ih < 0 || ih >= H_) continue;
                const int64_t base = n * @XSN@LL + (g * ICG + ic) * @XSC@LL + id * @XSD@LL + ih * @XSH@LL;
                for (int kw = 0; kw < KW; ++kw) {
                  const int64_t off = (int64_t)kw * @DW@ - @PW@;
                  const int64_t lo = off >= 0 ? 0 : (-off + @SW@ - 1) / @SW@;
                  const int64_t hi0 = W_ - 1 - off < 0 ? 0 : (W_ - 1 - off) / @SW@ + 1;
                  const int64_t hi = hi0 < OW ? hi0 : OW;
                  acc_t wv[OCB];
                  for (int u = 0; u < OCB; ++u) wv[u] = kf_w(P, oc0 + u, ic, kd, kh, kw);
                  for (int u = 0; u < OCB; ++u) {
                    acc_t* ru = row + u * OW;
                    const acc_t wu = wv[u];
#pragma omp simd
                    for (int64_t ow = lo; ow < hi; ++ow) ru[ow] += wu * kf_x(P, base + (ow * @SW@ + off) * @XSW@LL);
                  }
                }
              }
            }
          for (int u = 0; u < OCB; ++u)
            for (int64_t ow = 0; ow < OW; ++ow) kf_o(P, n, oc0 + u, od, oh, ow, row[u * OW + ow] + kf_bias(P, oc0 + u));
        }
    free(row);
  }
  return failed ? 1 : 0;
}
"""


def _conv_direct_common(ci: ConvInfo, backend: str) -> dict:
    x, w, o = ci.x, ci.w, ci.out
    ldx = load(x.dtype, backend, f"{x.ptr()}[off]", "acc_t")
    if ci.transposed:
        widx = off_expr([(f"(oc / {ci.OCg}) * {ci.ICg} + ic", ci.ws[0]), (f"oc % {ci.OCg}", ci.ws[1]),
                         ("kd", ci.ws[2]), ("kh", ci.ws[3]), ("kw", ci.ws[4])])
    else:
        widx = off_expr([("oc", ci.ws[0]), ("ic", ci.ws[1]), ("kd", ci.ws[2]), ("kh", ci.ws[3]),
                         ("kw", ci.ws[4])])
    ldw = load(w.dtype, backend, f"{w.ptr()}[{widx}]", "acc_t")
    if ci.bias is not None:
        b = ci.bias
        ldb = load(b.dtype, backend, f"{b.ptr()}[{off_expr([('oc', b.strides[0])])}]", "acc_t")
    else:
        ldb = "(acc_t)0"
    sto = (f"(({_otype(o.index)}*)P.out[{o.index}])[{off_expr([('n', ci.os[0]), ('oc', ci.os[1]), ('od', ci.os[2]), ('oh', ci.os[3]), ('ow', ci.os[4])])}] = "
           f"{store(o.dtype, backend, 'v')};")
    D, H, W = ci.sp
    OD, OH, OW = ci.osp
    KD, KH, KW = ci.ker
    return dict(N=ci.N, G=ci.G, ICG=ci.ICg, OCG=ci.OCg, D=D, H=H, W=W, OD=OD, OH=OH, OW=OW, KD=KD,
                KH=KH, KW=KW, ACC="double" if ci.dtype == "float64" else "float", LDX=ldx, LDW=ldw,
                LDBIAS=ldb, STO=sto, CD=_in_coord(ci, 0, "od", "kd", "id", "continue;"),
                CH=_in_coord(ci, 1, "oh", "kh", "ih", "continue;"),
                CW=_in_coord(ci, 2, "ow", "kw", "iw", "continue;"), SD=ci.stride[0], SH=ci.stride[1], SW=ci.stride[2],
                PD=ci.pad[0], PH=ci.pad[1], PW=ci.pad[2], DD=ci.dil[0], DH=ci.dil[1], DW=ci.dil[2],
                XSN=ci.xs[0], XSC=ci.xs[1], XSD=ci.xs[2], XSH=ci.xs[3], XSW=ci.xs[4])


def render_conv_direct_omp(task, p: dict) -> str:
    ci = conv_info(task)
    return prelude("cpu") + fill(_CPU_CONV_DIRECT, OCB=p["ocb"], FILL=entry_fill("cpu"),
                                 **_conv_direct_common(ci, "cpu"))


# ---------------------------------------------------------------------- cuda direct conv

_CUDA_CONV_DIRECT = r"""
#define CG_N @N@LL
#define CG_G @G@LL
#define ICG @ICG@LL
#define OCG @OCG@LL
#define OCPT @OCPT@
#define D_ @D@LL
#define H_ @H@LL
#define W_ @W@LL
#define OD @OD@LL
#define OH @OH@LL
#define OW @OW@LL
#define KD @KD@
#define KH @KH@
#define KW @KW@
#define THREADS @THREADS@
typedef @ACC@ acc_t;
KF_DEV acc_t kf_x(const kf_ptrs& P, int64_t off) { return @LDX@; }
KF_DEV acc_t kf_w(const kf_ptrs& P, int64_t oc, int64_t ic, int64_t kd, int64_t kh, int64_t kw) { return @LDW@; }
KF_DEV acc_t kf_bias(const kf_ptrs& P, int64_t oc) { return @LDBIAS@; }
KF_DEV void kf_o(const kf_ptrs& P, int64_t n, int64_t oc, int64_t od, int64_t oh, int64_t ow, acc_t v) { @STO@ }

__global__ void __launch_bounds__(THREADS) kf_conv_direct(kf_ptrs P) {
  const int64_t total = CG_N * CG_G * (OCG / OCPT) * OD * OH * OW;
  for (int64_t t = (int64_t)blockIdx.x * THREADS + threadIdx.x; t < total; t += (int64_t)gridDim.x * THREADS) {
    int64_t q = t;
@DECOMP@
    const int64_t oc0 = g * OCG + ocb * OCPT;
    acc_t acc[OCPT];
#pragma unroll
    for (int u = 0; u < OCPT; ++u) acc[u] = 0;
    for (int64_t ic = 0; ic < ICG; ++ic) {
#pragma unroll
      for (int kd = 0; kd < KD; ++kd) {
        @CD@
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
          @CH@
#pragma unroll
          for (int kw = 0; kw < KW; ++kw) {
            @CW@
            const acc_t xv = kf_x(P, n * @XSN@LL + (g * ICG + ic) * @XSC@LL + id * @XSD@LL + ih * @XSH@LL + iw * @XSW@LL);
#pragma unroll
            for (int u = 0; u < OCPT; ++u) acc[u] += xv * kf_w(P, oc0 + u, ic, kd, kh, kw);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < OCPT; ++u) kf_o(P, n, oc0 + u, od, oh, ow, acc[u] + kf_bias(P, oc0 + u));
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  const int64_t total = CG_N * CG_G * (OCG / OCPT) * OD * OH * OW;
  if (total == 0) return 0;
  int64_t blocks = (total + THREADS - 1) / THREADS;
  if (blocks > 1048576) blocks = 1048576;
  kf_conv_direct<<<(unsigned)blocks, THREADS, 0, stream>>>(P);
  return (int)cudaGetLastError();
}
"""


def _conv_decomp(ci: ConvInfo, ocpt: int) -> str:
    """Output index order for threads: the output's memory order (channels-last output keeps
    channels innermost so that consecutive threads write consecutive addresses)."""
    OD, OH, OW = ci.osp
    ocb_n = ci.OCg // ocpt
    if ci.os[1] == 1 and ci.OC > 1:  # channels innermost
        dims = [("ocb", ocb_n), ("g", ci.G), ("ow", OW), ("oh", OH), ("od", OD), ("n", ci.N)]
    else:
        dims = [("ow", OW), ("oh", OH), ("od", OD), ("ocb", ocb_n), ("g", ci.G), ("n", ci.N)]
    lines = []
    for nm, sz in dims[:-1]:
        lines.append(f"    const int64_t {nm} = q % {sz}LL; q /= {sz}LL;")
    lines.append(f"    const int64_t {dims[-1][0]} = q;")
    return "\n".join(lines)


def render_conv_direct_cuda(task, p: dict) -> str:
    ci = conv_info(task)
    return prelude("cuda") + fill(_CUDA_CONV_DIRECT, OCPT=p["ocpt"], THREADS=p["threads"],
                                  FILL=entry_fill("cuda"), DECOMP=_conv_decomp(ci, p["ocpt"]),
                                  **_conv_direct_common(ci, "cuda"))


def _conv_extent(task):
    ci = conv_info(task)
    return (ci.N * ci.OC, ci.osp[0] * ci.osp[1] * ci.osp[2])


def _conv_designs(task) -> list:
    ci = conv_info(task)
    if ci is None:
        return []
    out = []
    ocb_ok = lambda t, p, key: conv_info(t).OCg % p[key] == 0  # noqa: E731
    if task.backend == "cpu":
        out.append(compute_design(
            "gen_conv_omp", "cpu", _cpu_gemm_space(), "conv",
            lambda t: _cpu_gemm_default(_cg(t)),
            lambda t, p: _cpu_gemm_valid(_cg(t), p),
            lambda t, p: render_cpu_gemm(_cg(t), p, *_conv_ins(t)),
            _conv_extent, "implicit GEMM per group (im2col while packing), OpenMP"))
        out.append(compute_design(
            "gen_conv_direct_omp", "cpu", {"ocb": (1, 2, 4, 8)}, "conv",
            lambda t: {"ocb": max(c for c in (1, 2, 4, 8) if conv_info(t).OCg % c == 0)},
            lambda t, p: ocb_ok(t, p, "ocb") and not conv_info(t).transposed, render_conv_direct_omp,
            _conv_extent,
            "direct convolution over output rows, simd along the row (depthwise, few channels)"))
    elif task.backend == "cuda":
        out.append(compute_design(
            "gen_conv_simt", "cuda", {k: v for k, v in _simt_space().items() if k != "vec"} | {"vec": (1,)},
            "conv", lambda t: dict(_simt_default(_cg(t)), vec=1),
            lambda t, p: _simt_valid(_cg(t), p),
            lambda t, p: render_simt_gemm(_cg(t), p, *_conv_ins(t)),
            _conv_extent, "implicit GEMM per group, shared-memory tiles, register blocking"))
        if ci.dtype in HALVES:
            out.append(compute_design(
                "gen_conv_wmma", "cuda", _wmma_space(), "conv",
                lambda t: _wmma_default(_cg(t)),
                lambda t, p: _wmma_valid(_cg(t), p),
                lambda t, p: render_wmma_gemm(_cg(t), p, *_conv_ins(t)),
                _conv_extent, "implicit GEMM per group on tensor cores (wmma, f32 accumulate)"))
        out.append(compute_design(
            "gen_conv_direct", "cuda", {"threads": (64, 128, 256, 512), "ocpt": (1, 2, 4, 8)}, "conv",
            lambda t: {"threads": 256, "ocpt": max(c for c in (1, 2, 4) if conv_info(t).OCg % c == 0)},
            lambda t, p: ocb_ok(t, p, "ocpt"), render_conv_direct_cuda, _conv_extent,
            "direct convolution, a thread per OCPT output channels of one position"))
    return [d for d in out if usable(d, task)]


# =============================================================================== the generator

def generate(task) -> list:
    """Every generated compute design for this task ([] when none fits; never raises)."""
    try:
        if task.kind != "compute" or task.backend not in ("cpu", "cuda"):
            return []
        R = analyze(task)
        if R is None:
            return []
        if R.target in _MM_TARGETS:
            return _matmul_designs(task)
        if R.target in _SDPA:
            return _attention_designs(task)
        if R.target == "aten.convolution.default":
            return _conv_designs(task)
    except Exception:
        return []
    return []

