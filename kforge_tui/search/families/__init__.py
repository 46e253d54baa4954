"""Parameterised, expert-written kernel families: the built-in proposer's search space.

A family is one kernel *design* (block per row, warp per row, split row, two-phase group
reduction, ...) for some ops on one backend, with a small discrete parameter space (threads,
vector width, rows per block, ...). The built-in proposer moves through these spaces with MCTS
on real measurements; nothing here knows any benchmark shape. Every render is one
self-contained source file that exports exactly `patterns.signature(task).declaration()`.

Families use the task's shape at render time only for *compile-time sizing* (how many register
items a thread caches); every launcher checks the runtime sizes and alignment and falls back to
a generic instantiation, so a kernel is never wrong for an input it was not sized for.
"""
from __future__ import annotations

import threading

from dataclasses import dataclass, field
from typing import Callable

from kforge_tui.regions.patterns import OpTask


@dataclass(frozen=True)
class Family:
    name: str
    ops: tuple[str, ...]
    backend: str
    space: dict[str, tuple]  # parameter -> allowed values, in increasing "size" order
    _default: Callable[[OpTask], dict] = field(repr=False, compare=False)
    _valid: Callable[[OpTask, dict], bool] = field(repr=False, compare=False)
    _render: Callable[[OpTask, dict], str] = field(repr=False, compare=False)
    doc: str = ""

    def applies(self, task: OpTask) -> bool:
        """Whether this family can serve the task at all (its default point is valid)."""
        if task.op not in self.ops or task.backend != self.backend:
            return False
        try:
            return self.valid(task, self.default(task))
        except (KeyError, ValueError, ZeroDivisionError, TypeError):
            return False

    def default(self, task: OpTask) -> dict:
        """A sensible starting point for this task's shape and dtype."""
        return dict(self._default(task))

    def valid(self, task: OpTask, params: dict) -> bool:
        """Every parameter present and allowed, and the family's own shape/resource rules hold."""
        if set(params) != set(self.space):
            return False
        if any(params[k] not in vals for k, vals in self.space.items()):
            return False
        return bool(self._valid(task, params))

    def render(self, task: OpTask, params: dict) -> str:
        if not self.valid(task, params):
            raise ValueError(f"{self.name}: invalid parameters {params} for {task.task_id}")
        return self._render(task, params)


_REGISTRY: list[Family] = []


def register(fam: Family) -> Family:
    _REGISTRY.append(fam)
    return fam


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
