"""Tensor metadata and value statistics: the plain-data vocabulary every layer shares.

Kept free of torch at import time so that the engine, the store and the TUI can read tasks
without loading torch; functions that need torch import it where they run.
"""
from __future__ import annotations

from dataclasses import dataclass

# dtype name (as `str(torch.float32)` minus "torch.") -> short label, element size in bytes.
DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
               "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
               "bool": "b8"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
# Element types a kernel backend can take (the ABI has a C type for each). Complex, quantized
# and sub-byte dtypes are not among them: a region that uses one is listed, not searched.
KERNEL_DTYPES = tuple(DTYPE_BYTES)


def dtype_name(dt) -> str:
    """`torch.float32` -> "float32"."""
    return str(dt).replace("torch.", "")


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def contiguous_stride(shape) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(tuple(shape)):
        st.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(st))


def storage_span(shape, stride) -> int:
    """Elements a strided tensor's storage must hold: 1 + the largest offset (0 if empty)."""
    shape = tuple(shape)
    if any(int(s) == 0 for s in shape):
        return 0
    return 1 + sum((int(s) - 1) * int(st) for s, st in zip(shape, stride))


@dataclass(frozen=True)
class TensorMeta:
    """Name, shape, dtype and strides of one tensor; `shape=None` marks an absent optional input."""

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

    @property
    def strides(self) -> tuple[int, ...]:
        """The strides, contiguous ones when none were recorded."""
        return tuple(self.stride) if self.stride is not None else contiguous_stride(self.shape or ())

    @property
    def contiguous(self) -> bool:
        """Row-major dense (size-1 dims may have any stride, as in torch.is_contiguous)."""
        want = contiguous_stride(self.shape or ())
        return all(s == 1 or a == b for s, a, b in zip(self.shape or (), self.strides, want))

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (not of the storage span): what a kernel reads or writes."""
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape) if self.shape is not None else None,
                "dtype": self.dtype, "stride": list(self.stride) if self.stride is not None else None}

    @classmethod
    def from_json(cls, d: dict) -> "TensorMeta":
        return cls(d["name"], tuple(d["shape"]) if d["shape"] is not None else None, d["dtype"],
                   tuple(d["stride"]) if d.get("stride") is not None else None)

    @classmethod
    def of(cls, name: str, t) -> "TensorMeta":
        """From a tensor (real, fake or meta)."""
        return cls(name, tuple(int(s) for s in t.shape), dtype_name(t.dtype),
                   tuple(int(s) for s in t.stride()))


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

        if t.dtype == torch.bool:
            f = t.detach().to(torch.float32)
        else:
            f = t.detach().to(torch.float64 if not t.is_floating_point() else torch.float32)
        finite = f[torch.isfinite(f)] if f.is_floating_point() else f
        if finite.numel() == 0:
            return cls(0.0, 1.0, -1.0, 1.0, bool(torch.isnan(f).any()), bool(torch.isinf(f).any()))
        return cls(float(finite.mean()), float(finite.std()) if finite.numel() > 1 else 0.0,
                   float(finite.min()), float(finite.max()),
                   bool(torch.isnan(f).any()), bool(torch.isinf(f).any()))
