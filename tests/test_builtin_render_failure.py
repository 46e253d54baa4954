"""A point whose render raises costs no budget slot: the built-in proposer passes it over for the
next move and says so (a diffusers VAE group_norm+silu run lost 1 of 3 evaluations to a
"proposal error"); and the generated cpu cols design no longer admits the points its render
refuses ("the epilogue reads the reduction of another row")."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
import torch

from kforge_tui.regions import build, patterns
from kforge_tui.regions.build import tasks_of
from kforge_tui.search.designs import FamilyDesign, designs_for
from kforge_tui.search.proposers.builtin import BuiltinProposer
from test_builtin_proposer import ROOT, ctx_for, walk


def softmax_task():
    t = build.task_of(lambda x: torch.softmax(x, -1), (torch.randn(64, 1000),), "cpu")
    b = patterns.match(t)
    return replace(t, op=b.op_task.op, pattern=b.op_task.op, params={"binding": b.to_json()})


class RefusesToRender:
    """A family design whose render raises at the points `refused` picks (valid() admits them)."""

    def __init__(self, design, refused):
        self.design, self.refused = design, refused
        self.name, self.backend, self.space, self.op = design.name, design.backend, design.space, design.op

    def default(self, task):
        return self.design.default(task)

    def valid(self, task, params):
        return self.design.valid(task, params)

    def extent(self, task):
        return self.design.extent(task)

    def render(self, task, params):
        if self.refused(params):
            raise ValueError("boom: this point does not render")
        return self.design.render(task, params)


def the_family(task):
    (fam,) = [d for d in designs_for(task) if isinstance(d, FamilyDesign)]
    return fam


def _proposer(task, refused):
    broken = RefusesToRender(the_family(task), refused)
    return BuiltinProposer(families=lambda t: [broken])


async def test_a_refused_default_still_yields_a_candidate_in_its_slot():
    task = softmax_task()
    fam = the_family(task)
    bad = fam.default(task)
    prop = _proposer(task, lambda p: p == bad)
    # the root's only move is the family's default: it fails, its nearest neighbour takes the slot
    assert [m.params for m in prop.moves(ctx_for(task, ROOT, "root"), task)] == [bad]
    p = await prop.propose(ctx_for(task, ROOT, "root"))
    assert p.source and p.error is None
    assert p.params != {"family": fam.name, **bad} and fam.valid(task, {k: p.params[k] for k in fam.space})
    assert "render failed" in p.response and "boom" in p.response  # the dropped move is on record
    key = json.dumps({"family": fam.name, **bad}, sort_keys=True)
    assert "boom" in prop.unrenderable[task.task_id][key]
    # and it is never drawn again
    again = prop.moves(ctx_for(task, ROOT, "root", tried=[p.params]), task)
    assert all(m.params != bad for m in again)


async def test_a_walk_over_a_space_with_unrenderable_points_never_spends_a_slot_on_one():
    task = softmax_task()
    fam = the_family(task)
    k, v = next((k, vals[1]) for k, vals in fam.space.items() if len(vals) > 2)  # a value of one axis

    def refused(p):
        return p.get(k) == v

    prop = _proposer(task, refused)
    keys = list(fam.space)
    points = [dict(zip(keys, vals)) for vals in itertools.product(*fam.space.values())]
    renderable = [p for p in points if fam.valid(task, p) and not refused(p)]
    assert 0 < len(renderable) < len([p for p in points if fam.valid(task, p)])
    tried = []
    async for parent, p in walk(prop, task, {0: ROOT}, tried):
        if p.source is None:  # only when nothing renderable is left from this parent
            assert p.exhausted and not prop.can_expand(ctx_for(task, parent, "improve", tried)), p.error
            continue
        assert not refused(p.params) and p.params not in tried
    assert len(tried) == len(renderable)


@pytest.mark.parametrize("shape, groups", [((1, 64, 16, 16), 32), ((1, 32, 32, 32), 16)])
def test_group_norm_silu_cpu_admits_no_point_its_render_refuses(shape, groups):
    """Channels-last, as Inductor hands a diffusers VAE's GroupNorm its input: the cpu cols layout
    is offered, and a block past the last group (rb * block + j beyond the rows) is not."""
    gn = torch.nn.GroupNorm(groups, shape[1])
    x = torch.randn(*shape).to(memory_format=torch.channels_last)
    (task,) = [t for t in tasks_of(lambda x: torch.nn.functional.silu(gn(x)), (x,)) if t.kind == "reduction"]
    designs = {d.name: d for d in designs_for(task)}
    assert {"gen_rows", "gen_cols"} <= set(designs)
    refused = []
    for name, d in designs.items():
        keys, admitted = list(d.space), 0
        for vals in itertools.product(*d.space.values()):
            p = dict(zip(keys, vals))
            if not d.valid(task, p):
                continue
            admitted += 1
            try:
                d.render(task, p)
            except Exception as e:
                refused.append((name, p, str(e)[:80]))
        assert admitted, name
    assert not refused, refused[:5]
    # the blocks that do render are still offered
    assert any(designs["gen_cols"].valid(task, {"block": b, "splits": 1, "math": "libm"}) for b in (8, 16, 32))
