"""What ir.py and ops.py share, below both: dtype tables, references to graph values, and the
C spelling of casts and literals. (ir.py emits through ops.py; ops.py needs only these.)"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kforge_tui.search.codegen.sym import Unsupported, const

FLOATS = ("float32", "float16", "bfloat16", "float64")
HALF = ("float16", "bfloat16")
INTS = ("int64", "int32", "int16", "int8", "uint8")
COMPUTE_C = {"float32": "float", "float16": "float", "bfloat16": "float", "float64": "double",
             "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
             "uint8": "uint8_t", "bool": "bool"}
STORE_C = {
    "cuda": {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
             "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
             "uint8": "uint8_t", "bool": "bool"},
    "cpu": {"float32": "float", "float16": "uint16_t", "bfloat16": "uint16_t", "float64": "double",
            "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
            "uint8": "uint8_t", "bool": "bool"},
}
ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
              "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def dname(dt) -> str:
    return str(dt).replace("torch.", "")


@dataclass(frozen=True)
class Ref:
    name: str


def broadcast_idx(idx, shape) -> list:
    """Index of an operand of `shape` broadcast to the index `idx` (right-aligned)."""
    off = len(idx) - len(shape)
    if off < 0:
        raise Unsupported("operand with more dims than its result")
    return [const(0) if s == 1 else idx[d + off] for d, s in enumerate(shape)]


def cast(expr: str, src: str, dst: str) -> str:
    """Compute value of dtype `src` as compute value of dtype `dst` (16-bit rounding excepted)."""
    if src == dst or COMPUTE_C[src] == COMPUTE_C[dst] and not (dst in HALF and src not in HALF):
        return expr
    if dst == "bool":
        return f"(({expr}) != 0)"
    if dst in HALF:
        r = f"kf_r{'bf' if dst == 'bfloat16' else 'hf'}"
        return f"{r}((float)({expr}))"
    return f"(({COMPUTE_C[dst]})({expr}))"


def literal(v, dtype: str) -> str:
    """A Python scalar as a C literal of `dtype`'s compute type (16-bit values rounded first)."""
    if dtype == "bool":
        return "true" if bool(v) else "false"
    if dtype in INTS:
        iv = int(v)
        return f"(({COMPUTE_C[dtype]}){iv}LL)" if abs(iv) > 2**31 - 1 else f"(({COMPUTE_C[dtype]}){iv})"
    fv = float(v)
    if dtype in HALF:
        fv = float(torch.tensor(fv, dtype=getattr(torch, dtype)).item())
    if dtype != "float64":
        fv32 = float(torch.tensor(fv, dtype=torch.float32).item())
        if math.isnan(fv32):
            return "NAN"
        if math.isinf(fv32):
            return "INFINITY" if fv32 > 0 else "(-INFINITY)"
        s = repr(fv32)
        return (s if ("." in s or "e" in s) else s + ".0") + "f"
    if math.isnan(fv):
        return "((double)NAN)"
    if math.isinf(fv):
        return "((double)INFINITY)" if fv > 0 else "(-(double)INFINITY)"
    s = repr(fv)
    return s if ("." in s or "e" in s) else s + ".0"
