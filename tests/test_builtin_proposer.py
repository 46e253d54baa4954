"""The built-in proposer: the moves it makes through the family spaces, and that it never repeats."""
from __future__ import annotations

import collections
import json

import torch

import functools
from dataclasses import replace

from kforge_tui.regions import build, patterns
from kforge_tui.sandbox.static import check_source
from kforge_tui.search.designs import FamilyDesign, designs_for
from kforge_tui.search.proposers.base import NodeView, ProposalContext
from kforge_tui.search.proposers.builtin import BuiltinProposer


@functools.lru_cache(maxsize=None)
def task_of(shape, backend, dtype=torch.float32):
    """A softmax region of a real graph, bound to the softmax pattern (as capture binds it)."""
    t = build.task_of(lambda x: torch.softmax(x, -1), (torch.randn(shape).to(dtype),), backend)
    b = patterns.match(t)
    return replace(t, op=b.op_task.op, pattern=b.op_task.op, params={"binding": b.to_json()})


def families_for(task):
    """The family designs of a bound region (generated designs left out of these tests)."""
    return [d for d in designs_for(task) if isinstance(d, FamilyDesign)]


def BuiltinProposer():  # noqa: N802 - the proposer restricted to family designs
    from kforge_tui.search.proposers.builtin import BuiltinProposer as P

    return P(families=families_for)


def ctx_for(task, parent: NodeView, mode: str, tried=(), siblings=(), seed=0) -> ProposalContext:
    return ProposalContext(task=task.to_json(), signature=task.signature().declaration(),
                           canonical="", reference="", device={"sms": 132 if task.backend == "cuda" else 2},
                           eager_us=10.0, compiled_us=None, floor_us=1.0, parent=parent, ancestors=[],
                           siblings=list(siblings), tried=[dict(t) for t in tried], mode=mode, seed=seed)


ROOT = NodeView(node_id=0, parent_id=None, action="root", source=None, status="ok")


def node(i, params, status="ok"):
    return NodeView(node_id=i, parent_id=0, action="x", source="...", params=dict(params), status=status)


async def walk(prop, task, nodes: dict, tried: list, steps: int = 500):
    """Expand the nodes that can still expand, round robin, until none can (or `steps` run out),
    yielding each (parent, proposal) for the caller to check before it is recorded: a proposal
    with a source joins `tried` and becomes a node of `nodes` (both the caller's, to read after)."""
    def mode(n):
        return "root" if n.node_id == 0 else "improve"

    for step in range(steps):
        expandable = [n for n in nodes.values() if prop.can_expand(ctx_for(task, n, mode(n), tried))]
        if not expandable:
            return
        parent = expandable[step % len(expandable)]
        p = await prop.propose(ctx_for(task, parent, mode(parent), tried, seed=step))
        yield parent, p
        if p.source is not None:
            tried.append(p.params)
            nodes[len(nodes)] = node(len(nodes), p.params)


def space_size(fam, task) -> int:
    import itertools

    keys = list(fam.space)
    return sum(1 for vals in itertools.product(*fam.space.values())
               if fam.valid(task, dict(zip(keys, vals))))


async def test_root_proposes_one_default_per_family_then_neighbours():
    task = task_of((3000, 512), "cuda")
    prop = BuiltinProposer()
    fams = {f.name: f for f in families_for(task)}
    assert {"block_row", "warp_row"} <= set(fams)
    tried, actions = [], []
    for i in range(len(fams)):
        p = await prop.propose(ctx_for(task, ROOT, "root", tried=tried, seed=i))
        assert p.source and p.action.startswith("family:")
        actions.append(p.action)
        assert p.params == {"family": p.params["family"], **fams[p.params["family"]].default(task)}
        tried.append(p.params)
    assert sorted(a.split(":")[1] for a in actions) == sorted(fams)
    # defaults all taken: root still expands, with untried neighbours of the defaults
    p = await prop.propose(ctx_for(task, ROOT, "root", tried=tried))
    assert p.source and p.params not in tried


async def test_walk_never_repeats_and_exhausts_the_space():
    """Expand random parents until nothing is left: every point once, every point reachable."""
    task = task_of((64, 1000), "cpu")
    prop = BuiltinProposer()
    (fam,) = families_for(task)
    nodes = {0: ROOT}
    tried: list[dict] = []
    seen = set()
    async for _, p in walk(prop, task, nodes, tried):
        assert p.source is not None, p.error
        key = json.dumps(p.params, sort_keys=True)
        assert key not in seen, f"repeated {p.params}"
        seen.add(key)
    assert len(seen) == space_size(fam, task)
    p = await prop.propose(ctx_for(task, nodes[1], "improve", tried))
    assert p.source is None and p.exhausted


async def test_improve_makes_set_and_family_moves_and_repair_shrinks():
    task = task_of((3000, 512), "cuda")
    prop = BuiltinProposer()
    fam = next(f for f in families_for(task) if f.name == "block_row")
    parent = node(1, {"family": "block_row", **fam.default(task)})
    tried = [parent.params]
    kinds = collections.Counter()
    for seed in range(60):
        p = await prop.propose(ctx_for(task, parent, "improve", tried, seed=seed))
        kinds[p.action.split(":")[0]] += 1
        assert p.params != parent.params
        if p.action.startswith("set:"):
            changed = [k for k in parent.params if parent.params[k] != p.params[k]]
            assert len(changed) == 1 and p.action == f"set:{changed[0]}={p.params[changed[0]]}"
    assert kinds["set"] > 0 and kinds["family"] > 0
    # repair from a failed big configuration: smaller threads/vec, or the default
    big = {"family": "block_row", **{**fam.default(task), "threads": 1024, "vec": 4}}
    failed = node(2, big, status="compile_error")
    moves = prop.moves(ctx_for(task, failed, "repair", tried + [big]), task)
    acts = {m.action for m in moves}
    assert "repair:threads=512" in acts and "repair:vec=2" in acts
    assert "repair:default" not in acts  # the default is the parent above: already tried
    fresh = prop.moves(ctx_for(task, failed, "repair", [big]), task)
    assert "repair:default" in {m.action for m in fresh}
    p = await prop.propose(ctx_for(task, failed, "repair", tried + [big], seed=3))
    assert p.action.startswith(("repair:", "family:")) and p.source


async def test_sources_pass_the_static_check_and_seed_drives_choice():
    task = task_of((3000, 512), "cuda")
    prop = BuiltinProposer()
    chosen = set()
    for seed in range(12):
        p = await prop.propose(ctx_for(task, ROOT, "root", seed=seed))
        rep = check_source(p.source, task.signature())
        assert rep.ok, [d.text() for d in rep.diagnostics]
        chosen.add(p.params["family"])
        again = await prop.propose(ctx_for(task, ROOT, "root", seed=seed))
        assert again.params == p.params  # deterministic for one seed
    assert len(chosen) >= 2  # but the seed does explore


async def test_priors_follow_the_task_not_a_table():
    """Short rows favour warp-per-row; few long rows favour split rows; by sizes, not by name."""
    prop = BuiltinProposer()

    def tally(task):
        c = collections.Counter()
        for seed in range(200):
            m = prop.moves(ctx_for(task, ROOT, "root", seed=seed), task)
            import random

            rng = random.Random(seed)
            c[rng.choices(m, weights=[x.prior for x in m])[0].family.name] += 1
        return c

    short = tally(task_of((5000, 384), "cuda"))
    assert short["warp_row"] > short["block_row"]
    long_rows = tally(task_of((6, 100000), "cuda"))
    assert long_rows["split_row"] > long_rows["block_row"]


async def test_bad_context_is_a_failed_proposal_not_a_crash():
    task = task_of((8, 16), "cpu")
    ctx = ctx_for(task, ROOT, "root")
    ctx.task = {"op": "nope"}
    p = await BuiltinProposer().propose(ctx)
    assert p.source is None and p.error
    assert BuiltinProposer().can_expand(ctx) is False


async def test_generated_designs_serve_regions_no_family_fits():
    from kforge_tui.search.proposers.builtin import BuiltinProposer as Full

    t = build.task_of(lambda x: torch.relu(x * 0.5 + 1.0) * torch.sigmoid(x), (torch.randn(64, 256),), "cpu")
    assert patterns.match(t) is None
    prop = Full()
    p = await prop.propose(ctx_for(t, ROOT, "root"))
    assert p.source and '#include "kforge_region.h"' in p.source, p.error
    assert check_source(p.source, t.signature()).ok


async def test_a_point_that_renders_a_kernel_already_tried_is_passed_over():
    """T5's RMSNorm on the cpu: `math` changes no function its ops call, so four points were
    four identical kernels. A point whose kernel is in ctx.sources is passed over for good."""
    from kforge_tui.search.proposers.builtin import _key

    task = task_of((64, 512), "cpu")
    prop = BuiltinProposer()
    first = await prop.propose(ctx_for(task, ROOT, "root"))
    ctx = ctx_for(task, node(1, first.params), "improve", tried=[first.params])
    ctx.sources = {first.source}
    second = await prop.propose(ctx)
    assert second.source and len(prop.moves(ctx, task)) > 2
    ctx.sources.add(second.source)  # tried already: under another point, say
    third = await prop.propose(ctx)  # the same draw comes first; its kernel is passed over
    assert third.source and third.source not in ctx.sources
    assert _key(second.params) not in {_key(m.full) for m in prop.moves(ctx, task)}
    ctx.sources |= {m.family.render(task, m.params) for m in prop.moves(ctx, task)}
    last = await prop.propose(ctx)  # every point renders a kernel tried: nothing, and why
    assert last.source is None and "already tried" in last.error and not prop.can_expand(ctx)
