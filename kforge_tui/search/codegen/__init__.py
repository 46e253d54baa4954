"""Kernels generated mechanically from a region's own graph (the built-in proposer's designs for
regions no family matches, and competitors where one does).

  ir.py         the region graph analysed: shapes/strides/dtypes from a meta run, views as index
                maps, reductions; the C emitter (pointwise ops as C expressions: ops.py)
  cexpr.py      what ir.py and ops.py share: dtype tables, value references, C casts and literals
  sym.py        the index algebra (exact floor division / modulo with range-based simplification)
  pointwise.py  pointwise chains (cuda, cpu)
  rows/         one reduction domain with its prologue and epilogue: row, column and split
                (multi-CTA) layouts (cuda, cpu): the plan, an emitter per backend, the designs
  compute/      one compute op: matmul, convolution, attention (cuda, cpu), a module a family
  pool.py       pooling windows, gathers, copies and scans (cuda, cpu)
  triton_seed.py  Inductor's own Triton kernel for the region, and moves over it

`generators()` is the one place that says which modules generate designs: each exposes
`generate(task) -> list` and imports nothing above it (search.designs asks this package, never
the other way round). A module that fails to import is logged and skipped, so it cannot take
the others down with it.
"""
from __future__ import annotations

import importlib
import logging
import threading
from typing import Callable

# in this order: designs_for lists generated designs in it
GENERATOR_MODULES = ("pointwise", "rows", "compute", "pool", "topk", "triton_seed")

_generators: list[Callable] | None = None
_lock = threading.Lock()


def generators() -> list[Callable]:
    """Every generator module's `generate` (imported on the first call)."""
    global _generators
    if _generators is None:
        with _lock:
            if _generators is None:
                found = []
                for m in GENERATOR_MODULES:
                    try:
                        found.append(importlib.import_module(f"{__name__}.{m}").generate)
                    except ImportError as e:  # broken: it offers nothing, the others stay
                        logging.getLogger(__name__).warning("codegen.%s not loaded: %s", m, e)
                _generators = found
    return _generators
