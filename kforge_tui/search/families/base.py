"""The kernel-family contract (`Family`) and its registry, below the family modules that fill
it: each module calls `register` at import; the package's `all_families` imports them."""
from __future__ import annotations

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
