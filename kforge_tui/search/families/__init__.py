"""Parameterised, expert-written kernel families: the built-in proposer's search space.

A family is one kernel *design* (block per row, warp per row, split row, two-phase group
reduction, ...) for some ops on one backend, with a small discrete parameter space (threads,
vector width, rows per block, ...). The built-in proposer moves through these spaces with MCTS
on real measurements; nothing here knows any benchmark shape. Every render is one
self-contained source file that exports exactly `patterns.signature(task).declaration()`.

Families use the task's shape at render time only for *compile-time sizing* (how many register
items a thread caches); every launcher checks the runtime sizes and alignment and falls back to
a generic instantiation, so a kernel is never wrong for an input it was not sized for.

`Family` and the registry live in base.py, below the family modules that register into it.
"""
from __future__ import annotations

import threading

from kforge_tui.regions.patterns import OpTask
from kforge_tui.search.families.base import _REGISTRY, Family, register  # noqa: F401


def all_families() -> list[Family]:
    _load()
    return list(_REGISTRY)


def families_for(task: OpTask) -> list[Family]:
    """The families that can serve this task (by op, backend and shape), in registry order."""
    return [f for f in all_families() if f.applies(task)]


def get_family(name: str, backend: str, op: str | None = None) -> Family:
    """The family called `name` on `backend` (a name such as block_row exists for several ops:
    pass `op` to pick the one that serves it)."""
    for f in all_families():
        if f.name == name and f.backend == backend and (op is None or op in f.ops):
            return f
    raise KeyError(f"no kernel family {name!r} for backend {backend!r}" + (f" and op {op!r}" if op else ""))


_loaded = False
_load_lock = threading.Lock()


def _load() -> None:
    """Import the family modules once. Under a lock, and marked done only after the imports: two
    threads asking at once used to see a half-filled registry (found by a threaded test)."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        # Importing the modules registers their families (one module per op family).
        from kforge_tui.search.families import eltwise, norms, pool, softmax  # noqa: F401
        _loaded = True
