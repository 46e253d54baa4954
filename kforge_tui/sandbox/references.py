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


def reference64(task, device, slices: int = 1) -> Callable[[list], list] | None:
    """A callable running the region in float64 (floating inputs cast), or None if it can't.

    `slices` > 1: the run goes over `slices` pieces of dim 0 (of every input and output whose
    dim 0 is the batch), each cast and run on its own, into one float64 output: the float64
    copies and intermediates of a region of many GiB then take 1/slices of the room. Only for a
    region `sliceable` says computes each dim-0 slice from the same slice alone."""
    from kforge_tui.regions.graph import to_graph_module

    try:
        gm = to_graph_module(graph64(task.graph), device)
    except Exception:
        return None

    def run_whole(inputs: list) -> list:
        cast = [(t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
                for t in inputs]
        with torch.no_grad():
            out = gm(*cast)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    if slices <= 1 or batch_of(task) is None:
        return run_whole
    return lambda inputs: in_slices(task, run_whole, inputs, slices)


def in_slices(task, fn: Callable[[list], list], inputs: list, slices: int,
              prep: Callable[[list], list] | None = None) -> list:
    """fn over `slices` pieces of dim 0 of the inputs that carry the batch (`batch_of`; the
    others whole), each piece first through `prep`, assembled into whole outputs: the same
    result as fn over the whole for a region `sliceable` says computes its rows one by one,
    with 1/slices of the temporaries."""
    batch = batch_of(task)
    if slices <= 1 or batch is None:
        return fn(prep(inputs) if prep else inputs)
    outs = None
    for a, rows, part in _pieces(task, inputs, slices):
        got = fn(prep(part) if prep else part)
        if outs is None:
            outs = [torch.empty((batch,) + tuple(o.shape[1:]), dtype=o.dtype, device=o.device) for o in got]
        for full, o in zip(outs, got):
            full[a:a + rows].copy_(o)
        del got, part
    return outs


def _pieces(task, inputs: list, slices: int, which=None):
    """(first row, rows, inputs cut to them) for each dim-0 piece (`which`: of these pieces only)."""
    batch = batch_of(task)
    step = -(-batch // slices)
    cut = [m.present and len(m.shape) >= 1 and m.shape[0] == batch for m in task.inputs]
    for a in (range(0, batch, step) if which is None else which(batch, step)):
        yield a, min(step, batch - a), [t[a:a + step] if c and isinstance(t, torch.Tensor) else t
                                        for t, c in zip(inputs, cut)]


def batch_of(task) -> int | None:
    """The dim-0 size every output shares with at least one input (what a slice cuts), or None."""
    outs = {m.shape[0] if len(m.shape) else None for m in task.outputs}
    if len(outs) != 1 or None in outs:
        return None
    b = outs.pop()
    if b < 2 or not any(m.present and len(m.shape) and m.shape[0] == b for m in task.inputs):
        return None
    return b


def sliceable(task, reference: Callable[[list], list], inputs: list, expected: list, slices: int) -> bool:
    """Does the region compute each dim-0 slice of its outputs from that slice of its inputs
    alone? Run at the task dtype on the first and the last slice of one real input set, each
    must match the same rows of the whole run (within the task's tolerance: a reduction over
    dim 0 - a batch norm's statistics, a softmax over dim 0 - moves them far more), and a graph
    whose views fix the batch size fails to run on a slice: no."""
    from kforge_tui.sandbox.judge import compare

    if batch_of(task) is None or slices <= 1:
        return False
    for a, rows, part in _pieces(task, inputs, slices, lambda batch, step: sorted({0, (batch - 1) // step * step})):
        try:
            got = check_outputs_rows(task, reference(part), rows)
        except Exception:
            return False
        for g, e, m in zip(got, expected, task.outputs):
            if compare(e[a:a + g.shape[0]], g, m.dtype, "slice") is not None:
                return False
    return True


def check_outputs_rows(task, outs, rows: int) -> list:
    """The outputs of a run on `rows` rows, as a list matching the task's outputs (rows first)."""
    if isinstance(outs, torch.Tensor):
        outs = [outs]
    outs = list(outs)
    if len(outs) != len(task.outputs):
        raise ValueError("wrong number of outputs")
    for o, m in zip(outs, task.outputs):
        if tuple(o.shape) != (rows,) + tuple(m.shape[1:]):
            raise ValueError(f"a slice's output has shape {tuple(o.shape)}")
    return outs
