"""Where a model's forward spends its time, by region.

Each task (a region at one set of shapes; workload/capture.py) is timed on its captured real
inputs twice, in this process and on the model's device: eager (the op the model calls where a
pattern binds the region, else the region's own aten graph run op by op) and compiled
(torch.compile of the region alone, for the heaviest regions). A task's time in the forward is
its eager time times its calls; its share is that over the eager forward, timed the same way
(over the sum of the regions' times when that is larger: each region timed alone carries its
own call overhead, so shares never pass 100 %).
Unsupported regions are listed with their reason, never dropped; a region Inductor cannot
compile says why (`compile_error`).

Rows are ranked by headroom against torch.compile, not by share: (compiled - floor) x calls,
what a kernel could still win in one forward (issue 27). A region already at its floor, or a
bare GEMM/convolution (the vendor library, at its roofline), has none; where torch.compile was
not timed, the headroom is estimated from eager time and the median compiled/eager ratio of the
regions that were. The floor is bytes (and FLOPs) over this machine's copy bandwidth and
torch.mm rate (regions/floor.py), measured once per process.

Timing here is the profile's ranking, not a verdict: candidates are timed again in the sandbox,
side by side with eager and torch.compile (sandbox/bench.py).
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass, field

import torch

from kforge_tui.regions.eager import eager_function
from kforge_tui.regions.floor import vendor_op
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
    floor_us: float | None = None  # bytes (and FLOPs) over this machine's rates, per call
    # what a kernel could win over torch.compile in one forward: (compiled - floor) x calls;
    # 0 for a region at its floor or a bare GEMM/conv (the vendor library's roofline)
    headroom_us: float = 0.0
    headroom_note: str = ""  # "estimated" (compile not timed), "vendor GEMM, at its roofline", "at its floor"
    compile_error: str = ""  # why Inductor could not compile the region, when it could not

    def to_json(self) -> dict:
        r = lambda x: None if x is None else round(x, 3)  # noqa: E731
        return {"op": self.op, "aten": self.aten, "shapes": self.shapes, "dtype": self.dtype,
                "calls": self.calls, "total_us": round(self.total_us, 3),
                "mean_us": round(self.mean_us, 3), "share": round(self.share, 6),
                "target": self.target, "kind": self.kind, "compiled_us": r(self.compiled_us),
                "source": self.source, "module": self.module, "task_key": self.task_key,
                "reason": self.reason, "floor_us": r(self.floor_us),
                "headroom_us": round(self.headroom_us, 3), "headroom_note": self.headroom_note,
                "compile_error": self.compile_error}


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
    busy = busy_note(device)  # before our own timing loops add to the load
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
                out = gm[0](*ins)
                # eager is what the model calls (its calls undecomposed, or the pattern's op)
                # where that reproduces the region, not Inductor's decomposition of it
                # (regions/eager.py says why)
                native = eager_function(t, ins, list(out) if isinstance(out, (tuple, list)) else [out])
                fn = native[0] if native is not None else gm[0]
                mean = timer(lambda: fn(*ins), budget_s=budget_s)
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
    notes = [busy] if busy else []
    tasks = {r.task.key: r.task for r in records}
    # torch.compile of the heaviest regions alone (bare GEMMs/convs are the vendor's: skipped)
    heavy = [r for r in rows if r.target and not vendor_op(tasks[r.task_key])]
    for row in heavy[:max(0, compile_top)]:
        gm, ins = gms[row.task_key]
        try:
            fn = torch.compile(gm, dynamic=False)
            with torch.inference_mode():
                row.compiled_us = timer(lambda: fn(*ins), budget_s=budget_s)
        except Exception as e:  # Inductor unavailable (no C++ compiler, ...): said per row and once
            why = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            row.compile_error = why
            msg = f"torch.compile of a region failed: {why}"
            if msg not in notes:
                notes.append(msg)
    _headroom(rows, tasks, device)
    order = {id(r): k for k, r in enumerate(rows)}
    rows.sort(key=lambda r: (not r.target, -r.headroom_us, order[id(r)]))
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


BUSY_LOAD = 1.5  # load average per usable CPU above which the CPU's times are called noisy


def busy_note(device: str) -> str | None:
    """A note when the CPU that times this profile is already busy: wall-clock times there come
    in scheduler ticks and the ranking can be off (a 2-core machine running a test suite beside
    kforge gave regions in 4 ms steps). Only said, never acted on: candidates are re-timed side
    by side in the sandbox, which sees the same load in its references."""
    if not device.startswith("cpu"):
        return None
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load <= BUSY_LOAD * cpus:
        return None
    return (f"this machine is busy (load {load:.1f} on {cpus} CPU{'s' * (cpus != 1)}): CPU times are noisy "
            "and the ranking may be off; candidates are still timed side by side with their references")


def _headroom(rows: list[ProfileRow], tasks: dict, device: str) -> None:
    """Each target row's floor and headroom against torch.compile (regions/floor.py). A row
    whose compiled time was not measured is estimated from its eager time and the median
    compiled/eager ratio of the rows that were (marked "estimated")."""
    import math

    from kforge_tui.regions import floor as F

    ratios = sorted(r.compiled_us / r.mean_us for r in rows if r.target and r.compiled_us and r.mean_us)
    ratio = ratios[len(ratios) // 2] if ratios else 1.0
    bw, peaks = machine_rates(device), {}
    for r in rows:
        t = tasks.get(r.task_key)
        if not r.target or t is None:
            continue
        if F.flops(t) and t.dtype not in peaks:
            peaks[t.dtype] = peak_tflops(device, t.dtype)
        fl = F.floor(t, bw, peaks.get(t.dtype))
        r.floor_us = fl.us
        vendor = F.vendor_op(t)
        if vendor:
            r.headroom_us, r.headroom_note = 0.0, f"vendor {vendor}, at its roofline"
            continue
        compiled = r.compiled_us if r.compiled_us else r.mean_us * ratio
        # a tiny region compiled alone is mostly its call's overhead (30-60 us on a cpu against
        # 13 us eager): in the model it costs no more than eager, so that bounds what is won
        compiled = min(compiled, r.mean_us) if r.mean_us else compiled
        r.headroom_us = F.headroom(compiled, fl.us, r.calls)
        if compiled <= F.AT_FLOOR * fl.us:
            r.headroom_us, r.headroom_note = 0.0, "at its floor"
        elif not r.compiled_us:
            r.headroom_note = "estimated"
        if not math.isfinite(r.headroom_us):
            r.headroom_us = 0.0


_RATES: dict = {}


def machine_rates(device: str) -> float:
    """Bandwidth of this machine in GB/s, measured once per process, for the profile's floor:
    on a GPU a large copy's read + write bytes (best of 5); on the cpu the sandbox's own
    lower bound (device.cpu_bandwidth), so a floor is never above an eager time."""
    key = ("bw", str(device))
    if key in _RATES:
        return _RATES[key]
    if not str(device).startswith("cuda"):
        from kforge_tui.device import cpu_bandwidth

        _RATES[key] = cpu_bandwidth(torch.get_num_threads())[0]
        return _RATES[key]
    src = torch.ones(2**28, device=device)  # float32: 1 GiB
    dst = torch.empty_like(src)
    best = 0.0
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        best = max(best, 2 * src.numel() * 4 / max(a.elapsed_time(b) / 1e3, 1e-9) / 1e9)
    _RATES[key] = best
    return _RATES[key]


def peak_tflops(device: str, dtype: str) -> float | None:
    """The matrix rate torch.mm reaches here in `dtype` (a square product, best of 3): the
    vendor library's roofline, what a GEMM's compute floor is measured against."""
    key = ("mm", str(device), dtype)
    if key not in _RATES:
        cuda = str(device).startswith("cuda")
        dt = torch_dtype(dtype) if dtype in ("float32", "float16", "bfloat16", "float64") else torch.float32
        if not cuda and dt in (torch.float16, torch.bfloat16):
            dt = torch.float32
        n = 8192 if cuda else 512
        try:
            a = torch.randn(n, n, device=device).to(dt)
            b = torch.randn(n, n, device=device).to(dt)
            torch.mm(a, b)
            best = 0.0
            for _ in range(3):
                if cuda:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    torch.mm(a, b)
                    e1.record()
                    e1.synchronize()
                    s = e0.elapsed_time(e1) / 1e3
                else:
                    t0 = time.perf_counter()
                    torch.mm(a, b)
                    s = time.perf_counter() - t0
                best = max(best, 2 * n ** 3 / max(s, 1e-9) / 1e12)
            _RATES[key] = best
        except Exception:  # noqa: BLE001 - no compute floor rather than no profile
            _RATES[key] = None
    return _RATES[key]


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
    # on a GPU the regions are timed with CUDA events (device time); on the CPU with a wall
    # clock around each call, which is not the process's CPU time (threads, waits)
    unit = "device" if profile.device.startswith("cuda") else "wall-clock"
    header = ("", "region", "kind", "shapes", "dtype", "calls", "total µs", "mean µs", "compiled µs",
              "floor µs", "headroom µs", "share", "source")
    table = [header]
    for r in rows:
        comp = f"{r.compiled_us:.1f}" if r.compiled_us is not None else \
            ("failed" if r.compile_error else "-")
        src = r.source if r.target else f"{r.reason} ({r.source})" if r.source else r.reason
        if r.compile_error:
            src = f"Inductor: {r.compile_error} ({src})"
        fl = f"{r.floor_us:.1f}" if r.floor_us is not None else "-"
        hr = "-" if not r.target else f"{'~' if r.headroom_note == 'estimated' else ''}{r.headroom_us:.1f}"
        if r.target and r.headroom_note and r.headroom_note != "estimated":
            hr = f"0 ({r.headroom_note})"
        table.append(("*" if r.target else "", r.op, r.kind, _fmt_shapes(r.shapes), r.dtype,
                      str(r.calls), f"{r.total_us:.1f}", f"{r.mean_us:.1f}", comp, fl, hr,
                      f"{100 * r.share:.1f}%", src[:70]))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {5, 6, 7, 8, 9, 10, 11}
    lines = []
    for row in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    shown = f"top {len(rows)} of {len(profile.rows)} rows" if top and top < len(profile.rows) \
        else f"{len(rows)} rows"
    lines.append("")
    lines.append(f"forward: {profile.total_us / 1000:.3f} ms {unit} time on {profile.device} (eager, "
                 f"median); {shown}; * = kernel target; compiled = torch.compile of the region alone; "
                 "headroom = (compiled - floor) x calls, what a kernel could win over torch.compile "
                 "(~ estimated from eager); rows ranked by it")
    lines.extend(profile.notes)
    return "\n".join(lines)
