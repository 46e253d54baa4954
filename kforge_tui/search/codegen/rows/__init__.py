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

  plan.py   the reduction plan and the emission shared by every layout and backend
  cuda.py   the CUDA emitters (rows, cols)
  cpu.py    the OpenMP emitter (rows, cols)
  __init__  the designs (spaces, defaults, validity) and `generate`
"""
from __future__ import annotations

import functools

from kforge_tui.search.codegen import kbuild as K
from kforge_tui.search.codegen.sym import Unsupported
from kforge_tui.search.codegen.rows.plan import RPlan, plan_of, reads_own_rows
from kforge_tui.search.codegen.rows.cuda import cuda_render
from kforge_tui.search.codegen.rows.cpu import CpuRed, block_row


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
    return _cols_own_rows(P, p["block"])


@functools.lru_cache(maxsize=1024)
def _cols_own_rows(P: RPlan, block: int) -> bool:
    """reads_own_rows at the cols row of this `block`, the check render makes first: a point it
    fails is never proposed (and charged to the budget as a proposal error). Cached per plan
    (plan_of's, by identity): the proposer asks at every point it weighs."""
    try:
        return reads_own_rows(P, block_row(P.ROWS, block))
    except (Unsupported, ValueError):  # what render would raise too (generate drops those)
        return False


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
