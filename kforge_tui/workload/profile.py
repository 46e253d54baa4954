"""Where a model's forward spends its time, by region.

Each task (a region at one set of shapes; workload/capture.py) is timed on its captured real
inputs twice, in this process and on the model's device: eager (its aten ops one by one, the
region's own graph run by PyTorch) and compiled (torch.compile of the region alone, for the
heaviest regions). A task's time in the forward is its eager time times its calls; its share is
that over the eager forward, timed the same way (over the sum of the regions' times when that
is larger: each region timed alone carries its own call overhead, so shares never pass 100 %). Rows are ranked by that time. Unsupported
regions are listed with their reason, never dropped.

Timing here is the profile's ranking, not a verdict: candidates are timed again in the sandbox,
side by side with eager and torch.compile (sandbox/bench.py).
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

import torch

from kforge_tui.regions.graph import to_graph_module
from kforge_tui.regions.meta import storage_span, torch_dtype

log = logging.getLogger("kforge.workload")


@dataclass
class ProfileRow:
    op: str  # region label: pattern name, compute op or fused chain
    aten: str  # the region's aten ops
    shapes: list[list[int]]  # input shapes
    dtype: str
    calls: int
    total_us: float  # eager time in one forward (all calls)
    mean_us: float
    share: float
    target: bool  # kforge can write kernels for it
    kind: str = ""
    compiled_us: float | None = None  # torch.compile of the region alone, per call
    source: str = ""
    module: str = ""
    task_key: str = ""
    reason: str = ""  # why it is not a target

    def to_json(self) -> dict:
        return {"op": self.op, "aten": self.aten, "shapes": self.shapes, "dtype": self.dtype,
                "calls": self.calls, "total_us": round(self.total_us, 3),
                "mean_us": round(self.mean_us, 3), "share": round(self.share, 6),
                "target": self.target, "kind": self.kind,
                "compiled_us": None if self.compiled_us is None else round(self.compiled_us, 3),
                "source": self.source, "module": self.module, "task_key": self.task_key,
                "reason": self.reason}


@dataclass
class Profile:
    rows: list[ProfileRow]
    total_us: float  # one eager forward
    device: str
    iters: int
    notes: list[str] = field(default_factory=list)
    compiled_forward_us: float | None = None

    def to_json(self) -> dict:
        return {"device": self.device, "iters": self.iters, "total_us": round(self.total_us, 3),
                "compiled_forward_us": self.compiled_forward_us,
                "rows": [r.to_json() for r in self.rows], "notes": list(self.notes)}

    def row_for(self, task_key: str) -> ProfileRow | None:
        return next((r for r in self.rows if r.task_key == task_key), None)


# ------------------------------------------------------------------------------ timing

class _Timer:
    """Median time of a callable: cuda events with the L2 flushed before each call, or wall
    clock on the CPU. Small and explicit, as in KernelBench's timing.py."""

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.flush_buf = torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if self.cuda else None

    def __call__(self, fn, budget_s: float = 0.2, max_iters: int = 50) -> float:
        for _ in range(2):
            fn()
        self._sync()
        samples: list[float] = []
        t_end = time.perf_counter() + budget_s
        while len(samples) < 3 or (time.perf_counter() < t_end and len(samples) < max_iters):
            if self.cuda:
                self.flush_buf.zero_()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                samples.append(a.elapsed_time(b) * 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def random_inputs(task, device, seed: int = 0) -> list:
    """Inputs matching a task's metas (for timing regions whose calls were not kept)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for m in task.inputs:
        if not m.present:
            out.append(None)
            continue
        dt = torch_dtype(m.dtype)
        span = max(1, storage_span(m.shape, m.strides))
        if dt.is_floating_point:
            base = torch.randn(span, generator=gen).to(dt)
        elif dt == torch.bool:
            base = torch.rand(span, generator=gen) > 0.5
        else:
            base = torch.zeros(span, dtype=dt)  # indices: 0 is always valid
        out.append(base.to(device).as_strided(tuple(m.shape), tuple(m.strides)))
    return out


def profile_regions(loaded, traced, *, compile_top: int = 5, budget_s: float = 0.2,
                    on_progress=None) -> Profile:
    """Rows for every task and unsupported region of `traced`, heaviest first."""
    device = str(loaded.device)
    timer = _Timer(device)
    with torch.inference_mode():
        fwd = timer(loaded.run, budget_s=max(budget_s, 0.5), max_iters=20)
    rows: list[ProfileRow] = []
    records = sorted(traced.records.values(), key=lambda r: r.first_index)
    gms = {}
    for k, r in enumerate(records):
        t = r.task
        ins = r.saved[0][0] if r.saved else random_inputs(t, device)
        gm = gms[t.key] = (to_graph_module(t.graph, device), ins)
        try:
            with torch.inference_mode():
                mean = timer(lambda: gm[0](*ins), budget_s=budget_s)
        except Exception as e:  # the region's own graph failed here: list it, do not stop
            rows.append(_row(t, r.calls, 0.0, fwd, target=False,
                             reason=f"its graph did not run alone: {str(e).splitlines()[0][:120]}"))
            continue
        rows.append(_row(t, r.calls, mean, fwd))
        if on_progress:
            on_progress(k + 1, len(records))
    rows.sort(key=lambda r: r.total_us, reverse=True)
    # Regions timed alone can add up to more than the forward timed whole (launch overheads,
    # a busy machine): shares are then over their sum, so that none says more than 100 %.
    summed = sum(r.total_us for r in rows)
    if summed > fwd > 0:
        for r in rows:
            r.share = r.total_us / summed
    notes = []
    for row in [r for r in rows if r.target][:max(0, compile_top)]:
        gm, ins = gms[row.task_key]
        try:
            fn = torch.compile(gm, dynamic=False)
            with torch.inference_mode():
                row.compiled_us = timer(lambda: fn(*ins), budget_s=budget_s)
        except Exception as e:  # Inductor unavailable (no C++ compiler, ...): say it once
            msg = f"torch.compile of a region failed: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}"
            if msg not in notes:
                notes.append(msg)
    for u in traced.unsupported:
        rows.append(ProfileRow(op=u.label, aten="", shapes=[], dtype="", calls=u.calls, total_us=0.0,
                               mean_us=0.0, share=0.0, target=False, kind="unsupported",
                               source=u.source, reason=u.reason))
    for what, why in _count(traced.skipped):
        notes.append(f"skipped {what}: {why}")
    breaks = getattr(traced, "breaks", None) or []
    if traced.graphs == 0 and breaks:
        notes.append(f"torch.compile captured no graph: the model runs eagerly under "
                     f"torch.compile too ({breaks[0]})")
        breaks = breaks[1:]
    elif traced.graphs == 0:
        notes.append("torch.compile captured no graph: the forward does no tensor operation")
    elif traced.graphs > 1:
        notes.append(f"{traced.graphs} graphs captured (graph breaks); regions come from all of them")
    for b in breaks:
        notes.append(f"graph break: {b}")
    if not any(r.target for r in rows):
        notes.append("no region kforge can write a kernel for")
    return Profile(rows=rows, total_us=fwd, device=device, iters=1, notes=notes)


def _count(pairs) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], int] = {}
    for p in pairs:
        seen[p] = seen.get(p, 0) + 1
    return [(f"{n}x {w}" if n > 1 else w, why) for (w, why), n in seen.items()]


def _row(t, calls: int, mean: float, fwd: float, target: bool = True, reason: str = "") -> ProfileRow:
    total = mean * calls
    return ProfileRow(op=t.op, aten=t.aten, shapes=[list(m.shape) for m in t.inputs if m.present],
                      dtype=t.dtype, calls=calls, total_us=total, mean_us=mean,
                      share=total / fwd if fwd > 0 else 0.0, target=target, kind=t.kind,
                      source=t.source, module=t.module, task_key=t.key, reason=reason)


# --------------------------------------------------------------------------- text table

def _fmt_shapes(shapes: list[list[int]], limit: int = 36) -> str:
    s = " ".join("[" + ",".join(str(d) for d in sh) + "]" for sh in shapes)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def format_profile(profile: Profile, top: int | None = None) -> str:
    """Aligned text table; `*` marks regions kforge can write kernels for."""
    rows = profile.rows[:top] if top else profile.rows
    unit = "device" if profile.device.startswith("cuda") else "CPU"
    header = ("", "region", "kind", "shapes", "dtype", "calls", "total µs", "mean µs", "compiled µs",
              "share", "source")
    table = [header]
    for r in rows:
        comp = f"{r.compiled_us:.1f}" if r.compiled_us is not None else "-"
        src = r.source if r.target else f"{r.reason} ({r.source})" if r.source else r.reason
        table.append(("*" if r.target else "", r.op, r.kind, _fmt_shapes(r.shapes), r.dtype,
                      str(r.calls), f"{r.total_us:.1f}", f"{r.mean_us:.1f}", comp,
                      f"{100 * r.share:.1f}%", src[:70]))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {5, 6, 7, 8, 9}
    lines = []
    for row in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    shown = f"top {len(rows)} of {len(profile.rows)} rows" if top and top < len(profile.rows) \
        else f"{len(rows)} rows"
    lines.append("")
    lines.append(f"forward: {profile.total_us / 1000:.3f} ms {unit} time on {profile.device} (eager, "
                 f"median); {shown}; * = kernel target; compiled = torch.compile of the region alone")
    lines.extend(profile.notes)
    return "\n".join(lines)
