"""Record real calls of the kernel-target ops during one forward and turn them into Tasks.

The kernels are later checked on exactly these tensors (alongside random ones), so capture
records what the model really passes: a `TorchFunctionMode` sees every functional call
(F.softmax, F.group_norm, ...; the mode is off inside its own handler, so an op is recorded
once, at the outermost call), and forward hooks see *RMSNorm modules, which are a pattern of
small ops rather than one function. The mode calls the original function with the original
arguments and returns its result untouched, so the model's outputs do not change.

Calls are grouped by (op, input shapes/strides/dtypes, params); each group becomes one Task.
Up to `max_calls` calls per task are saved, within `max_bytes_per_op` bytes per task.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from kforge_tui.task import SUPPORTED_DTYPES, Task, capture_dir, save_call
from kforge_tui.workload import catalogue
from kforge_tui.workload.loader import LoadedModel
from kforge_tui.workload.profile import Profile

log = logging.getLogger("kforge.workload")

# Bytes a saved call costs on disk beyond its raw tensor data (torch.save zip framing, params,
# stats), so that max_bytes_per_op bounds real file sizes, not just tensor payloads.
FILE_OVERHEAD = 8192


def _dtname(dt) -> str:
    return str(dt).replace("torch.", "")


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


# ------------------------------------------------------------------ function handlers
# Each handler maps one call's (args, kwargs) to (op, canonical inputs, params) or None when
# the call is outside what the catalogue expresses (then it is simply not recorded).

def _h_softmax(op):
    def h(args, kwargs):
        x, dim = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim")
        if x is None:
            x = kwargs.get("self")
        if not isinstance(x, torch.Tensor) or dim is None or x.dim() == 0:
            return None
        return op, {"x": x}, {"dim": int(dim) % x.dim()}
    return h


def _h_layer_norm(args, kwargs):
    x = _arg(args, kwargs, 0, "input")
    shape = _arg(args, kwargs, 1, "normalized_shape")
    w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
    eps = _arg(args, kwargs, 4, "eps", 1e-5)
    return "layer_norm", {"x": x, "weight": w, "bias": b}, \
        {"normalized_shape": [int(s) for s in shape], "eps": float(eps)}


def _h_group_norm(args, kwargs):
    x = _arg(args, kwargs, 0, "input")
    g = _arg(args, kwargs, 1, "num_groups")
    w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
    eps = _arg(args, kwargs, 4, "eps", 1e-5)
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return None
    return "group_norm", {"x": x, "weight": w, "bias": b}, {"groups": int(g), "eps": float(eps)}


def _h_pool(args, kwargs):
    x, size = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "output_size")
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        return None
    if isinstance(size, int):
        size = (size, size)
    oh, ow = size
    oh = x.shape[-2] if oh is None else int(oh)
    ow = x.shape[-1] if ow is None else int(ow)
    return "adaptive_avg_pool2d", {"x": x}, {"output_size": [oh, ow]}


def _h_gelu(args, kwargs):
    return "gelu", {"x": _arg(args, kwargs, 0, "input")}, \
        {"approximate": _arg(args, kwargs, 1, "approximate", "none")}


def _h_unary(op):
    def h(args, kwargs):
        x = _arg(args, kwargs, 0, "input")
        if x is None:
            x = kwargs.get("self")
        return op, {"x": x}, {}
    return h


def _h_rms_norm(args, kwargs):
    x = _arg(args, kwargs, 0, "input")
    shape = _arg(args, kwargs, 1, "normalized_shape")
    w, eps = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "eps")
    if not isinstance(x, torch.Tensor) or eps is None:
        return None  # eps=None means "dtype eps" inside aten; only explicit eps is recorded
    return "rms_norm", {"x": x, "weight": w}, \
        {"normalized_shape": [int(s) for s in shape], "eps": float(eps), "variant": "functional"}


_HANDLERS = {
    F.softmax: _h_softmax("softmax"), torch.softmax: _h_softmax("softmax"),
    torch.Tensor.softmax: _h_softmax("softmax"),
    F.log_softmax: _h_softmax("log_softmax"), torch.log_softmax: _h_softmax("log_softmax"),
    torch.Tensor.log_softmax: _h_softmax("log_softmax"),
    F.layer_norm: _h_layer_norm, F.group_norm: _h_group_norm,
    F.adaptive_avg_pool2d: _h_pool, F.gelu: _h_gelu, F.silu: _h_unary("silu"),
    F.relu: _h_unary("relu"), torch.relu: _h_unary("relu"), torch.Tensor.relu: _h_unary("relu"),
    F.rms_norm: _h_rms_norm,
}
_INPLACE = {F.relu, F.silu}  # inplace=True is a keyword/3rd arg of these
_MULS = {torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.mul, torch.mul}


# ------------------------------------------------------------------ recorder

@dataclass
class _Group:
    op: str
    inputs_meta: dict  # name -> meta tensor (shape/stride/dtype) or None
    params: dict
    out_meta: object = None
    calls: int = 0
    saved: list = field(default_factory=list)  # (inputs, output) clones
    bytes: int = 0
    over_budget: int = 0
    ref_mismatch: int = 0


def _meta(t):
    return None if t is None else torch.empty_strided(tuple(t.shape), tuple(t.stride()),
                                                      dtype=t.dtype, device="meta")


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _rows_uniform(t) -> bool:
    """Unit column stride and one row stride over all leading dims (silu_mul's layout)."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return False
    for d in range(t.dim() - 2, 0, -1):
        if t.shape[d - 1] != 1 and t.stride(d - 1) != t.stride(d) * t.shape[d]:
            return False
    return True


class _Recorder:
    def __init__(self, max_calls: int, max_bytes: int):
        self.max_calls, self.max_bytes = max_calls, max_bytes
        self.groups: dict[tuple, _Group] = {}
        self.skipped: dict[str, int] = {}
        self.busy = 0  # >0 inside an RMSNorm module or our own reference checks
        self.last_silu = None  # (output, a) of the latest silu, for the silu(a)*b pattern

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def key_of(self, op, inputs, params):
        """Group key, or None (with the reason noted) when the call cannot become a task."""
        tensors = [t for t in inputs.values() if t is not None]
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            self._skip(f"{op}: non-tensor input")
            return None
        x = tensors[0]
        if _dtname(x.dtype) not in SUPPORTED_DTYPES:
            self._skip(f"{op}: dtype {_dtname(x.dtype)} is not a kernel dtype")
            return None
        if x.device.type not in ("cpu", "cuda"):
            self._skip(f"{op}: device {x.device.type}")
            return None
        if op == "silu_mul":
            if not all(_rows_uniform(t) for t in tensors):
                self._skip(f"{op}: inputs without unit column stride")
                return None
        elif not all(t.is_contiguous() for t in tensors):
            self._skip(f"{op}: non-contiguous input {list(x.shape)}")
            return None
        sig = tuple((n, None if t is None else (tuple(t.shape), tuple(t.stride()), _dtname(t.dtype)))
                    for n, t in inputs.items())
        return op, sig, repr(sorted(params.items()))

    def record(self, key, op, inputs, params, output, clones=None):
        # the output's dtype is part of the task (softmax(x, dtype=float32) on bf16 x)
        key = key + (_dtname(output.dtype), tuple(output.shape))
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(op, {n: _meta(t) for n, t in inputs.items()}, params,
                                          _meta(output))
        g.calls += 1
        if len(g.saved) >= self.max_calls:
            return
        cost = sum(_nbytes(t) for t in inputs.values()) + _nbytes(output) + FILE_OVERHEAD
        if g.bytes + cost > self.max_bytes:
            g.over_budget += 1
            return
        src = clones if clones is not None else inputs
        saved_in = {n: (None if t is None else t.detach().clone()) for n, t in src.items()}
        g.saved.append((saved_in, output.detach().clone()))
        g.bytes += cost

    def check_references(self) -> None:
        """The catalogue reference must reproduce each saved output exactly; note when not."""
        self.busy += 1
        try:
            for g in self.groups.values():
                task = self._task(g)
                for inp, out in g.saved:
                    ref = catalogue.reference(task, inp)
                    if not torch.equal(ref, out):
                        g.ref_mismatch += 1
        finally:
            self.busy -= 1

    def _task(self, g: _Group, backend: str = "cpu", **profile) -> Task:
        return catalogue.make_task(g.op, g.inputs_meta, g.params, g.out_meta, backend, **profile)


class _CaptureMode(TorchFunctionMode):
    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.rec
        if rec.busy:
            return func(*args, **kwargs)
        if func in _MULS and rec.last_silu is not None and len(args) >= 2:
            return self._maybe_silu_mul(func, args, kwargs)
        handler = _HANDLERS.get(func)
        if handler is None:
            return func(*args, **kwargs)
        try:
            spec = handler(args, kwargs)
        except Exception:  # an unusual call form: do not record it, do not disturb it
            spec = None
        if spec is None:
            return func(*args, **kwargs)
        op, inputs, params = spec
        key = self.rec.key_of(op, inputs, params)
        clones = None
        inplace = func in _INPLACE and bool(_arg(args, kwargs, 1, "inplace", False))
        if key is not None and inplace:  # keep the input as it was before the op overwrites it
            clones = {n: (None if t is None else t.detach().clone()) for n, t in inputs.items()}
        out = func(*args, **kwargs)
        if key is not None and isinstance(out, torch.Tensor):
            rec.record(key, op, inputs, params, out, clones=clones)
        if op == "silu" and not inplace and isinstance(out, torch.Tensor):
            rec.last_silu = (out, inputs["x"])
        return out

    def _maybe_silu_mul(self, func, args, kwargs):
        rec = self.rec
        silu_out, a = rec.last_silu
        lhs, rhs = args[0], args[1]
        out = func(*args, **kwargs)
        other = rhs if lhs is silu_out else lhs if rhs is silu_out else None
        if (other is not None and isinstance(other, torch.Tensor) and other.shape == a.shape
                and other.dtype == a.dtype and isinstance(out, torch.Tensor)):
            rec.last_silu = None
            inputs = {"a": a, "b": other}
            key = rec.key_of("silu_mul", inputs, {})
            if key is not None:
                rec.record(key, "silu_mul", inputs, {}, out)
        return out


# ------------------------------------------------------------------ RMSNorm modules

def _rms_eps(module):
    for name in ("eps", "variance_epsilon", "epsilon"):
        v = getattr(module, name, None)
        if isinstance(v, (int, float)):
            return float(v)
    return None


class _RmsNormHooks:
    """Record *RMSNorm module calls; the variant is whichever reference reproduces the output."""

    def __init__(self, model, rec: _Recorder):
        self.model, self.rec, self.handles = model, rec, []
        self.variant: dict[int, str | None] = {}

    def _pre(self, module, args):
        self.rec.busy += 1

    def _post(self, module, args, output):
        rec = self.rec
        rec.busy -= 1
        if rec.busy or not args or not isinstance(args[0], torch.Tensor) \
                or not isinstance(output, torch.Tensor):
            return
        x, w, eps = args[0], getattr(module, "weight", None), _rms_eps(module)
        if eps is None or (w is not None and not isinstance(w, torch.Tensor)):
            rec._skip(f"{type(module).__name__}: no eps attribute")
            return
        inputs = {"x": x, "weight": w}
        params = {"normalized_shape": [int(x.shape[-1])], "eps": eps}
        variant = self._variant(module, inputs, params, output)
        if variant is None:
            rec._skip(f"{type(module).__name__}: no catalogue rms_norm variant reproduces it")
            return
        params["variant"] = variant
        key = rec.key_of("rms_norm", inputs, params)
        if key is not None:
            rec.record(key, "rms_norm", inputs, params, output)

    def _variant(self, module, inputs, params, output):
        if id(module) in self.variant:
            return self.variant[id(module)]
        found = None
        self.rec.busy += 1
        try:
            for v in ("llama", "gemma", "functional"):
                try:
                    ref = catalogue.OPS["rms_norm"].reference(inputs, dict(params, variant=v), None)
                except Exception:
                    continue
                if ref.dtype == output.dtype and torch.equal(ref, output):
                    found = v
                    break
        finally:
            self.rec.busy -= 1
        self.variant[id(module)] = found
        return found

    def __enter__(self):
        for m in self.model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                self.handles.append(m.register_forward_pre_hook(self._pre))
                self.handles.append(m.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


# ------------------------------------------------------------------ public entry

def _profile_facts(profile: Profile, task: Task) -> dict:
    """calls/total_us/share/aten for a task from the profile row of its op, shape and dtype."""
    if task.op == "silu_mul":  # a pattern: priced as its silu plus its mul
        a = task.input("a")
        rows = [profile.find("silu", a.shape, task.dtype), profile.find("mul", a.shape, task.dtype)]
        mean = sum(r.mean_us for r in rows if r)
        aten = "silu(a)*b pattern"
    else:
        row = None
        if task.op == "rms_norm" and task.params.get("variant") == "functional":
            row = profile.find(task.op, task.shape, task.dtype, aten="aten::rms_norm")
        row = row or profile.find(task.op, task.shape, task.dtype)
        mean, aten = (row.mean_us, row.aten) if row else (0.0, catalogue.get(task.op).aten[0])
    total = mean * task.calls
    share = total / profile.total_us if profile.total_us > 0 else 0.0
    return {"total_us": total, "share": share, "aten": aten}


def capture(loaded: LoadedModel, run_dir, profile: Profile, *, top_n: int | None = 5,
            ops: list[str] | None = None, backend: str = "cpu", max_calls: int = 3,
            max_bytes_per_op: int = 256 * 2**20) -> list[Task]:
    """Run one forward recording target-op calls; save the chosen tasks' calls; return the tasks.

    Tasks are ordered by time share. With `ops`, only tasks of those ops are kept; `top_n`
    (None = no limit) then caps how many are kept.
    """
    if ops:
        for o in ops:
            catalogue.get(o)  # UsageError naming the known ops
    rec = _Recorder(max_calls=max_calls, max_bytes=max_bytes_per_op)
    with _RmsNormHooks(loaded.model, rec), _CaptureMode(rec):
        loaded.run()
    rec.last_silu = None
    rec.check_references()

    entries = []
    for g in rec.groups.values():
        task = rec._task(g, backend, calls=g.calls)
        task = replace(task, **_profile_facts(profile, task))
        entries.append((task, g))
    entries.sort(key=lambda e: (e[0].share, e[0].total_us, e[0].calls), reverse=True)
    if ops:
        entries = [e for e in entries if e[0].op in ops]
    if top_n is not None:
        entries = entries[:top_n]

    for why, n in sorted(rec.skipped.items()):
        log.info("capture: skipped %d call(s): %s", n, why)
    for task, g in entries:
        d = capture_dir(run_dir, task.task_id)
        for stale in Path(d).glob("call_*.pt"):  # an earlier capture into the same run dir
            stale.unlink()
        for k, (inp, out) in enumerate(g.saved):
            save_call(Path(d) / f"call_{k}.pt", inp, task.params, out)
        if g.over_budget:
            log.info("capture: %s: %d call(s) not saved, over %d bytes per op", task.task_id,
                     g.over_budget, max_bytes_per_op)
        if g.ref_mismatch:
            log.warning("capture: %s: the catalogue reference differs from the model's output "
                        "on %d saved call(s)", task.task_id, g.ref_mismatch)
    return [t for t, _ in entries]
