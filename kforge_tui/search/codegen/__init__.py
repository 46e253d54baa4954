"""Kernels generated mechanically from a region's own graph (the built-in proposer's designs for
regions no family matches, and competitors where one does).

  ir.py         the region graph analysed: shapes/strides/dtypes from a meta run, views as index
                maps, pointwise ops as C expressions (ops.py), reductions; the C emitter
  sym.py        the index algebra (exact floor division / modulo with range-based simplification)
  pointwise.py  pointwise chains (cuda, cpu)
  rows.py       one reduction domain with its prologue and epilogue: row, column and split
                (multi-CTA) layouts (cuda, cpu)

Importing this package registers each module's generator with search.designs. Generator modules
written by others (compute.py, pool.py, triton_seed.py) are imported when present; one that is
present but fails to import is logged and skipped, so it cannot take these down with it.
"""
from __future__ import annotations

import importlib

from kforge_tui.search.codegen import pointwise, rows  # noqa: F401  (register their generators)

for _m in ("compute", "pool", "triton_seed"):
    try:
        importlib.import_module(f"{__name__}.{_m}")
    except ImportError as _e:
        if getattr(_e, "name", None) != f"{__name__}.{_m}":
            # the module is there but broken: it offers nothing, and ours stay registered
            import logging

            logging.getLogger(__name__).warning("codegen.%s not loaded: %s", _m, _e)
