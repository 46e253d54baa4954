"""GEMMs that apply their epilogue before the one write: `linear+gelu`, a residual add, a scale.

A GEMM region with its elementwise epilogue (partition rule 2) is served by the GEMM core of
gemm.py with its per-element store replaced: for the output element (b, m, n) the kernel has
the GEMM's value `v` (alpha, bias and beta applied, rounded to the op's dtype like eager), and
every region output is the epilogue's expression (codegen/ir.py's Emitter, PyTorch's semantics
op by op) at the element of its own index space that is element (b, m, n) of the GEMM's, read
through the row-major linear index (the views between them reshape, they do not permute). Other
tensors the epilogue reads (a bias, the residual stream, batch_norm statistics) are loaded at
their broadcast index. What cannot be written so (an output reading the GEMM result at another
element, a view that transposes it) offers no design: the region's seed (Inductor's library
GEMM plus its Triton epilogue) covers it.

Designs: the GEMM core's gen_gemm_omp (cpu), gen_gemm_simt and gen_gemm_wmma (cuda, 16-bit),
each with the fused epilogue.
"""
from __future__ import annotations

import math

from kforge_tui.regions.meta import TensorMeta
from kforge_tui.search.codegen import cbase
from kforge_tui.search.codegen.cexpr import COMPUTE_C, HALF
from kforge_tui.search.codegen.compute import gemm as G
from kforge_tui.search.codegen.compute.base import arg_refs, ptrs_struct
from kforge_tui.search.codegen.ir import Emitter, Region, Scope
from kforge_tui.search.codegen.sym import Unsupported, ravel, unravel, var

# what the generated epilogue needs beside the GEMM core's prelude (rounding to 16-bit like
# eager, NaN-propagating max/min, integer floor division ...)
_EXTRA = {
    "cpu": ("inline float kf_rbf(float v) { return kf_bf2f(kf_f2bf(v)); }\n"
            "inline float kf_rhf(float v) { return kf_h2f(kf_f2h(v)); }\n"),
    "cuda": cbase.CUDA_PRELUDE[cbase.CUDA_PRELUDE.index("__device__ __forceinline__ float kf_f(float v)"):],
}


def _core(task):
    """(GEMM node, a task that computes the GEMM alone: the views feeding it and the op)."""
    from kforge_tui.regions.task import Task

    nodes = task.graph["nodes"]
    mm = [n for n in nodes if n["target"] in G.MM_TARGETS]
    if len(mm) != 1 or len(nodes) == len([n for n in nodes if n["target"] in G.MM_TARGETS]):
        return None
    need, keep = {mm[0]["name"]}, []
    for n in reversed(nodes):
        if n["name"] in need:
            keep.append(n)
            need |= set(arg_refs(n["args"])) | set(arg_refs(list(n["kwargs"].values())))
    keep.reverse()
    region = Region(task, external=frozenset(G.MM_TARGETS))
    v = region.vals[mm[0]["name"]]
    shape = tuple(v.shape)
    strides = tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))
    core = Task(op="matmul", kind="compute",
                graph={"inputs": task.graph["inputs"], "nodes": keep, "outputs": [{"ref": mm[0]["name"]}]},
                inputs=task.inputs, outputs=(TensorMeta("out0", shape, v.dtype, strides),),
                backend=task.backend)
    return mm[0], core, region


def epilogue_info(task):
    """matmul_info of the core GEMM with the region's epilogue as its store (None: no fit)."""
    try:
        got = _core(task)
        if got is None:
            return None
        mm, core, region = got
        info = G.matmul_info(core)
        if info is None:
            return None
    except Unsupported:
        return None
    g = info.gemm
    gemm_val = region.vals[mm["name"]]
    total = g.batch * g.M * g.N
    for m in task.outputs:
        if math.prod(m.shape) != total:
            return None
    core_value = g.value

    def epi(backend: str) -> str:
        em = Emitter(region, backend)
        sc = em.push(Scope(vars=("b", "m", "n")))
        lin = ravel([var("b", g.batch), var("m", g.M), var("n", g.N)], (g.batch, g.M, g.N))

        def load(em_, v, off):
            key = ("ld", v.name, off.key)
            if key not in sc.memo:
                name = em_.fresh("ld")
                raw = f"((const kf_in{v.pos}_t*)P.in[{v.pos}])[{off.c()}]"
                em_.emit(sc, f"const {COMPUTE_C[v.dtype]} {name} = {em_.conv_in(v.dtype, raw)};")
                sc.memo[key] = name
            return sc.memo[key]

        def ext(em_, v, idx):
            if ravel(idx, v.shape).key != lin.key:
                raise Unsupported("the epilogue reads the GEMM result at another element")
            return "kf_gv"

        em.load, em.ext_value = load, ext
        gv = core_value(backend)
        if gemm_val.dtype in HALF:
            gv = f"kf_r{'bf' if gemm_val.dtype == 'bfloat16' else 'hf'}((float)({gv}))"
        head = [f"const {COMPUTE_C[gemm_val.dtype]} kf_gv = ({COMPUTE_C[gemm_val.dtype]})({gv});"]
        stores = []
        for k, (name, m) in enumerate(zip(region.outputs, task.outputs)):
            idx = unravel(lin, m.shape)
            val = em.value(name, idx)
            off = "0"
            terms = [f"({i.c()}) * {st}LL" for i, s, st in zip(idx, m.shape, m.strides) if s != 1 and st]
            if terms:
                off = " + ".join(terms)
            stores.append(f"((kf_out{k}_t*)P.out[{k}])[{off}] = {em.conv_out(m.dtype, val)};")
        em.pop()
        return " ".join(head + sc.lines + stores)

    epi("cpu" if task.backend == "cpu" else "cuda")  # raises Unsupported now, not at render time
    g.epi = epi
    return info


def _with_helpers(src: str, backend: str) -> str:
    ps = ptrs_struct()
    return src.replace(ps, ps + _EXTRA[backend] + cbase.COMMON, 1)


def _info(task):
    try:
        return epilogue_info(task)
    except Unsupported:
        return None


def epilogue_designs(task) -> list:
    """The GEMM core's designs with the region's epilogue fused ([] when it does not fit)."""
    return G.gemm_designs(task, _info, finish=_with_helpers,
                          also="; the region's epilogue applied before the one write")
