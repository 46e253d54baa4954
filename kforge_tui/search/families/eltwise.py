"""Elementwise families: gelu (erf / tanh), silu, relu, and the gated silu(a) * b.

All compute in f32 and round once, as PyTorch does for half types; silu(a) * b rounds silu(a)
to the input dtype first, because that is what the two-op PyTorch reference does.

cuda:
  vec_grid  one (or `unroll`) 16-byte packs per thread over the flat tensor, the tail in the
            same launch (tiny tensors: one launch); flat or persistent grid.
  rows_vec  silu_mul over [rows, cols] with row strides (a, b may be halves of one tensor).
  flat_vec  silu_mul over the flattened (row, column pack) index: short rows keep blocks busy.
cpu:
  flat_omp / rows_omp  `omp parallel for simd`, polynomial exp so the loop vectorises.
"""
from __future__ import annotations

from dataclasses import replace

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import ELEM_BYTES, cpu_head, cuda_head, entry, fill
from kforge_tui.regions.patterns import OpTask
from kforge_tui.regions import patterns

FLAT_OPS = ("gelu", "silu", "relu")


def _fn_cuda(task: OpTask, fast: bool = False) -> str:
    """`kf_op(float) -> float` for the task's op (device code). `fast`: the exponential and the
    division as the hardware approximations (ex2.approx, rcp.approx: ~2 ulp), as Triton and so
    torch.compile emit them; IEEE expf / division cost ~20 instructions per element, a third of
    the issue slots a bandwidth-bound 16-bit kernel has. Whether the result is close enough is
    for verification to judge, per dtype."""
    ex, div = ("__expf", "__fdividef({}, {})") if fast else ("expf", "{} / ({})")
    if task.op == "relu":
        body = "return v < 0.f ? 0.f : v;"  # keeps NaN, as torch.relu does
    elif task.op == "gelu" and task.params.get("approximate", "none") == "tanh":
        body = ("const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v); return "
                + div.format("v", f"1.f + {ex}(-2.f * u)") + ";")
    elif task.op == "gelu":
        body = "return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));"
    else:
        body = "return " + div.format("v", f"1.f + {ex}(-v)") + ";"
    return f"__device__ __forceinline__ float kf_op(float v) {{ {body} }}\n"


def _fn_cpu(task: OpTask, exp: str) -> str:
    if task.op == "relu":
        body = "return v < 0.f ? 0.f : v;"
    elif task.op == "gelu" and task.params.get("approximate", "none") == "tanh":
        body = f"const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v); return v / (1.f + {exp}(-2.f * u));"
    elif task.op == "gelu":
        body = "return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));"
    else:
        body = f"return v / (1.f + {exp}(-v));"
    return f"inline float kf_op(float v) {{ {body} }}\n" + _vfn_cpu(task, exp)


def _vfn_cpu(task: OpTask, exp: str) -> str:
    """`kf_vop(kf_v) -> kf_v` and `kf_sop(float)` (its tail twin); exp=libm keeps scalar kf_op."""
    if exp != "kf_exp" and _uses_exp(task):
        return "#define ELT_VEC 0\ninline kf_v kf_vop(kf_v v) { return v; }\ninline float kf_sop(float v) { return kf_op(v); }\n"
    if task.op == "relu":
        vb, sb = "return kf_vrelu(v);", "return kf_op(v);"
    elif task.op == "gelu" and task.params.get("approximate", "none") == "tanh":
        vb = ("const kf_v u = kf_vmul(kf_vset(0.7978845608028654f), kf_vfma(kf_vmul(kf_vset(0.044715f), v), kf_vmul(v, v), v)); "
              "return kf_vdiv(v, kf_vadd(kf_vset(1.f), kf_vexp(kf_vmul(kf_vset(-2.f), u))));")
        sb = "return kf_op(v);"
    elif task.op == "gelu":
        vb = ("return kf_vmul(kf_vmul(kf_vset(0.5f), v), "
              "kf_vadd(kf_vset(1.f), kf_verf(kf_vmul(v, kf_vset(0.7071067811865476f)))));")
        sb = "return 0.5f * v * (1.f + kf_erf_as(v * 0.7071067811865476f));"
    else:
        vb = "return kf_vdiv(v, kf_vadd(kf_vset(1.f), kf_vexp(kf_vsub(kf_vset(0.f), v))));"
        sb = "return kf_op(v);"
    return (f"#define ELT_VEC 1\ninline kf_v kf_vop(kf_v v) {{ {vb} }}\n"
            f"inline float kf_sop(float v) {{ {sb} }}\n")


def _default_math(task: OpTask) -> str:
    """fast where there is an exp to approximate: on the H200, silu*b bf16 ran 2-7 % faster with it
    (bench/NOTES.md round 4), and its ~2 ulp error is 50x inside the f32 tolerance."""
    return "fast" if _uses_exp(task) else "ieee"


def _uses_exp(task: OpTask) -> bool:
    return task.op in ("silu", "silu_mul") or (task.op == "gelu" and task.params.get("approximate") == "tanh")


def _hint(p: dict) -> str:
    """Load/store hint as the kernels' HINT template argument: 0 none, 1 stream (evict-first
    loads and stores), 2 L2 256-byte prefetch on loads."""
    return str({"stream": 1, "l2pf": 2}.get(p.get("hint"), 0))


_CUDA_LD = r"""
template <int HINT, typename T, int V> __device__ __forceinline__ kf_pack<T, V> kf_ld(const T* p) {
  if constexpr (HINT == 1) return kf_load_cs<T, V>(p);
  else if constexpr (HINT == 2) return kf_load_pf<T, V>(p);
  else return kf_load<T, V>(p);
}
template <int HINT, typename T, int V> __device__ __forceinline__ void kf_st_out(T* p, const kf_pack<T, V>& v) {
  if constexpr (HINT == 1) kf_store_cs<T, V>(p, v);
  else kf_store<T, V>(p, v);
}
"""

_CUDA_FLAT = r"""
// HINT 1: streaming (evict-first) loads and stores (every byte is touched once); 2: loads that
// prefetch their 256-byte L2 block. Grid-stride over blocks of THREADS x UNROLL packs (a flat
// grid has one pass; a persistent one strides); the numel % VEC tail elements are done by
// block 0 in the same launch (one launch for any size: tiny tensors are launch-bound).
template <int THREADS, int VEC, int UNROLL, int HINT = 0>
__global__ void __launch_bounds__(THREADS) kf_elt(const TI* __restrict__ x, TO* __restrict__ y, int64_t npack,
                                                 int64_t numel) {
  constexpr int64_t PER = (int64_t)THREADS * UNROLL;
  for (int64_t blk = blockIdx.x; blk * PER < npack; blk += gridDim.x) {
    const int64_t i0 = blk * PER + threadIdx.x;
    kf_pack<TI, VEC> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = i0 + (int64_t)u * THREADS;
      if (i < npack) p[u] = kf_ld<HINT, TI, VEC>(x + i * VEC);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = i0 + (int64_t)u * THREADS;
      if (i < npack) {
        float r[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) r[j] = kf_op(kf_f(p[u].v[j]));
        kf_st_out<HINT, TO, VEC>(y + i * VEC, kf_to_pack<TO, VEC>(r));
      }
    }
  }
  if (VEC > 1 && blockIdx.x == 0) {
    const int64_t e = npack * VEC + threadIdx.x;
    if (e < numel) y[e] = kf_to<TO>(kf_op(kf_f(x[e])));
  }
}
"""

_CUDA_FLAT_LAUNCH = r"""
  if (numel <= 0) return 0;
  const bool fast = kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO));
  const int vec = fast ? @VEC@ : 1;
  const int64_t npack = numel / vec, per = (int64_t)@THREADS@ * @UNROLL@;
  int64_t blocks = (npack + per - 1) / per;
  if (blocks < 1) blocks = 1;
  if (@PERSIST@) {  // persistent: a few blocks per SM stride over the tensor
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const int64_t cap = (int64_t)(sms > 0 ? sms : 132) * (2048 / @THREADS@);
    if (blocks > cap) blocks = cap;
  }
  if (blocks > 2147483647) blocks = 2147483647;  // the kernel strides over the rest
  if (fast) kf_elt<@THREADS@, @VEC@, @UNROLL@, @HINT@><<<(unsigned)blocks, @THREADS@, 0, stream>>>(x, y, npack, numel);
  else kf_elt<@THREADS@, 1, @UNROLL@><<<(unsigned)blocks, @THREADS@, 0, stream>>>(x, y, npack, numel);
  return (int)cudaGetLastError();
"""


def _flat_default(task: OpTask) -> dict:
    """16-byte packs, a flat grid (one pass: on the H200 a persistent grid was 7-11 % slower on
    1-4 GB tensors, bench/results/shape_sweep), 512 threads from 2^26 elements (1-2 % faster
    there) else 256; two packs in flight per thread from 8 full waves up (2M f32 elements)."""
    vec = 16 // max(ELEM_BYTES[task.dtype], ELEM_BYTES[task.output.dtype])
    n = task.inputs[0].numel
    return {"threads": 512 if n >= 2**26 else 256, "vec": vec, "unroll": 2 if n >= 256 * vec * 2 * 132 * 8 else 1,
            "hint": "none", "math": _default_math(task), "grid": "flat"}


def _flat_valid(task: OpTask, p: dict) -> bool:
    return (max(ELEM_BYTES[task.dtype], ELEM_BYTES[task.output.dtype]) * p["vec"] <= 32
            and (p.get("math", "ieee") == "ieee" or _uses_exp(task)))  # relu / erf gelu: nothing to approximate


def _flat_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_FLAT_LAUNCH, THREADS=p["threads"], VEC=p["vec"], UNROLL=p["unroll"], HINT=_hint(p),
                PERSIST="true" if p.get("grid") == "persist" else "false")
    return cuda_head(task) + _fn_cuda(task, p.get("math") == "fast") + _CUDA_LD + _CUDA_FLAT + entry(task, "cuda", body)


register(Family("vec_grid", FLAT_OPS, "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16), "unroll": (1, 2, 4),
                 "hint": ("none", "stream", "l2pf"), "math": ("ieee", "fast"), "grid": ("flat", "persist")},
                _flat_default, _flat_valid, _flat_render,
                doc="16-byte packs, `unroll` packs in flight per thread, tail in the same launch; `hint` "
                    "stream = evict-first loads and stores, l2pf = 256-byte L2 prefetch; `math` fast = "
                    "approximate exp and division; `grid` flat (one pass) or persist (blocks stride)"))


_CUDA_ROWS = r"""
template <int THREADS, int VEC, int UNROLL, int HINT = 0>
__global__ void __launch_bounds__(THREADS) kf_silu_mul(const TI* __restrict__ a, int64_t sa, const TI* __restrict__ b,
    int64_t sb, TO* __restrict__ y, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const TI* ar = a + r * sa;
    const TI* br = b + r * sb;
    TO* yr = y + r * cols;
    const int64_t c0 = ((int64_t)blockIdx.x * THREADS * UNROLL + threadIdx.x) * VEC;
    kf_pack<TI, VEC> pa[UNROLL], pb[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t c = c0 + (int64_t)u * THREADS * VEC;
      if (c < cols) {
        pa[u] = kf_ld<HINT, TI, VEC>(ar + c);
        pb[u] = kf_ld<HINT, TI, VEC>(br + c);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t c = c0 + (int64_t)u * THREADS * VEC;
      if (c < cols) {
        float r[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) r[j] = kf_f(kf_to<TI>(kf_op(kf_f(pa[u].v[j])))) * kf_f(pb[u].v[j]);
        kf_st_out<HINT, TO, VEC>(yr + c, kf_to_pack<TO, VEC>(r));
      }
    }
  }
}
"""

_CUDA_ROWS_LAUNCH = r"""
  if (rows <= 0 || cols <= 0) return 0;
  const bool fast = cols % @VEC@ == 0 && a_row_stride % @VEC@ == 0 && b_row_stride % @VEC@ == 0 &&
                    kf_aligned(a, @VEC@ * sizeof(TI)) && kf_aligned(b, @VEC@ * sizeof(TI)) &&
                    kf_aligned(y, @VEC@ * sizeof(TO));
  const int vec = fast ? @VEC@ : 1;
  const int64_t per = (int64_t)@THREADS@ * @UNROLL@ * vec;
  const dim3 grid((unsigned)((cols + per - 1) / per), (unsigned)(rows < 65535 ? rows : 65535));
  if (fast) kf_silu_mul<@THREADS@, @VEC@, @UNROLL@, @HINT@><<<grid, @THREADS@, 0, stream>>>(a, a_row_stride, b, b_row_stride, y, rows, cols);
  else kf_silu_mul<@THREADS@, 1, @UNROLL@><<<grid, @THREADS@, 0, stream>>>(a, a_row_stride, b, b_row_stride, y, rows, cols);
  return (int)cudaGetLastError();
"""


def _rows_default(task: OpTask) -> dict:
    cols = patterns.scalar_args(task)["cols"]
    vec = 16 // ELEM_BYTES[task.dtype]
    while vec > 1 and cols % vec:
        vec //= 2
    # 128 threads x 2 packs of a and of b in flight: on the H200, 128 threads beat 256 (more,
    # smaller blocks balance better over 132 SMs) and a second pack hides more DRAM latency.
    threads = 128
    while threads > 32 and threads * vec > cols:
        threads //= 2
    unroll = 2 if cols >= threads * vec * 2 else 1
    return {"threads": threads if threads in (64, 128, 256, 512, 1024) else 64, "vec": vec, "unroll": unroll,
            "hint": "none", "math": _default_math(task)}


def _rows_valid(task: OpTask, p: dict) -> bool:
    return ELEM_BYTES[task.dtype] * p["vec"] <= 32


def _rows_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_ROWS_LAUNCH, THREADS=p["threads"], VEC=p["vec"], UNROLL=p["unroll"], HINT=_hint(p))
    fn = _fn_cuda(replace(task, op="silu"), p.get("math") == "fast")
    return cuda_head(task) + fn + _CUDA_LD + _CUDA_ROWS + entry(task, "cuda", body)


register(Family("rows_vec", ("silu_mul",), "cuda",
                {"threads": (64, 128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16), "unroll": (1, 2, 4),
                 "hint": ("none", "stream", "l2pf"), "math": ("ieee", "fast")},
                _rows_default, _rows_valid, _rows_render,
                doc="2-D grid over (column packs, rows), strided rows, 16-byte packs; `hint` stream = "
                    "evict-first loads and stores, l2pf = 256-byte L2 prefetch; `math` fast = "
                    "approximate exp and division"))


_CUDA_ROWS_FLAT = r"""
// silu(a) * b over the flattened (row, column pack) index: for short rows (a 2-D grid would leave
// most of each block idle when cols < THREADS x VEC). Pack i is row i / ppr, column (i % ppr) x
// VEC; 32-bit index arithmetic when the pack count fits (I32).
template <int THREADS, int VEC, int UNROLL, bool I32>
__global__ void __launch_bounds__(THREADS) kf_silu_mul_flat(const TI* __restrict__ a, int64_t sa,
    const TI* __restrict__ b, int64_t sb, TO* __restrict__ y, int64_t total, int64_t ppr) {
  constexpr int64_t PER = (int64_t)THREADS * UNROLL;
  for (int64_t blk = blockIdx.x; blk * PER < total; blk += gridDim.x) {
    kf_pack<TI, VEC> pa[UNROLL], pb[UNROLL];
    int64_t yo[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = blk * PER + (int64_t)u * THREADS + threadIdx.x;
      yo[u] = -1;
      if (i < total) {
        int64_t r, c;
        if constexpr (I32) { r = (unsigned)i / (unsigned)ppr; c = ((unsigned)i - (unsigned)r * (unsigned)ppr) * VEC; }
        else { r = i / ppr; c = (i - r * ppr) * VEC; }
        pa[u] = kf_load<TI, VEC>(a + r * sa + c);
        pb[u] = kf_load<TI, VEC>(b + r * sb + c);
        yo[u] = i * VEC;
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (yo[u] >= 0) {
        float r[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) r[j] = kf_f(kf_to<TI>(kf_op(kf_f(pa[u].v[j])))) * kf_f(pb[u].v[j]);
        kf_store<TO, VEC>(y + yo[u], kf_to_pack<TO, VEC>(r));
      }
    }
  }
}
"""

_CUDA_ROWS_FLAT_LAUNCH = r"""
  if (rows <= 0 || cols <= 0) return 0;
  const bool fast = cols % @VEC@ == 0 && a_row_stride % @VEC@ == 0 && b_row_stride % @VEC@ == 0 &&
                    kf_aligned(a, @VEC@ * sizeof(TI)) && kf_aligned(b, @VEC@ * sizeof(TI)) &&
                    kf_aligned(y, @VEC@ * sizeof(TO));
  const int vec = fast ? @VEC@ : 1;
  const int64_t ppr = cols / vec, total = rows * ppr, per = (int64_t)@THREADS@ * @UNROLL@;
  int64_t blocks = (total + per - 1) / per;
  if (blocks > 2147483647) blocks = 2147483647;  // the kernel strides over the rest
  const bool i32 = total + per < 2147483647;
  const unsigned grid = (unsigned)blocks;
  if (fast && i32) kf_silu_mul_flat<@THREADS@, @VEC@, @UNROLL@, true><<<grid, @THREADS@, 0, stream>>>(a, a_row_stride, b, b_row_stride, y, total, ppr);
  else if (fast) kf_silu_mul_flat<@THREADS@, @VEC@, @UNROLL@, false><<<grid, @THREADS@, 0, stream>>>(a, a_row_stride, b, b_row_stride, y, total, ppr);
  else kf_silu_mul_flat<@THREADS@, 1, @UNROLL@, false><<<grid, @THREADS@, 0, stream>>>(a, a_row_stride, b, b_row_stride, y, total, ppr);
  return (int)cudaGetLastError();
"""


def _rows_flat_default(task: OpTask) -> dict:
    cols = patterns.scalar_args(task)["cols"]
    vec = 16 // ELEM_BYTES[task.dtype]
    while vec > 1 and cols % vec:
        vec //= 2
    return {"threads": 256, "vec": vec, "unroll": 2, "math": _default_math(task)}


def _rows_flat_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_ROWS_FLAT_LAUNCH, THREADS=p["threads"], VEC=p["vec"], UNROLL=p["unroll"])
    fn = _fn_cuda(replace(task, op="silu"), p.get("math") == "fast")
    return cuda_head(task) + fn + _CUDA_ROWS_FLAT + entry(task, "cuda", body)


register(Family("flat_vec", ("silu_mul",), "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8), "unroll": (1, 2, 4),
                 "math": ("ieee", "fast")},
                _rows_flat_default, lambda t, p: ELEM_BYTES[t.dtype] * p["vec"] <= 16, _rows_flat_render,
                doc="silu(a)*b over flattened (row, column pack) indices: whole blocks busy for short rows"))


# ------------------------------------------------------------------------------- CPU

_CPU_FLAT = r"""
// Threads take contiguous runs of whole vectors; the last (< SIMD_W) elements go scalar.
inline int kf_flat(const TI* x, TO* y, int64_t numel) {
  if (!ELT_VEC) {
#pragma omp parallel for simd schedule(static, @GRAIN@) if(numel >= kf_omp_min_work)
    for (int64_t i = 0; i < numel; ++i) y[i] = kf_out(kf_op(kf_in(x[i])));
    return 0;
  }
  const int64_t nvec = numel / SIMD_W;
#pragma omp parallel for schedule(static, @GRAIN@ / SIMD_W) if(numel >= kf_omp_min_work)
  for (int64_t b = 0; b < nvec; ++b) kf_vout(y + b * SIMD_W, kf_vop(kf_vin(x + b * SIMD_W)));
  for (int64_t i = nvec * SIMD_W; i < numel; ++i) y[i] = kf_out(kf_sop(kf_in(x[i])));
  return 0;
}
"""


def _cpu_valid(task: OpTask, p: dict) -> bool:
    return _uses_exp(task) or p["exp"] == "poly"


def _cpu_flat_render(task: OpTask, p: dict) -> str:
    exp = "kf_exp" if p["exp"] == "poly" else "kf_exp_libm"
    return (cpu_head(task) + _fn_cpu(task, exp) + fill(_CPU_FLAT, GRAIN=p["grain"])
            + entry(task, "cpu", "  return kf_flat(x, y, numel);"))


register(Family("flat_omp", FLAT_OPS, "cpu",
                {"grain": (1024, 8192, 65536), "exp": ("poly", "libm")},
                lambda t: {"grain": 8192, "exp": "poly"}, _cpu_valid, _cpu_flat_render,
                doc="omp parallel for simd over the flat tensor"))


_CPU_ROWS = r"""
inline int kf_silu_mul(const TI* a, int64_t sa, const TI* b, int64_t sb, TO* y, int64_t rows, int64_t cols) {
  const int64_t nv = ELT_VEC ? cols - cols % SIMD_W : 0;
#pragma omp parallel for schedule(static, @GRAIN@) if(rows > 1 && rows * cols >= kf_omp_min_work)
  for (int64_t r = 0; r < rows; ++r) {
    const TI* ar = a + r * sa;
    const TI* br = b + r * sb;
    TO* yr = y + r * cols;
    for (int64_t c = 0; c < nv; c += SIMD_W)
      kf_vout(yr + c, kf_vmul(kf_vround(kf_vop(kf_vin(ar + c))), kf_vin(br + c)));
#pragma omp simd
    for (int64_t c = nv; c < cols; ++c) yr[c] = kf_out(kf_in(kf_round(kf_sop(kf_in(ar[c])))) * kf_in(br[c]));
  }
  return 0;
}
"""


def _cpu_rows_render(task: OpTask, p: dict) -> str:
    exp = "kf_exp" if p["exp"] == "poly" else "kf_exp_libm"
    return (cpu_head(task) + _fn_cpu(replace(task, op="silu"), exp)
            + fill(_CPU_ROWS, GRAIN=p["grain"])
            + entry(task, "cpu", "  return kf_silu_mul(a, a_row_stride, b, b_row_stride, y, rows, cols);"))


register(Family("rows_omp", ("silu_mul",), "cpu", {"grain": (1, 4, 16, 64), "exp": ("poly", "libm")},
                lambda t: {"grain": 4, "exp": "poly"}, lambda t, p: True, _cpu_rows_render,
                doc="OpenMP over rows, omp simd over columns"))
