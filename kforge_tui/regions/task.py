"""A task: one region of the model's graph at one set of shapes, dtypes and strides.

A `Task` is plain data (JSON round-trip) so it can live in the run store, cross process
boundaries to sandbox workers, and be rebuilt on `resume`. It carries the region's own graph
(graph.py form): the reference is that graph run by PyTorch eager, and the candidate ABI
(abi.py) is derived from its inputs and outputs.

Captured calls are saved as one `torch.save` file per call under
`RUN_DIR/captures/<task_id>/call_<k>.pt` holding {"inputs": [tensor or None, ...],
"outputs": [tensor, ...], "stats": [TensorStats-as-dict or None, ...]}.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kforge_tui.regions.meta import DTYPE_SHORT, FLOAT_DTYPES, TensorMeta, TensorStats, storage_span

BACKENDS = ("cuda", "cpu", "triton")


@dataclass(frozen=True)
class Task:
    """One region at one set of shapes to optimise.

    `op` is the label users see and select with `--ops`: a recognised pattern name
    (softmax, layer_norm, ...), a compute op (conv, linear, sdpa, ...) or the leading ops of a
    fused chain (`mul+erf+add`). `kind` is compute | pointwise | reduction.
    """

    op: str
    kind: str
    graph: dict
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    backend: str = "cpu"
    pattern: str = ""  # named pattern the region matched ("" when none)
    params: dict = field(default_factory=dict)  # the pattern's parameters (dim, eps, ...)
    # profile facts, filled by the workload step; not part of identity
    calls: int = 0
    total_us: float = 0.0
    share: float = 0.0
    compiled_us: float | None = None
    source: str = ""  # model source line that produced the region
    module: str = ""  # module path (class) it sits in
    aten: str = ""  # the region's aten ops, for tables
    parts: str = ""  # what the model called, by name (`gelu layer_norm softmax`): for --ops
    called: str = ""  # the torch functions and torch.nn modules its code called (native eager)
    # the model's calls the region is made of, traced to aten undecomposed (regions/eager.py):
    # what PyTorch eager runs, in graph.py JSON, one per way its inputs feed the calls; empty
    # where the region is not whole calls
    eager_graphs: list = field(default_factory=list)
    # The strides the traced graph gives the region's inputs and outputs, when the task's own
    # are the ones Inductor hands the region inside the compiled model and differ from them
    # (regions/layout.py): {"inputs": [[...], ...], "outputs": [...]}; empty when they agree.
    traced_strides: dict = field(default_factory=dict)
    # The traced strides of further sites that Inductor lays out as this task (a group_norm fed
    # NCHW in the encoder and channels-last in the decoder of a VAE): the same kernel serves
    # them all, so they are one task whose every site the graph rewrite must find.
    more_traced_strides: tuple = ()

    @property
    def key(self) -> str:
        """What identifies the kernel: the canonical graph, every input/output meta, backend."""
        from kforge_tui.regions.graph import region_key

        return region_key(self.graph, [m.to_json() for m in self.inputs],
                          [m.to_json() for m in self.outputs], self.backend)

    def _key_at(self, strides: dict) -> str:
        """The region's key with its inputs and outputs at `strides` (empty: the task's own)."""
        if not strides:
            return self.key
        from kforge_tui.regions.graph import region_key

        def metas(ms, st):
            return [dict(m.to_json(), stride=list(s)) for m, s in zip(ms, st)]

        return region_key(self.graph, metas(self.inputs, strides["inputs"]),
                          metas(self.outputs, strides["outputs"]), self.backend)

    @property
    def site_key(self) -> str:
        """The key the graph rewrite computes for this region (at the traced layouts)."""
        return self._key_at(self.traced_strides)

    @property
    def site_keys(self) -> tuple[str, ...]:
        """The keys the graph rewrite computes at every site of this task, `site_key` first."""
        return tuple(dict.fromkeys([self.site_key] + [self._key_at(st) for st in self.more_traced_strides]))

    def with_sites_of(self, other: "Task") -> "Task":
        """This task serving `other`'s sites too (the same task once laid out as Inductor lays
        them out: `other.key == self.key`)."""
        own = {"inputs": [list(m.strides) for m in other.inputs],
               "outputs": [list(m.strides) for m in other.outputs]}
        more = (other.traced_strides or own,) + tuple(other.more_traced_strides)
        return replace(self, more_traced_strides=tuple(self.more_traced_strides) + more)

    def with_layouts(self, in_strides: list, out_strides: list) -> "Task":
        """This task with the inputs and outputs laid out so (Inductor's choice), remembering
        the traced strides the graph rewrite will key on."""
        traced = self.traced_strides or {"inputs": [list(m.strides) for m in self.inputs],
                                         "outputs": [list(m.strides) for m in self.outputs]}
        ins = tuple(replace(m, stride=tuple(st)) if st is not None and m.present else m
                    for m, st in zip(self.inputs, in_strides))
        outs = tuple(replace(m, stride=tuple(st)) if st is not None else m
                     for m, st in zip(self.outputs, out_strides))
        same = ([list(m.strides) for m in ins] == traced["inputs"]
                and [list(m.strides) for m in outs] == traced["outputs"])
        return replace(self, inputs=ins, outputs=outs, traced_strides={} if same else traced)

    @property
    def task_id(self) -> str:
        """Stable id: readable prefix plus a hash of everything that changes the kernel."""
        slug = "".join(c if c.isalnum() or c == "_" else "_" for c in self.op)[:32].strip("_")
        shape = "x".join(str(s) for s in self.shape)
        return f"{slug or 'region'}_{shape}_{DTYPE_SHORT.get(self.dtype, self.dtype)}_{self.key[:6]}"

    @property
    def main_input(self) -> TensorMeta:
        """The largest present input (ties: the first): what `shape` and `dtype` describe."""
        present = [m for m in self.inputs if m.present] or list(self.outputs)
        return max(present, key=lambda m: m.numel) if present else TensorMeta("?", (), "float32")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.main_input.shape or ())

    @property
    def dtype(self) -> str:
        """The dtype of the largest floating input (else of the first output)."""
        fl = [m for m in self.inputs if m.present and m.dtype in FLOAT_DTYPES]
        if fl:
            return max(fl, key=lambda m: m.numel).dtype
        return self.outputs[0].dtype if self.outputs else "float32"

    @property
    def output(self) -> TensorMeta:
        return self.outputs[0]

    def signature(self, backend: str | None = None):
        from kforge_tui.regions.abi import Signature

        return Signature(backend or self.backend, tuple(self.inputs), tuple(self.outputs))

    def header(self, backend: str | None = None) -> str:
        return self.signature(backend).header(self.task_id)

    def code(self) -> str:
        """The region as PyTorch code: the reference."""
        from kforge_tui.regions.graph import python_code

        return python_code(self.graph)

    def reference(self, inputs: list) -> list:
        """Run the reference (the region's own graph, PyTorch eager) on real tensors."""
        from kforge_tui.regions.graph import run

        return run(self.graph, list(inputs))

    def to_json(self) -> dict:
        d = asdict(self)
        d["inputs"] = [m.to_json() for m in self.inputs]
        d["outputs"] = [m.to_json() for m in self.outputs]
        d["task_id"] = self.task_id
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Task":
        d = dict(d)
        d.pop("task_id", None)
        known = cls.__dataclass_fields__
        d = {k: v for k, v in d.items() if k in known}
        d["inputs"] = tuple(TensorMeta.from_json(m) for m in d["inputs"])
        d["outputs"] = tuple(TensorMeta.from_json(m) for m in d["outputs"])
        d["more_traced_strides"] = tuple(d.get("more_traced_strides", ()))
        return cls(**d)

    def with_backend(self, backend: str) -> "Task":
        return replace(self, backend=backend)

    @property
    def capture_id(self) -> str:
        """Where the region's captured calls live (RUN_DIR/captures/<capture_id>): one place per
        region and device, whatever language a candidate is in, so that a Triton candidate (or
        baseline) of a CUDA run is checked on the same real calls as a CUDA one."""
        return self.with_backend("cuda").task_id if self.backend in ("cuda", "triton") else self.task_id


# ---------------------------------------------------------------- captured calls on disk

def capture_dir(run_dir: str | Path, task_id: str) -> Path:
    return Path(run_dir) / "captures" / task_id


def save_call(path: str | Path, inputs: list, outputs: list) -> None:
    """Save one captured call (tensors moved to the CPU, strides kept) with value statistics."""
    import torch

    def cpu(t):
        """A CPU copy with the same strides, overlapping ones (expanded dims) included: the
        storage span the view covers is copied and viewed again (torch.save keeps views)."""
        if t is None:
            return None
        t = t.detach()
        span = storage_span(t.shape, t.stride())
        base = t.as_strided((span,), (1,)).to("cpu", copy=True)
        return base.as_strided(tuple(t.shape), tuple(t.stride()))

    ins = [cpu(t) for t in inputs]
    stats = [asdict(TensorStats.of(t)) if t is not None and t.numel() else None for t in ins]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    torch.save({"inputs": ins, "outputs": [cpu(t) for t in outputs], "stats": stats}, path)
    try:
        os.chmod(path, 0o600)
    except OSError:
        pass


def load_calls(run_dir: str | Path, task_id: str) -> list[dict[str, Any]]:
    """All captured calls of a task, in call order (empty list when none were captured)."""
    import torch

    d = capture_dir(run_dir, task_id)
    files = sorted(d.glob("call_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    return [torch.load(f, map_location="cpu", weights_only=True) for f in files]
