"""What a region holds at its edges: views that only feed the next region move into it, and a
GEMM or convolution takes its pointwise epilogue (issue 27).

Small graphs with the shapes of the LLM and conv-net patterns that showed the problem: an RMSNorm
whose value three Linears read through three `view`s (three outputs holding the same elements),
and a permuted input a chain only hands on (an output that is a copy of an input).
"""
from __future__ import annotations

import pytest
import torch

from kforge_tui.regions.build import tasks_of


def _by_op(tasks, needle):
    return [t for t in tasks if needle in t.op]


def test_norm_read_by_three_linears_is_one_output():
    w = torch.randn(64)
    ws = [torch.randn(n, 64) for n in (64, 32, 16)]

    def f(x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return [torch.nn.functional.linear(h.view(-1, 64), W) for W in ws]  # a view per Linear

    tasks = tasks_of(f, (torch.randn(2, 8, 64),))
    norm = [t for t in tasks if t.kind == "reduction"]
    assert len(norm) == 1 and len(norm[0].outputs) == 1, [(t.op, len(t.outputs)) for t in tasks]
    assert tuple(norm[0].outputs[0].shape) == (2, 8, 64)
    # each Linear now starts from the norm's value and views it itself
    lin = [t for t in tasks if t.kind == "compute"]
    assert len(lin) == 3 and all("view" in t.aten for t in lin)


def test_a_view_of_an_input_is_not_an_output():
    def f(x):
        q = x.view(2, 8, 4, 16).permute(0, 2, 1, 3)  # heads: a view the next region reads
        k = q[:, :, None].expand(2, 4, 2, 8, 16).reshape(2, 8, 8, 16)  # repeat_kv
        return torch.matmul(q, q.transpose(-1, -2)), k * 2

    tasks = tasks_of(f, (torch.randn(16, 64),))
    for t in tasks:
        if t.kind == "compute":
            continue
        names = t.graph["inputs"]
        outs = {o["ref"] for o in t.graph["outputs"]}
        assert not outs & set(names), t.code()
        # no output is a pure view chain of an input
        for n in t.graph["nodes"]:
            if n["name"] in outs:
                assert not n["target"].endswith(("view.default", "permute.default")), t.code()


def _partitions(fn, args) -> list:
    """The partition of every graph `fn` compiles to (the specs keep their fx nodes)."""
    from kforge_tui.regions import partition as P
    from kforge_tui.regions import trace

    found = []

    def hook(gm, example_inputs, is_inference, inner_kwargs):
        found.append(P.partition(gm))
        return trace.eager_runner(gm)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=trace.make_backend(hook), dynamic=False)(*args)
    return found


def _region_order(part) -> list[int]:
    """The regions in an order that runs each after those it reads (CycleError if none)."""
    from graphlib import TopologicalSorter

    owner = {n: k for k, r in enumerate(part.regions) for n in r.nodes}
    deps = {k: {owner[i] for i in r.inputs if i in owner and owner[i] != k} for k, r in enumerate(part.regions)}
    return list(TopologicalSorter(deps).static_order())


@pytest.mark.parametrize("fuse_cat", ["0", "1"])
@pytest.mark.parametrize("epilogues", ["0", "1"])
def test_regions_never_read_each_other_in_a_cycle(monkeypatch, fuse_cat, epilogues):
    """A region is one kernel: if the q chain reads k's heads while k's chain reads an unsqueeze
    the q chain holds, neither can run first. The LLM fixtures under every partition setting."""
    import llm_regions as L

    monkeypatch.setenv("KFORGE_FUSE_CAT", fuse_cat)
    monkeypatch.setenv("KFORGE_EPILOGUES", epilogues)
    for name in sorted(L.FIXTURES):
        fn, args = L.FIXTURES[name]()
        for part in _partitions(fn, args):
            assert len(_region_order(part)) == len(part.regions), name


def test_on_a_gpu_rotate_half_is_fused_with_the_rope_around_it(monkeypatch):
    """Inductor fuses `cat(-x2, x1)` into RoPE's kernel; as a region of its own it split the RoPE
    into three regions with the halves and the rotated value written between them."""
    import llm_regions as L

    fn, args = L.FIXTURES["rope_apply"]()
    monkeypatch.setenv("KFORGE_FUSE_CAT", "1")
    (rope,) = tasks_of(fn, args)
    assert "cat" in rope.aten.split() and "neg" in rope.aten.split()
    assert [tuple(o.shape) for o in rope.outputs] == [(2, 4, 16, 16), (2, 2, 16, 16)]  # q and k, nothing between
    monkeypatch.setenv("KFORGE_FUSE_CAT", "0")  # the cpu partition: the C kernels have no cat
    assert [t.op for t in tasks_of(fn, args)].count("cat") == 2


def test_cat_fuses_only_on_a_gpu_and_only_as_inductor_fuses_it(monkeypatch):
    import torch.fx as fx

    from kforge_tui.regions import partition as P

    monkeypatch.delenv("KFORGE_FUSE_CAT", raising=False)
    g = fx.Graph()
    xs = [g.placeholder(f"x{k}") for k in range(10)]
    few = g.call_function(torch.ops.aten.cat.default, (xs[:2], -1))
    many = g.call_function(torch.ops.aten.cat.default, (xs, -1))
    for n in (few, many):
        n.meta["val"] = torch.empty(2, device="meta")
    assert not P.fuses_cat(few)  # not a cuda value: the cpu's partition
    monkeypatch.setenv("KFORGE_FUSE_CAT", "1")
    assert P.fuses_cat(few) and not P.fuses_cat(many)  # more than 8 inputs: a ConcatKernel
