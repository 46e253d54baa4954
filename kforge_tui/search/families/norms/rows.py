"""One block or part of a warp per row (or group): block_row, block_group, warp_row."""
from __future__ import annotations

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import ELEM_BYTES, cdiv
from kforge_tui.regions.patterns import OpTask
from kforge_tui.search.families.norms.common import MAX_REG_BYTES, ROW_OPS, norm_source, rows_n, unit, vec16


# --- block_row (layer/rms) and block_group (group_norm): one block per row/group
def _block_default(task: OpTask) -> dict:
    _, n = rows_n(task)
    vec = vec16(task)
    # two 16-byte packs per thread: measured on the H200, 256 threads x 2 packs beat 512 x 1 and
    # 1024 x 1 on 4096-wide bf16 rows (fewer barrier participants, more rows in flight per SM)
    threads = 128
    for t in (128, 256, 512, 1024):
        if n >= t * vec * 2:
            threads = t
    p = {"threads": threads, "vec": vec, "cache": "regs"}
    if not _block_valid(task, p):
        p["cache"] = "none"
    if task.op in ROW_OPS:
        p.update(wpre=0, stats="one", pipe=0, minb=1)
    return p


def _block_valid(task: OpTask, p: dict) -> bool:
    _, n = rows_n(task)
    if unit(task) % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    if p.get("stats") == "two" and (task.op != "layer_norm" or p["cache"] != "regs"):
        return False  # rms_norm has one sum; without the row in registers there is no second pass
    if (p.get("wpre") or p.get("pipe")) and p["cache"] != "regs":
        return False
    if p.get("minb", 1) * p["threads"] > 2048:  # more threads than an SM holds
        return False
    held = 2 if p.get("pipe") else 1  # the next row is in registers too
    return p["cache"] == "none" or \
        cdiv(n, p["threads"] * p["vec"]) * p["vec"] * ELEM_BYTES[task.dtype] * held <= MAX_REG_BYTES


def _block_render(task: OpTask, p: dict) -> str:
    return norm_source(task, p["threads"], p["threads"], p["vec"], p["cache"] == "regs", p)


_BLOCK_SPACE = {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16), "cache": ("none", "regs")}
register(Family("block_row", ROW_OPS, "cuda",
                {**_BLOCK_SPACE, "wpre": (0, 1), "stats": ("one", "two"), "pipe": (0, 1),
                 "minb": (1, 4, 5, 6, 8, 12, 16)},
                _block_default, _block_valid, _block_render,
                doc="one block per row, row in registers, f32 stats, fused affine; `wpre` loads the "
                    "affine before the row, `stats` one round of shifted sums or two exact rounds, "
                    "`pipe` a persistent grid loading the next row during this one, `minb` blocks per "
                    "SM the compiler must fit"))
register(Family("block_group", ("group_norm",), "cuda", _BLOCK_SPACE, _block_default, _block_valid,
                _block_render, doc="one block per (n, group); group in registers when it fits"))


# --- warp_row: `lanes` threads per row, shuffles only
def _warp_default(task: OpTask) -> dict:
    _, n = rows_n(task)
    vec = vec16(task)
    lanes = 32
    for ln in (32, 16, 8, 4):
        if n <= ln * vec * 2:
            lanes = ln
    return {"warps": 4, "lanes": lanes, "vec": vec, "pipe": 0}


def _warp_valid(task: OpTask, p: dict) -> bool:
    _, n = rows_n(task)
    if unit(task) % p["vec"] or p["vec"] * ELEM_BYTES[task.dtype] > 32:
        return False
    held = 2 if p.get("pipe") else 1  # the next row is in registers too
    return cdiv(n, p["lanes"] * p["vec"]) * p["vec"] * ELEM_BYTES[task.dtype] * held <= MAX_REG_BYTES


def _warp_render(task: OpTask, p: dict) -> str:
    return norm_source(task, p["warps"] * 32, p["lanes"], p["vec"], True, p)


register(Family("warp_row", ROW_OPS + ("group_norm",), "cuda",
                {"warps": (1, 2, 4, 8, 16), "lanes": (4, 8, 16, 32), "vec": (1, 2, 4, 8, 16), "pipe": (0, 1)},
                _warp_default, _warp_valid, _warp_render,
                doc="a warp (or `lanes` threads) per row, row in registers; `pipe` a persistent grid "
                    "loading the next row during this one"))
