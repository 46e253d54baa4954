"""What a region holds at its edges: views that only feed the next region move into it, and a
GEMM or convolution takes its pointwise epilogue (issue 27).

Small graphs with the shapes of the LLM and conv-net patterns that showed the problem: an RMSNorm
whose value three Linears read through three `view`s (three outputs holding the same elements),
and a permuted input a chain only hands on (an output that is a copy of an input).
"""
from __future__ import annotations

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
