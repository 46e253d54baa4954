"""The CUDA emitters: the rows layout (`lanes` per row, warp shuffles, a block reduce across
warps, the row cached between sweeps) and the cols layout (threads across row packs), each split
over CTAs through stream-ordered scratch when `splits` > 1."""
from __future__ import annotations

from kforge_tui.search.codegen import kbuild as K
from kforge_tui.search.codegen.cexpr import ELEM_BYTES, STORE_C
from kforge_tui.search.codegen.ir import Scope
from kforge_tui.search.codegen.sym import Form, const, var
from kforge_tui.search.codegen.rows.plan import (Comp, RPlan, plan_of, Gen, stage_comps, acc_names, scratch,
                                                 finalize, accumulate, row_outputs)


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
        scr, total = scratch(P, P.ROWS * self.splits)
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
                _shfl(c, acc_names(c), self.L, lines)
            else:
                _block_reduce(c, acc_names(c), self.threads, lines, shm)

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
            comps = stage_comps(P, s)
            for c in comps:
                names = acc_names(c)
                for n, init, T in zip(names, c.init(), c.ctypes()):
                    body.append(f"{T} {n} = {init};")
                vals = tuple(f"reinterpret_cast<const {T}*>(kf_scr + {scr[(c.name, i)]})[row * {self.splits} + s]"
                             for i, T in enumerate(c.ctypes()))
                body += [f"for (int64_t s = lane; s < {self.splits}; s += {L}) {{", "  " + c.combine(names, vals), "}"]
            self._reduce(comps, body, shm)
            finalize(g, comps, body)
        for s in run_stages:
            comps = stage_comps(P, s)
            for c in comps:
                for n, init, T in zip(acc_names(c), c.init(), c.ctypes()):
                    body.append(f"{T} {n} = {init};")
            r_expr = self._r_expr()
            body += self._pass(g, lambda g_, sidx, es, post, comps=comps: accumulate(g_, comps, sidx, r_expr),
                               cache, chunked)
            self._reduce(comps, body, shm)
            if scr is not None:
                body.append("if (lane == 0 && kf_act) {")
                for c in comps:
                    for i, (n, T) in enumerate(zip(acc_names(c), c.ctypes())):
                        body.append(f"  reinterpret_cast<{T}*>(kf_scr + {scr[(c.name, i)]})"
                                    f"[row * {self.splits} + blockIdx.y] = {n};")
                body.append("}")
            else:
                finalize(g, comps, body)
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
            body += row_outputs(g, task, P, var("row", P.ROWS),
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
            for n, T in zip(acc_names(c), c.ctypes()):
                shm.append(f"__shared__ {T} kf_sh_{n}[{TY * TX * V}];")
                lines.append(f"for (int jr = 0; jr < {V}; ++jr) kf_sh_{n}[(ty * {TX} + tx) * {V} + jr] = {n}[jr];")
        lines.append("__syncthreads();")
        for c in comps:
            names = acc_names(c)
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
            comps = stage_comps(P, s)
            for c in comps:
                names = acc_names(c)
                for n, init, T in zip(names, c.init(), c.ctypes()):
                    body.append(f"{T} {n}[{V}];")
                body.append(f"for (int jr = 0; jr < {V}; ++jr) {{")
                for n, init in zip(names, c.init()):
                    body.append(f"  {n}[jr] = {init};")
                vals = tuple(f"reinterpret_cast<const {T}*>(kf_scr + {scr[(c.name, i)]})[(rp * {V} + jr) * {self.splits} + s]"
                             for i, T in enumerate(c.ctypes()))
                body.append(f"  for (int s = 0; s < {self.splits}; ++s) {{ {c.combine(tuple(n + '[jr]' for n in names), vals)} }}")
                body.append("}")
            finalize(g, comps, body, V)
        for s in run_stages:
            comps = stage_comps(P, s)
            for c in comps:
                names = acc_names(c)
                for n, init, T in zip(names, c.init(), c.ctypes()):
                    body.append(f"{T} {n}[{V}];")
                    body.append(f"for (int jr = 0; jr < {V}; ++jr) {n}[jr] = {init};")
            r_expr = "r"
            lane = "jr" if V > 1 else "0"
            body += self._pass(g, lambda g_, sidx, es, post, comps=comps: accumulate(g_, comps, sidx, r_expr, f"[{lane}]"),
                               chunked)
            self._reduce(comps, body, shm)
            if scr is not None:
                body.append("if (ty == 0 && kf_act) {")
                body.append(f"  for (int jr = 0; jr < {V}; ++jr) {{")
                for c in comps:
                    for i, (n, T) in enumerate(zip(acc_names(c), c.ctypes())):
                        body.append(f"    reinterpret_cast<{T}*>(kf_scr + {scr[(c.name, i)]})"
                                    f"[(rp * {V} + jr) * {self.splits} + blockIdx.y] = {n}[jr];")
                body += ["  }", "}"]
            else:
                finalize(g, comps, body, V)
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
            body += row_outputs(g, task, P, self._row(), cond, ("rp",),
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
