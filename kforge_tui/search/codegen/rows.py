"""Generated kernels for regions with one reduction domain: prologue, reductions, epilogue.

The domain is the reductions' common input shape S and reduced dims: ROWS independent rows
(the kept dims) of N elements (the reduced dims, row-major). Every reduction of the region
(sum, mean, amax/amin, max/min.dim with indices, argmax/argmin, prod, any/all, var/std(_mean))
reduces a value computed from the graph at each point of the domain (its pointwise prologue,
inlined into the loads). Reductions that read other reductions' results (softmax's sum of
exp(x - amax), the variance's squared deviations from the mean) run in later *stages*, each a
sweep over the row; var/std take two (mean, then squared deviations: two-pass, exact as
torch's Welford within rounding). The epilogue - every output on the domain (softmax's
probabilities, the normalised row) or on the rows (logsumexp, mean, MSE's scalar) - is written in
the same kernel. An epilogue value must read the reductions of its own row: the index algebra
proves it (group_norm's [N,C,H,W] output against its [N,G,C/G*H*W] rows) or the region gets no
design.

Layouts (the `layout` of a design, its own parameter space):

  rows  `lanes` threads per row (a sub-warp, a warp, or the whole block), `vec` elements per
        thread-iteration along the row (16-byte packs where the row is contiguous), warp
        shuffles (and shared memory across warps) to combine; `cache` keeps the row's loaded
        packs in registers or shared memory between sweeps instead of re-reading them.
  cols  threads across `vec`-wide packs of *rows* (coalesced when the rows are the contiguous
        dim: mean over dim 0, per-channel statistics), `ty` threads per row pack along the
        reduced dim, combined in shared memory.
  both  `splits` > 1 splits every row over that many CTAs (cpu: tasks): each stage is a launch
        that writes partial results to stream-ordered scratch (cudaMallocAsync/cudaFreeAsync on
        the given stream; cpu: malloc), the next combines them first; a last launch writes the
        epilogue. For few long rows (a full reduction to a scalar loss, softmax over 262144).

cpu: OpenMP over rows (or row blocks, or (row, split) units), `omp simd` over lane arrays of
`vec` accumulators (rows) or over the rows of a block (cols).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kforge_tui.search.csrc import OMP_MIN_WORK
from kforge_tui.search.codegen import kbuild as K
from kforge_tui.search.codegen.cexpr import COMPUTE_C, ELEM_BYTES, FLOATS, STORE_C, cast, literal
from kforge_tui.search.codegen.ir import Emitter, Scope, region_of
from kforge_tui.search.codegen.sym import Form, Unsupported, const, ravel, unravel, var

INT_MIN = {"int64": "(-9223372036854775807LL - 1)", "int32": "(-2147483647 - 1)", "int16": "((int16_t)-32768)",
           "int8": "((int8_t)-128)", "uint8": "((uint8_t)0)", "bool": "false"}
INT_MAX = {"int64": "9223372036854775807LL", "int32": "2147483647", "int16": "((int16_t)32767)",
           "int8": "((int8_t)127)", "uint8": "((uint8_t)255)", "bool": "true"}
IDX_INIT = "9223372036854775807LL"


# ------------------------------------------------------------------------------ plan

@dataclass
class Comp:
    """One accumulator: a reduction's pass (main, or the variance's second pass `m2`)."""
    red: object
    part: str  # main | m2
    op: str  # sum prod max min argmax argmin any all
    dtype: str  # accumulator dtype
    name: str
    stage: int

    @property
    def T(self) -> str:
        return COMPUTE_C[self.dtype]

    @property
    def arg(self) -> bool:
        return self.op in ("argmax", "argmin")

    def init(self) -> tuple[str, ...]:
        d = self.dtype
        if self.op in ("sum",):
            return (literal(0, d),)
        if self.op == "prod":
            return (literal(1, d),)
        if self.op == "any":
            return ("false",)
        if self.op == "all":
            return ("true",)
        hi = self.op in ("max", "argmax")
        if d in FLOATS:
            v = "(-INFINITY)" if hi else "INFINITY"
            if d == "float64":
                v = f"((double){v})"
        else:
            v = INT_MIN[d] if hi else INT_MAX[d]
        return (v, IDX_INIT) if self.arg else (v,)

    def combine(self, a: tuple, b: tuple) -> str:
        """Statement merging accumulator b into accumulator a (tuples of C lvalues/exprs)."""
        if self.op == "sum":
            return f"{a[0]} += {b[0]};"
        if self.op == "prod":
            return f"{a[0]} *= {b[0]};"
        if self.op == "max":
            return f"{a[0]} = kf_max<{self.T}>({a[0]}, {b[0]});"
        if self.op == "min":
            return f"{a[0]} = kf_min<{self.T}>({a[0]}, {b[0]});"
        if self.op == "any":
            return f"{a[0]} = {a[0]} || {b[0]};"
        if self.op == "all":
            return f"{a[0]} = {a[0]} && {b[0]};"
        f = "kf_amax_better" if self.op == "argmax" else "kf_amin_better"
        return f"if ({f}<{self.T}>({b[0]}, {b[1]}, {a[0]}, {a[1]})) {{ {a[0]} = {b[0]}; {a[1]} = {b[1]}; }}"

    @property
    def ncomp(self) -> int:
        return 2 if self.arg else 1

    def ctypes(self) -> tuple[str, ...]:
        return (self.T, "int64_t") if self.arg else (self.T,)


class RPlan:
    """The reduction domain, accumulators by stage, and where each output goes."""

    def __init__(self, task):
        R = region_of(task)
        if not R.reductions:
            raise Unsupported("region has no reduction")
        self.R = R
        self.task = task
        S, dims = R.domain
        self.S, self.dims = tuple(S), tuple(dims)
        self.kept = tuple(d for d in range(len(S)) if d not in dims)
        self.ROWS = math.prod(S[d] for d in self.kept)
        self.N = math.prod(S[d] for d in dims)
        if self.ROWS == 0 or self.N == 0:
            raise Unsupported("empty reduction")
        if self.ROWS * self.N >= 2**62:
            raise Unsupported("domain too large")
        # accumulators by stage
        self.comps: list[Comp] = []
        for k, r in enumerate(R.reductions):
            if r.kind in ("sum", "mean", "var", "std"):
                op = "sum"
            else:
                op = r.kind
            self.comps.append(Comp(r, "main", op, r.acc_dtype, f"a{k}", r.stage))
            if r.kind in ("var", "std"):
                self.comps.append(Comp(r, "m2", "sum", r.acc_dtype, f"a{k}m", r.stage + 1))
        self.nstages = 1 + max(c.stage for c in self.comps)
        # outputs
        self.elem_out, self.row_out = [], []
        keep_shape = tuple(1 if d in dims else s for d, s in enumerate(S))
        red_shape = tuple(S[d] for d in self.kept)
        for k, name in enumerate(R.outputs):
            shp = tuple(task.outputs[k].shape)
            n = math.prod(shp)
            if shp == self.S:
                self.elem_out.append((k, name, "same"))
            elif n == self.ROWS * self.N and self.N > 1:
                self.elem_out.append((k, name, "linear"))
            elif shp == keep_shape:
                self.row_out.append((k, name, "keep"))
            elif shp == red_shape:
                self.row_out.append((k, name, "kept"))
            elif n == self.ROWS:
                self.row_out.append((k, name, "linear"))
            else:
                raise Unsupported(f"output {k} of shape {shp} is neither on the domain {self.S} "
                                  f"nor on its {self.ROWS} rows")
        # tensors streamed along the rows (what a cache keeps) and access patterns
        self.streamed = sorted({R.vals[n].pos for c in self.comps for n in R.leaves(c.red.inp)
                                if R.vals[n].numel > self.N} |
                               {R.vals[n].pos for _, name, _ in self.elem_out for n in R.leaves(name)
                                if R.vals[n].numel > self.N})
        self.r_contig, self.row_contig = self._access()
        self.main_bytes = max([ELEM_BYTES[task.inputs[i].dtype] for i in self.streamed] or
                              [ELEM_BYTES[m.dtype] for m in task.inputs] or [4])

    @property
    def passes(self) -> int:
        return self.nstages + (1 if self.elem_out else 0)

    def sidx(self, row: Form, r: Form) -> list:
        """The domain index (S) of element r of row `row`."""
        kc = unravel(row, [self.S[d] for d in self.kept])
        rc = unravel(r, [self.S[d] for d in self.dims])
        out, ki, ri = [], iter(kc), iter(rc)
        for d in range(len(self.S)):
            out.append(next(ri) if d in self.dims else next(ki))
        return out

    def row_of(self, val, idx) -> Form:
        """The row a reduction value at index idx belongs to."""
        if len(idx) == len(self.S) and len(self.S) != len(self.kept):
            kc = [idx[d] for d in self.kept]
        else:
            kc = list(idx)
        return ravel(kc, [self.S[d] for d in self.kept])

    def out_idx_elem(self, k: int, mode: str, sidx) -> list:
        if mode == "same":
            return sidx
        return unravel(ravel(sidx, self.S), self.task.outputs[k].shape)

    def out_idx_row(self, k: int, mode: str, row: Form) -> list:
        kc = unravel(row, [self.S[d] for d in self.kept])
        if mode == "kept":
            return kc
        if mode == "keep":
            it = iter(kc)
            return [const(0) if d in self.dims else next(it) for d in range(len(self.S))]
        return unravel(row, self.task.outputs[k].shape)

    def _access(self) -> tuple[bool, bool]:
        """Whether the streamed inputs are read contiguously along r / along the rows."""
        seen = []
        em = Emitter(self.R, self.task.backend)

        def rec(em_, v, off):
            seen.append((v.pos, off))
            return "0"
        em.load = rec
        em.red_value = lambda em_, v, idx: "0"
        em.push(Scope(("row", "r"), red=True))
        row, r = var("row", self.ROWS), var("r", self.N)
        for c in self.comps:
            em.value(c.red.inp, self.sidx(row, r))
        rc = co = False
        for pos, off in seen:
            if pos not in self.streamed:
                continue
            if self.N > 1 and off.terms.get(next(iter(r.terms)), 0) == 1:
                rc = True
            if self.ROWS > 1 and off.terms.get(next(iter(row.terms)), 0) == 1:
                co = True
        return rc, co


_PLANS: dict = {}


def plan_of(task) -> RPlan:
    k = task.key
    hit = _PLANS.get(k)
    if hit is None:
        try:
            hit = RPlan(task)
        except Unsupported as e:
            hit = e
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[k] = hit
    if isinstance(hit, Unsupported):
        raise hit
    return hit


# ------------------------------------------------------------------------------ shared emission

class Gen:
    """Emission state of one kernel body: accumulators, finalized reduction values, hooks."""

    def __init__(self, plan: RPlan, backend: str, math_mode: str, access: K.Access | None = None):
        self.P = plan
        self.em = Emitter(plan.R, backend, math_mode)
        self.em.red_value = self._red_value
        self.ready: dict = {}  # (reduction name, comp) -> C expr pattern ("{}" is the lane index)
        self.row_form: Form | None = None  # the current row (in the lane variable, if any)
        self.lane_var: str | None = None  # name of the lane var when finalized values are arrays
        self.access = access if access is not None else K.Access()

    def _red_value(self, em, v, idx) -> str:
        key = (v.red.name, v.comp)
        if key not in self.ready:
            raise Unsupported("a reduction value is read before its stage")
        row = self.P.row_of(v, idx)
        if row != self.row_form:
            raise Unsupported("the epilogue reads the reduction of another row")
        return self.ready[key].format(self.lane_var or "")

    def elem_value(self, c: Comp, sidx) -> str:
        """The value accumulator c takes at domain point sidx (its dtype's compute type)."""
        r = c.red
        x = self.em.value(r.inp, sidx)
        src = self.P.R.vals[r.inp].dtype
        x = cast(x, src, r.in_dtype)
        if c.op in ("any", "all"):
            return cast(x, r.in_dtype, "bool")
        x = cast(x, r.in_dtype, c.dtype)
        if c.part == "m2":
            mean = self.ready[(r.name, "@mean")].format(self.lane_var or "")
            d = self.em.fresh("d")
            self.em.emit(self.em.cur, f"const {c.T} {d} = {x} - {mean};")
            return f"{d} * {d}"
        return x

    def finals(self, c: Comp, acc: tuple) -> list[tuple[str, str, str]]:
        """(key comp, C type, expr) of the values a finished accumulator yields."""
        r = c.red
        N = self.P.N
        out = []
        vals = [v for v in self.P.R.vals.values() if v.kind == "red" and v.red is r]
        if c.part == "main" and r.kind in ("var", "std"):
            out.append(("@mean", c.T, f"{acc[0]} / ({c.T}){N}"))
            for v in vals:
                if v.comp == "mean":
                    out.append(("mean", COMPUTE_C[v.dtype], cast(f"({acc[0]} / ({c.T}){N})", c.dtype, v.dtype)))
            return out
        for v in vals:
            T = COMPUTE_C[v.dtype]
            if c.part == "m2":
                if v.comp not in ("var", "std"):
                    continue
                div = max(0.0, N - r.correction)
                e = f"({acc[0]} / ({c.T}){div!r})"
                if v.comp == "std":
                    e = f"sqrt({e})"
                out.append((v.comp, T, cast(e, c.dtype, v.dtype)))
                continue
            if v.comp == "index":
                out.append(("index", T, cast(acc[1], "int64", v.dtype)))
            elif r.kind == "mean":
                out.append(("value", T, cast(f"({acc[0]} / ({c.T}){N})", c.dtype, v.dtype)))
            else:
                out.append(("value", T, cast(acc[0], c.dtype, v.dtype)))
        return out


def _stage_comps(plan: RPlan, s: int) -> list[Comp]:
    return [c for c in plan.comps if c.stage == s]


def _acc_names(c: Comp, suffix: str = "") -> tuple:
    return (f"{c.name}_v{suffix}", f"{c.name}_i{suffix}") if c.arg else (f"{c.name}{suffix}",)


def _csize(T: str) -> int:
    return {"double": 8, "int64_t": 8, "float": 4, "int32_t": 4, "int16_t": 2}.get(T, 1)


def _scratch(plan: RPlan, units: int) -> tuple[dict, int]:
    """Byte offsets of one [units] array per accumulator component, and the total."""
    scr, off = {}, 0
    for c in plan.comps:
        for i, T in enumerate(c.ctypes()):
            scr[(c.name, i)] = off
            off += units * _csize(T)
            off = -(-off // 16) * 16
    return scr, max(off, 16)


def _finalize(g: Gen, comps, lines, arr: int = 0, lane: str = "jr", bound: str = "") -> None:
    """Finished accumulators -> the reduction values the graph reads (scalars, or arrays of
    `arr` entries indexed by the lane when a thread holds several rows)."""
    for c in comps:
        if not arr:
            for comp, T, e in g.finals(c, _acc_names(c)):
                nm = f"rd_{c.name}_{comp.replace('@', 'i')}"
                lines.append(f"const {T} {nm} = {e};")
                g.ready[(c.red.name, comp)] = nm
            continue
        names = tuple(f"{n}[{lane}]" for n in _acc_names(c))
        fins = g.finals(c, names)
        for comp, T, e in fins:
            lines.append(f"{T} rd_{c.name}_{comp.replace('@', 'i')}[{arr}];")
        lines.append(f"for (int {lane} = 0; {lane} < {bound or arr}; ++{lane}) {{")
        for comp, T, e in fins:
            nm = f"rd_{c.name}_{comp.replace('@', 'i')}"
            lines.append(f"  {nm}[{lane}] = {e};")
            g.ready[(c.red.name, comp)] = nm + "[{}]"
        lines.append("}")


# ------------------------------------------------------------------------------ cuda

def _shfl(c: Comp, names: tuple, width: int, lines: list) -> None:
    """Butterfly-combine accumulator `names` across `width` lanes (every lane gets the total)."""
    if width <= 1:
        return
    tmp = tuple(f"{n}_o" for n in names)
    lines.append(f"for (int o = {width // 2}; o > 0; o >>= 1) {{")
    for t, n, T in zip(tmp, names, c.ctypes()):
        if T == "bool":
            lines.append(f"  const bool {t} = __shfl_xor_sync(0xffffffffu, (int){n}, o, {width}) != 0;")
        elif T in ("int8_t", "uint8_t", "int16_t"):
            lines.append(f"  const {T} {t} = ({T})__shfl_xor_sync(0xffffffffu, (int){n}, o, {width});")
        else:
            lines.append(f"  const {T} {t} = __shfl_xor_sync(0xffffffffu, {n}, o, {width});")
    lines.append("  " + c.combine(names, tmp))
    lines.append("}")


def _block_reduce(c: Comp, names: tuple, threads: int, lines: list, shm: list) -> None:
    """Warp butterflies, then across the block's warps through shared memory (all get it)."""
    _shfl(c, names, 32, lines)
    nw = threads // 32
    if nw <= 1:
        return
    sh = []
    for n, T in zip(names, c.ctypes()):
        shm.append(f"__shared__ {T} kf_sh_{n}[32];")
        sh.append(f"kf_sh_{n}")
    lines.append("__syncthreads();")
    lines.append("if ((threadIdx.x & 31) == 0) { "
                 + " ".join(f"{s}[threadIdx.x >> 5] = {n};" for s, n in zip(sh, names)) + " }")
    lines.append("__syncthreads();")
    for s, n in zip(sh, names):
        lines.append(f"{n} = {s}[threadIdx.x & {nw - 1}];")
    _shfl(c, names, nw, lines)


def _accumulate(g: Gen, comps, sidx, r_expr: str, suffix: str = "") -> None:
    em = g.em
    for c in comps:
        x = g.elem_value(c, sidx)
        names = _acc_names(c, suffix)
        em.emit(em.cur, c.combine(names, (x, r_expr) if c.arg else (x,)))


class _CudaBase:
    """What both CUDA layouts share: the kernel sequence (one kernel, or a stage kernel per
    stage plus a final one when rows are split over CTAs) and the launch code."""

    prefix = "kf"

    def __init__(self, task, plan: RPlan, p: dict, access: K.Access, prefix: str):
        self.task, self.P, self.p, self.access, self.prefix = task, plan, p, access, prefix
        self.splits = p["splits"]

    def gen(self) -> Gen:
        return Gen(self.P, "cuda", self.p["math"], self.access)

    def render(self) -> tuple[str, list]:
        """(kernels source, launch lines)."""
        P, task = self.P, self.task
        args = K.ptr_args(task)
        kerns, launch = [], []
        pf = self.prefix
        if self.splits == 1:
            src, smem = self.kernel(f"{pf}_red", list(range(P.nstages)), [], None, True, False)
            kerns.append(src)
            launch += self._launch(f"{pf}_red", self.grid(1), smem, args)
            return "\n\n".join(kerns), launch
        scr, total = _scratch(P, P.ROWS * self.splits)
        launch.append("{")
        launch.append("  unsigned char* kf_scr = nullptr;")
        launch.append(f"  {{ cudaError_t e = cudaMallocAsync((void**)&kf_scr, {total}, stream); "
                      "if (e != cudaSuccess) return (int)e; }")
        for s in range(P.nstages):
            nm = f"{pf}_stage{s}"
            src, smem = self.kernel(nm, [s], list(range(s)), scr, False, True)
            kerns.append(src)
            launch += ["  " + x for x in self._launch(nm, self.grid(self.splits), smem, args + ", kf_scr")]
        nm = f"{pf}_final"
        src, smem = self.kernel(nm, [], list(range(P.nstages)), scr, True, True)
        kerns.append(src)
        gy = self.splits if P.elem_out else 1
        launch += ["  " + x for x in self._launch(nm, self.grid(gy), smem, args + ", kf_scr")]
        launch.append("  { cudaError_t e = cudaFreeAsync(kf_scr, stream); if (e != cudaSuccess) return (int)e; }")
        launch.append("}")
        return "\n\n".join(kerns), launch

    def _launch(self, nm, grid, smem, args) -> list:
        out = []
        if smem > 48 * 1024:
            out.append(f"{{ cudaError_t e = cudaFuncSetAttribute({nm}, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                       f"{smem}); if (e != cudaSuccess) return (int)e; }}")
        out.append(f"{nm}<<<{grid}, {self.threads}, {smem}, stream>>>({args});")
        out.append("{ cudaError_t e = cudaGetLastError(); if (e != cudaSuccess) return (int)e; }")
        return out

    def _params(self, scr) -> str:
        return K.ptr_params(self.task, "cuda") + (", unsigned char* __restrict__ kf_scr" if scr is not None else "")


class CudaRows(_CudaBase):
    """`lanes` threads per row; rows of a block are consecutive; packs of `vec` along the row."""

    def __init__(self, task, plan, p, access, prefix):
        super().__init__(task, plan, p, access, prefix)
        self.L, self.threads, self.V = p["lanes"], p["threads"], p["vec"]
        self.RPB = self.threads // self.L
        self.NQ = plan.N // self.V
        self.CQ = -(-self.NQ // self.splits)
        self.NRB = -(-plan.ROWS // self.RPB)

    def grid(self, gy: int) -> str:
        return f"dim3({min(self.NRB, 2**31 - 1)}, {gy})"

    def _loader(self, g: Gen, cache):
        base_loader = K.cuda_loader(g.access)
        if cache is None:
            return base_loader
        P, V = self.P, self.V

        def load(em, v, off):
            if v.pos in P.streamed:
                ln = K.lane_of(em)
                base = K.contig_base(off, ln[0], ln[1]) if ln else (off if "q" in off.free else None)
                if base is not None and "q" in base.free:
                    st = STORE_C["cuda"][v.dtype]
                    key = (v.name, base.key)
                    if key not in cache["keys"]:
                        nm = f"kc{len(cache['keys'])}"
                        cache["keys"][key] = (nm, v.dtype)
                        if V > 1:
                            g.access.packed_in.add(v.pos)
                        em.emit(em.target(base.free), f"{self._slot(nm, st)} = kf_ldp<{st}, {V}>(in{v.pos} + {base.c()});")
                    nm = cache["keys"][key][0]
                    return em.conv_in(v.dtype, f"{self._slot(nm, st)}.v[{ln[0] if ln else 0}]")
            return base_loader(em, v, off)
        return load

    def _slot(self, nm, st) -> str:
        if self.p["cache"] == "regs":
            return f"{nm}[k]"
        return (f"reinterpret_cast<kf_pack<{st}, {self.V}>*>(kf_smem + {nm}_off)"
                f"[(int64_t)(threadIdx.x / {self.L}) * {self.NQ} + q]")

    def _pass(self, g: Gen, work, cache, chunked: bool) -> list:
        em, P, L, V = g.em, self.P, self.L, self.V
        ps = em.push(Scope(("row",), red=True))
        es = em.push(Scope(("row", "q"), red=True))
        post: list = []
        if V > 1:
            ls = em.push(Scope(("row", "q", "j"), red=True, lane="j", lane_n=V))
        rform = var("q", self.NQ) * V + (var("j", V) if V > 1 else const(0))
        work(g, P.sidx(var("row", P.ROWS), rform), es, post)
        if V > 1:
            em.pop()
        em.pop()
        em.pop()
        inner = list(es.lines)
        if V > 1:
            inner += ["#pragma unroll", f"for (int j = 0; j < {V}; ++j) {{"] + ["  " + x for x in ls.lines] + ["}"]
        inner += post
        out = ["{"] + ["  " + x for x in ps.lines]
        if cache is not None and self.p["cache"] == "regs":
            items = -(-self.NQ // L)
            out += ["#pragma unroll", f"  for (int k = 0; k < {items}; ++k) {{",
                    f"    const int64_t q = lane + (int64_t)k * {L};", f"    if (q < {self.NQ}LL) {{"]
            out += ["      " + x for x in inner]
            out += ["    }", "  }"]
        else:
            lo, hi = ("kf_c0 + lane", "kf_c1") if chunked else ("lane", f"{self.NQ}LL")
            out += [f"#pragma unroll {self.p['unroll']}", f"  for (int64_t q = {lo}; q < {hi}; q += {L}) {{"]
            out += ["    " + x for x in inner]
            out.append("  }")
        out.append("}")
        return out

    def _r_expr(self) -> str:
        return f"(q * {self.V} + j)" if self.V > 1 else "q"

    def _reduce(self, comps, lines, shm):
        for c in comps:
            if self.L <= 32:
                _shfl(c, _acc_names(c), self.L, lines)
            else:
                _block_reduce(c, _acc_names(c), self.threads, lines, shm)

    def kernel(self, name, run_stages, combine_stages, scr, epilogue: bool, chunked: bool):
        P, task, L = self.P, self.task, self.L
        g = self.gen()
        cache = {"keys": {}} if self.p["cache"] != "none" else None
        g.em.load = self._loader(g, cache)
        g.row_form = var("row", P.ROWS)
        ks = g.em.push(Scope(()))
        shm: list = []
        body: list = []
        for s in combine_stages:
            comps = _stage_comps(P, s)
            for c in comps:
                names = _acc_names(c)
                for n, init, T in zip(names, c.init(), c.ctypes()):
                    body.append(f"{T} {n} = {init};")
                vals = tuple(f"reinterpret_cast<const {T}*>(kf_scr + {scr[(c.name, i)]})[row * {self.splits} + s]"
                             for i, T in enumerate(c.ctypes()))
                body += [f"for (int64_t s = lane; s < {self.splits}; s += {L}) {{", "  " + c.combine(names, vals), "}"]
            self._reduce(comps, body, shm)
            _finalize(g, comps, body)
        for s in run_stages:
            comps = _stage_comps(P, s)
            for c in comps:
                for n, init, T in zip(_acc_names(c), c.init(), c.ctypes()):
                    body.append(f"{T} {n} = {init};")
            r_expr = self._r_expr()
            body += self._pass(g, lambda g_, sidx, es, post, comps=comps: _accumulate(g_, comps, sidx, r_expr),
                               cache, chunked)
            self._reduce(comps, body, shm)
            if scr is not None:
                body.append("if (lane == 0 && kf_act) {")
                for c in comps:
                    for i, (n, T) in enumerate(zip(_acc_names(c), c.ctypes())):
                        body.append(f"  reinterpret_cast<{T}*>(kf_scr + {scr[(c.name, i)]})"
                                    f"[row * {self.splits} + blockIdx.y] = {n};")
                body.append("}")
            else:
                _finalize(g, comps, body)
        if epilogue and P.elem_out:
            def work(g_, sidx, es, post):
                vals = []
                for k, nm, mode in P.elem_out:
                    idx = P.out_idx_elem(k, mode, sidx)
                    vals.append((k, idx, g_.em.value(nm, idx)))
                for k, idx, v in vals:
                    K.store(g_.em, task, k, K.out_offset(task.outputs[k], idx), v, g_.access, "", es, post)
            body += ["if (kf_act) "] + self._pass(g, work, cache, chunked)
        if epilogue and P.row_out:
            body += _row_outputs(g, task, P, var("row", P.ROWS),
                                 "lane == 0 && kf_act" + (" && blockIdx.y == 0" if chunked else ""), ("row",))
        g.em.pop()
        smem = 0
        pre = []
        if cache is not None and cache["keys"]:
            for nm, dt in cache["keys"].values():
                st = STORE_C["cuda"][dt]
                if self.p["cache"] == "regs":
                    pre.append(f"kf_pack<{st}, {self.V}> {nm}[{-(-self.NQ // L)}];")
                else:
                    pre.append(f"const int64_t {nm}_off = {smem};")
                    smem += -(-self.RPB * P.N * ELEM_BYTES[dt] // 16) * 16
        out = [f"__global__ void __launch_bounds__({self.threads}) {name}({self._params(scr)}) {{"]
        out += ["  " + x for x in dict.fromkeys(shm)]
        if smem:
            out.append("  extern __shared__ __align__(16) unsigned char kf_smem[];")
        out += ["  " + x for x in ks.lines]
        out.append(f"  const int lane = threadIdx.x % {L};")
        if chunked:
            out.append(f"  const int64_t kf_c0 = (int64_t)blockIdx.y * {self.CQ};")
            out.append(f"  const int64_t kf_c1 = kf_c0 + {self.CQ} < {self.NQ}LL ? kf_c0 + {self.CQ} : {self.NQ}LL;")
            out.append("  (void)kf_c0; (void)kf_c1;")
        out.append(f"  for (int64_t rb = blockIdx.x; rb < {self.NRB}LL; rb += gridDim.x) {{")
        out.append(f"    const int64_t rowraw = rb * {self.RPB} + threadIdx.x / {L};")
        out.append(f"    const bool kf_act = rowraw < {P.ROWS}LL;")
        out.append(f"    const int64_t row = kf_act ? rowraw : {P.ROWS - 1}LL;")
        out.append("    (void)row;")
        out += ["    " + x for x in pre]
        out += ["    " + x for x in body]
        out += ["  }", "}"]
        return "\n".join(out), smem


def _row_outputs(g: Gen, task, P: RPlan, row: Form, cond: str, outer: tuple, lane: tuple | None = None,
                 pack: bool = False, pragma: str = "") -> list:
    """Outputs on the rows, written once per row by the row's leader (`cond`). With `lane`
    (name, n, bound) a thread holds several rows: a loop over them (cuda: pack stores)."""
    em = g.em
    rs = em.push(Scope(outer, red=True))
    ls = em.push(Scope(outer + (lane[0],), red=True, lane=lane[0] if pack else None,
                       lane_n=lane[1])) if lane else rs
    post: list = []
    vals = []
    for k, nm, mode in P.row_out:
        idx = P.out_idx_row(k, mode, row)
        vals.append((k, idx, em.value(nm, idx)))
    for k, idx, v in vals:
        K.store(em, task, k, K.out_offset(task.outputs[k], idx), v, g.access, "",
                rs if pack else None, post if pack else None)
    if lane:
        em.pop()
    em.pop()
    inner = list(rs.lines)
    if lane:
        inner += ([pragma] if pragma else []) + [f"for (int64_t {lane[0]} = 0; {lane[0]} < {lane[2]}; ++{lane[0]}) {{"]
        inner += ["  " + x for x in ls.lines] + ["}"] + post
    return [f"if ({cond}) {{"] + ["  " + x for x in inner] + ["}"]


class CudaCols(_CudaBase):
    """Threads across packs of `vec` consecutive rows (coalesced when rows are contiguous),
    `ty` threads per row pack along the reduced dim, combined through shared memory."""

    def __init__(self, task, plan, p, access, prefix):
        super().__init__(task, plan, p, access, prefix)
        self.TX, self.TY, self.V = p["tx"], p["ty"], p["vec"]
        self.threads = self.TX * self.TY
        self.NRP = plan.ROWS // self.V
        self.NB = -(-self.NRP // self.TX)
        self.CR = -(-plan.N // self.splits)

    def grid(self, gy: int) -> str:
        return f"dim3({min(self.NB, 2**31 - 1)}, {gy})"

    def _row(self) -> Form:
        return var("rp", self.NRP) * self.V + (var("jr", self.V) if self.V > 1 else const(0))

    def _pass(self, g: Gen, work, chunked: bool) -> list:
        em, P, V = g.em, self.P, self.V
        ps = em.push(Scope(("rp",), red=True))
        es = em.push(Scope(("rp", "r"), red=True))
        post: list = []
        if V > 1:
            ls = em.push(Scope(("rp", "r", "jr"), red=True, lane="jr", lane_n=V))
        work(g, P.sidx(self._row(), var("r", P.N)), es, post)
        if V > 1:
            em.pop()
        em.pop()
        em.pop()
        inner = list(es.lines)
        if V > 1:
            inner += ["#pragma unroll", f"for (int jr = 0; jr < {V}; ++jr) {{"] + ["  " + x for x in ls.lines] + ["}"]
        inner += post
        lo, hi = ("kf_c0 + ty", "kf_c1") if chunked else ("ty", f"{P.N}LL")
        out = ["{"] + ["  " + x for x in ps.lines]
        out += [f"#pragma unroll {self.p['unroll']}", f"  for (int64_t r = {lo}; r < {hi}; r += {self.TY}) {{"]
        out += ["    " + x for x in inner]
        out += ["  }", "}"]
        return out

    def _reduce(self, comps, lines, shm) -> None:
        if self.TY == 1:
            return
        TX, TY, V = self.TX, self.TY, self.V
        lines.append("__syncthreads();")
        for c in comps:
            for n, T in zip(_acc_names(c), c.ctypes()):
                shm.append(f"__shared__ {T} kf_sh_{n}[{TY * TX * V}];")
                lines.append(f"for (int jr = 0; jr < {V}; ++jr) kf_sh_{n}[(ty * {TX} + tx) * {V} + jr] = {n}[jr];")
        lines.append("__syncthreads();")
        for c in comps:
            names = _acc_names(c)
            lines.append(f"for (int jr = 0; jr < {V}; ++jr) {{")
            for n in names:
                lines.append(f"  {n}[jr] = kf_sh_{n}[tx * {V} + jr];")
            lines.append(f"  for (int y = 1; y < {TY}; ++y) {{")
            b = tuple(f"kf_sh_{n}[(y * {TX} + tx) * {V} + jr]" for n in names)
            lines.append("    " + c.combine(tuple(f"{n}[jr]" for n in names), b))
            lines.append("  }")
            lines.append("}")

    def kernel(self, name, run_stages, combine_stages, scr, epilogue: bool, chunked: bool):
        P, task, V = self.P, self.task, self.V
        g = self.gen()
        g.em.load = K.cuda_loader(g.access)
        g.row_form = self._row()
        g.lane_var = "jr" if V > 1 else "0"
        ks = g.em.push(Scope(()))
        shm: list = []
        body: list = []
        for s in combine_stages:
            comps = _stage_comps(P, s)
            for c in comps:
                names = _acc_names(c)
                for n, init, T in zip(names, c.init(), c.ctypes()):
                    body.append(f"{T} {n}[{V}];")
                body.append(f"for (int jr = 0; jr < {V}; ++jr) {{")
                for n, init in zip(names, c.init()):
                    body.append(f"  {n}[jr] = {init};")
                vals = tuple(f"reinterpret_cast<const {T}*>(kf_scr + {scr[(c.name, i)]})[(rp * {V} + jr) * {self.splits} + s]"
                             for i, T in enumerate(c.ctypes()))
                body.append(f"  for (int s = 0; s < {self.splits}; ++s) {{ {c.combine(tuple(n + '[jr]' for n in names), vals)} }}")
                body.append("}")
            _finalize(g, comps, body, V)
        for s in run_stages:
            comps = _stage_comps(P, s)
            for c in comps:
                names = _acc_names(c)
                for n, init, T in zip(names, c.init(), c.ctypes()):
                    body.append(f"{T} {n}[{V}];")
                    body.append(f"for (int jr = 0; jr < {V}; ++jr) {n}[jr] = {init};")
            r_expr = "r"
            lane = "jr" if V > 1 else "0"
            body += self._pass(g, lambda g_, sidx, es, post, comps=comps: _accumulate(g_, comps, sidx, r_expr, f"[{lane}]"),
                               chunked)
            self._reduce(comps, body, shm)
            if scr is not None:
                body.append("if (ty == 0 && kf_act) {")
                body.append(f"  for (int jr = 0; jr < {V}; ++jr) {{")
                for c in comps:
                    for i, (n, T) in enumerate(zip(_acc_names(c), c.ctypes())):
                        body.append(f"    reinterpret_cast<{T}*>(kf_scr + {scr[(c.name, i)]})"
                                    f"[(rp * {V} + jr) * {self.splits} + blockIdx.y] = {n}[jr];")
                body += ["  }", "}"]
            else:
                _finalize(g, comps, body, V)
        if epilogue and P.elem_out:
            def work(g_, sidx, es, post):
                vals = []
                for k, nm, mode in P.elem_out:
                    idx = P.out_idx_elem(k, mode, sidx)
                    vals.append((k, idx, g_.em.value(nm, idx)))
                for k, idx, v in vals:
                    K.store(g_.em, task, k, K.out_offset(task.outputs[k], idx), v, g_.access, "", es, post)
            body += ["if (kf_act) "] + self._pass(g, work, chunked)
        if epilogue and P.row_out:
            cond = "ty == 0 && kf_act" + (" && blockIdx.y == 0" if chunked else "")
            body += _row_outputs(g, task, P, self._row(), cond, ("rp",),
                                 ("jr", V, V) if V > 1 else None, pack=V > 1, pragma="#pragma unroll")
        g.em.pop()
        out = [f"__global__ void __launch_bounds__({self.threads}) {name}({self._params(scr)}) {{"]
        out += ["  " + x for x in dict.fromkeys(shm)]
        out += ["  " + x for x in ks.lines]
        out.append(f"  const int tx = threadIdx.x % {self.TX}, ty = threadIdx.x / {self.TX};")
        out.append("  (void)tx; (void)ty;")
        if chunked:
            out.append(f"  const int64_t kf_c0 = (int64_t)blockIdx.y * {self.CR};")
            out.append(f"  const int64_t kf_c1 = kf_c0 + {self.CR} < {P.N}LL ? kf_c0 + {self.CR} : {P.N}LL;")
            out.append("  (void)kf_c0; (void)kf_c1;")
        out.append(f"  for (int64_t rb = blockIdx.x; rb < {self.NB}LL; rb += gridDim.x) {{")
        out.append(f"    const int64_t rpraw = rb * {self.TX} + tx;")
        out.append(f"    const bool kf_act = rpraw < {self.NRP}LL;")
        out.append(f"    const int64_t rp = kf_act ? rpraw : {self.NRP - 1}LL;")
        out.append("    (void)rp;")
        out += ["    " + x for x in body]
        out += ["  }", "}"]
        return "\n".join(out), 0


def cuda_render(task, p: dict, layout: str) -> str:
    P = plan_of(task)
    cls = CudaRows if layout == "rows" else CudaCols
    acc = K.Access()
    kern, launch = cls(task, P, p, acc, "kf").render()
    body = [K.ptr_decls(task, "cuda")]
    if p["vec"] > 1:
        fb_acc = K.Access()
        fb_p = {**p, "vec": 1}
        if layout == "rows" and p["cache"] == "regs" and -(-P.N // p["lanes"]) > 64:
            fb_p["cache"] = "none"
        kern_fb, launch_fb = cls(task, P, fb_p, fb_acc, "kf_fb").render()
        kern = kern + "\n\n" + kern_fb
        body.append(f"  if ({K.align_check(task, acc, p['vec'])}) {{")
        body += ["    " + x for x in launch]
        body.append("  } else {")
        body += ["    " + x for x in launch_fb]
        body.append("  }")
    else:
        body += ["  " + x for x in launch]
    body.append("  return (int)cudaGetLastError();")
    return K.head("cuda") + "\n" + kern + "\n" + K.entry("cuda", "\n".join(body))


# ------------------------------------------------------------------------------ cpu

class CpuRed:
    """OpenMP kernels: `rows` (a row per iteration, `vec` lane accumulators under omp simd) or
    `cols` (a block of `block` rows per iteration, omp simd across the block's rows); `splits`
    > 1 cuts each row into that many tasks with partial results in malloc'd scratch."""

    def __init__(self, task, plan: RPlan, p: dict, layout: str):
        self.task, self.P, self.p, self.layout = task, plan, p, layout
        self.splits = p["splits"]
        if layout == "rows":
            self.W = p["vec"]
            self.NQ = plan.N // self.W
            self.CQ = -(-self.NQ // self.splits)
            self.NU = plan.ROWS
        else:
            self.B = p["block"]
            self.NU = -(-plan.ROWS // self.B)
            self.CR = -(-plan.N // self.splits)

    # ---- rows layout
    def _row(self) -> Form:
        if self.layout == "rows":
            return var("row", self.P.ROWS)
        return var("rb", self.NU) * self.B + var("j", self.B)

    def _outer(self) -> tuple:
        return ("row",) if self.layout == "rows" else ("rb",)

    def _acc_pass(self, g: Gen, comps, chunked: bool) -> list:
        em, P = g.em, self.P
        if self.layout == "cols":
            return self._cols_loop(g, lambda g_, sidx: _accumulate(g_, comps, sidx, "r", "[j]"), chunked)
        W, NQ = self.W, self.NQ
        tail = P.N - NQ * W
        row = var("row", P.ROWS)
        ps = em.push(Scope(("row",), red=True))
        qs = em.push(Scope(("row", "q"), red=True))
        if W > 1:
            ls = em.push(Scope(("row", "q", "j"), red=True))
            _accumulate(g, comps, P.sidx(row, var("q", NQ) * W + var("j", W)), f"(q * {W} + j)", "[j]")
            em.pop()
        else:
            _accumulate(g, comps, P.sidx(row, var("q", NQ)), "q", "[0]")
        em.pop()
        ts = None
        if tail:
            ts = em.push(Scope(("row", "t"), red=True))
            _accumulate(g, comps, P.sidx(row, var("t", tail) + NQ * W), f"({NQ * W} + t)", "[0]")
            em.pop()
        em.pop()
        lo, hi = ("kf_q0", "kf_q1") if chunked else ("0", f"{NQ}LL")
        out = ["{"] + ["  " + x for x in ps.lines]
        out.append(f"  for (int64_t q = {lo}; q < {hi}; ++q) {{")
        out += ["    " + x for x in qs.lines]
        if W > 1:
            out += ["#pragma omp simd", f"    for (int j = 0; j < {W}; ++j) {{"]
            out += ["      " + x for x in ls.lines] + ["    }"]
        out.append("  }")
        if ts is not None:
            guard = f"if (kf_c == {self.splits - 1}) " if chunked else ""
            out.append(f"  {guard}for (int64_t t = 0; t < {tail}; ++t) {{")
            out += ["    " + x for x in ts.lines] + ["  }"]
        out.append("}")
        return out

    def _cols_loop(self, g: Gen, work, chunked: bool) -> list:
        em, P = g.em, self.P
        ps = em.push(Scope(("rb",), red=True))
        rs = em.push(Scope(("rb", "r"), red=True))
        ls = em.push(Scope(("rb", "r", "j"), red=True))
        work(g, P.sidx(self._row(), var("r", P.N)))
        em.pop(), em.pop(), em.pop()
        lo, hi = ("kf_r0", "kf_r1") if chunked else ("0", f"{P.N}LL")
        out = ["{"] + ["  " + x for x in ps.lines]
        out.append(f"  for (int64_t r = {lo}; r < {hi}; ++r) {{")
        out += ["    " + x for x in rs.lines]
        out += ["#pragma omp simd", "    for (int64_t j = 0; j < jn; ++j) {"]
        out += ["      " + x for x in ls.lines] + ["    }", "  }", "}"]
        return out

    def _epilogue(self, g: Gen, chunked: bool) -> list:
        em, P, task = g.em, self.P, self.task

        def work(g_, sidx):
            vals = []
            for k, nm, mode in P.elem_out:
                idx = P.out_idx_elem(k, mode, sidx)
                vals.append((k, idx, g_.em.value(nm, idx)))
            for k, idx, v in vals:
                K.store(g_.em, task, k, K.out_offset(task.outputs[k], idx), v, g_.access)
        if self.layout == "cols":
            return self._cols_loop(g, work, chunked)
        ps = em.push(Scope(("row",), red=True))
        rs = em.push(Scope(("row", "r"), red=True))
        work(g, P.sidx(var("row", P.ROWS), var("r", P.N)))
        em.pop(), em.pop()
        lo, hi = ("kf_r0", "kf_r1") if chunked else ("0", f"{P.N}LL")
        return (["{"] + ["  " + x for x in ps.lines] + ["#pragma omp simd", f"  for (int64_t r = {lo}; r < {hi}; ++r) {{"]
                + ["    " + x for x in rs.lines] + ["  }", "}"])

    def _declare(self, comps, body) -> None:
        n = self.W if self.layout == "rows" else self.B
        for c in comps:
            for nm, init, T in zip(_acc_names(c), c.init(), c.ctypes()):
                body.append(f"{T} {nm}[{n}];")
                body.append(f"for (int j = 0; j < {n}; ++j) {nm}[j] = {init};")

    def _hsum(self, comps, body) -> None:
        """rows layout: fold the lane accumulators into lane 0 (fixed order)."""
        if self.W == 1:
            return
        for c in comps:
            names = _acc_names(c)
            body.append(f"for (int j = 1; j < {self.W}; ++j) {{ "
                        + c.combine(tuple(f"{n}[0]" for n in names), tuple(f"{n}[j]" for n in names)) + " }")

    def _fin(self, g, comps, body) -> None:
        if self.layout == "rows":
            for c in comps:
                for comp, T, e in g.finals(c, tuple(f"{n}[0]" for n in _acc_names(c))):
                    nm = f"rd_{c.name}_{comp.replace('@', 'i')}"
                    body.append(f"const {T} {nm} = {e};")
                    g.ready[(c.red.name, comp)] = nm
        else:
            _finalize(g, comps, body, self.B, "j", "jn")

    def _unit_rows(self, j: str = "j") -> str:
        """C expression of the scratch unit index of the current row (times splits)."""
        return "row" if self.layout == "rows" else f"(rb * {self.B} + {j})"

    def block(self, run_stages, combine_stages, scr, epilogue: bool, chunked: bool, units: int) -> list:
        P, task = self.P, self.task
        g = Gen(P, "cpu", self.p["math"])
        g.em.load = K.cpu_loader()
        g.row_form = self._row()
        g.lane_var = None if self.layout == "rows" else "j"
        ks = g.em.push(Scope(()))
        body: list = []
        S = self.splits
        for s in combine_stages:
            comps = _stage_comps(P, s)
            self._declare(comps, body)
            for c in comps:
                names = _acc_names(c)
                if self.layout == "rows":
                    vals = tuple(f"((const {T}*)(kf_scr + {scr[(c.name, i)]}))[row * {S} + s]"
                                 for i, T in enumerate(c.ctypes()))
                    body.append(f"for (int64_t s = 0; s < {S}; ++s) {{ {c.combine(tuple(n + '[0]' for n in names), vals)} }}")
                else:
                    vals = tuple(f"((const {T}*)(kf_scr + {scr[(c.name, i)]}))[{self._unit_rows()} * {S} + s]"
                                 for i, T in enumerate(c.ctypes()))
                    body.append(f"for (int64_t j = 0; j < jn; ++j) for (int64_t s = 0; s < {S}; ++s) {{ "
                                f"{c.combine(tuple(n + '[j]' for n in names), vals)} }}")
            self._fin(g, comps, body)
        for s in run_stages:
            comps = _stage_comps(P, s)
            self._declare(comps, body)
            body += self._acc_pass(g, comps, chunked)
            if self.layout == "rows":
                self._hsum(comps, body)
            if scr is not None:
                for c in comps:
                    for i, (n, T) in enumerate(zip(_acc_names(c), c.ctypes())):
                        if self.layout == "rows":
                            body.append(f"((({T}*)(kf_scr + {scr[(c.name, i)]}))[row * {S} + kf_c]) = {n}[0];")
                        else:
                            body.append(f"for (int64_t j = 0; j < jn; ++j) "
                                        f"((({T}*)(kf_scr + {scr[(c.name, i)]}))[{self._unit_rows()} * {S} + kf_c]) = {n}[j];")
            else:
                self._fin(g, comps, body)
        if epilogue and P.elem_out:
            body += self._epilogue(g, chunked)
        if epilogue and P.row_out:
            cond = "kf_c == 0" if chunked else "true"
            if self.layout == "rows":
                body += _row_outputs(g, task, P, self._row(), cond, ("row",))
            else:
                body += _row_outputs(g, task, P, self._row(), cond, ("rb",), ("j", self.B, "jn"),
                                     pragma="#pragma omp simd")
        g.em.pop()
        # the unit loop
        out = ["{"] + ["  " + x for x in ks.lines]
        work = P.ROWS * P.N
        out.append(f"#pragma omp parallel for schedule(static) if({units} > 1 && {work} >= {OMP_MIN_WORK})")
        out.append(f"  for (int64_t u = 0; u < {units}LL; ++u) {{")
        per = units // self.NU
        if per > 1:
            out.append(f"    const int64_t kf_c = u % {per};")
            unit = f"u / {per}"
        else:
            out.append("    const int64_t kf_c = 0;")
            unit = "u"
        if self.layout == "rows":
            out.append(f"    const int64_t row = {unit};")
            out.append(f"    const int64_t kf_q0 = kf_c * {self.CQ}LL, kf_q1 = kf_q0 + {self.CQ}LL < {self.NQ}LL ? kf_q0 + {self.CQ}LL : {self.NQ}LL;")
            out.append(f"    const int64_t kf_r0 = kf_q0 * {self.W}, kf_r1 = kf_c == {S - 1} ? {P.N}LL : kf_q1 * {self.W};")
        else:
            out.append(f"    const int64_t rb = {unit};")
            out.append(f"    const int64_t jn = {P.ROWS}LL - rb * {self.B} < {self.B} ? {P.ROWS}LL - rb * {self.B} : {self.B};")
            out.append(f"    const int64_t kf_r0 = kf_c * {self.CR}LL, kf_r1 = kf_r0 + {self.CR}LL < {P.N}LL ? kf_r0 + {self.CR}LL : {P.N}LL;")
        out.append("    (void)kf_c; (void)kf_r0; (void)kf_r1;" + (" (void)kf_q0; (void)kf_q1;" if self.layout == "rows" else ""))
        out += ["    " + x for x in body]
        out += ["  }", "}"]
        return out

    def render(self) -> str:
        P, task = self.P, self.task
        body = [K.ptr_decls(task, "cpu")]
        if self.splits == 1:
            body += ["  " + x for x in self.block(list(range(P.nstages)), [], None, True, False, self.NU)]
        else:
            rows_total = P.ROWS if self.layout == "rows" else self.NU * self.B
            scr, total = _scratch(P, rows_total * self.splits)
            body.append(f"  unsigned char* kf_scr = (unsigned char*)malloc({total});")
            body.append("  if (!kf_scr) return 1;")
            units = self.NU * self.splits
            for s in range(P.nstages):
                body += ["  " + x for x in self.block([s], list(range(s)), scr, False, True, units)]
            body += ["  " + x for x in self.block([], list(range(P.nstages)), scr, True, True,
                                                 units if P.elem_out else self.NU)]
            body.append("  free(kf_scr);")
        body.append("  return 0;")
        return K.head("cpu") + K.entry("cpu", "\n".join(body))


# ------------------------------------------------------------------------------ designs

CUDA_ROWS_SPACE = {"threads": (32, 64, 128, 256, 512, 1024),
                   "lanes": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                   "vec": (1, 2, 4, 8), "unroll": (1, 2, 4), "cache": ("none", "regs", "smem"),
                   "splits": (1, 2, 4, 8, 16, 32, 64, 128), "math": ("ieee", "fast")}
CUDA_COLS_SPACE = {"tx": (8, 16, 32, 64, 128, 256), "ty": (1, 2, 4, 8, 16, 32), "vec": (1, 2, 4, 8),
                   "unroll": (1, 2, 4), "splits": (1, 2, 4, 8, 16, 32, 64, 128), "math": ("ieee", "fast")}
CPU_ROWS_SPACE = {"vec": (1, 4, 8, 16, 32), "splits": (1, 2, 4, 8, 16, 32, 64), "math": ("libm", "poly")}
CPU_COLS_SPACE = {"block": (8, 16, 32, 64, 128, 256), "splits": (1, 2, 4, 8, 16, 32, 64),
                  "math": ("libm", "poly")}
SMS = 132
REG_CACHE_MAX = 64  # cached elements per thread (registers)
SMEM_MAX = 200 * 1024


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _math_ok(P: RPlan, m: str) -> bool:
    return m in ("ieee", "libm") or K.has_math_param(P.R)


def _vec_ok(P: RPlan, vec: int, n: int) -> bool:
    return n % vec == 0 and vec * P.main_bytes <= 32


def cuda_rows_valid(task, p) -> bool:
    P = plan_of(task)
    L, T, V = p["lanes"], p["threads"], p["vec"]
    if L > T or (L > 32 and L != T) or not _vec_ok(P, V, P.N) or not _math_ok(P, p["math"]):
        return False
    NQ = P.N // V
    if L > 1 and L > 2 * NQ:  # lanes with nothing to read
        return False
    if p["splits"] > 1:
        if L != T or p["cache"] != "none" or p["splits"] * L > 2 * NQ:
            return False
    if p["cache"] != "none":
        if P.passes < 2 or not P.streamed:
            return False
        ncache = len(P.streamed)
        if p["cache"] == "regs" and -(-NQ // L) * V * ncache > REG_CACHE_MAX:
            return False
        if p["cache"] == "smem" and (T // L) * P.N * P.main_bytes * ncache > SMEM_MAX:
            return False
        if p["unroll"] != 1 and p["cache"] == "regs":
            return False
    return True


def cuda_rows_default(task) -> dict:
    P = plan_of(task)
    V = 1
    for v in (8, 4, 2):
        if v * P.main_bytes <= 16 and P.N % v == 0 and P.N // v >= 8:
            V = v
            break
    NQ = P.N // V
    if NQ <= 128:
        # short rows: a warp (or less) per row (H200: mean over 7x7 of [32, 2048] ran in 44 us
        # with a 64-thread block per row, 24 us with a thread per row)
        L = min(32, _pow2_at_least(NQ))
        T = 256 if P.ROWS * L >= 256 * SMS else 128
    else:
        # a block per row, about two packs per thread (H200: softmax [16384, 2048] bf16 ran in
        # 40 us with 128 threads, 61 us with 256, 73 us with a warp per row and 256 threads)
        T = min(1024, max(64, _pow2_at_least(NQ // 2)))
        L = T
    splits = 1
    if L == T and P.ROWS < SMS and NQ >= 4 * T:
        while splits < 128 and P.ROWS * splits < 2 * SMS and (splits * 2) * T * 2 <= NQ:
            splits *= 2
    p = {"threads": T, "lanes": L, "vec": V, "unroll": 1 if splits == 1 else 4, "cache": "none",
         "splits": splits, "math": "fast" if K.has_math_param(P.R) else "ieee"}
    if splits == 1 and P.passes >= 2 and P.streamed:
        for c in ("regs", "smem"):
            q = {**p, "cache": c}
            if cuda_rows_valid(task, q):
                p = q
                break
    if not cuda_rows_valid(task, p):
        p = {"threads": 32, "lanes": 32 if NQ >= 16 else max(1, _pow2_at_least(NQ)), "vec": V, "unroll": 1,
             "cache": "none", "splits": 1, "math": p["math"]}
        p["threads"] = max(32, p["lanes"])
    return p


def cuda_cols_valid(task, p) -> bool:
    P = plan_of(task)
    TX, TY, V = p["tx"], p["ty"], p["vec"]
    if TX * TY > 1024 or TX * TY < 32 or not _vec_ok(P, V, P.ROWS) or not _math_ok(P, p["math"]):
        return False
    if TY > 1 and TY * TX * V * 8 > 48 * 1024 // 2:
        return False
    if TX > 2 * max(1, P.ROWS // V):
        return False
    if p["splits"] > 1 and p["splits"] * TY > P.N:
        return False
    return True


def cuda_cols_default(task) -> dict:
    P = plan_of(task)
    V = 1
    for v in (4, 2):
        if v * P.main_bytes <= 16 and P.ROWS % v == 0 and P.ROWS // v >= 8:
            V = v
            break
    NRP = P.ROWS // V
    TX = min(32, max(8, _pow2_at_least(NRP)))
    TY = max(1, min(32, 256 // TX, _pow2_at_least(P.N)))
    while TX * TY < 32:
        TY *= 2
    nb = -(-NRP // TX)
    splits = 1
    while splits < 128 and nb * splits < 4 * SMS and splits * 2 * TY * 16 <= P.N:
        splits *= 2
    return {"tx": TX, "ty": TY, "vec": V, "unroll": 4 if P.N >= 64 * TY * splits else 1, "splits": splits,
            "math": "fast" if K.has_math_param(P.R) else "ieee"}


def cpu_rows_valid(task, p) -> bool:
    P = plan_of(task)
    if not _math_ok(P, p["math"]):
        return False
    if p["vec"] > 1 and p["vec"] > P.N:
        return False
    if p["splits"] > 1 and p["splits"] * p["vec"] * 64 > P.N:
        return False
    return True


def cpu_rows_default(task) -> dict:
    P = plan_of(task)
    vec = 16 if P.main_bytes <= 4 else 8
    while vec > 1 and vec > P.N:
        vec //= 2
    vec = vec if vec in CPU_ROWS_SPACE["vec"] else 1
    splits = 1
    while splits < 64 and P.ROWS * splits < 32 and (splits * 2) * vec * 64 <= P.N and P.N * P.ROWS >= 1 << 16:
        splits *= 2
    return {"vec": vec, "splits": splits, "math": "poly" if K.has_math_param(P.R) else "libm"}


def cpu_cols_valid(task, p) -> bool:
    P = plan_of(task)
    if not _math_ok(P, p["math"]):
        return False
    if p["block"] > 2 * _pow2_at_least(P.ROWS) and p["block"] > 8:
        return False
    if p["splits"] > 1 and p["splits"] * 16 > P.N:
        return False
    return True


def cpu_cols_default(task) -> dict:
    P = plan_of(task)
    block = min(256, max(8, _pow2_at_least(min(P.ROWS, 64))))
    nb = -(-P.ROWS // block)
    splits = 1
    while splits < 64 and nb * splits < 32 and splits * 2 * 16 <= P.N and P.N * P.ROWS >= 1 << 16:
        splits *= 2
    return {"block": block, "splits": splits, "math": "poly" if K.has_math_param(P.R) else "libm"}


def _extent(task) -> tuple[int, int]:
    P = plan_of(task)
    return P.ROWS, P.N


def _cpu_render(layout):
    return lambda task, p: CpuRed(task, plan_of(task), p, layout).render()


def _cuda_render(layout):
    return lambda task, p: cuda_render(task, p, layout)


CUDA_ROWS = K.GenDesign("gen_rows", "cuda", CUDA_ROWS_SPACE, "reduction", cuda_rows_default, cuda_rows_valid,
                        _cuda_render("rows"), _extent,
                        doc="generated reduction, rows layout: `lanes` threads per row, packs of `vec` "
                            "along it, row cached in registers/shared memory between sweeps, "
                            "`splits` CTAs per row")
CUDA_COLS = K.GenDesign("gen_cols", "cuda", CUDA_COLS_SPACE, "reduction", cuda_cols_default, cuda_cols_valid,
                        _cuda_render("cols"), _extent,
                        doc="generated reduction, column layout: threads across packs of `vec` rows, "
                            "`ty` threads per row pack along the reduced dim, `splits` CTAs per row")
CPU_ROWS = K.GenDesign("gen_rows", "cpu", CPU_ROWS_SPACE, "reduction", cpu_rows_default, cpu_rows_valid,
                       _cpu_render("rows"), _extent,
                       doc="generated reduction, rows layout: omp over rows, `vec` lane accumulators")
CPU_COLS = K.GenDesign("gen_cols", "cpu", CPU_COLS_SPACE, "reduction", cpu_cols_default, cpu_cols_valid,
                       _cpu_render("cols"), _extent,
                       doc="generated reduction, column layout: omp over blocks of `block` rows, simd across them")


def generate(task) -> list:
    """The reduction designs for a task: rows always, cols when some streamed input is
    contiguous along the rows (or none along the row)."""
    if task.backend not in ("cuda", "cpu"):
        return []
    try:
        P = plan_of(task)
    except Unsupported:
        return []
    cands = [CUDA_ROWS, CUDA_COLS] if task.backend == "cuda" else [CPU_ROWS, CPU_COLS]
    out = []
    for d in cands:
        if d.name == "gen_cols" and not (P.row_contig or not P.r_contig) and P.ROWS > 1:
            continue
        if d.name == "gen_cols" and P.ROWS == 1:
            continue
        try:
            p = d.default(task)
            if not d.valid(task, p):
                continue
            d.render(task, p)  # dry run: the graph must emit and its epilogue stay on its rows
        except (Unsupported, ValueError):
            continue
        out.append(d)
    return out

