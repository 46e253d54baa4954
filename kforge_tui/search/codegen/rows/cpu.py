"""The cpu emitter: OpenMP over rows, row blocks or (row, split) units, omp simd over lane
accumulators (rows) or across a block's rows (cols)."""
from __future__ import annotations

import copy
import dataclasses

from kforge_tui.search.csrc import OMP_MIN_WORK
from kforge_tui.search.codegen import kbuild as K
from kforge_tui.search.codegen.ir import Scope
from kforge_tui.search.codegen.sym import Form, Unsupported, const, var
from kforge_tui.search.codegen.rows.plan import (RPlan, Gen, stage_comps, acc_names, scratch, finalize,
                                                 reads_own_rows, row_outputs)


# ------------------------------------------------------------------------------ cpu

CHUNK = 32  # adds a float partial sum takes (per lane) before it is folded into its double total


def _f64_sums(plan: RPlan) -> tuple[RPlan, dict]:
    """The plan with its float sums (sum, mean, var/std's two passes) totalled in double, and
    {name: the float partial each adds into}. One float accumulator along the whole row rounds at
    every add, an error that grows with N: gen_cols summed a group_norm group of 1024 in one chain
    and, on the sandbox's rows of equal values, the variance's rounding divided by sqrt(var + eps)
    came to 3.3e3 ulps. Float partials of CHUNK adds (the vectorised float add, as before) folded
    into double totals bound the error by a CHUNK-term sum's whatever N is; adding every element
    in double instead cost 1.35-1.5x on gen_cols mean/var over dim 0 (2-core dev box, one
    thread). Max/min/arg are exact already; prod and integer sums are left as they are."""
    comps, part = [], {}
    for c in plan.comps:
        if c.op == "sum" and c.dtype == "float32":
            part[c.name] = dataclasses.replace(c, name=c.name + "k")
            c = dataclasses.replace(c, dtype="float64")
        comps.append(c)
    if not part:
        return plan, part
    wide = copy.copy(plan)  # plan_of's cached plan is shared with the cuda emitters: not edited
    wide.comps = comps
    return wide, part


def block_row(rows: int, block: int) -> Form:
    """The cols layout's row: row j of row block rb (past the last row in a partial last block).
    The render and cpu_cols_valid's ownership check both take it from here."""
    return var("rb", -(-rows // block)) * block + var("j", block)


def _ind(lines: list, pad: str = "  ") -> list:
    """Lines indented one level, pragmas left where they are (as every emitter here writes them)."""
    return [x if x.startswith("#") else pad + x for x in lines]


class CpuRed:
    """OpenMP kernels: `rows` (a row per iteration, `vec` lane accumulators under omp simd) or
    `cols` (a block of `block` rows per iteration, omp simd across the block's rows); `splits`
    > 1 cuts each row into that many tasks with partial results in malloc'd scratch."""

    def __init__(self, task, plan: RPlan, p: dict, layout: str):
        plan, self.part = _f64_sums(plan)
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
        return block_row(self.P.ROWS, self.B)

    def _outer(self) -> tuple:
        return ("row",) if self.layout == "rows" else ("rb",)

    def _acc_pass(self, g: Gen, comps, chunked: bool) -> list:
        em, P = g.em, self.P
        inner = [self.part.get(c.name, c) for c in comps]  # float sums add into their partials
        if self.layout == "cols":
            return self._cols_loop(g, lambda g_, sidx: self._add(g_, inner, sidx, "r", "[j]"), chunked, comps)
        W, NQ = self.W, self.NQ
        tail = P.N - NQ * W
        row = var("row", P.ROWS)
        ps = em.push(Scope(("row",), red=True))
        qs = em.push(Scope(("row", "q"), red=True))
        if W > 1:
            ls = em.push(Scope(("row", "q", "j"), red=True))
            self._add(g, inner, P.sidx(row, var("q", NQ) * W + var("j", W)), f"(q * {W} + j)", "[j]")
            em.pop()
        else:
            self._add(g, inner, P.sidx(row, var("q", NQ)), "q", "[0]")
        em.pop()
        ts = None
        if tail:  # fewer than W elements: straight into the totals
            ts = em.push(Scope(("row", "t"), red=True))
            self._add(g, comps, P.sidx(row, var("t", tail) + NQ * W), f"({NQ * W} + t)", "[0]")
            em.pop()
        em.pop()
        lo, hi = ("kf_q0", "kf_q1") if chunked else ("0", f"{NQ}LL")
        body = list(qs.lines)
        if W > 1:
            body += ["#pragma omp simd", f"for (int j = 0; j < {W}; ++j) {{"]
            body += ["  " + x for x in ls.lines] + ["}"]
        out = ["{"] + ["  " + x for x in ps.lines]
        out += _ind(self._partials("q", lo, hi, body, comps, W, str(W)))
        if ts is not None:
            guard = f"if (kf_c == {self.splits - 1}) " if chunked else ""
            out.append(f"  {guard}for (int64_t t = 0; t < {tail}; ++t) {{")
            out += ["    " + x for x in ts.lines] + ["  }"]
        out.append("}")
        return out

    def _add(self, g: Gen, comps, sidx, r_expr: str, suffix: str) -> None:
        """Each accumulator takes its value at sidx (a shifted mean, less its row's reference)."""
        for c in comps:
            x = g.elem_value(c, sidx)
            ref = self.ref.get(c.red.name) if c.part == "main" else None
            if ref is not None:
                x = f"({x} - {ref})"
            g.em.emit(g.em.cur, c.combine(acc_names(c, suffix), (x, r_expr) if c.arg else (x,)))

    def _shifted(self, c) -> bool:
        """var/std's mean is summed as x - x0, x0 its row's first element (0 unless finite), and
        N * x0 added back in double: a row of equal values adds zeros, so its mean is exact and
        its variance 0 (as Welford's), and elsewhere the float partials' error scales with the
        row's spread instead of its magnitude."""
        return c.part == "main" and c.red.kind in ("var", "std") and c.name in self.part

    def _refs(self, g: Gen, comps, body: list) -> None:
        """Declare the shifted means' references (a float per row, or per lane of a block)."""
        em, P = g.em, self.P
        for c in comps:
            if not self._shifted(c):
                continue
            nm = f"{c.name}x"
            if self.layout == "rows":
                rs = em.push(Scope(("row",), red=True))
                x = g.elem_value(self.part[c.name], P.sidx(var("row", P.ROWS), const(0)))
                em.pop()
                body += rs.lines + [f"const float {nm}0 = {x};",
                                    f"const float {nm} = {nm}0 - {nm}0 == 0.0f ? {nm}0 : 0.0f;"]
                self.ref[c.red.name] = nm
                continue
            bs = em.push(Scope(("rb",), red=True))
            ls = em.push(Scope(("rb", "j"), red=True))
            x = g.elem_value(self.part[c.name], P.sidx(self._row(), const(0)))
            em.pop(), em.pop()
            body += bs.lines + [f"float {nm}[{self.B}];", "for (int64_t j = 0; j < jn; ++j) {"]
            body += ["  " + y for y in ls.lines] + [f"  const float {nm}0 = {x};",
                                                      f"  {nm}[j] = {nm}0 - {nm}0 == 0.0f ? {nm}0 : 0.0f;", "}"]
            self.ref[c.red.name] = nm + "[j]"

    def _unshift(self, comps, body: list) -> None:
        """Add N times the reference back into the shifted totals (before they finalize)."""
        for c in comps:
            if self._shifted(c):
                if self.layout == "rows":
                    body.append(f"{c.name}[0] += (double){self.P.N} * (double){c.name}x;")
                else:
                    body.append(f"for (int64_t j = 0; j < jn; ++j) "
                                f"{c.name}[j] += (double){self.P.N} * (double){c.name}x[j];")

    def _partials(self, v: str, lo: str, hi: str, body: list, comps, n: int, bound: str) -> list:
        """The loop `for v in [lo, hi)` over `body`; where comps have float partials, run in
        pieces of CHUNK steps, each partial zeroed before a piece and folded into its double
        total after it (lanes 0..bound of n)."""
        parts = [(c, self.part[c.name]) for c in comps if c.name in self.part]
        if not parts:
            return [f"for (int64_t {v} = {lo}; {v} < {hi}; ++{v}) {{"] + _ind(body) + ["}"]
        out = [f"for (int64_t kf_k0 = {lo}; kf_k0 < {hi}; kf_k0 += {CHUNK}) {{",
               f"  const int64_t kf_k1 = kf_k0 + {CHUNK} < {hi} ? kf_k0 + {CHUNK} : {hi};"]
        for _, k in parts:
            out += [f"  {k.T} {k.name}[{n}];", f"  for (int j = 0; j < {n}; ++j) {k.name}[j] = {k.init()[0]};"]
        out.append(f"  for (int64_t {v} = kf_k0; {v} < kf_k1; ++{v}) {{")
        out += _ind(body, "    ") + ["  }", "#pragma omp simd", f"  for (int64_t j = 0; j < {bound}; ++j) {{"]
        out += [f"    {c.combine((c.name + '[j]',), (f'({c.T}){k.name}[j]',))}" for c, k in parts]
        return out + ["  }", "}"]

    def _cols_loop(self, g: Gen, work, chunked: bool, comps=()) -> list:
        em, P = g.em, self.P
        ps = em.push(Scope(("rb",), red=True))
        rs = em.push(Scope(("rb", "r"), red=True))
        ls = em.push(Scope(("rb", "r", "j"), red=True))
        work(g, P.sidx(self._row(), var("r", P.N)))
        em.pop(), em.pop(), em.pop()
        lo, hi = ("kf_r0", "kf_r1") if chunked else ("0", f"{P.N}LL")
        body = list(rs.lines) + ["#pragma omp simd", "for (int64_t j = 0; j < jn; ++j) {"]
        body += ["  " + x for x in ls.lines] + ["}"]
        out = ["{"] + ["  " + x for x in ps.lines]
        out += _ind(self._partials("r", lo, hi, body, comps, self.B, "jn"))
        return out + ["}"]

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
            for nm, init, T in zip(acc_names(c), c.init(), c.ctypes()):
                body.append(f"{T} {nm}[{n}];")
                body.append(f"for (int j = 0; j < {n}; ++j) {nm}[j] = {init};")

    def _hsum(self, comps, body) -> None:
        """rows layout: fold the lane accumulators into lane 0 (fixed order)."""
        if self.W == 1:
            return
        for c in comps:
            names = acc_names(c)
            body.append(f"for (int j = 1; j < {self.W}; ++j) {{ "
                        + c.combine(tuple(f"{n}[0]" for n in names), tuple(f"{n}[j]" for n in names)) + " }")

    def _fin(self, g, comps, body) -> None:
        if self.layout == "rows":
            for c in comps:
                for comp, T, e in g.finals(c, tuple(f"{n}[0]" for n in acc_names(c))):
                    nm = f"rd_{c.name}_{comp.replace('@', 'i')}"
                    body.append(f"const {T} {nm} = {e};")
                    g.ready[(c.red.name, comp)] = nm
        else:
            finalize(g, comps, body, self.B, "j", "jn")
        # the deviations of var's second pass are taken from the mean rounded to float (as torch's
        # float kernels do): a double mean would widen every element of that pass
        for c in comps:
            if self._shifted(c):
                nm = f"rd_{c.name}_imeanf"
                if self.layout == "rows":
                    body.append(f"const float {nm} = (float){g.ready[(c.red.name, '@mean')]};")
                    g.ready[(c.red.name, "@mean")] = nm
                else:
                    body += [f"float {nm}[{self.B}];",
                             f"for (int j = 0; j < jn; ++j) {nm}[j] = (float)rd_{c.name}_imean[j];"]
                    g.ready[(c.red.name, "@mean")] = nm + "[{}]"

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
        self.ref = {}  # reduction name -> C expr of its shifted mean's reference (this block)
        for s in combine_stages:
            comps = stage_comps(P, s)
            self._declare(comps, body)
            for c in comps:
                names = acc_names(c)
                if self.layout == "rows":
                    vals = tuple(f"((const {T}*)(kf_scr + {scr[(c.name, i)]}))[row * {S} + s]"
                                 for i, T in enumerate(c.ctypes()))
                    body.append(f"for (int64_t s = 0; s < {S}; ++s) {{ {c.combine(tuple(n + '[0]' for n in names), vals)} }}")
                else:
                    vals = tuple(f"((const {T}*)(kf_scr + {scr[(c.name, i)]}))[{self._unit_rows()} * {S} + s]"
                                 for i, T in enumerate(c.ctypes()))
                    body.append(f"for (int64_t j = 0; j < jn; ++j) for (int64_t s = 0; s < {S}; ++s) {{ "
                                f"{c.combine(tuple(n + '[j]' for n in names), vals)} }}")
            self._refs(g, comps, body)
            self._unshift(comps, body)
            self._fin(g, comps, body)
        for s in run_stages:
            comps = stage_comps(P, s)
            self._declare(comps, body)
            self._refs(g, comps, body)
            body += self._acc_pass(g, comps, chunked)
            if self.layout == "rows":
                self._hsum(comps, body)
            if scr is not None:
                for c in comps:
                    for i, (n, T) in enumerate(zip(acc_names(c), c.ctypes())):
                        if self.layout == "rows":
                            body.append(f"((({T}*)(kf_scr + {scr[(c.name, i)]}))[row * {S} + kf_c]) = {n}[0];")
                        else:
                            body.append(f"for (int64_t j = 0; j < jn; ++j) "
                                        f"((({T}*)(kf_scr + {scr[(c.name, i)]}))[{self._unit_rows()} * {S} + kf_c]) = {n}[j];")
            else:
                self._unshift(comps, body)
                self._fin(g, comps, body)
        if epilogue and P.elem_out:
            body += self._epilogue(g, chunked)
        if epilogue and P.row_out:
            cond = "kf_c == 0" if chunked else "true"
            if self.layout == "rows":
                body += row_outputs(g, task, P, self._row(), cond, ("row",))
            else:
                body += row_outputs(g, task, P, self._row(), cond, ("rb",), ("j", self.B, "jn"),
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
        if not reads_own_rows(P, self._row()):  # cpu_cols_valid asks the same: no such point is proposed
            raise Unsupported("the epilogue reads the reduction of another row")
        body = [K.ptr_decls(task, "cpu")]
        if self.splits == 1:
            body += ["  " + x for x in self.block(list(range(P.nstages)), [], None, True, False, self.NU)]
        else:
            rows_total = P.ROWS if self.layout == "rows" else self.NU * self.B
            scr, total = scratch(P, rows_total * self.splits)
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
