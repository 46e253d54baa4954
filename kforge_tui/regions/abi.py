"""The one candidate ABI, derived mechanically from a task's inputs and outputs.

Every candidate, for every region, exports the same entry point:

    cuda:   extern "C" int kforge_launch(const void* const* inputs, void* const* outputs,
                                         cudaStream_t stream);
    cpu:    extern "C" int kforge_launch(const void* const* inputs, void* const* outputs);
    triton: def kforge_launch(inputs, outputs): ...      (lists of torch tensors)

`inputs[i]` / `outputs[j]` point at element 0 of the task's i-th input / j-th output (NULL for an
absent optional input). Shapes, strides and dtypes are not passed: they are compile-time
constants of a header generated per task (`kforge_region.h`), because a kernel runs only on
the exact shapes, dtypes and strides it was verified on (the integration checks that per call).
Outputs are allocated by the caller with exactly the declared strides; the candidate writes
every element of every output and allocates nothing else beyond stream-ordered scratch.
The entry point returns 0 on success (cuda: `(int)cudaGetLastError()` after its launches).

The header is a file beside the candidate (`#include "kforge_region.h"`), not pasted into it:
compile errors keep the candidate's own line numbers and stored sources stay short. The
sandbox writes it from the task (`header(task, backend)`), and its text is part of the compile
cache key.
"""
from __future__ import annotations

from dataclasses import dataclass

from kforge_tui.regions.meta import TensorMeta

ENTRY = "kforge_launch"
HEADER_NAME = "kforge_region.h"
INCLUDE_LINE = f'#include "{HEADER_NAME}"'

CUDA_CTYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16",
              "float64": "double", "int64": "int64_t", "int32": "int32_t", "int16": "int16_t",
              "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}
# No portable C++ half type on the host compilers we support: 16-bit floats are their raw bits.
CPU_CTYPE = {**CUDA_CTYPE, "float16": "uint16_t", "bfloat16": "uint16_t"}

_INCLUDES = {
    "cuda": ("cuda_runtime.h", "stdint.h", "stddef.h"),
    "cpu": ("stdint.h", "stddef.h", "math.h"),
}
# The 16-bit float headers, included only where a tensor (or, for generated code, any value)
# has that type: together they are a third of nvcc's time on a small kernel (preprocessing,
# cudafe++ and the host compile; 1.72 -> 1.10 s for a softmax, nvcc 13.0, 2026-12-03), and
# compiling is what bounds the search's rate on a GPU.
CUDA_16BIT_HEADERS = {"float16": "cuda_fp16.h", "bfloat16": "cuda_bf16.h"}


def cuda_16bit_includes(dtypes) -> list[str]:
    """`#include` lines for the 16-bit float types among `dtypes` (names like "bfloat16")."""
    dtypes = set(dtypes)
    return [f"#include <{h}>" for d, h in CUDA_16BIT_HEADERS.items() if d in dtypes]


def ctype(dtype: str, backend: str) -> str:
    return (CUDA_CTYPE if backend == "cuda" else CPU_CTYPE)[dtype]


def declaration(backend: str) -> str:
    """The exact C declaration of the entry point (prompts, static check, header)."""
    if backend == "cuda":
        return (f'extern "C" int {ENTRY}(const void* const* inputs, void* const* outputs, '
                "cudaStream_t stream)")
    if backend == "cpu":
        return f'extern "C" int {ENTRY}(const void* const* inputs, void* const* outputs)'
    if backend == "triton":
        return f"def {ENTRY}(inputs, outputs)"
    raise ValueError(f"unknown backend {backend!r}")


def _meta_lines(prefix: str, idx: int, m: TensorMeta, backend: str) -> list[str]:
    p = f"KF_{prefix}{idx}"
    if not m.present:
        return [f"// {prefix.lower()}{idx} {m.name!r}: absent (the pointer is NULL)",
                f"#define {p}_PRESENT 0"]
    shape, stride = list(m.shape), list(m.strides)
    lines = [f"// {prefix.lower()}{idx} {m.name!r}: {m.dtype} {shape}, strides {stride}"
             f"{' (contiguous)' if m.contiguous else ''}",
             f"typedef {ctype(m.dtype, backend)} kf_{prefix.lower()}{idx}_t;",
             f"#define {p}_PRESENT 1",
             f"#define {p}_NDIM {len(shape)}",
             f"#define {p}_NUMEL {m.numel}LL",
             f"#define {p}_CONTIGUOUS {1 if m.contiguous else 0}"]
    for d, (s, st) in enumerate(zip(shape, stride)):
        lines.append(f"#define {p}_SIZE_{d} {s}LL")
        lines.append(f"#define {p}_STRIDE_{d} {st}LL")
    return lines


def header(inputs, outputs, backend: str, title: str = "") -> str:
    """The per-task header: every input and output with shape, strides and dtype as constants."""
    if backend not in _INCLUDES:
        raise ValueError(f"no C header for backend {backend!r}")
    lines = [f"// kforge region ABI{': ' + title if title else ''} (generated from the task; "
             "do not edit)",
             "#pragma once"]
    lines += [f"#include <{h}>" for h in _INCLUDES[backend]]
    if backend == "cuda":
        lines += cuda_16bit_includes(m.dtype for m in (*inputs, *outputs) if m.present)
        lines.append("// cuda_fp16.h / cuda_bf16.h come with a tensor of that type; include them "
                     "yourself to use __half or __nv_bfloat16 otherwise")
    lines += [f"#define KF_NUM_INPUTS {len(inputs)}", f"#define KF_NUM_OUTPUTS {len(outputs)}"]
    for i, m in enumerate(inputs):
        lines += _meta_lines("IN", i, m, backend)
    for j, m in enumerate(outputs):
        lines += _meta_lines("OUT", j, m, backend)
    lines.append(declaration(backend) + ";")
    return "\n".join(lines) + "\n"


def python_header(inputs, outputs) -> str:
    """What a Triton candidate may rely on, as a Python comment block (prompts and docs)."""
    rows = ["# kforge region ABI (the harness passes these tensors; allocate nothing else)"]
    for kind, metas in (("inputs", inputs), ("outputs", outputs)):
        for i, m in enumerate(metas):
            if m.present:
                rows.append(f"#   {kind}[{i}] {m.name}: {m.dtype} {list(m.shape)} strides "
                            f"{list(m.strides)}")
            else:
                rows.append(f"#   {kind}[{i}] {m.name}: absent (None)")
    rows.append(f"# {declaration('triton')}: write every element of every output")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class Signature:
    """The entry point of one task on one backend, and how to call it through ctypes."""

    backend: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]

    def declaration(self) -> str:
        return declaration(self.backend)

    def header(self, title: str = "") -> str:
        return header(self.inputs, self.outputs, self.backend, title)

    def argtypes(self) -> list:
        import ctypes

        n = 3 if self.backend == "cuda" else 2
        return [ctypes.c_void_p] * n

    def call_args(self, inputs, outputs, stream=None) -> list:
        """ctypes arguments for one call: pointer arrays of `inputs` (tensor or None each) and
        `outputs`, then the stream handle on cuda. The arrays are returned inside the list so
        that they stay alive as long as the caller keeps the list (cache it per buffer set)."""
        import ctypes

        ins = (ctypes.c_void_p * max(1, len(inputs)))(
            *[(t.data_ptr() if t is not None else None) for t in inputs])
        outs = (ctypes.c_void_p * max(1, len(outputs)))(*[t.data_ptr() for t in outputs])
        args = [ctypes.cast(ins, ctypes.c_void_p), ctypes.cast(outs, ctypes.c_void_p)]
        if self.backend == "cuda":
            args.append(stream)
        return _Args(args, keep=(ins, outs))


class _Args(list):
    """A list of ctypes arguments that also holds the arrays its pointers point into."""

    def __init__(self, items, keep):
        super().__init__(items)
        self.keep = keep
