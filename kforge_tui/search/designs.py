"""Kernel designs the built-in proposer searches: what it can render for a region task.

A design is one kernel construction for a region with a small discrete parameter space; MCTS
moves through the spaces on real measurements. Two kinds:

  * family designs: an expert-written kernel family (search/families/) for the named pattern
    the region matched (regions/patterns.py), its source adapted to the region's generic
    entry point;
  * generated designs: kernels generated mechanically from the region's own graph
    (search/codegen/: pointwise chains, row reductions with their epilogues, pooling windows),
    for regions no family fits or to compete with one.

Every render is one self-contained candidate source for the task's backend (generated ones
`#include "kforge_region.h"`, the per-task ABI header the sandbox writes beside it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kforge_tui.regions import patterns
from kforge_tui.regions.task import Task
from kforge_tui.search.codegen import generators


class Design(Protocol):
    name: str
    backend: str
    space: dict  # parameter -> allowed values, in increasing "size" order
    op: str  # what priors reason about: a pattern name, or the region kind

    def default(self, task: Task) -> dict: ...

    def valid(self, task: Task, params: dict) -> bool: ...

    def render(self, task: Task, params: dict) -> str: ...

    def extent(self, task: Task) -> tuple[int, int]:
        """(independent rows, elements per row): what grid-fill priors reason about."""
        ...


@dataclass(frozen=True)
class FamilyDesign:
    """A kernel family serving a region through the region's pattern binding."""

    family: object  # search.families.Family
    binding: patterns.Binding

    @property
    def name(self) -> str:
        return self.family.name

    @property
    def backend(self) -> str:
        return self.family.backend

    @property
    def space(self) -> dict:
        return self.family.space

    @property
    def op(self) -> str:
        return self.binding.op_task.op

    def _ot(self, task: Task):
        return self.binding.op_task.with_backend(task.backend)

    def default(self, task: Task) -> dict:
        return self.family.default(self._ot(task))

    def valid(self, task: Task, params: dict) -> bool:
        return self.family.valid(self._ot(task), params)

    def render(self, task: Task, params: dict) -> str:
        return patterns.adapt(self.family.render(self._ot(task), params), self.binding, task)

    def extent(self, task: Task) -> tuple[int, int]:
        return pattern_extent(self._ot(task))


def pattern_extent(ot) -> tuple[int, int]:
    s = patterns.scalar_args(ot)
    op = ot.op
    if op in ("softmax", "log_softmax"):
        return s["outer"] * s["inner"], s["n"]
    if op == "group_norm":
        return s["N"] * s["G"], s["C"] // max(1, s["G"]) * s["HxW"]
    if op == "adaptive_avg_pool2d":
        return s["NC"], s["H"] * s["W"]
    if op == "silu_mul":
        return s["rows"], s["cols"]
    if op in ("layer_norm", "rms_norm"):
        return s["rows"], s["n"]
    return 1, s.get("numel", 1)


def designs_for(task: Task) -> list:
    """Every design that can serve this region task on its backend: families first, then each
    generator's (search.codegen.generators(), in its order)."""
    from kforge_tui.search.families import families_for

    out: list = []
    b = patterns.binding_of(task)
    if b is not None:
        ot = b.op_task.with_backend(task.backend)
        out.extend(FamilyDesign(f, b) for f in families_for(ot))
    for gen in generators():
        try:
            out.extend(d for d in gen(task) if d.backend == task.backend)
        except Exception:  # a generator that cannot read this graph offers nothing
            continue
    return out


@dataclass(frozen=True)
class InLanguage:
    """A design of another kernel language than the task's ABI one (an `auto` run's Triton
    seed on a cuda task), bound to the task as that language sees it: its defaults, validity
    and renders are the language's own, whatever task object the proposer hands it."""

    design: object
    task: Task

    @property
    def name(self) -> str:
        return self.design.name

    @property
    def backend(self) -> str:
        return self.design.backend

    @property
    def space(self) -> dict:
        return self.design.space

    @property
    def op(self) -> str:
        return self.design.op

    def default(self, task: Task) -> dict:
        return self.design.default(self.task)

    def valid(self, task: Task, params: dict) -> bool:
        return self.design.valid(self.task, params)

    def render(self, task: Task, params: dict) -> str:
        return self.design.render(self.task, params)

    def extent(self, task: Task) -> tuple[int, int]:
        return self.design.extent(self.task)


def designs_in(task: Task, languages) -> list:
    """Every design of every language searched (search/languages.py), in the languages' order
    (an `auto` run: Inductor's Triton variants, then the CUDA families and generated kernels);
    a name already offered by an earlier language is not offered again."""
    out, seen = [], set()
    for lang in list(languages or ()) or [task.backend]:
        t = task.with_backend(lang)
        for d in designs_for(t):
            if d.name in seen:
                continue
            seen.add(d.name)
            out.append(d if lang == task.backend else InLanguage(d, t))
    return out

