"""Eager is what PyTorch eager runs for a region: the model's own calls, undecomposed
(regions/eager.py). A fused chain's graph is Inductor's decomposition (group_norm as var_mean,
rsqrt, mul, add; silu as neg, exp, add, div): timed op by op it read 5-10x slower than eager
on held-out GPT-2, BERT and a diffusers VAE (2026-12-07)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from kforge_tui.regions.build import tasks_of
from kforge_tui.regions.eager import eager_function
from kforge_tui.regions.task import Task
from kforge_tui.workload.profile import random_inputs


class _Aten(TorchDispatchMode):
    """The aten ops a call dispatches, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


class _NormAct(torch.nn.Module):
    """A diffusers resnet block's head: group_norm then silu, one region for Inductor."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(4, 16)

    def forward(self, x):
        return F.silu(self.norm(x))


class _ResidualNorm(torch.nn.Module):
    """GPT-2's residual: an add, a dropout (a no-op in eval, gone from Inductor's graph), then
    layer_norm."""

    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.1)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x, y):
        return self.ln(self.drop(x + y))


def _task(model, args, op: str) -> Task:
    (t,) = [t for t in tasks_of(model.eval(), args) if t.op == op]
    return t


def _check(t: Task, native: list[str], decomposed: list[str]):
    ins = random_inputs(t, "cpu", seed=1)
    expected = t.reference(ins)
    got = eager_function(t, ins, expected)
    assert got is not None, t.eager_graphs
    fn, label = got
    with _Aten() as seen:
        out = fn(*ins)
    for name in native:
        assert name in seen.names, (name, seen.names)
    for name in decomposed:
        assert name not in seen.names, (name, seen.names)
    for o, e in zip(out, expected):
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-5)
    return label


def test_a_fused_norm_and_activation_is_timed_as_the_two_calls_eager_makes():
    t = _task(_NormAct(), (torch.randn(2, 16, 8, 8),), "group_norm+silu")
    with _Aten() as seen:  # the region's own graph is the decomposition
        t.reference(random_inputs(t, "cpu"))
    assert "native_group_norm" not in seen.names and "var_mean" in seen.names
    label = _check(t, ["native_group_norm", "silu"], ["var_mean", "rsqrt", "exp"])
    assert label == "group_norm, silu as PyTorch runs them"


def test_calls_that_left_nothing_in_the_graph_do_not_break_the_chain():
    t = _task(_ResidualNorm(), (torch.randn(2, 8, 32), torch.randn(2, 8, 32)), "add+layer_norm")
    assert t.eager_graphs
    _check(t, ["add", "native_layer_norm"], ["var_mean", "rsqrt"])


def test_the_graph_is_used_only_where_it_reproduces_the_region():
    """Inputs alike (a - b, both [8, 64]) can feed the calls two ways: a graph fed the wrong way
    computes b - a, and the check on real values must refuse it and take the right one."""
    (t,) = tasks_of(lambda a, b: torch.relu(a - b), (torch.randn(8, 64), torch.randn(8, 64)))
    (right,) = t.eager_graphs
    nodes = json.dumps(right["nodes"]).replace('"in0"', '"inX"').replace('"in1"', '"in0"').replace('"inX"', '"in1"')
    swapped = dict(right, nodes=json.loads(nodes))  # the placeholders as they were, the uses swapped
    ins = random_inputs(t, "cpu", seed=2)
    expected = t.reference(ins)
    assert eager_function(replace(t, eager_graphs=[swapped]), ins, expected) is None  # b - a: refused
    fn, _ = eager_function(replace(t, eager_graphs=[swapped, right]), ins, expected)
    torch.testing.assert_close(fn(*ins)[0], expected[0])
    # an output the calls do not give: not this region, whatever the graph says
    assert eager_function(t, ins, [expected[0] + 1.0]) is None


def test_calls_that_write_into_their_arguments_are_never_eager():
    """Timed on the harness's input sets, `x.mul_(2)` would change them under every later check."""
    def inplace(x, y):
        h = x + y
        h.mul_(2.0)
        return torch.relu(h)

    for t in tasks_of(inplace, (torch.randn(8, 64), torch.randn(8, 64))):
        for g in t.eager_graphs:
            assert not any(n["target"].split(".")[1].endswith("_") for n in g["nodes"]), g


def test_the_eager_graphs_travel_with_the_task():
    t = _task(_NormAct(), (torch.randn(2, 16, 8, 8),), "group_norm+silu")
    back = Task.from_json(json.loads(json.dumps(t.to_json())))
    assert back.eager_graphs == t.eager_graphs and back.key == t.key
    old = t.to_json()
    del old["eager_graphs"]  # a task stored before the field: the region's graph is eager
    assert Task.from_json(old).eager_graphs == []


@pytest.mark.models
def test_a_transformer_blocks_chains_are_timed_as_eager_runs_them():
    """Every add+layer_norm of a real GPT-2 block (held-out, not in the repository) is eager's
    add and native_layer_norm, not var_mean, rsqrt and the rest."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)
    model = transformers.GPT2Model(cfg).eval()
    tasks = [t for t in tasks_of(model, (torch.randint(0, 100, (2, 16)),)) if t.op == "add+layer_norm"]
    assert len(tasks) >= 3
    for t in tasks:
        _check(t, ["add", "native_layer_norm"], ["var_mean", "rsqrt"])


def test_a_call_split_between_regions_is_not_timed_whole_in_either():
    """Half a group_norm (its statistics) as a region of its own: timing the whole call as its
    eager would count the call once per piece."""
    from kforge_tui.regions import partition as P
    from kforge_tui.regions import trace
    from kforge_tui.regions.eager import _eager_graphs

    seen = {}

    def hook(gm, example_inputs, is_inference, kwargs):
        (spec,) = [s for s in P.partition(gm).regions if s.label == "group_norm+silu"]
        seen["whole"] = _eager_graphs(spec)
        k = next(i for i, n in enumerate(spec.nodes) if "rsqrt" in str(n.target))
        half = P.RegionSpec(spec.nodes[:k + 1], spec.inputs[:1], [spec.nodes[k]], "reduction", "stats")
        seen["half"] = _eager_graphs(half)
        return trace.eager_runner(gm)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_NormAct().eval(), backend=trace.make_backend(hook))(torch.randn(2, 16, 8, 8))
    assert len(seen["whole"][0]) == 1, seen["whole"]
    assert seen["half"][0] == [] and "split between regions" in seen["half"][1], seen["half"]


@pytest.mark.models
def test_a_region_that_only_views_a_calls_result_takes_that_result_as_its_input():
    """BERT's attention region starts from three Linear outputs it only reshapes (the addmms
    are in the Linear regions): those calls are its inputs, not calls it times, and its eager
    is the attention op itself."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=100)
    model = transformers.BertModel(cfg).eval()
    (t,) = [t for t in tasks_of(model, (torch.randint(0, 100, (2, 16)),)) if t.op == "sdpa"]
    assert t.eager_graphs
    ops = {n["target"].split(".")[1] for g in t.eager_graphs for n in g["nodes"] if "." in n["target"]}
    assert "addmm" not in ops and any("scaled_dot_product" in o for o in ops), ops
    _check(t, [], ["addmm", "bmm", "_softmax"])


def test_a_region_at_many_sites_keeps_the_eager_graphs_of_its_first(tmp_path):
    """The capture traces a region's calls once per distinct region (its first site), not at
    each of its sites: what every site's task carries is still the model's calls."""
    from kforge_tui.workload.capture import trace_model
    from kforge_tui.workload.loader import load_model

    (tmp_path / "blocks.py").write_text(
        "import torch, torch.nn as nn, torch.nn.functional as F\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv, self.norm = nn.Conv2d(16, 16, 3, padding=1), nn.GroupNorm(4, 16)\n"
        "    def forward(self, x):\n"
        "        return F.silu(self.norm(self.conv(x)))\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return nn.Sequential(*[Block() for _ in range(4)]), (torch.randn(2, 16, 8, 8),)\n")
    traced = trace_model(load_model(str(tmp_path / "blocks.py"), "cpu"), "cpu", max_calls=1)
    (t,) = [r.task for r in traced.records.values() if r.task.op == "group_norm+silu"]
    assert [r.calls for r in traced.records.values() if r.task.op == "group_norm+silu"] == [4]
    assert "group_norm, silu as PyTorch runs them" == _check(t, ["native_group_norm", "silu"], ["var_mean"])
