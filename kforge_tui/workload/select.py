"""Which regions to optimise: `--ops` names and `--top N`, over the profile's ranking.

A name selects a region when it is the region's label (`softmax`, `conv`, `gelu+layer_norm`), its
pattern, its kind (`pointwise`, `reduction`, `compute`, or `fused` for both chain kinds), one of
the torch functions or modules the model called in it (`softmax`, `batch_norm`), one of the aten
ops in it (`addmm`, `var_mean`) or its task id. Unknown names are an error that lists
what the model has, so a typo never runs an empty search.
"""
from __future__ import annotations

from kforge_tui.errors import UsageError
from kforge_tui.regions.task import Task


def matches(task: Task, name: str) -> bool:
    n = name.strip().lower()
    if not n:
        return False
    kinds = {task.kind}
    if task.kind in ("pointwise", "reduction"):
        kinds.add("fused")
    ops = set(task.aten.replace("…", "").split()) | set(task.parts.split())
    return (n in (task.op.lower(), task.pattern.lower(), task.task_id.lower()) or n in kinds
            or n in ops or n in task.op.lower().split("+"))


def select(tasks: list[Task], ops: list[str] | None, top: int | None) -> list[Task]:
    """Tasks ranked by their time in the forward, filtered by `ops`, capped at `top`."""
    ranked = sorted(tasks, key=lambda t: (t.total_us, t.share, t.calls), reverse=True)
    if ops:
        unknown = [o for o in ops if not any(matches(t, o) for t in ranked)]
        if unknown:
            have = sorted({t.op for t in ranked} | {t.kind for t in ranked})
            raise UsageError(f"no region matches {', '.join(unknown)}; this model has: "
                             f"{', '.join(have[:30])}{' …' if len(have) > 30 else ''}")
        ranked = [t for t in ranked if any(matches(t, o) for o in ops)]
    return ranked[:top] if top else ranked
