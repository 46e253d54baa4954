"""Where a model's forward spends its time, per operator, shape and dtype.

torch.profiler records the forward; each row is a *top-level* aten call (one whose callers are not
aten ops) with its inclusive time, i.e. the op and everything it dispatches to. That is the unit a
user recognises (`aten::softmax` with its `aten::_softmax`, `aten::conv2d` with the mkldnn call
under it) and the unit a kernel replaces. On CUDA the time is the device (kernel) time launched
under the op; on CPU it is CPU time. Times are per forward (averaged over `iters` passes).

HF RMSNorm modules are not one aten op but pow/mean/rsqrt/mul; forward pre/post hooks open a
`record_function` range around each one so that the whole module shows as one `rms_norm` row.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field

from kforge_tui.workload import catalogue
from kforge_tui.workload.loader import LoadedModel

log = logging.getLogger("kforge.workload")

FORWARD_RANGE = "kforge::forward"
RANGE_PREFIX = "kforge::"
RMS_RANGE = "kforge::rms_norm"

# aten name -> friendly name where stripping "aten::" and underscores is not enough.
_FRIENDLY = {
    "aten::_softmax": "softmax", "aten::_log_softmax": "log_softmax",
    "aten::native_layer_norm": "layer_norm", "aten::native_group_norm": "group_norm",
    "aten::_adaptive_avg_pool2d": "adaptive_avg_pool2d", "aten::_fused_rms_norm": "rms_norm",
    "aten::mm": "matmul", "aten::bmm": "matmul", "aten::addmm": "matmul", "aten::matmul": "matmul",
    "aten::linear": "linear", "aten::conv2d": "conv2d", "aten::convolution": "conv2d",
    "aten::scaled_dot_product_attention": "sdpa",
}


def friendly_name(aten: str) -> str:
    """`aten::_softmax` -> `softmax`, `aten::relu_` -> `relu`, `kforge::rms_norm` -> `rms_norm`."""
    if aten in _FRIENDLY:
        return _FRIENDLY[aten]
    name = aten.split("::", 1)[-1]
    return name.strip("_") or name


@dataclass
class ProfileRow:
    op: str
    aten: str
    shapes: list[list[int]]
    dtype: str
    calls: int
    total_us: float
    mean_us: float
    share: float
    target: bool

    def to_json(self) -> dict:
        return {"op": self.op, "aten": self.aten, "shapes": self.shapes, "dtype": self.dtype,
                "calls": self.calls, "total_us": round(self.total_us, 3),
                "mean_us": round(self.mean_us, 3), "share": round(self.share, 6),
                "target": self.target}


@dataclass
class Profile:
    rows: list[ProfileRow]
    total_us: float  # one forward: CPU time of the forward (cpu) or all its kernel time (cuda)
    device: str
    iters: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"device": self.device, "iters": self.iters, "total_us": round(self.total_us, 3),
                "rows": [r.to_json() for r in self.rows], "notes": list(self.notes)}

    def find(self, op: str, shape, dtype: str, aten: str | None = None) -> ProfileRow | None:
        """The heaviest row of `op` whose first input has `shape` and `dtype` (capture uses it)."""
        shape = list(shape)
        for r in self.rows:
            if r.op == op and r.dtype == dtype and r.shapes and r.shapes[0] == shape \
                    and (aten is None or r.aten == aten):
                return r
        return None


# --------------------------------------------------------------------------- rms_norm ranges

def _is_rms_norm(module) -> bool:
    return type(module).__name__.endswith("RMSNorm")


class RmsNormRanges:
    """Context manager: every *RMSNorm module's forward runs inside a named profiler range.

    The range name carries the input shape and dtype (`kforge::rms_norm|2x32x1152|float32|1152`)
    because record_function ranges do not record shapes themselves.
    """

    def __init__(self, model):
        self.model = model
        self.handles = []
        self.stack = []

    def _pre(self, module, args, kwargs=None):
        import torch

        x = args[0] if args else next(iter((kwargs or {}).values()), None)
        w = getattr(module, "weight", None)
        shape = "x".join(str(s) for s in x.shape) if isinstance(x, torch.Tensor) else "?"
        dtype = str(x.dtype).replace("torch.", "") if isinstance(x, torch.Tensor) else "?"
        wshape = "x".join(str(s) for s in w.shape) if isinstance(w, torch.Tensor) else ""
        rf = torch.autograd.profiler.record_function(f"{RMS_RANGE}|{shape}|{dtype}|{wshape}")
        rf.__enter__()
        self.stack.append(rf)

    def _post(self, module, args, output):
        if self.stack:
            self.stack.pop().__exit__(None, None, None)

    def __enter__(self):
        for m in self.model.modules():
            if _is_rms_norm(m):
                self.handles.append(m.register_forward_pre_hook(self._pre))
                self.handles.append(m.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        while self.stack:  # a forward that raised inside a norm leaves its range open
            self.stack.pop().__exit__(None, None, None)
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _parse_range(name: str) -> tuple[str, list[list[int]], str]:
    parts = name.split("|")
    op = friendly_name(parts[0])
    shapes = []
    for p in (parts[1:2] + parts[3:4]):
        if p and p != "?":
            shapes.append([int(s) for s in p.split("x")])
    dtype = parts[2] if len(parts) > 2 else ""
    return op, shapes, dtype


# --------------------------------------------------------------------------- profiling

def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _dtype_of(evt) -> str:
    for shape, dt in zip(evt.input_shapes or [], getattr(evt, "input_dtypes", None) or []):
        if shape and dt:
            return _DTYPE_NAMES.get(dt, dt)
    for dt in getattr(evt, "input_dtypes", None) or []:
        if dt:
            return _DTYPE_NAMES.get(dt, dt)
    return ""


_DTYPE_NAMES = {"float": "float32", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
                "double": "float64", "long int": "int64", "int": "int32", "bool": "bool",
                "unsigned char": "uint8", "signed char": "int8", "short int": "int16"}


def profile_model(loaded: LoadedModel, warmup: int = 1, iters: int = 3) -> Profile:
    """Warm up, then profile `iters` forwards; rows sorted by time, heaviest first."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if iters < 1:
        raise ValueError("iters must be >= 1")
    cuda = loaded.device.startswith("cuda")
    with RmsNormRanges(loaded.model):
        for _ in range(max(0, warmup)):
            loaded.run()
        _sync(loaded.device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        prof = profile(activities=activities, record_shapes=True)
        with _quiet_stderr():
            prof.start()
        try:
            for _ in range(iters):
                with record_function(FORWARD_RANGE):
                    loaded.run()
                _sync(loaded.device)
        finally:
            with _quiet_stderr():
                prof.stop()
    return _aggregate(prof.events(), loaded.device, iters)


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto prints `USDT: ... profiler_start` lines on fd 2 from C++ (no setting turns them
    off in torch 2.13); hide fd 2 only while the profiler starts and stops, so the user's own
    warnings during the forward still show."""
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _time(evt, cuda: bool) -> float:
    return float(evt.device_time_total if cuda else evt.cpu_time_total)


def _aggregate(events, device: str, iters: int) -> Profile:
    cuda = device.startswith("cuda")
    total = 0.0
    groups: dict[tuple, list] = defaultdict(lambda: [0, 0.0])  # calls, time (all iters)
    for evt in events:
        if evt.device_type.name != "CPU" or getattr(evt, "is_async", False):
            continue
        name = evt.name
        if name == FORWARD_RANGE:
            total += _time(evt, cuda)
            continue
        is_range = name.startswith(RMS_RANGE)
        if not (is_range or name.startswith("aten::")):
            continue
        # Top level = no aten op or rms_norm range above it (those already count this time).
        p, inside_forward, nested = evt.cpu_parent, False, False
        while p is not None:
            if p.name == FORWARD_RANGE:
                inside_forward = True
            elif p.name.startswith("aten::") or p.name.startswith(RMS_RANGE):
                nested = True
                break
            p = p.cpu_parent
        if nested or not inside_forward:
            continue
        if is_range:
            op, shapes, dtype = _parse_range(name)
            aten = "rms_norm pattern"
        else:
            op = friendly_name(name)
            shapes = [list(s) for s in (evt.input_shapes or []) if s]
            dtype = _dtype_of(evt)
            aten = name
        key = (op, aten, tuple(tuple(s) for s in shapes), dtype)
        g = groups[key]
        g[0] += 1
        g[1] += _time(evt, cuda)
    per_fwd_total = total / iters
    rows = []
    for (op, aten, shapes, dtype), (calls, t) in groups.items():
        t_fwd = t / iters
        n = max(1, round(calls / iters))
        rows.append(ProfileRow(op=op, aten=aten, shapes=[list(s) for s in shapes], dtype=dtype,
                               calls=n, total_us=t_fwd, mean_us=t_fwd / n,
                               share=(t_fwd / per_fwd_total) if per_fwd_total > 0 else 0.0,
                               target=op in catalogue.TARGET_OPS))
    rows.sort(key=lambda r: r.total_us, reverse=True)
    notes = []
    if not any(r.target for r in rows):
        notes.append("no kernel-target ops in this model (targets: "
                     + ", ".join(catalogue.TARGET_OPS) + ")")
    return Profile(rows=rows, total_us=per_fwd_total, device=device, iters=iters, notes=notes)


# --------------------------------------------------------------------------- text table

def _fmt_shapes(shapes: list[list[int]], limit: int = 44) -> str:
    s = " ".join("[" + ",".join(str(d) for d in sh) + "]" for sh in shapes)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def format_profile(profile: Profile, top: int | None = None) -> str:
    """Aligned text table; `*` marks ops kforge can write kernels for."""
    rows = profile.rows[:top] if top else profile.rows
    unit = "device" if profile.device.startswith("cuda") else "CPU"
    header = ("", "op", "aten", "shapes", "dtype", "calls", "total µs", "mean µs", "share")
    table = [header]
    for r in rows:
        table.append(("*" if r.target else "", r.op, r.aten, _fmt_shapes(r.shapes), r.dtype,
                      str(r.calls), f"{r.total_us:.1f}", f"{r.mean_us:.1f}", f"{100 * r.share:.1f}%"))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {5, 6, 7, 8}
    lines = []
    for row in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    shown = f"top {len(rows)} of {len(profile.rows)} rows" if top and top < len(profile.rows) \
        else f"{len(rows)} rows"
    lines.append("")
    lines.append(f"forward: {profile.total_us / 1000:.3f} ms {unit} time on {profile.device} "
                 f"(mean of {profile.iters}); {shown}; * = kernel target")
    lines.extend(profile.notes)
    return "\n".join(lines)
