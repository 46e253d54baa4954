"""The operator catalogue: what each kernel-target op means.

For every op the product can write kernels for, this module states in one place:
  * how users and the profiler name it (`aten` names),
  * the PyTorch reference (what "correct" means),
  * the exact `extern "C"` entry point a candidate must export, per backend,
  * how a task's tensors map onto that entry point's arguments,
  * the bytes it must move at least (the memory-roofline floor).

Every candidate exports `extern "C" int kforge_launch(...)`, returning 0 on success (CUDA
candidates return `(int)cudaGetLastError()` after launching). Kernels see canonical,
contiguous layouts (see each op's `canonical` doc); the integration layer only dispatches
to a kernel for inputs in that layout.

Element types: cuda uses `float`, `__half`, `__nv_bfloat16`; cpu uses `float` and `uint16_t`
holding the raw bits of half / bfloat16 (no portable C++ half type on the host compilers we
support).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kforge_tui.task import Task, TensorMeta

ENTRY = "kforge_launch"

CUDA_CTYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
CPU_CTYPE = {"float32": "float", "float16": "uint16_t", "bfloat16": "uint16_t"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

CUDA_PRELUDE = """#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
"""
CPU_PRELUDE = """#include <stdint.h>
#include <stddef.h>
#include <math.h>
"""


@dataclass(frozen=True)
class Param:
    """One entry-point parameter. kind: in_ptr | out_ptr | opt_ptr | int64 | float | stream."""

    name: str
    kind: str
    dtype: str | None = None  # element dtype for pointers

    def ctype(self, backend: str) -> str:
        table = CUDA_CTYPE if backend == "cuda" else CPU_CTYPE
        if self.kind in ("in_ptr", "opt_ptr"):
            return f"const {table[self.dtype]}*"
        if self.kind == "out_ptr":
            return f"{table[self.dtype]}*"
        if self.kind == "int64":
            return "int64_t"
        if self.kind == "float":
            return "float"
        if self.kind == "stream":
            return "cudaStream_t"
        raise ValueError(self.kind)


@dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]
    backend: str

    def declaration(self) -> str:
        """The exact C declaration a candidate must define (what prompts and static checks use)."""
        args = ", ".join(f"{p.ctype(self.backend)} {p.name}" for p in self.params)
        return f'extern "C" int {ENTRY}({args})'

    def prelude(self) -> str:
        return CUDA_PRELUDE if self.backend == "cuda" else CPU_PRELUDE

    def argtypes(self) -> list:
        """ctypes argument types of the entry point, in order (set as `fn.argtypes`)."""
        import ctypes

        return [ctypes.c_int64 if p.kind == "int64" else ctypes.c_float if p.kind == "float"
                else ctypes.c_void_p for p in self.params]

    def call_args(self, tensors: dict, out, scalars: dict, stream=None) -> list:
        """The entry point's arguments for one call: data pointers of `tensors` (by name; None
        for an absent optional input) and `out`, the scalars by name, then the stream handle.
        Plain Python values, for a function whose `argtypes` are `self.argtypes()`. (The
        integration runtime generates this instead: it runs without kforge and per call.)"""
        args = []
        for p in self.params:
            if p.kind in ("in_ptr", "opt_ptr"):
                t = tensors.get(p.name)
                args.append(t.data_ptr() if t is not None else None)
            elif p.kind == "out_ptr":
                args.append(out.data_ptr())
            elif p.kind == "stream":
                args.append(stream)
            else:
                args.append(scalars[p.name])
        return args


@dataclass(frozen=True)
class OpDef:
    name: str
    aten: tuple[str, ...]
    summary: str
    canonical: str  # how the kernel sees the data, for prompts and docs
    reference: Callable  # (inputs: dict[str, Tensor|None], params: dict, out_dtype) -> Tensor
    params: Callable  # (task, backend) -> tuple[Param, ...] without the stream
    sizes: Callable  # (task) -> dict of the int64/float scalars, by param name


def _prod(xs) -> int:
    n = 1
    for s in xs:
        n *= int(s)
    return n


def _dt(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "float64": torch.float64}[name]


# ------------------------------------------------------------------------- references

def _ref_softmax(inp, p, out_dtype):
    import torch

    return torch.softmax(inp["x"], dim=p["dim"], dtype=_dt(out_dtype) if out_dtype else None)


def _ref_log_softmax(inp, p, out_dtype):
    import torch

    return torch.log_softmax(inp["x"], dim=p["dim"], dtype=_dt(out_dtype) if out_dtype else None)


def _ref_layer_norm(inp, p, out_dtype):
    import torch.nn.functional as F

    return F.layer_norm(inp["x"], tuple(p["normalized_shape"]), inp.get("weight"), inp.get("bias"),
                        p["eps"])


def _ref_rms_norm(inp, p, out_dtype):
    """The three spellings models use; each reproduced exactly as the library writes it.

    variant "llama" (Llama/Qwen): w * (x.float() * rsqrt(mean(x^2)+eps)).to(dtype)
    variant "gemma" (Gemma 3):    (x.float() * rsqrt(mean(x^2)+eps) * (1 + w.float())).to(dtype)
    variant "functional":         F.rms_norm(x, normalized_shape, w, eps)
    """
    import torch
    import torch.nn.functional as F

    x, w, variant, eps = inp["x"], inp.get("weight"), p.get("variant", "llama"), p["eps"]
    if variant == "functional":
        return F.rms_norm(x, tuple(p["normalized_shape"]), w, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if variant == "gemma":
        return (h * (1.0 + w.float())).type_as(x) if w is not None else h.type_as(x)
    return w * h.to(x.dtype) if w is not None else h.to(x.dtype)


def _ref_group_norm(inp, p, out_dtype):
    import torch.nn.functional as F

    return F.group_norm(inp["x"], p["groups"], inp.get("weight"), inp.get("bias"), p["eps"])


def _ref_adaptive_avg_pool2d(inp, p, out_dtype):
    import torch.nn.functional as F

    return F.adaptive_avg_pool2d(inp["x"], tuple(p["output_size"]))


def _ref_gelu(inp, p, out_dtype):
    import torch.nn.functional as F

    return F.gelu(inp["x"], approximate=p.get("approximate", "none"))


def _ref_silu(inp, p, out_dtype):
    import torch.nn.functional as F

    return F.silu(inp["x"])


def _ref_relu(inp, p, out_dtype):
    import torch

    return torch.relu(inp["x"])


def _ref_silu_mul(inp, p, out_dtype):
    import torch.nn.functional as F

    return F.silu(inp["a"]) * inp["b"]


# --------------------------------------------------------------------- entry points

def _p_softmax(t: Task, backend: str):
    return (Param("x", "in_ptr", t.dtype), Param("y", "out_ptr", t.output.dtype),
            Param("outer", "int64"), Param("n", "int64"), Param("inner", "int64"))


def _s_softmax(t: Task):
    shape = t.shape
    dim = t.params["dim"] % len(shape)
    return {"outer": _prod(shape[:dim]), "n": shape[dim], "inner": _prod(shape[dim + 1:])}


def _p_layer_norm(t: Task, backend: str):
    return (Param("x", "in_ptr", t.dtype), Param("weight", "opt_ptr", t.dtype),
            Param("bias", "opt_ptr", t.dtype), Param("y", "out_ptr", t.output.dtype),
            Param("rows", "int64"), Param("n", "int64"), Param("eps", "float"))


def _s_rows_n(t: Task):
    n = _prod(t.params["normalized_shape"])
    return {"rows": t.inputs[0].numel // n, "n": n, "eps": float(t.params["eps"])}


def _p_rms_norm(t: Task, backend: str):
    return (Param("x", "in_ptr", t.dtype), Param("weight", "opt_ptr", t.dtype),
            Param("y", "out_ptr", t.output.dtype), Param("rows", "int64"), Param("n", "int64"),
            Param("eps", "float"), Param("weight_offset", "float"))


def _s_rms_norm(t: Task):
    d = _s_rows_n(t)
    d["weight_offset"] = 1.0 if t.params.get("variant") == "gemma" else 0.0
    return d


def _p_group_norm(t: Task, backend: str):
    return (Param("x", "in_ptr", t.dtype), Param("weight", "opt_ptr", t.dtype),
            Param("bias", "opt_ptr", t.dtype), Param("y", "out_ptr", t.output.dtype),
            Param("N", "int64"), Param("C", "int64"), Param("HxW", "int64"), Param("G", "int64"),
            Param("eps", "float"))


def _s_group_norm(t: Task):
    s = t.shape
    return {"N": s[0], "C": s[1], "HxW": _prod(s[2:]), "G": int(t.params["groups"]),
            "eps": float(t.params["eps"])}


def _p_pool(t: Task, backend: str):
    return (Param("x", "in_ptr", t.dtype), Param("y", "out_ptr", t.output.dtype),
            Param("NC", "int64"), Param("H", "int64"), Param("W", "int64"),
            Param("OH", "int64"), Param("OW", "int64"))


def _s_pool(t: Task):
    s = t.shape
    oh, ow = t.params["output_size"]
    return {"NC": _prod(s[:-2]), "H": s[-2], "W": s[-1], "OH": oh, "OW": ow}


def _p_eltwise(t: Task, backend: str):
    return (Param("x", "in_ptr", t.dtype), Param("y", "out_ptr", t.output.dtype),
            Param("numel", "int64"))


def _s_eltwise(t: Task):
    return {"numel": t.inputs[0].numel}


def _p_silu_mul(t: Task, backend: str):
    return (Param("a", "in_ptr", t.dtype), Param("a_row_stride", "int64"),
            Param("b", "in_ptr", t.dtype), Param("b_row_stride", "int64"),
            Param("y", "out_ptr", t.output.dtype), Param("rows", "int64"), Param("cols", "int64"))


def _s_silu_mul(t: Task):
    a, b = t.input("a"), t.input("b")
    cols = a.shape[-1]
    rows = a.numel // cols
    return {"a_row_stride": (a.stride or (cols,))[-2] if len(a.shape) > 1 else cols,
            "b_row_stride": (b.stride or (cols,))[-2] if len(b.shape) > 1 else cols,
            "rows": rows, "cols": cols}


OPS: dict[str, OpDef] = {}


def _add(op: OpDef) -> None:
    OPS[op.name] = op


_add(OpDef("softmax", ("aten::_softmax", "aten::softmax"), "softmax over one dim",
           "x is contiguous [outer, n, inner]; reduce over n; element (o, j, i) at (o*n + j)*inner + i; "
           "y may have a wider dtype than x (softmax(..., dtype=float32))",
           _ref_softmax, _p_softmax, _s_softmax))
_add(OpDef("log_softmax", ("aten::_log_softmax", "aten::log_softmax"), "log_softmax over one dim",
           "as softmax", _ref_log_softmax, _p_softmax, _s_softmax))
_add(OpDef("layer_norm", ("aten::native_layer_norm", "aten::layer_norm"),
           "layer_norm over the last dims",
           "x contiguous [rows, n]; weight/bias length n or NULL; y = (x-mean)/sqrt(var+eps)*w+b, "
           "biased variance, statistics in float32", _ref_layer_norm, _p_layer_norm, _s_rows_n))
_add(OpDef("rms_norm", ("aten::_fused_rms_norm", "aten::rms_norm", "rms_norm pattern"),
           "RMS norm (decomposed HF pattern or F.rms_norm)",
           "x contiguous [rows, n]; weight length n or NULL; r = rsqrt(mean(x^2)+eps) in float32; "
           "y = x*r*(weight + weight_offset)", _ref_rms_norm, _p_rms_norm, _s_rms_norm))
_add(OpDef("group_norm", ("aten::native_group_norm", "aten::group_norm"), "group_norm",
           "x contiguous [N, C, HxW]; G groups of C/G channels; statistics per (n, group) in float32; "
           "weight/bias length C or NULL", _ref_group_norm, _p_group_norm, _s_group_norm))
_add(OpDef("adaptive_avg_pool2d", ("aten::_adaptive_avg_pool2d", "aten::adaptive_avg_pool2d",
                                   "aten::mean"),
           "adaptive average pool 2d",
           "x contiguous [NC, H, W]; y [NC, OH, OW]; window of output (i, j) is rows "
           "[floor(i*H/OH), ceil((i+1)*H/OH)) and columns likewise",
           _ref_adaptive_avg_pool2d, _p_pool, _s_pool))
_add(OpDef("gelu", ("aten::gelu",), "gelu (erf, or tanh when approximate='tanh')",
           "x contiguous, numel elements", _ref_gelu, _p_eltwise, _s_eltwise))
_add(OpDef("silu", ("aten::silu",), "silu", "x contiguous, numel elements", _ref_silu,
           _p_eltwise, _s_eltwise))
_add(OpDef("relu", ("aten::relu", "aten::relu_"), "relu", "x contiguous, numel elements",
           _ref_relu, _p_eltwise, _s_eltwise))
_add(OpDef("silu_mul", ("silu(a)*b pattern",), "silu(a) * b (gated MLP)",
           "a, b are [rows, cols] with unit column stride and row strides a_row_stride, "
           "b_row_stride (they may be the two halves of one tensor); y contiguous [rows, cols]",
           _ref_silu_mul, _p_silu_mul, _s_silu_mul))

TARGET_OPS = tuple(OPS)


def get(op: str) -> OpDef:
    try:
        return OPS[op]
    except KeyError:
        from kforge_tui.errors import UsageError

        raise UsageError(f"unknown op {op!r}; known ops: {', '.join(TARGET_OPS)}") from None


def signature(task: Task, backend: str | None = None) -> Signature:
    backend = backend or task.backend
    params = get(task.op).params(task, backend)
    if backend == "cuda":
        params = params + (Param("stream", "stream"),)
    return Signature(params, backend)


def reference(task: Task, inputs: dict):
    """Run the PyTorch reference on a dict of input tensors (optional ones may be None)."""
    return get(task.op).reference(inputs, task.params,
                                  task.output.dtype if task.output.dtype != task.dtype else None)


def scalar_args(task: Task) -> dict:
    """The int64/float arguments of the entry point, by parameter name."""
    return get(task.op).sizes(task)


def bytes_moved(task: Task, l2_bytes: int = 60 * 2**20) -> tuple[int, str]:
    """Fewest bytes a kernel must move: inputs read once, output written once.

    group_norm whose input exceeds the L2 cache needs a second read of the input (statistics
    first, then normalise): the floor then counts the input twice, and the note says so.
    """
    total = sum(m.numel * DTYPE_BYTES[m.dtype] for m in task.inputs if m.present)
    total += task.output.numel * DTYPE_BYTES[task.output.dtype]
    note = "inputs read once, output written once"
    if task.op == "group_norm":
        xb = task.inputs[0].numel * DTYPE_BYTES[task.dtype]
        if xb > l2_bytes:
            total += xb
            note = "input read twice (groups exceed L2), output written once"
    return total, note


def canonical_doc(task: Task) -> str:
    return get(task.op).canonical


def make_task(op: str, inputs: dict, params: dict, output, backend: str = "cpu", **profile) -> Task:
    """Build a Task from live tensors (capture) — shapes, dtypes and strides as seen."""
    metas = []
    for name, t in inputs.items():
        if t is None:
            metas.append(TensorMeta(name, None, _dtname(output.dtype)))
        else:
            metas.append(TensorMeta(name, tuple(t.shape), _dtname(t.dtype), tuple(t.stride())))
    out = TensorMeta("y", tuple(output.shape), _dtname(output.dtype), tuple(output.stride()))
    return Task(op=op, dtype=metas[0].dtype, inputs=tuple(metas), output=out, params=dict(params),
                backend=backend, **profile)


def _dtname(dt) -> str:
    return str(dt).replace("torch.", "")
