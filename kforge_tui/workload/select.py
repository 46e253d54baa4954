"""Which regions to optimise: `--ops` names and `--top N`, over the profile's ranking.

With a profile, regions are ranked by headroom against torch.compile ((compiled - floor) x calls,
workload/profile.py), not by their share of eager time: the budget goes where something can be
won. A region with none (at its floor, or a bare GEMM/conv at the vendor library's roofline) is
searched only when `--ops` names it.

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


def select(tasks: list[Task], ops: list[str] | None, top: int | None, profile=None, *,
           serves=None, passed: list | None = None, left: list | None = None) -> list[Task]:
    """Tasks ranked by headroom (with a profile; else by their time in the forward), filtered
    by `ops`, capped at `top`. Regions `serves(task)` says the proposer can write nothing for go
    to `passed` (in rank order) instead of taking a slot. Without `ops`, regions with no
    headroom are left out. With `ops`, every name gets its best-ranked region whatever `top`
    says (a user who names four ops wants four searched), then `top` is filled by rank from the
    other matches; matches that get no slot go to `left`, so the user can be told."""
    rows = {r.task_key: r for r in profile.rows} if profile is not None else None

    def room(t: Task) -> float:
        r = rows.get(t.key) if rows is not None else None
        return r.headroom_us if r is not None else 0.0

    ranked = sorted(tasks, key=lambda t: (room(t), t.total_us, t.share, t.calls), reverse=True)
    if ops:
        unknown = [o for o in ops if not any(matches(t, o) for t in ranked)]
        if unknown:
            have = sorted({t.op for t in ranked} | {t.kind for t in ranked})
            raise UsageError(f"no region matches {', '.join(unknown)}; this model has: "
                             f"{', '.join(have[:30])}{' …' if len(have) > 30 else ''}")
        ranked = [t for t in ranked if any(matches(t, o) for o in ops)]
    elif rows is not None:
        searched = [t for t in ranked if room(t) > 0]
        if ranked and not searched:  # "at its floor" is measured (a noisy floor or compile time
            # on a loaded cpu): with nothing else to search those are; a vendor GEMM/conv is not
            searched = [t for t in ranked if t.key in rows
                        and not (rows[t.key].headroom_note or "").startswith("vendor")]
        if ranked and not searched:
            why = sorted({(rows[t.key].headroom_note or "no headroom") for t in ranked if t.key in rows})
            names = list(dict.fromkeys(t.op for t in ranked))
            raise UsageError("no region has headroom against torch.compile ("
                             + "; ".join(why[:4]) + "); name one with --ops to search it anyway "
                             f"(--ops {names[0]}; this model has: {', '.join(names[:10])}"
                             f"{' …' if len(names) > 10 else ''})")
        ranked = searched
    if serves is not None:
        served = []
        for t in ranked:
            if serves(t):
                served.append(t)
            elif passed is not None and (ops or not top or len(served) < top):
                passed.append(t)  # without ops: only those met while `top` is being filled
        ranked = served
    if not ops:
        return ranked[:top] if top else ranked
    first = {id(next(t for t in ranked if matches(t, o))) for o in ops if any(matches(t, o) for t in ranked)}
    room_left = max(0, (top or len(ranked)) - len(first))
    out = []
    for t in ranked:
        if id(t) in first:
            out.append(t)
        elif room_left:
            out.append(t)
            room_left -= 1
        elif left is not None:
            left.append(t)
    return out


def check_ops(tasks, ops: list[str]) -> None:
    """`--ops` against the regions the capture found, before the profile times them; the
    names offered are all typeable (a label cut with `…` is offered as its parts)."""
    unknown = [o for o in ops if not any(matches(t, o) for t in tasks)]
    if unknown:
        names = {t.kind for t in tasks}
        for t in tasks:
            names.update(p for p in t.op.split("+") if p != "…") if "…" in t.op else names.add(t.op)
        raise UsageError(f"--ops: no region matches {', '.join(unknown)}; this model has: "
                         f"{', '.join(sorted(names))}")
