"""A task: one hot operator at one shape and dtype, the unit the search optimises.

A `Task` is plain data (JSON round-trip) so it can live in the run store, cross process
boundaries to sandbox workers, and be rebuilt on `resume`. What the op *means* (reference,
entry-point signature, bytes moved) lives in `workload/catalogue.py`, keyed by `Task.op`.

Captured calls are saved as one `torch.save` file per call under
`RUN_DIR/captures/<task_id>/call_<k>.pt` holding {"inputs": {name: tensor or None},
"params": {...}, "output": tensor, "stats": {name: TensorStats-as-dict}}.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class TensorMeta:
    """Shape/dtype/stride of one tensor argument; `None` shape means the optional input is absent."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str
    stride: tuple[int, ...] | None = None

    @property
    def present(self) -> bool:
        return self.shape is not None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape or ():
            n *= s
        return n

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape) if self.shape is not None else None,
                "dtype": self.dtype, "stride": list(self.stride) if self.stride is not None else None}

    @classmethod
    def from_json(cls, d: dict) -> "TensorMeta":
        return cls(d["name"], tuple(d["shape"]) if d["shape"] is not None else None, d["dtype"],
                   tuple(d["stride"]) if d.get("stride") is not None else None)


@dataclass(frozen=True)
class TensorStats:
    """Value statistics of a captured tensor, used to draw fresh random inputs in the same range."""

    mean: float
    std: float
    min: float
    max: float
    has_nan: bool = False
    has_inf: bool = False

    @classmethod
    def of(cls, t) -> "TensorStats":
        import torch

        f = t.detach().float()
        finite = f[torch.isfinite(f)]
        if finite.numel() == 0:
            return cls(0.0, 1.0, -1.0, 1.0, bool(torch.isnan(f).any()), bool(torch.isinf(f).any()))
        return cls(float(finite.mean()), float(finite.std()) if finite.numel() > 1 else 0.0,
                   float(finite.min()), float(finite.max()),
                   bool(torch.isnan(f).any()), bool(torch.isinf(f).any()))


@dataclass(frozen=True)
class Task:
    """One (op, shapes, dtype, params) to optimise. `inputs` are the canonical kernel inputs.

    `op` is a catalogue name (softmax, log_softmax, layer_norm, rms_norm, group_norm,
    adaptive_avg_pool2d, gelu, silu, relu, silu_mul). `out_dtype` differs from `dtype` only
    where the op casts (softmax(..., dtype=torch.float32) in HF eager attention).
    """

    op: str
    dtype: str
    inputs: tuple[TensorMeta, ...]
    output: TensorMeta
    params: dict = field(default_factory=dict)
    backend: str = "cpu"  # "cuda" | "cpu"
    # profile facts, filled by the workload step; not part of identity
    calls: int = 0
    total_us: float = 0.0
    share: float = 0.0
    aten: str = ""

    @property
    def task_id(self) -> str:
        """Stable id: readable prefix plus a hash of everything that changes the kernel."""
        x = self.inputs[0]
        shape = "x".join(str(s) for s in (x.shape or ()))
        key = json.dumps({"op": self.op, "dtype": self.dtype, "out": self.output.dtype,
                          "inputs": [m.to_json() for m in self.inputs], "params": self.params,
                          "backend": self.backend}, sort_keys=True)
        h = hashlib.sha1(key.encode()).hexdigest()[:6]
        return f"{self.op}_{shape}_{DTYPE_SHORT.get(self.dtype, self.dtype)}_{h}"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.inputs[0].shape or ())

    def input(self, name: str) -> TensorMeta:
        for m in self.inputs:
            if m.name == name:
                return m
        raise KeyError(name)

    def to_json(self) -> dict:
        d = asdict(self)
        d["inputs"] = [m.to_json() for m in self.inputs]
        d["output"] = self.output.to_json()
        d["task_id"] = self.task_id
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Task":
        d = dict(d)
        d.pop("task_id", None)
        d["inputs"] = tuple(TensorMeta.from_json(m) for m in d["inputs"])
        d["output"] = TensorMeta.from_json(d["output"])
        return cls(**d)

    def with_backend(self, backend: str) -> "Task":
        from dataclasses import replace

        return replace(self, backend=backend)


# ---------------------------------------------------------------- captured calls on disk

def capture_dir(run_dir: str | Path, task_id: str) -> Path:
    return Path(run_dir) / "captures" / task_id


def save_call(path: str | Path, inputs: dict[str, Any], params: dict, output) -> None:
    """Save one captured call (tensors moved to CPU, contiguous) with value statistics."""
    import torch

    cpu_inputs = {k: (v.detach().to("cpu").contiguous().clone() if v is not None else None)
                  for k, v in inputs.items()}
    stats = {k: asdict(TensorStats.of(v)) for k, v in cpu_inputs.items() if v is not None}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"inputs": cpu_inputs, "params": params,
                "output": output.detach().to("cpu").contiguous().clone(), "stats": stats}, path)


def load_calls(run_dir: str | Path, task_id: str) -> list[dict]:
    """All captured calls of a task, in call order (empty list when none were captured)."""
    import torch

    d = capture_dir(run_dir, task_id)
    files = sorted(d.glob("call_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    return [torch.load(f, map_location="cpu", weights_only=True) for f in files]
