"""Load compiled winning kernels and route a live model's matching op calls to them.

This file is copied verbatim into exported packages (export.py), so it imports only torch,
ctypes and the standard library — never kforge_tui, litellm or Textual.

Mechanism (chosen by measurement, see the integration notes in docs/ARCHITECTURE.md): the
functions model code looks up at call time (`torch.nn.functional.softmax`, `torch.softmax`,
`F.layer_norm`, ...) are replaced by thin Python wrappers, and modules whose forward does not go
through such a function (HF `*RMSNorm`) get an instance-level `forward`. Module-backed ops
(nn.LayerNorm, nn.GroupNorm, nn.SiLU, nn.AdaptiveAvgPool2d, ...) are covered by the functional
patch because their forward calls `F.*` at call time. A wrapper does one dict lookup keyed by the
exact task identity (shape, dtype, params, device kind) and otherwise hands the call to the
original PyTorch function. Measured on the 2-core CI CPU: a TorchFunctionMode added ~2.5 us to
*every* torch call in the model and a `torch.library.custom_op` cost ~21 us per call, against
~1-2 us for the wrapper plus a ctypes call.

Wrappers only dispatch while a patched model's forward is running (the root module gets an
instance `forward` that pushes its kernel table), so other models in the process are untouched.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import keyword
import os
import platform
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

ENTRY = "kforge_launch"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}
# Tensor arguments of each op, in the order the wrappers pass them (names as in the catalogue).
OP_INPUTS = {"softmax": ("x",), "log_softmax": ("x",), "layer_norm": ("x", "weight", "bias"),
             "rms_norm": ("x", "weight"), "group_norm": ("x", "weight", "bias"),
             "adaptive_avg_pool2d": ("x",), "gelu": ("x",), "silu": ("x",), "relu": ("x",),
             "silu_mul": ("a", "b")}
_CTYPES = {"in_ptr": ctypes.c_void_p, "out_ptr": ctypes.c_void_p, "opt_ptr": ctypes.c_void_p,
           "int64": ctypes.c_int64, "float": ctypes.c_float, "stream": ctypes.c_void_p}

_STACK: list = []  # runtimes of the patched forwards now running (innermost last)
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # torch < 2.3
    def _is_compiling() -> bool:
        return False


class KernelLoadError(RuntimeError):
    """A kernel library could not be loaded or does not match its manifest."""


class ArchMismatch(RuntimeError):
    """Binaries were built for another GPU/CPU and no compiler is there to rebuild them."""


# ------------------------------------------------------------------ kernels

class Kernel:
    """One verified task's compiled entry point, with what a call must look like to use it."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.task_id = spec["task_id"]
        self.op = spec["op"]
        if self.op not in OP_INPUTS:
            raise KernelLoadError(f"{self.task_id}: op {self.op!r} cannot be dispatched in a live model")
        self.cuda = spec["backend"] == "cuda"
        metas = {m["name"]: m for m in spec["inputs"]}
        names = OP_INPUTS[self.op]
        if set(metas) - set(names) or names[0] not in metas:
            raise KernelLoadError(f"{self.task_id}: inputs {sorted(metas)} do not match op {self.op}")
        # (shape, dtype) each later tensor must have; None = absent, the kernel gets NULL
        self.checks = tuple(
            (tuple(metas[n]["shape"]), DTYPES[metas[n]["dtype"]])
            if n in metas and metas[n]["shape"] is not None else None for n in names[1:])
        x = metas[names[0]]  # the primary tensor: its shape/dtype key the dispatch
        self.shape = tuple(x["shape"])
        self.dtype = DTYPES[x["dtype"]]
        self.out_shape = tuple(spec["output"]["shape"])
        self.out_dtype = DTYPES[spec["output"]["dtype"]]
        self.params = spec.get("params", {})
        self.same_out = self.out_shape == self.shape and self.out_dtype == self.dtype
        try:
            lib = ctypes.CDLL(str(spec["lib"]))
            cfn = getattr(lib, ENTRY)
        except (OSError, AttributeError) as e:
            raise KernelLoadError(f"{self.task_id}: cannot load {ENTRY} from {spec['lib']}: {e}") from None
        self._lib = lib  # keep the library mapped as long as the kernel lives
        sig = [tuple(p) for p in spec["signature"]]
        proto = ctypes.CFUNCTYPE(ctypes.c_int, *[_CTYPES[k] for _, k in sig])
        self.fn = proto(ctypes.cast(cfn, ctypes.c_void_p).value)
        self.launch = _codegen(self.task_id, sig, names, spec.get("scalars", {}), self.fn)

    def key(self):
        params = self.params
        if self.op == "silu_mul":
            sc = self.spec.get("scalars", {})
            params = {"a_row_stride": sc["a_row_stride"], "b_row_stride": sc["b_row_stride"]}
        return op_key(self.op, self.shape, self.dtype, params, self.checks, self.out_dtype)


def _codegen(task_id: str, sig, names, scalars: dict, fn):
    """Build `launch(<tensors>, y, stream) -> int` with the scalars baked in as literals.

    Generated rather than looped over at call time: a per-call argument loop costs about a
    microsecond, which is the whole gain of a small kernel.
    """
    args = []
    for name, kind in sig:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise KernelLoadError(f"{task_id}: bad parameter name {name!r}")
        if kind in ("in_ptr", "opt_ptr"):
            if name not in names:
                raise KernelLoadError(f"{task_id}: signature names unknown tensor {name!r}")
            args.append(f"t_{name}.data_ptr() if t_{name} is not None else None")
        elif kind == "out_ptr":
            args.append("y.data_ptr()")
        elif kind == "stream":
            args.append("stream")
        elif kind in ("int64", "float"):
            v = scalars.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise KernelLoadError(f"{task_id}: scalar {name!r} is {v!r}, not a number")
            args.append(repr(int(v)) if kind == "int64" else repr(float(v)))
        else:
            raise KernelLoadError(f"{task_id}: unknown parameter kind {kind!r}")
    params = ", ".join([f"t_{n}" for n in names] + ["y", "stream"])
    src = f"def launch({params}):\n    return fn({', '.join(args)})\n"
    ns = {"fn": fn, "inf": float("inf"), "nan": float("nan")}
    exec(compile(src, f"<kforge kernel {task_id}>", "exec"), ns)
    return ns["launch"]


def _f(v) -> float:
    return float(v)


def op_key(op, shape, dtype, params, checks, out_dtype):
    """The dispatch key of a task, matching what the call-site wrappers compute."""
    has = tuple(c is not None for c in checks)
    if op in ("softmax", "log_softmax"):
        return (tuple(shape), dtype, int(params["dim"]) % len(shape), out_dtype)
    if op == "layer_norm":
        return (tuple(shape), dtype, tuple(params["normalized_shape"]), _f(params["eps"])) + has
    if op == "rms_norm":
        eps = params.get("eps")
        eps = torch.finfo(dtype).eps if eps is None else _f(eps)
        return (tuple(shape), dtype, tuple(params["normalized_shape"]), eps, params.get("variant", "llama"),
                out_dtype) + has
    if op == "group_norm":
        return (tuple(shape), dtype, int(params["groups"]), _f(params["eps"])) + has
    if op == "adaptive_avg_pool2d":
        return (tuple(shape), dtype, tuple(int(s) for s in params["output_size"]))
    if op == "gelu":
        return (tuple(shape), dtype, params.get("approximate", "none"))
    if op == "silu_mul":  # the row strides are baked into the kernel's scalars
        return (tuple(shape), dtype, int(params["a_row_stride"]), int(params["b_row_stride"]))
    return (tuple(shape), dtype)


# ------------------------------------------------------------------ runtime

class Runtime:
    """The kernel tables of one applied run, plus how often each kernel / fallback was taken."""

    def __init__(self, kernels: list[Kernel]):
        self.kernels = list(kernels)
        self.tables: dict[str, dict] = {}
        for k in self.kernels:
            tab = self.tables.setdefault(k.op, {})
            key = k.key()
            tab[key] = k
            if k.op in ("softmax", "log_softmax"):  # both spellings of the dim: -1 and ndim-1
                tab[key[:2] + (key[2] - len(k.shape),) + key[3:]] = k
        self.counts: dict[str, int] = {k.task_id: 0 for k in self.kernels}
        self.fallback_raw: dict[tuple, int] = {}
        self.enabled = True

    def fallback(self, op, reason, x=None):
        key = (op, reason, x.shape, x.dtype) if x is not None else (op, reason, (), "")
        self.fallback_raw[key] = self.fallback_raw.get(key, 0) + 1
        return None

    @property
    def fallbacks(self) -> dict[str, int]:
        """'op [shape] dtype: reason' -> calls that went to PyTorch instead of a kernel."""
        out: dict[str, int] = {}
        for (op, reason, shape, dtype), n in self.fallback_raw.items():
            label = f"{op} {list(shape)} {str(dtype).replace('torch.', '')}: {reason}"
            out[label] = out.get(label, 0) + n
        return out

    def reset_counts(self) -> None:
        for t in self.counts:
            self.counts[t] = 0
        self.fallback_raw.clear()


def _launch(rt: Runtime, k: Kernel, x, a=None, b=None):
    """Run kernel k on (x, a, b) if every per-call condition holds; None means use PyTorch."""
    if not (x.is_cuda if k.cuda else x.is_cpu):
        return rt.fallback(k.op, "tensor on another device kind", x)
    if _grad_enabled() and (x.requires_grad or (a is not None and a.requires_grad)
                            or (b is not None and b.requires_grad)):
        return rt.fallback(k.op, "autograd (kernel has no backward)", x)
    if not x.is_contiguous():
        return rt.fallback(k.op, "non-contiguous input", x)
    for t, c in zip((a, b), k.checks):
        if c is None:
            continue  # absent in the task: the key already says the call has none either
        if type(t) is not _Tensor and not isinstance(t, torch.nn.Parameter):
            return rt.fallback(k.op, "tensor subclass argument", x)
        if t.shape != c[0] or t.dtype != c[1] or not t.is_contiguous() or t.is_cuda != x.is_cuda:
            return rt.fallback(k.op, "weight/bias shape, dtype, layout or device differs", x)
    if k.cuda:
        dev = x.get_device()
        if dev != torch.cuda.current_device() or (a is not None and a.get_device() != dev) \
                or (b is not None and b.get_device() != dev):
            return rt.fallback(k.op, "tensor not on the current CUDA device", x)
        stream = torch._C._cuda_getCurrentRawStream(dev)
    else:
        stream = None
    # contiguous: x is contiguous here, and empty_like keeps its layout
    y = torch.empty_like(x) if k.same_out else x.new_empty(k.out_shape, dtype=k.out_dtype)
    rc = k.launch(x, a, b, y, stream) if len(k.checks) == 2 else (
        k.launch(x, a, y, stream) if k.checks else k.launch(x, y, stream))
    if rc != 0:
        return rt.fallback(k.op, f"kernel returned error {rc}", x)
    rt.counts[k.task_id] += 1
    return y


def _active():
    """The runtime of the innermost patched forward now running, or None (also under compile)."""
    if not _STACK or _is_compiling():
        return None
    rt = _STACK[-1]
    return rt if rt.enabled else None


def _miss(rt, op, x):
    return rt.fallback(op, "no verified kernel for this shape/dtype/params", x)


def _dispatch(rt, op, key, x, a=None, b=None):
    """The kernel's output for this call, or None (counted as a fallback) to use PyTorch."""
    tab = rt.tables.get(op)
    if tab is None:  # another applied model's wrapper is shared, but this runtime lacks the op
        return None
    k = tab.get(key)
    if k is None:
        return _miss(rt, op, x)
    return _launch(rt, k, x, a, b)


# ------------------------------------------------------------------ call-site wrappers

def _w_softmax(op, orig):
    def wrapper(input, dim=None, _stacklevel=3, dtype=None):
        rt = _active()
        if rt is not None and type(input) is _Tensor:
            if type(dim) is int:
                y = _dispatch(rt, op, (input.shape, input.dtype, dim, dtype or input.dtype), input)
                if y is not None:
                    return y
            else:
                rt.fallback(op, "dim not given as an int", input)
        return orig(input, dim, _stacklevel, dtype)
    return wrapper


def _w_torch_softmax(op, orig):
    def wrapper(input, dim, dtype=None, **kw):
        rt = _active()
        if rt is not None and type(input) is _Tensor and not kw and type(dim) is int:
            y = _dispatch(rt, op, (input.shape, input.dtype, dim, dtype or input.dtype), input)
            if y is not None:
                return y
        return orig(input, dim, dtype=dtype, **kw)
    return wrapper


def _w_layer_norm(orig):
    def wrapper(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        rt = _active()
        if rt is not None and type(input) is _Tensor:
            ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
            y = _dispatch(rt, "layer_norm", (input.shape, input.dtype, ns, float(eps), weight is not None,
                                             bias is not None), input, weight, bias)
            if y is not None:
                return y
        return orig(input, normalized_shape, weight, bias, eps)
    return wrapper


def _w_rms_norm(orig):
    def wrapper(input, normalized_shape, weight=None, eps=None):
        rt = _active()
        if rt is not None and type(input) is _Tensor:
            ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
            e = torch.finfo(input.dtype).eps if eps is None else float(eps)
            out = torch.promote_types(input.dtype, weight.dtype) if weight is not None else input.dtype
            y = _dispatch(rt, "rms_norm", (input.shape, input.dtype, ns, e, "functional", out,
                                           weight is not None), input, weight)
            if y is not None:
                return y
        return orig(input, normalized_shape, weight, eps)
    return wrapper


def _w_group_norm(orig):
    def wrapper(input, num_groups, weight=None, bias=None, eps=1e-5):
        rt = _active()
        if rt is not None and type(input) is _Tensor:
            y = _dispatch(rt, "group_norm", (input.shape, input.dtype, int(num_groups), float(eps),
                                             weight is not None, bias is not None), input, weight, bias)
            if y is not None:
                return y
        return orig(input, num_groups, weight, bias, eps)
    return wrapper


def _w_pool(orig):
    def wrapper(input, output_size):
        rt = _active()
        if rt is not None and type(input) is _Tensor and input.dim() >= 2:
            os_ = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
            if len(os_) == 2:
                os_ = tuple(input.shape[-2 + i] if s is None else int(s) for i, s in enumerate(os_))
                y = _dispatch(rt, "adaptive_avg_pool2d", (input.shape, input.dtype, os_), input)
                if y is not None:
                    return y
        return orig(input, output_size)
    return wrapper


def _w_gelu(orig):
    def wrapper(input, approximate="none"):
        rt = _active()
        if rt is not None and type(input) is _Tensor:
            y = _dispatch(rt, "gelu", (input.shape, input.dtype, approximate), input)
            if y is not None:
                return y
        return orig(input, approximate=approximate)
    return wrapper


def _w_silu(orig):
    def wrapper(input, inplace=False):
        rt = _active()
        if rt is not None and type(input) is _Tensor:
            k = rt.tables["silu"].get((input.shape, input.dtype))
            if k is None:
                _miss(rt, "silu", input)
            elif inplace:
                rt.fallback("silu", "in-place call", input)
            else:
                y = _launch(rt, k, input)
                if y is not None:
                    return y
        return orig(input, inplace)
    return wrapper


def _w_relu(orig):
    # torch.relu only: F.relu and nn.ReLU look torch.relu up at call time (in-place relu_ is left alone)
    def wrapper(input):
        rt = _active()
        if rt is not None and type(input) is _Tensor:
            y = _dispatch(rt, "relu", (input.shape, input.dtype), input)
            if y is not None:
                return y
        return orig(input)
    return wrapper


# (module holding the attribute, attribute name, op, wrapper factory)
_SITES = (
    (F, "softmax", "softmax", lambda o: _w_softmax("softmax", o)),
    (torch, "softmax", "softmax", lambda o: _w_torch_softmax("softmax", o)),
    (F, "log_softmax", "log_softmax", lambda o: _w_softmax("log_softmax", o)),
    (torch, "log_softmax", "log_softmax", lambda o: _w_torch_softmax("log_softmax", o)),
    (F, "layer_norm", "layer_norm", _w_layer_norm),
    (F, "rms_norm", "rms_norm", _w_rms_norm),
    (F, "group_norm", "group_norm", _w_group_norm),
    (F, "adaptive_avg_pool2d", "adaptive_avg_pool2d", _w_pool),
    (F, "gelu", "gelu", _w_gelu),
    (F, "silu", "silu", _w_silu),
    (torch, "relu", "relu", _w_relu),
)
_GLOBAL: dict[tuple, tuple] = {}  # (module name, attr) -> (original, wrapper, users)


def _install_sites(ops: set[str]) -> list[tuple]:
    taken = []
    for mod, attr, op, make in _SITES:
        if op not in ops or not hasattr(mod, attr):
            continue
        key = (mod.__name__, attr)
        if key in _GLOBAL:
            orig, wrapper, users = _GLOBAL[key]
            _GLOBAL[key] = (orig, wrapper, users + 1)
        else:
            orig = getattr(mod, attr)
            wrapper = make(orig)
            wrapper.__wrapped__ = orig
            wrapper.__name__ = getattr(orig, "__name__", attr)
            wrapper.__doc__ = getattr(orig, "__doc__", None)
            setattr(mod, attr, wrapper)
            _GLOBAL[key] = (orig, wrapper, 1)
        taken.append((mod, attr))
    return taken


def _release_sites(taken: list[tuple]) -> None:
    for mod, attr in taken:
        key = (mod.__name__, attr)
        orig, wrapper, users = _GLOBAL[key]
        if users > 1:
            _GLOBAL[key] = (orig, wrapper, users - 1)
            continue
        del _GLOBAL[key]
        if getattr(mod, attr) is wrapper:  # leave a later monkey-patch by someone else in place
            setattr(mod, attr, orig)


# ------------------------------------------------------------------ module-level replacements

def _rms_variant(module) -> str | None:
    """HF RMSNorm modules whose forward is pure Python (no F.rms_norm): which spelling they use."""
    name = type(module).__name__
    if not name.endswith("RMSNorm") or isinstance(module, getattr(torch.nn, "RMSNorm", ())):
        return None
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        return None
    if _rms_eps(module) is None:
        return None
    return "gemma" if "Gemma" in name else "llama"


def _rms_eps(module):
    for attr in ("variance_epsilon", "eps"):
        v = getattr(module, attr, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def _rms_forward(module, orig_forward, variant):
    eps = _rms_eps(module)

    def forward(hidden_states, *args, **kwargs):
        rt = _active()
        if rt is not None and not args and not kwargs and type(hidden_states) is _Tensor:
            x, w = hidden_states, module.weight
            out = x.dtype if variant == "gemma" else torch.promote_types(w.dtype, x.dtype)
            if "rms_norm" in rt.tables:
                y = _dispatch(rt, "rms_norm", (x.shape, x.dtype, (x.shape[-1],), eps, variant, out, True), x, w)
                if y is not None:
                    return y
        return orig_forward(hidden_states, *args, **kwargs)
    return forward


def _gated_silu_mlp(module) -> bool:
    """HF's gated MLP (Llama/Qwen/Mistral `*MLP`): down_proj(act_fn(gate_proj(x)) * up_proj(x))
    with a SiLU activation. Its silu(a)*b is one kernel-target op, but it is spelled inside the
    module's forward, so the module's forward is what gets replaced (and checked: see install)."""
    act = getattr(module, "act_fn", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")
    return silu and all(isinstance(getattr(module, n, None), torch.nn.Module)
                        for n in ("gate_proj", "up_proj", "down_proj"))


def _silu_mul_forward(module, orig_forward):
    def spelled_out(x):  # what the replacement computes when no kernel applies
        return module.down_proj(module.act_fn(module.gate_proj(x)) * module.up_proj(x))

    def forward(x, *args, **kwargs):
        rt = _active()
        if rt is None or args or kwargs or type(x) is not _Tensor:
            return orig_forward(x, *args, **kwargs)
        a, b = module.gate_proj(x), module.up_proj(x)
        y = _launch_silu_mul(rt, a, b)
        if y is None:
            y = module.act_fn(a) * b
        return module.down_proj(y)
    forward.spelled_out = spelled_out
    return forward


def _launch_silu_mul(rt, a, b):
    tab = rt.tables.get("silu_mul")
    if not tab or a.dim() < 2 or a.shape != b.shape or a.dtype != b.dtype:
        return None
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        return rt.fallback("silu_mul", "inputs without unit column stride", a)
    k = tab.get((a.shape, a.dtype, a.stride(-2), b.stride(-2)))
    if k is None:
        return _miss(rt, "silu_mul", a)
    if not (a.is_cuda if k.cuda else a.is_cpu) or a.device != b.device:
        return rt.fallback("silu_mul", "tensor on another device", a)
    if _grad_enabled() and (a.requires_grad or b.requires_grad):
        return rt.fallback("silu_mul", "autograd (kernel has no backward)", a)
    if a.dim() > 2 and not (a.is_contiguous() and b.is_contiguous()):
        return rt.fallback("silu_mul", "rows are not evenly strided", a)
    stream = torch._C._cuda_getCurrentRawStream(a.get_device()) if k.cuda else None
    y = a.new_empty(a.shape)
    rc = k.launch(a, b, y, stream)
    if rc != 0:
        return rt.fallback("silu_mul", f"kernel returned error {rc}", a)
    rt.counts[k.task_id] += 1
    return y


def _same_as_original(module, orig_forward, new_forward) -> bool:
    """A replaced forward must compute exactly what the module's own forward computes: run the
    original and the replacement's spelled-out PyTorch path on random rows before trusting it."""
    try:
        w = module.gate_proj.weight
        x = torch.randn(2, w.shape[1], device=w.device, dtype=w.dtype)
        with torch.inference_mode():
            return bool(torch.equal(orig_forward(x), new_forward.spelled_out(x)))
    except Exception:  # noqa: BLE001 - anything unexpected: keep the module's own forward
        return False


# ------------------------------------------------------------------ install / uninstall

_INSTALLED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MISSING = object()


def install(model: torch.nn.Module, runtime: Runtime) -> None:
    """Route `model`'s matching op calls to `runtime`'s kernels; replaces an earlier install."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if model in _INSTALLED:
        uninstall(model)
    ops = set(runtime.tables)
    replaced = []  # (module, previous instance forward or _MISSING)
    if "rms_norm" in ops:
        for m in model.modules():
            variant = _rms_variant(m)
            if variant is not None:
                replaced.append((m, m.__dict__.get("forward", _MISSING)))
                m.forward = _rms_forward(m, m.forward, variant)
    if "silu_mul" in ops:
        for m in model.modules():
            if _gated_silu_mlp(m):
                fwd = _silu_mul_forward(m, m.forward)
                if _same_as_original(m, m.forward, fwd):
                    replaced.append((m, m.__dict__.get("forward", _MISSING)))
                    m.forward = fwd
    taken = _install_sites(ops)
    rebound = _rebind_bound_references(model, taken)
    inner = model.forward

    def forward(*args, **kwargs):
        if _is_compiling():
            return inner(*args, **kwargs)
        _STACK.append(runtime)
        try:
            return inner(*args, **kwargs)
        finally:
            _STACK.pop()

    replaced.append((model, model.__dict__.get("forward", _MISSING)))
    model.forward = forward
    _INSTALLED[model] = (runtime, replaced, taken, rebound)


def uninstall(model: torch.nn.Module) -> bool:
    """Undo install(): original forwards and torch functions back; False if nothing was installed."""
    rec = _INSTALLED.pop(model, None)
    if rec is None:
        return False
    _runtime, replaced, taken, rebound = rec
    for m, attr, prev in reversed(rebound):
        setattr(m, attr, prev)
    for m, prev in reversed(replaced):
        if prev is _MISSING:
            m.__dict__.pop("forward", None)
        else:
            m.forward = prev
    _release_sites(taken)
    return True


def _rebind_bound_references(model: torch.nn.Module, taken: list[tuple]) -> list[tuple]:
    """Modules that stored the torch function itself at construction (HF's GELUTanh keeps
    `functools.partial(F.gelu, approximate="tanh")`) never look it up again, so patching
    `F.gelu` does not reach them: point those instance attributes at the wrapper too."""
    swap = {}
    for mod, attr in taken:
        orig, wrapper, _users = _GLOBAL[(mod.__name__, attr)]
        swap[id(orig)] = wrapper
    if not swap:
        return []
    rebound = []
    for m in model.modules():
        for attr, val in list(vars(m).items()):
            if isinstance(val, functools.partial) and id(val.func) in swap:
                new = functools.partial(swap[id(val.func)], *val.args, **(val.keywords or {}))
            elif callable(val) and id(val) in swap:
                new = swap[id(val)]
            else:
                continue
            rebound.append((m, attr, val))
            setattr(m, attr, new)
    return rebound


def runtime_of(model) -> Runtime | None:
    rec = _INSTALLED.get(model)
    return rec[0] if rec else None


# ------------------------------------------------------------------ architectures and rebuilds

def current_arch(backend: str) -> str:
    """What binaries must have been built for: 'sm_90' on cuda; machine and CPU model on cpu
    (the cpu backend builds with -march=native, so another CPU model may lack instructions)."""
    if backend == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA GPU"
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    name = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.machine()} {name}".strip()


def find_compiler(backend: str) -> str | None:
    names = (os.environ.get("KFORGE_NVCC"), "nvcc", os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"),
                                                             "bin", "nvcc")) if backend == "cuda" else \
        (os.environ.get("KFORGE_CXX"), os.environ.get("CXX"), "g++", "c++", "clang++")
    for n in names:
        if n and shutil.which(n):
            return shutil.which(n)
    return None


def build_command(backend: str, compiler: str, src: str, out: str, arch: str) -> list[str]:
    """The sandbox compiler's flags (kforge_tui/sandbox/compile.py), repeated here because this
    file must not import kforge; the manifest records the flags the shipped binaries used."""
    if backend == "cuda":
        return [compiler, "-O3", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC", "-lineinfo",
                "-std=c++17", "-o", out, src]
    return [compiler, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
            "-Wl,-z,defs", "-o", out, src]


def rebuild(spec: dict, src_path: Path, backend: str, arch: str, cache_dir: Path) -> Path:
    """Compile one kernel source for this machine into cache_dir (kept across imports by hash)."""
    compiler = find_compiler(backend)
    if compiler is None:
        raise ArchMismatch("no compiler")
    code = src_path.read_bytes()
    h = hashlib.sha1(code + arch.encode() + backend.encode()).hexdigest()[:16]
    out = cache_dir / f"{spec['task_id']}_{h}.so"
    if out.exists():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{out.name}.{os.getpid()}.tmp"
    cmd = build_command(backend, compiler, str(src_path), str(tmp), arch)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise KernelLoadError(f"rebuilding {spec['task_id']} failed: {(p.stderr or p.stdout).strip()[-500:]}")
    os.replace(tmp, out)
    return out


def load_export(pkg_dir: str | Path) -> Runtime:
    """Load an exported package's manifest and binaries for this machine (rebuilding if needed)."""
    pkg_dir = Path(pkg_dir)
    manifest = json.loads((pkg_dir / "manifest.json").read_text())
    backend, built_for = manifest["backend"], manifest["arch"]
    here = current_arch(backend)
    specs = []
    for entry in manifest["kernels"]:
        spec = dict(entry)
        if here == built_for:
            spec["lib"] = str(pkg_dir / entry["binary"])
        else:
            cache = pkg_dir / "build" / _safe(here)
            if not os.access(pkg_dir, os.W_OK):
                cache = Path(tempfile.gettempdir()) / "kforge_export_build" / _safe(here)
            try:
                spec["lib"] = str(rebuild(entry, pkg_dir / entry["source"], backend,
                                          here if backend == "cuda" else "native", cache))
            except ArchMismatch:
                tool = "nvcc" if backend == "cuda" else "a C++ compiler (g++)"
                raise ArchMismatch(
                    f"kernels in {pkg_dir} were built for {built_for} but this machine is {here}, "
                    f"and {tool} was not found to rebuild them from source") from None
        specs.append(spec)
    return Runtime([Kernel(s) for s in specs])


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in s)[:80]
