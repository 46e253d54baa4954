"""Generated kernels for pointwise chains (regions with no reduction).

The kernel iterates the index space D of the largest output (outputs that fit no common space
are grouped by space, `groups`: one loop or kernel per group, in one launch); every value is computed from the
region graph at that index (ir.Emitter), views and broadcasts are index maps, and each output is
written at its own strides. An output smaller than D but broadcastable to it is written only by
the threads whose broadcast coordinates are 0; one of D's size but another shape is written
through the row-major linear index.

cuda (`gen_pointwise`): a flat index over D in packs of `vec` elements; an access that is
contiguous along the pack (a contiguous tensor, a slice of one along the inner dim) is one
vector load/store (16 bytes at the default point), one that is constant along it (a per-channel
scale) is one scalar load per pack, anything else is a per-element gather. `unroll` packs per
thread with all their loads issued before any compute; `grid` exact (one pack group per thread)
or stride (a grid that fills the SMs and loops). A misaligned pointer at run time takes a
scalar instantiation; the `numel % vec` tail is a one-warp launch.

cpu (`gen_pointwise`): OpenMP over inner blocks (the trailing dims, split into pieces when
longer than 2 x `grain`), about `grain` elements per task, `omp simd` over each block with the
per-block values (a channel's scale) hoisted out of the simd loop; `math` poly replaces expf/tanhf/erff by vectorisable polynomials.
"""
from __future__ import annotations

import math

from kforge_tui.search.csrc import OMP_MIN_WORK
from kforge_tui.search.codegen import kbuild as K
from kforge_tui.search.codegen.cexpr import ELEM_BYTES, broadcast_idx
from kforge_tui.search.codegen.ir import Emitter, Scope, region_of
from kforge_tui.search.codegen.sym import Unsupported, const, ravel, unravel, var

CUDA_SPACE = {"threads": (64, 128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16), "unroll": (1, 2, 4),
              "grid": ("exact", "stride"), "math": ("ieee", "fast")}
CPU_SPACE = {"grain": (1024, 4096, 16384, 65536), "math": ("libm", "poly")}


class Plan:
    """Iteration space and output placement of a pointwise region (or of the group `ks` of
    its outputs that share one iteration space; see `groups`)."""

    def __init__(self, task, ks: tuple[int, ...] | None = None):
        R = region_of(task)
        if R.reductions:
            raise Unsupported("region has a reduction")
        outs = [R.vals[n] for n in R.outputs]
        if not outs:
            raise Unsupported("no outputs")
        self.ks = tuple(range(len(outs))) if ks is None else tuple(ks)
        main = max(self.ks, key=lambda k: (outs[k].numel, -k))
        self.R = R
        self.D = tuple(outs[main].shape)
        self.N = math.prod(self.D)
        # iterate in the main output's memory order (channels-last writes stay contiguous)
        st = task.outputs[main].strides
        self.order = sorted(range(len(self.D)), key=lambda d: (-(st[d] if self.D[d] != 1 else 2**62), d))
        self.PD = tuple(self.D[d] for d in self.order)
        if self.N == 0:
            raise Unsupported("empty output")
        self.place = {}
        for k in self.ks:
            place = _placement(tuple(outs[k].shape), outs[k].numel, self.D, self.N)
            if place is None:
                raise Unsupported(f"output {k} of shape {tuple(outs[k].shape)} is not on the "
                                  f"iteration space {self.D}")
            self.place[k] = place
        self.leaf_bytes = max([ELEM_BYTES[m.dtype] for m in task.inputs if m.numel >= self.N] +
                              [ELEM_BYTES[task.outputs[k].dtype] for k in self.ks])

    def didx(self, pidx) -> list:
        """D index from an index over the permuted (memory-order) shape PD."""
        out = [None] * len(self.D)
        for k, d in enumerate(self.order):
            out[d] = pidx[k]
        return out

    def emit_outputs(self, em: Emitter, task, lin, access, pack_scope=None, post=None) -> None:
        """Compute and store every output at the flat index `lin` (a Form) of the iteration
        space in memory order."""
        didx = self.didx(unravel(lin, self.PD))
        vals = []
        for k in self.ks:
            name = self.R.outputs[k]
            mode, guard = self.place[k]
            shp = task.outputs[k].shape
            if mode == "same":
                idx = didx
            elif mode == "bcast":
                idx = broadcast_idx(didx, shp)
            else:
                idx = unravel(ravel(didx, self.D), shp)
            conds = []
            for d in guard:
                f = didx[d]
                if f.is_const():
                    if f.const != 0:
                        conds = None
                        break
                    continue
                conds.append(f"{f.c()} == 0")
            if conds is None:
                continue
            vals.append((k, idx, " && ".join(conds), em.value(name, idx)))
        for k, idx, guard, val in vals:
            K.store(em, task, k, K.out_offset(task.outputs[k], idx), val, access, guard, pack_scope, post)


def _placement(shp: tuple, numel: int, D: tuple, N: int):
    """How an output of shape `shp` is written from the iteration space D (None: it is not
    on it): at D's own index, broadcast (written where its broadcast coordinates are 0), or
    through the row-major linear index."""
    if shp == D:
        return ("same", ())
    if len(shp) <= len(D) and all(s in (1, d) for s, d in zip(shp[::-1], D[::-1])):
        off = len(D) - len(shp)
        return ("bcast", tuple(d for d in range(len(D)) if D[d] != 1 and (d < off or shp[d - off] == 1)))
    if numel == N:
        return ("linear", ())
    return None


def groups(task) -> list[Plan]:
    """The region's outputs in groups that share an iteration space, largest first: one loop
    (cpu) or one kernel (cuda) each. A region whose outputs are views of one input in other
    shapes (RoPE's halves, q/k/v split from one projection) is several pointwise pieces that
    read the same memory; one launch runs them all."""
    R = region_of(task)
    outs = [R.vals[n] for n in R.outputs]
    order = sorted(range(len(outs)), key=lambda k: (-outs[k].numel, k))
    spaces: list[tuple[tuple, int, list[int]]] = []
    for k in order:
        shp, n = tuple(outs[k].shape), outs[k].numel
        for D, N, ks in spaces:
            if _placement(shp, n, D, N) is not None:
                ks.append(k)
                break
        else:
            spaces.append((shp, n, [k]))
    return [Plan(task, tuple(sorted(ks))) for _, _, ks in spaces]


def _plan(task) -> Plan:
    """The plan of the largest group (sizes the design's parameters)."""
    return groups(task)[0]


# ------------------------------------------------------------------------------ cuda

def _cuda_body(task, plan: Plan, p: dict, vec: int, access: K.Access, name: str) -> str:
    """One kernel over packs of `vec` (vec == 1: scalar)."""
    em = Emitter(plan.R, "cuda", p["math"])
    em.load = K.cuda_loader(access)
    ks = em.push(Scope(()))
    threads, unroll = p["threads"], p["unroll"]
    npk = plan.N // vec
    blocks_u = []
    for u in range(unroll):
        pv = f"p{u}"
        es = em.push(Scope((pv,), loads=True))
        post: list[str] = []
        if vec > 1:
            ls = em.push(Scope((pv, "j"), lane="j", lane_n=vec))
            plan.emit_outputs(em, task, var(pv, npk) * vec + var("j", vec), access, es, post)
            em.pop()
            body = (es.lines + [f"#pragma unroll", f"for (int j = 0; j < {vec}; ++j) {{"]
                    + ["  " + ln for ln in ls.lines] + ["}"] + post)
        else:
            plan.emit_outputs(em, task, var(pv, npk), access)
            body = es.lines
        em.pop()
        blocks_u.append((pv, es.loads, body))
    em.pop()
    chunk = threads * unroll
    out = [f"__global__ void __launch_bounds__({threads}) {name}({K.ptr_params(task, 'cuda')}) {{"]
    out += ["  " + ln for ln in ks.lines]
    if p["grid"] == "stride":
        out.append(f"  for (int64_t b = (int64_t)blockIdx.x * {chunk}; b < {npk}LL; "
                   f"b += (int64_t)gridDim.x * {chunk}) {{")
    else:
        out.append(f"  {{ const int64_t b = (int64_t)blockIdx.x * {chunk};")
    for u, (pv, loads, _) in enumerate(blocks_u):
        out.append(f"    const int64_t {pv} = b + {u * threads} + threadIdx.x;")
    for pv, loads, _ in blocks_u:
        for stmt in loads:  # "const kf_pack<T, V> name = expr;" -> declared, then loaded under the guard
            decl, rhs = stmt[len("const "):].split(" = ", 1)
            out.append(f"    {decl};")
        if loads:
            out.append(f"    if ({pv} < {npk}LL) {{")
            for stmt in loads:
                decl, rhs = stmt[len("const "):].split(" = ", 1)
                out.append(f"      {decl.split()[-1]} = {rhs}")
            out.append("    }")
    for pv, _, body in blocks_u:
        out.append(f"    if ({pv} < {npk}LL) {{")
        out += ["      " + ln for ln in body]
        out.append("    }")
    out.append("  }")
    out.append("}")
    return "\n".join(out)


def _cuda_tail(task, plan: Plan, p: dict, start: int, n: int, access: K.Access,
               name: str = "kf_pw_tail") -> str:
    em = Emitter(plan.R, "cuda", p["math"])
    em.load = K.cuda_loader(access)
    ks = em.push(Scope(()))
    es = em.push(Scope(("t",)))
    plan.emit_outputs(em, task, var("t", n) + start, access)
    em.pop()
    em.pop()
    return "\n".join([f"__global__ void {name}({K.ptr_params(task, 'cuda')}) {{",
                      "  const int64_t t = threadIdx.x;", f"  if (t >= {n}) return;"]
                     + ["  " + ln for ln in ks.lines + es.lines] + ["}"])


def cuda_render(task, p: dict) -> str:
    threads, unroll, vec0 = p["threads"], p["unroll"], p["vec"]
    args = K.ptr_args(task)

    def launch(kname, n_packs):
        blocks = -(-n_packs // (threads * unroll))
        if blocks > 2**31 - 1 and p["grid"] == "exact":
            raise Unsupported("grid too large for the exact variant")
        if p["grid"] == "stride":
            return (f"    int64_t nb = {blocks}LL, cap = (int64_t)kf_sms * {max(1, 2048 // threads)};\n"
                    f"    if (nb > cap) nb = cap;\n"
                    f"    {kname}<<<(unsigned)nb, {threads}, 0, stream>>>({args});")
        return f"    {kname}<<<{blocks}, {threads}, 0, stream>>>({args});"

    kern: list[str] = []
    body = [K.ptr_decls(task, "cuda")]
    if p["grid"] == "stride":
        body.append("  int kf_dev = 0, kf_sms = 132;\n  cudaGetDevice(&kf_dev);\n"
                    "  cudaDeviceGetAttribute(&kf_sms, cudaDevAttrMultiProcessorCount, kf_dev);")
    for g, plan in enumerate(groups(task)):  # one kernel per iteration space, in stream order
        sfx = f"_g{g}" if g else ""
        vec = vec0
        while vec > 1 and plan.N < vec:  # a smaller group than the one the point was sized on
            vec //= 2
        acc = K.Access()
        kern.append(_cuda_body(task, plan, p, vec, acc, f"kf_pw{sfx}"))
        npk, tail = plan.N // vec, plan.N % vec
        if vec > 1:
            sacc = K.Access()
            kern.append(_cuda_body(task, plan, p, 1, sacc, f"kf_pw_scalar{sfx}"))
            if tail:
                kern.append(_cuda_tail(task, plan, p, npk * vec, tail, sacc, f"kf_pw_tail{sfx}"))
            cond = K.align_check(task, acc, vec)
            body.append(f"  if ({cond}) {{")
            if npk:
                body.append(launch(f"kf_pw{sfx}", npk))
            if tail:
                body.append(f"    kf_pw_tail{sfx}<<<1, 32, 0, stream>>>({args});")
            body.append("  } else {")
            body.append(launch(f"kf_pw_scalar{sfx}", plan.N))
            body.append("  }")
        else:
            body.append("  {")
            body.append(launch(f"kf_pw{sfx}", plan.N))
            body.append("  }")
    body.append("  return (int)cudaGetLastError();")
    return K.head("cuda") + "\n" + "\n\n".join(kern) + "\n" + K.entry("cuda", "\n".join(body))


def cuda_default(task) -> dict:
    plan = _plan(task)
    vec = max(1, 16 // plan.leaf_bytes)
    while vec > 1 and plan.N < vec * 32:
        vec //= 2
    threads = 256
    per = threads * vec
    unroll = 2 if plan.N >= per * 2 * 132 * 4 else 1
    return {"threads": threads, "vec": vec, "unroll": unroll, "grid": "exact",
            "math": "fast" if K.has_math_param(plan.R) else "ieee"}


def cuda_valid(task, p: dict) -> bool:
    plan = _plan(task)
    if p["vec"] * plan.leaf_bytes > 32:
        return False
    if p["math"] == "fast" and not K.has_math_param(plan.R):
        return False
    if p["vec"] > 1 and plan.N < p["vec"]:
        return False
    if p["grid"] == "exact" and -(-plan.N // (p["vec"] * p["threads"] * p["unroll"])) > 2**31 - 1:
        return False
    return True


# ------------------------------------------------------------------------------ cpu

def _coalesced(plan: Plan, task) -> int:
    """How many trailing dims of D every access walks as one run (TensorIterator's coalescing:
    dim d joins when each offset's coefficient of d is that of d+1 times D[d+1])."""
    nd = len(plan.D)
    if nd <= 1:
        return nd
    names = [f"d{k}" for k in range(nd)]
    idx = plan.didx([var(n, s) for n, s in zip(names, plan.PD)])
    offs = []
    em = Emitter(plan.R, "cpu")

    def rec(em_, v, off):
        offs.append(off)
        return "0"
    em.load = rec
    em.push(Scope(tuple(names)))
    try:
        for k in plan.ks:
            name = plan.R.outputs[k]
            mode, _ = plan.place[k]
            shp = task.outputs[k].shape
            oidx = idx if mode == "same" else (broadcast_idx(idx, shp) if mode == "bcast"
                                               else unravel(ravel(idx, plan.D), shp))
            offs.append(K.out_offset(task.outputs[k], oidx))
            em.value(name, oidx)
    except Unsupported:
        return 1

    def coef(f, n):
        c = 0
        for a, v in f.terms.items():
            if a.kind == "var" and a.name == n:
                c += v
            elif n in a.free():
                return None
        return c

    k = nd - 1
    while k > 0:
        d, e = names[k - 1], names[k]
        ok = True
        for f in offs:
            cd, ce = coef(f, d), coef(f, e)
            if cd is None or ce is None or cd != ce * plan.PD[k]:
                ok = False
                break
        if not ok:
            break
        k -= 1
    return nd - k


def _inner(plan: Plan, grain: int, task=None) -> tuple[int, int, int]:
    """(INNER, IC, per): the simd loop runs over IC elements of an inner block of INNER (the
    trailing dims every access walks as one run, widened to at least 16 elements); IC divides
    INNER; OpenMP hands out `per` blocks at a time (about `grain` elements)."""
    nco = _coalesced(plan, task) if task is not None else 1
    inner = 1
    for k, s in enumerate(reversed(plan.PD)):
        if k >= nco and inner >= 16:
            break
        inner *= s
    ic = inner
    if inner > 2 * grain:
        ic = grain  # no divisor near the grain: chunks of `grain`, the last one shorter
        for g in range(grain, grain // 4 - 1, -1):
            if inner % g == 0:
                ic = g
                break
    return inner, ic, max(1, grain // ic)


def cpu_render(task, p: dict) -> str:
    body = [K.ptr_decls(task, "cpu")]
    for plan in groups(task):  # one loop nest per iteration space
        inner, ic, per = _inner(plan, p["grain"], task)
        NO = -(-plan.N // ic)
        em = Emitter(plan.R, "cpu", p["math"])
        em.load = K.cpu_loader()
        acc = K.Access()
        ks = em.push(Scope(()))
        os_ = em.push(Scope(("o",)))
        is_ = em.push(Scope(("o", "c")))
        plan.emit_outputs(em, task, var("o", NO) * ic + var("c", ic), acc)
        em.pop(), em.pop(), em.pop()
        body.append("  {")
        body += ["  " + ln for ln in ks.lines]
        par = f"#pragma omp parallel for schedule(static, {per}) if({NO} > 1 && {plan.N} >= {OMP_MIN_WORK})"
        body += [par, f"  for (int64_t o = 0; o < {NO}LL; ++o) {{"]
        body += ["    " + ln for ln in os_.lines]
        bound = f"{ic}LL"
        if plan.N % ic:
            body.append(f"    const int64_t cn = {plan.N}LL - o * {ic}LL < {ic}LL ? {plan.N}LL - o * {ic}LL : {ic}LL;")
            bound = "cn"
        body += ["#pragma omp simd", f"    for (int64_t c = 0; c < {bound}; ++c) {{"]
        body += ["      " + ln for ln in is_.lines]
        body += ["    }", "  }", "  }"]
    body += ["  return 0;"]
    return K.head("cpu") + K.entry("cpu", "\n".join(body))


def cpu_default(task) -> dict:
    plan = _plan(task)
    return {"grain": 16384, "math": "poly" if K.has_math_param(plan.R) else "libm"}


def cpu_valid(task, p: dict) -> bool:
    plan = _plan(task)
    if p["math"] == "poly" and not K.has_math_param(plan.R):
        return False
    return True


def _extent(task) -> tuple[int, int]:
    return 1, _plan(task).N


CUDA_DESIGN = K.GenDesign("gen_pointwise", "cuda", CUDA_SPACE, "pointwise", cuda_default, cuda_valid,
                          cuda_render, _extent,
                          doc="generated pointwise chain: packs of `vec` along the flat index, "
                              "`unroll` packs per thread, exact or grid-stride grid")
CPU_DESIGN = K.GenDesign("gen_pointwise", "cpu", CPU_SPACE, "pointwise", cpu_default, cpu_valid,
                         cpu_render, _extent,
                         doc="generated pointwise chain: omp parallel chunks of `grain` elements, omp simd inside")


def generate(task) -> list:
    """The pointwise designs for a task (none when the region is not a pointwise chain this
    generator can express)."""
    if task.backend not in ("cuda", "cpu"):
        return []
    try:
        d = CUDA_DESIGN if task.backend == "cuda" else CPU_DESIGN
        d.render(task, d.default(task))  # dry run: every op and view of the graph must emit
    except (Unsupported, ValueError):
        return []
    return [d]

