"""What a proposer is shown of one expansion: its ProposalContext.

The engine builds it when it reserves an expansion (`build`: the region, its ABI, the device and
reference times, the node being expanded and its neighbourhood) and brings it up to date when the
expansion proposes (`refresh`): expansions reserved together must see what the others tried by
then, or the built-in proposer picks one point (or one kernel under two names) twice.
"""
from __future__ import annotations

from kforge_tui.regions.task import Task
from kforge_tui.search.proposers.base import NodeView, ProposalContext


def abi_text(task: Task) -> str:
    """What a proposer is shown of the ABI: the C header, or the Python one for Triton."""
    if task.backend == "triton":
        from kforge_tui.regions.abi import python_header

        return python_header(task.inputs, task.outputs)
    return task.header()


def build(ts, leaf, mode: str, *, device: dict, seed: int, languages) -> ProposalContext:
    """The context for expanding `leaf` of the search state `ts` (engine.SearchState) in `mode`;
    `device` is DeviceInfo.to_json() of where the task's kernels run."""
    task = ts.task
    parent = ts.views[leaf.node_id]
    ancestors, cur = [], parent.parent_id
    while cur is not None and cur in ts.views:
        ancestors.insert(0, ts.views[cur])
        cur = ts.views[cur].parent_id
    b = ts.baseline or {}
    best = ts.tree.best()
    dev = dict(device)
    if b.get("bandwidth_gbs"):
        dev["bandwidth_gbs"] = b["bandwidth_gbs"]
    ctx = ProposalContext(
        task=task.to_json(), signature=task.signature().declaration(),
        canonical=abi_text(task), reference=task.code(),
        device=dev, eager_us=(b.get("eager") or {}).get("median_us"),
        compiled_us=(b.get("compiled") or {}).get("median_us"), floor_us=b.get("floor_us"),
        parent=parent, ancestors=ancestors, siblings=[], tried=[], mode=mode,
        best=ts.views.get(best.node_id) if best is not None else None,
        seed=seed, languages=list(languages))
    refresh(ctx, ts.views)
    return ctx


def refresh(ctx: ProposalContext, views: dict[int, NodeView], node_id: int | None = None) -> None:
    """What was tried in the task as of now (`node_id`: the expansion's own reserved node, not
    one of its siblings)."""
    ctx.tried = [v.params for v in views.values() if v.params]
    ctx.siblings = [v for v in views.values() if v.parent_id == ctx.parent.node_id and v.node_id != node_id]
    ctx.sources = {v.source for v in views.values() if v.source}
