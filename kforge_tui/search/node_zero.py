"""Node zero of a search: Inductor's own kernel for the region, as a candidate.

Every region's tree starts from what torch.compile runs for it (the Triton seed of
search/inductor_seed.py at the config Inductor's autotuner chose, rendered by the `inductor`
design of search/codegen/triton_seed.py), evaluated before any proposal: the search's best is
then never worse than torch.compile, the built-in proposer's moves start from the seed's
parameters, and an LLM sees its source and config as the starting point. The engine adds the
node (engine.Engine._seed_node); this module says what it is, or why there is none.
"""
from __future__ import annotations

from kforge_tui.regions.task import Task

ACTION = "seed:inductor"
PROPOSER = "inductor"


def node_zero(task: Task, note: str = "") -> tuple[str | None, dict, str]:
    """(source, params, "") of the task's seed node, or (None, {}, why there is none).
    `note` is the worker's baseline note (its compile of the region, when it failed)."""
    from kforge_tui.search import inductor_seed
    from kforge_tui.search.codegen import triton_seed

    tt = task.with_backend("triton")
    d = next((d for d in triton_seed.generate(tt) if d.variant == "default"), None)
    if d is None:
        why = inductor_seed.why_no_seed(tt) or next(
            (p.strip() for p in note.split(";") if p.strip().startswith("no Triton seed")), "")
        return None, {}, why or "Inductor generated no Triton code for this region"
    p = d.default(tt)
    try:
        return d.render(tt, p), {"family": d.name, **p}, ""
    except Exception as e:  # noqa: BLE001 - a rewrite bug costs the seed, not the search
        return None, {}, f"rendering Inductor's kernel failed: {type(e).__name__}: {e}"


def shares(left: int, n: int) -> list[int]:
    """`left` unspent candidates split over `n` searches, the first ones getting the rest."""
    share, extra = divmod(max(0, left), max(1, n))
    return [share + (1 if i < extra else 0) for i in range(n)]
