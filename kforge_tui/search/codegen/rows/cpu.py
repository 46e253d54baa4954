"""The cpu emitter: OpenMP over rows, row blocks or (row, split) units, omp simd over lane
accumulators (rows) or across a block's rows (cols)."""
from __future__ import annotations

from kforge_tui.search.csrc import OMP_MIN_WORK
from kforge_tui.search.codegen import kbuild as K
from kforge_tui.search.codegen.ir import Scope
from kforge_tui.search.codegen.sym import Form, var
from kforge_tui.search.codegen.rows.plan import (RPlan, Gen, stage_comps, acc_names, scratch, finalize,
                                                 accumulate, row_outputs)


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
            return self._cols_loop(g, lambda g_, sidx: accumulate(g_, comps, sidx, "r", "[j]"), chunked)
        W, NQ = self.W, self.NQ
        tail = P.N - NQ * W
        row = var("row", P.ROWS)
        ps = em.push(Scope(("row",), red=True))
        qs = em.push(Scope(("row", "q"), red=True))
        if W > 1:
            ls = em.push(Scope(("row", "q", "j"), red=True))
            accumulate(g, comps, P.sidx(row, var("q", NQ) * W + var("j", W)), f"(q * {W} + j)", "[j]")
            em.pop()
        else:
            accumulate(g, comps, P.sidx(row, var("q", NQ)), "q", "[0]")
        em.pop()
        ts = None
        if tail:
            ts = em.push(Scope(("row", "t"), red=True))
            accumulate(g, comps, P.sidx(row, var("t", tail) + NQ * W), f"({NQ * W} + t)", "[0]")
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
            self._fin(g, comps, body)
        for s in run_stages:
            comps = stage_comps(P, s)
            self._declare(comps, body)
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
