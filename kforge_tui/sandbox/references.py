"""References: what a candidate's outputs are compared with.

The reference is the region's own graph run by PyTorch eager at the task dtypes (the promise is
"the model computes what it computed before", PyTorch's roundings included); `reference64` runs
the same graph in float64 for the judge's ulp checks (sandbox/judge.py).
"""
from __future__ import annotations

from typing import Callable

import torch

from kforge_tui.regions.meta import FLOAT_DTYPES

def check_outputs(task, outs) -> list:
    """The reference's outputs as a list matching the task's outputs (raises when they don't)."""
    if isinstance(outs, torch.Tensor):
        outs = [outs]
    outs = list(outs)
    if len(outs) != len(task.outputs):
        raise ValueError(f"the region returned {len(outs)} outputs, the task declares {len(task.outputs)}")
    fixed = []
    for o, m in zip(outs, task.outputs):
        if tuple(o.shape) != tuple(m.shape):
            if o.numel() != m.numel:
                raise ValueError(f"output shape {tuple(o.shape)} differs from the task's {m.shape}")
            o = o.reshape(m.shape)
        fixed.append(o)
    return fixed



def fresh_outputs(task, outs, inputs: list) -> list:
    """The reference's outputs kept as expected values: not copied unless one shares memory
    with an input (a copy of a multi-GiB output is memory the sets need)."""
    outs = check_outputs(task, outs)
    ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    return [o.detach().clone() if o.untyped_storage().data_ptr() in ptrs else o.detach() for o in outs]



def graph64(graph: dict) -> dict:
    """The same graph computing in float64: every floating dtype argument becomes float64."""
    def walk(a):
        if isinstance(a, list):
            return [walk(x) for x in a]
        if isinstance(a, dict):
            if "dtype" in a and len(a) == 1 and a["dtype"] in FLOAT_DTYPES:
                return {"dtype": "float64"}
            return {k: walk(v) for k, v in a.items()}
        return a

    return {"inputs": list(graph["inputs"]),
            "nodes": [{**n, "args": walk(n["args"]), "kwargs": walk(n["kwargs"])} for n in graph["nodes"]],
            "outputs": walk(graph["outputs"])}


def reference64(task, device) -> Callable[[list], list] | None:
    """A callable running the region in float64 (floating inputs cast), or None if it can't."""
    from kforge_tui.regions.graph import to_graph_module

    try:
        gm = to_graph_module(graph64(task.graph), device)
    except Exception:
        return None

    def run(inputs: list) -> list:
        cast = [(t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
                for t in inputs]
        with torch.no_grad():
            out = gm(*cast)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return run


