"""The plan of a one-domain reduction region (its accumulators, the stages they run in, what is
written on the domain and on the rows) and the emission every layout and backend shares."""
from __future__ import annotations

import math
from dataclasses import dataclass

from kforge_tui.search.codegen import kbuild as K
from kforge_tui.search.codegen.cexpr import COMPUTE_C, ELEM_BYTES, FLOATS, Ref, broadcast_idx, cast, literal
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


def reads_own_rows(P: RPlan, row: Form) -> bool:
    """Whether every reduction value a kernel at row form `row` reads - in a later stage's
    accumulation (softmax's exp(x - max)), an output on the domain or on the rows - is provably
    its own row's (the check Gen._red_value makes while emitting). A row form that runs past the
    last row (the cpu cols layout's last block) can leave the index algebra unable to prove it
    (group_norm's channel index, taken modulo the groups). Walks the value graph along the
    indices Emitter.value passes down (views' maps, operands broadcast), so a validity check
    can ask without emitting; raises Unsupported where those index maps do (emission would too)."""
    R = P.R
    sidx = P.sidx(row, var("r", P.N))
    todo = [(c.red.inp, sidx) for c in P.comps]
    todo += [(name, P.out_idx_elem(k, mode, sidx)) for k, name, mode in P.elem_out]
    todo += [(name, P.out_idx_row(k, mode, row)) for k, name, mode in P.row_out]
    seen = set()
    while todo:
        name, idx = todo.pop()
        v = R.vals[name]
        if len(idx) != len(v.shape):
            raise Unsupported(f"index rank mismatch at {name}")
        idx = [const(0) if s == 1 else i for i, s in zip(idx, v.shape)]
        key = (name, tuple(f.key for f in idx))
        if key in seen:
            continue
        seen.add(key)
        if v.kind == "view":
            todo.append((v.base, v.vmap(idx)))
        elif v.kind == "red":
            if P.row_of(v, idx) != row:
                return False
        elif v.kind == "op":
            todo += [(a.name, broadcast_idx(idx, R.vals[a.name].shape)) for a in v.a.values() if isinstance(a, Ref)]
        elif v.kind not in ("input", "const"):
            raise Unsupported(f"value {name} of kind {v.kind}")
    return True


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


def stage_comps(plan: RPlan, s: int) -> list[Comp]:
    return [c for c in plan.comps if c.stage == s]


def acc_names(c: Comp, suffix: str = "") -> tuple:
    return (f"{c.name}_v{suffix}", f"{c.name}_i{suffix}") if c.arg else (f"{c.name}{suffix}",)


def _csize(T: str) -> int:
    return {"double": 8, "int64_t": 8, "float": 4, "int32_t": 4, "int16_t": 2}.get(T, 1)


def scratch(plan: RPlan, units: int) -> tuple[dict, int]:
    """Byte offsets of one [units] array per accumulator component, and the total."""
    scr, off = {}, 0
    for c in plan.comps:
        for i, T in enumerate(c.ctypes()):
            scr[(c.name, i)] = off
            off += units * _csize(T)
            off = -(-off // 16) * 16
    return scr, max(off, 16)


def finalize(g: Gen, comps, lines, arr: int = 0, lane: str = "jr", bound: str = "") -> None:
    """Finished accumulators -> the reduction values the graph reads (scalars, or arrays of
    `arr` entries indexed by the lane when a thread holds several rows)."""
    for c in comps:
        if not arr:
            for comp, T, e in g.finals(c, acc_names(c)):
                nm = f"rd_{c.name}_{comp.replace('@', 'i')}"
                lines.append(f"const {T} {nm} = {e};")
                g.ready[(c.red.name, comp)] = nm
            continue
        names = tuple(f"{n}[{lane}]" for n in acc_names(c))
        fins = g.finals(c, names)
        for comp, T, e in fins:
            lines.append(f"{T} rd_{c.name}_{comp.replace('@', 'i')}[{arr}];")
        lines.append(f"for (int {lane} = 0; {lane} < {bound or arr}; ++{lane}) {{")
        for comp, T, e in fins:
            nm = f"rd_{c.name}_{comp.replace('@', 'i')}"
            lines.append(f"  {nm}[{lane}] = {e};")
            g.ready[(c.red.name, comp)] = nm + "[{}]"
        lines.append("}")


def accumulate(g: Gen, comps, sidx, r_expr: str, suffix: str = "") -> None:
    em = g.em
    for c in comps:
        x = g.elem_value(c, sidx)
        names = acc_names(c, suffix)
        em.emit(em.cur, c.combine(names, (x, r_expr) if c.arg else (x,)))


def row_outputs(g: Gen, task, P: RPlan, row: Form, cond: str, outer: tuple, lane: tuple | None = None,
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
