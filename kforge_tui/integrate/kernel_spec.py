"""What the graph rewrite and the region op need to know about one verified kernel, whatever its
language: the task it won, its keys and the exact layouts it was verified on.

This file is copied verbatim into exported packages beside runtime.py (export.py), so it
imports only torch.
"""
from __future__ import annotations

import torch

# The sandbox places every tensor at a 64-byte boundary (and no closer to a page start than
# that), so a kernel is known to be right only for pointers aligned so: any other call falls back.
ALIGN = 64


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def same_strides(got, want, shape) -> bool:
    # the stride of a dim of size 1 never moves a pointer ([16, 1] as (1, 0) or (1, 1))
    return all(a == b for a, b, n in zip(got, want, shape) if n > 1)


class KernelSpec:
    """A verified region kernel's identity and layouts (its spec: patch.spec_for).

    `site_key` is the key the graph rewrite computes (the region at the graph's own layouts),
    `site_keys` those of every site the kernel serves (sites traced in other layouts that
    Inductor lays out alike);
    `key` names the kernel (the region at the layouts it was verified on: Inductor's, for a
    task whose capture found them) and is the op's argument in the graph, so two kernels for one
    site with different layouts never share a graph in Inductor's FX graph cache."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.task_id = spec["task_id"]
        self.key = spec["key"]
        self.site_key = spec.get("site_key") or spec["key"]
        self.site_keys = tuple(spec.get("site_keys") or (self.site_key,))  # every site it serves
        self.op = spec.get("op", "")
        self.backend = spec["backend"]
        self.cuda = self.backend == "cuda"
        self.graph = spec["graph"]
        self.inputs = [(tuple(m["shape"]), _dtype(m["dtype"]), tuple(m["stride"])) for m in spec["inputs"]]
        self.outputs = [(tuple(m["shape"]), _dtype(m["dtype"]), tuple(m["stride"])) for m in spec["outputs"]]

    def matches(self, tensors) -> bool:
        if len(tensors) != len(self.inputs):
            return False
        for t, (shape, dt, stride) in zip(tensors, self.inputs):
            if t.dtype != dt or tuple(t.shape) != shape or t.is_cuda != self.cuda:
                return False
            if not same_strides(t.stride(), stride, shape) or t.data_ptr() % ALIGN:
                return False
        return True

    def empty_outputs(self, device) -> list:
        return [torch.empty_strided(s, st, dtype=dt, device=device) for s, dt, st in self.outputs]

    def fake_inputs(self, vals: list) -> list:
        """The site's fake input values with this kernel's strides: what Inductor must hand it."""
        out = []
        for v, (shape, dt, stride) in zip(vals, self.inputs):
            if isinstance(v, torch.Tensor) and not same_strides(v.stride(), stride, shape):
                mode = getattr(v, "fake_mode", None)
                if mode is not None:
                    with mode:
                        v = torch.empty_strided(shape, stride, dtype=dt, device=v.device)
                else:
                    v = torch.empty_strided(shape, stride, dtype=dt, device="meta")
            out.append(v)
        return out

    def fake_outputs(self, vals: list) -> list:
        """Fake values of what the kernel writes (its verified output layouts)."""
        ref = next((v for v in vals if isinstance(v, torch.Tensor)), None)
        mode = getattr(ref, "fake_mode", None)
        if mode is None:
            return vals
        with mode:
            return [torch.empty_strided(s, st, dtype=dt, device=ref.device) for s, dt, st in self.outputs]

