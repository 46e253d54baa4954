"""Capture a model's regions and the real tensors each one sees, in one compiled forward.

The model runs once through torch.compile with kforge's capture backend (regions/trace.py): for
every graph dynamo captures (graph breaks give several), the aten-level inference graph
Inductor would generate code for is partitioned into regions (regions/partition.py) and run
eagerly by an interpreter that keeps the inputs and outputs of each region. Regions with the
same graph and the same input/output shapes, dtypes and strides are one task (a transformer's
24 identical norms are one task with 24 calls).

What is kept per task: the first `max_calls` calls (inputs and outputs), while they fit in
`max_bytes_per_task` (CAPTURE_CAP by default); a call that does not fit is summarised instead
(value statistics and a checksum of the real bytes), so verification can draw inputs in the same
range and the user is told that it did, with the cap in force and why. The first call is kept
whenever its inputs fit the cap (its outputs too when they also fit; else they are computed
again from its inputs when saved): a task has a real call unless a single call's inputs are
over the cap (issue 20). Nothing is skipped silently: unsupported regions and over-budget calls
are listed with their reason.

The interpreter computes exactly what the graph computes (it is the graph, run eagerly), and
after the run each region's own graph is re-run on its captured inputs and must reproduce the
captured outputs bit for bit: the check that a task's reference is the model's own code.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.fx as fx

from kforge_tui.regions import partition as P
from kforge_tui.regions import trace
from kforge_tui.regions.build import task_from_spec, with_eager_graphs
from kforge_tui.regions.graph import run as run_graph
from kforge_tui.regions.meta import TensorStats
from kforge_tui.regions.task import Task, capture_dir, save_call

log = logging.getLogger("kforge.workload")

# Captured calls are written to the run directory and read back whole by every worker that
# evaluates the task (and kept in its memory while it does): 1 GiB a task keeps a model with a
# few dozen tasks within a laptop's disk and a worker's host memory. A call with bigger inputs
# (KernelBench's level-1 sizes) is verified on random draws matched to its value statistics.
CAPTURE_CAP = 1 << 30
CAPTURE_CAP_WHY = "captured tensors are written to the run directory and read back by every worker"


@dataclass
class TaskRecord:
    """One task as seen in the forward: its calls and what was kept of them."""

    task: Task
    calls: int = 0
    saved: list = field(default_factory=list)  # [(inputs list, outputs list or None)] kept tensors
    summarised: list = field(default_factory=list)  # [{"stats": [...], "sha1": str}] over budget
    bytes: int = 0
    first_index: int = 0  # order of first appearance (graph order)
    over: int = 0  # the largest input bytes of one summarised call (what the cap refused)


@dataclass
class Unsupported:
    label: str
    reason: str
    source: str
    calls: int = 1


@dataclass
class Traced:
    """What one forward through the capture backend found."""

    records: dict[str, TaskRecord]  # task key as traced (its first site's) -> record
    unsupported: list[Unsupported]
    skipped: list[tuple[str, str]]  # (what, why)
    graphs: int  # graphs dynamo captured (graph breaks + 1)
    ref_mismatch: dict[str, int] = field(default_factory=dict)  # task key -> calls not reproduced
    breaks: list[str] = field(default_factory=list)  # why dynamo broke the graph (one line each)
    layout_notes: list[str] = field(default_factory=list)  # what the layout probe could not see
    cap: int = CAPTURE_CAP  # bytes of real calls kept per task

    def record_of(self, task: Task) -> TaskRecord | None:
        """The record of a task, whichever layout or kernel language the task is in now."""
        return (self.records.get(task.site_key) or self.records.get(task.key)
                or self.records.get(task.with_backend(self._backend()).site_key))

    def _backend(self) -> str:
        return next((r.task.backend for r in self.records.values()), "cpu")

    def tasks(self) -> list[Task]:
        return [r.task for r in sorted(self.records.values(), key=lambda r: r.first_index)]


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _digest(t: torch.Tensor) -> str:
    """sha1 of the tensor's elements in logical order (on the CPU, in chunks)."""
    h = hashlib.sha1()
    flat = t.detach().reshape(-1)
    step = 1 << 24
    for i in range(0, flat.numel(), step):
        h.update(flat[i:i + step].contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _Recorder:
    def __init__(self, backend: str, max_calls: int, max_bytes: int, probe_layouts: bool = True):
        self.backend = backend
        self.max_calls, self.max_bytes = max_calls, max_bytes
        self.records: dict[str, TaskRecord] = {}
        self.unsupported: dict[tuple, Unsupported] = {}
        self.skipped: list[tuple[str, str]] = []
        self.graphs = 0
        self.probe_layouts = probe_layouts
        self.layouts: dict[str, list] = {}  # site key -> what Inductor handed each of its sites
        self.layout_notes: list[str] = []

    def hook(self, gm: fx.GraphModule, example_inputs, is_inference: bool, kwargs):
        self.graphs += 1
        if self.probe_layouts and is_inference:
            from kforge_tui.regions import layout

            seen, why = layout.observe(gm, example_inputs, kwargs, self.backend)
            for k, v in seen.items():
                self.layouts.setdefault(k, []).extend(v)
            if why:
                self.layout_notes.append(f"graph {self.graphs}: Inductor's layouts unknown ({why}); "
                                         "its regions keep the traced ones")
        part = P.partition(gm)
        self.skipped.extend(part.skipped)
        plans = []  # (spec, task key)
        for spec in part.regions:
            if spec.unsupported:
                key = (spec.label, spec.unsupported, trace.source_line(trace.source_node(spec.nodes)))
                if key in self.unsupported:
                    self.unsupported[key].calls += 1
                else:
                    self.unsupported[key] = Unsupported(spec.label, spec.unsupported, key[2])
                continue
            task = task_from_spec(spec, self.backend)
            if task is None:
                self.skipped.append((spec.label, "inputs or outputs are not tensors"))
                continue
            rec = self.records.get(task.key)
            if rec is None:
                task = with_eager_graphs(task, spec)
                rec = self.records[task.key] = TaskRecord(task, first_index=len(self.records))
            plans.append((spec, rec))
        mutated = {n.args[0] for n in gm.graph.nodes
                   if n.op == "call_function" and getattr(n.target, "_schema", None) is not None
                   and n.target._schema.is_mutable and n.args and isinstance(n.args[0], fx.Node)}
        return trace.boxed(_Runner(gm, plans, self, mutated).run)


class _Runner:
    """Runs one graph eagerly and records region inputs/outputs for the calls still wanted."""

    def __init__(self, gm, plans, rec: _Recorder, mutated: set):
        self.gm, self.plans, self.rec, self.mutated = gm, plans, rec, mutated

    def run(self, *args):
        rec = self.rec
        wanted = []
        planned: dict[int, int] = {}
        for spec, r in self.plans:
            r.calls += 1
            n = len(r.saved) + len(r.summarised) + planned.get(id(r), 0)
            if n < rec.max_calls:
                planned[id(r)] = planned.get(id(r), 0) + 1
                wanted.append((spec, r))
        need: set = set()
        for spec, _ in wanted:
            need.update(spec.inputs)
            need.update(spec.outputs)
        vals: dict = {}
        mutated = self.mutated

        class Interp(fx.Interpreter):
            def run_node(self, n):
                v = super().run_node(n)
                if n in need:
                    # a graph input the graph later overwrites in place must be copied now
                    vals[n] = v.clone() if (n in mutated and isinstance(v, torch.Tensor)) else v
                return v

        out = Interp(self.gm).run(*args)
        for spec, r in wanted:
            ins = [vals.get(i) for i in spec.inputs]
            outs = [vals.get(o) for o in spec.outputs]
            if any(not isinstance(t, torch.Tensor) for t in ins + outs):
                continue
            cost_in, cost_out = sum(_nbytes(t) for t in ins), sum(_nbytes(t) for t in outs)
            if r.bytes + cost_in + cost_out <= rec.max_bytes:
                r.saved.append(([t.detach() for t in ins], [t.detach() for t in outs]))
                r.bytes += cost_in + cost_out
            elif not r.saved and cost_in <= rec.max_bytes:  # a real call, its outputs made again
                r.saved.append(([t.detach() for t in ins], None))
                r.bytes += cost_in
            else:
                r.over = max(r.over, cost_in)
                r.summarised.append({"stats": [TensorStats.of(t).__dict__ for t in ins],
                                     "sha1": [_digest(t) if _nbytes(t) <= rec.max_bytes else None
                                              for t in ins],
                                     "values": [_held_values(t) for t in ins]})
        return out


# integer inputs up to this many elements keep their values when a call is summarised (over the
# capture cap): offsets and index lists are small next to the activations that were over it
HELD_MAX_NUMEL = 1 << 20


def _held_values(t):
    """A small integer/bool input's real values (offsets, indices): random sets keep them, since a
    uniform draw breaks their structure (sandbox/inputs.py RealValues)."""
    if (isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()
            and t.numel() <= HELD_MAX_NUMEL):
        return t.detach().to("cpu").reshape(-1).tolist()
    return None


def trace_model(loaded, backend: str = "cpu", *, max_calls: int = 3,
                max_bytes_per_task: int = CAPTURE_CAP, probe_layouts: bool = True) -> Traced:
    """One forward of `loaded` through the capture backend; the regions and their real calls,
    each task laid out as Inductor lays its region out in the compiled model (`probe_layouts`)."""
    from kforge_tui.errors import UsageError

    rec = _Recorder(backend, max_calls, max_bytes_per_task, probe_layouts)
    loaded.run()  # the model's own errors first, in its own terms (dynamo would log a trace)
    compiled = torch.compile(loaded.model, backend=trace.make_backend(rec.hook), dynamic=False)
    traced_model = replace(loaded, model=compiled)
    before = _break_counts()
    try:
        with trace.quiet_dynamo():
            traced_model.run()
    except UsageError as e:
        raise UsageError(f"{loaded.spec}: torch.compile could not capture the model's graph "
                         f"(its eager forward runs): {str(e).split('raised', 1)[-1].strip()}") from e
    traced = Traced(rec.records, list(rec.unsupported.values()), rec.skipped, rec.graphs,
                    breaks=_break_reasons(before, _break_counts()), layout_notes=rec.layout_notes,
                    cap=max_bytes_per_task)
    _check_references(traced)
    _apply_layouts(traced, rec.layouts)
    _merge_alike(traced, max_calls)
    _name_patterns(traced, loaded.device)
    return traced


def _apply_layouts(traced: Traced, layouts: dict[str, list]) -> None:
    """Each task takes the layout Inductor hands its region (regions/layout.py); its captured
    calls are laid out so when saved."""
    from kforge_tui.regions.layout import chosen_layout

    for key, r in traced.records.items():
        got = chosen_layout(layouts.get(key, []))
        if got is not None:
            r.task = r.task.with_layouts(*got)


def _merge_alike(traced: Traced, max_calls: int) -> None:
    """Records traced in different layouts that Inductor lays out alike are one task: one
    search, its calls counted together, and every site of it rewritten (the first record keeps
    them, its task serving the others' sites)."""
    first: dict[str, str] = {}  # task key -> the record key that keeps the task
    for rk, r in sorted(traced.records.items(), key=lambda kv: kv[1].first_index):
        keep = first.setdefault(r.task.key, rk)
        if keep == rk:
            continue
        k = traced.records.pop(rk)
        into = traced.records[keep]
        into.task = into.task.with_sites_of(k.task)
        into.calls += k.calls
        for call in k.saved:  # within the same limits the capture kept each record to
            cost = sum(_nbytes(t) for part in call if part for t in part)
            if len(into.saved) < max_calls and into.bytes + cost <= traced.cap:
                into.saved.append(call)
                into.bytes += cost
        into.summarised += k.summarised
        into.over = max(into.over, k.over)
        if rk in traced.ref_mismatch:
            traced.ref_mismatch[keep] = traced.ref_mismatch.get(keep, 0) + traced.ref_mismatch.pop(rk)


def _break_counts() -> dict[str, int]:
    """dynamo's own tally of graph breaks and of frames it gave up on (reason text -> count)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - an older or newer torch without it: no reasons, no harm
        return {}
    out: dict[str, int] = {}
    for group in ("graph_break", "unimplemented"):
        for k, v in dict(counters.get(group, {})).items():
            out[str(k)] = out.get(str(k), 0) + int(v)
    return out


def _break_reasons(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """One line per new reason: its title, dynamo's explanation and the model line it names."""
    import re

    out = []
    for text, n in after.items():
        if n <= before.get(text, 0):
            continue
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        title = lines[0] if lines else "graph break"
        expl = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Explanation:")), "")
        where = re.search(r'File "([^"]+)", line (\d+)', text)
        line = title if not expl or expl.rstrip(".") in title else f"{title}: {expl}"
        if where and "/torch/" not in where.group(1):
            line += f" ({Path(where.group(1)).name}:{where.group(2)})"
        if line not in out:
            out.append(line[:240])
    return out


def _name_patterns(traced: Traced, device: str) -> None:
    """Regions that are a named pattern (softmax, rms_norm, ...) take its name and binding."""
    from kforge_tui.regions import patterns

    for r in traced.records.values():
        try:
            b = patterns.match(r.task, device=str(device))
        except Exception as e:  # a matcher bug must not cost the region its generated kernels
            log.debug("pattern match failed for %s: %s", r.task.op, e)
            b = None
        if b is not None:
            r.task = replace(r.task, op=b.op_task.op, pattern=b.op_task.op,
                             params={"binding": b.to_json()})


def _check_references(traced: Traced) -> None:
    """Each task's graph must reproduce its captured outputs exactly (same device, same ops)."""
    for key, r in traced.records.items():
        bad = 0
        for ins, outs in r.saved:
            if outs is None:  # kept without its outputs (over the cap): nothing to reproduce
                continue
            try:
                got = run_graph(r.task.graph, ins)
            except Exception:
                bad += 1
                continue
            if len(got) != len(outs) or not all(
                    g.shape == o.shape and g.dtype == o.dtype and torch.equal(g, o)
                    for g, o in zip(got, outs)):
                bad += 1
        if bad:
            traced.ref_mismatch[key] = bad


def _laid_out(tensors: list, metas) -> list:
    """The captured tensors in the task's strides (same values): a task laid out as Inductor
    lays its region out is verified on real calls in that layout."""
    out = []
    for t, m in zip(tensors, metas):
        if isinstance(t, torch.Tensor) and m.present and m.stride is not None and tuple(t.stride()) != tuple(m.stride):
            t = torch.empty_strided(t.shape, m.stride, dtype=t.dtype, device=t.device).copy_(t)
        out.append(t)
    return out


def _mib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def _over_cap_note(r: TaskRecord, cap: int) -> str:
    """What the capture cap left out, in its own terms: the cap, why, and why these calls."""
    n = len(r.summarised)
    what = (f"inputs of {_mib(r.over)} a call" if r.over > cap else
            f"the task's {_mib(r.bytes)} kept already")
    return (f"{n} call{'s' if n > 1 else ''} over the {_mib(cap)} per-task capture cap ({what}; "
            f"the cap because {CAPTURE_CAP_WHY}) kept only as value statistics"
            + (" with a sha1 of the real bytes" if all(all(h for h in c["sha1"]) for c in r.summarised) else "")
            + " (random inputs are drawn from them)")


def save_captures(run_dir, tasks: list[Task], traced: Traced) -> dict[str, str]:
    """Write the kept calls of `tasks` under RUN_DIR/captures/<capture_id>/; returns a note per
    task id (what was kept, what was summarised) for the run log."""
    notes = {}
    by_region = {r.task.with_backend("cpu").site_key: r for r in traced.records.values()}
    for task in tasks:  # a region searched in another kernel language has the same calls
        r = traced.record_of(task) or by_region.get(task.with_backend("cpu").site_key)
        if r is None:
            continue
        d = capture_dir(run_dir, task.capture_id)
        Path(d).mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in Path(d).glob("call_*.pt"):
            stale.unlink()
        for k, (ins, outs) in enumerate(r.saved):
            laid = _laid_out(ins, task.inputs)
            if outs is None or any(a is not b for a, b in zip(laid, ins)):
                # the region's reference in this layout: PyTorch may round a reduction over
                # another memory order differently, and verification compares against this
                outs = run_graph(task.graph, laid)
            save_call(Path(d) / f"call_{k}.pt", laid, outs)
        note = f"{len(r.saved)} of {r.calls} call(s) captured"
        if r.summarised:
            import json

            (Path(d) / "summarised.json").write_text(json.dumps(r.summarised))
            note += "; " + _over_cap_note(r, traced.cap)
        if r.task.traced_strides:
            note += "; laid out as Inductor lays the region out in the compiled model"
        mism = next((n for k, n in traced.ref_mismatch.items() if traced.records.get(k) is r), 0)
        if mism:
            note += (f"; WARNING: the region's graph did not reproduce {mism} "
                     "captured output(s) exactly")
        notes[task.task_id] = note
    return notes
