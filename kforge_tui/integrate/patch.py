"""Put a run's verified winners into a live model: `apply(model, run_dir)` / `remove(model)`.

This module decides *which* kernels go in (read from the run store, gated by measured speedup
against what they replace, built with the sandbox compiler); `runtime.py` does the rest — the
torch.compile backend, the custom op and the graph rewrite — and is the part that also ships
inside exports. The model's source is never edited.

Which kernels go in is decided on the whole model (decide.py, run by the end-to-end check at
the end of `optimize` and by `kforge apply`), and recorded per mode in the run store: `apply`
puts in exactly the kernels that decision kept. Region figures only choose the candidates the
decision tries: a region's kernel must beat what it replaces on the region clock (device time
on cuda), by `min_speedup`.

Modes:
  * "compile" (default): the model is compiled in place with the kforge backend; candidates
    beat torch.compile's own version of their region (Inductor's kernels, timed in the same
    worker on the same clock), since everything around them is Inductor's;
  * "eager": the same graph rewrite with the rest of the graph run eagerly, for when Inductor
    cannot compile the model; candidates beat eager PyTorch.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from kforge_tui.errors import UsageError
from kforge_tui.integrate import runtime as rt

COMPILE_TIMEOUT_S = 300.0


@dataclass
class Prepared:
    """Kernel specs ready for runtime.Kernel, and why the other tasks were left out."""

    specs: list[dict] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # task_id -> reason
    n_tasks: int = 0
    device: dict = field(default_factory=dict)  # the run's device facts (what it was verified on)
    mode: str = "compile"
    message: str = ""


def _gate(t: dict, mode: str, min_speedup: float) -> str:
    """Why task row `t` is not integrated in `mode` ("" when it is)."""
    best, eager, comp = t.get("best_us"), t.get("baseline_us"), t.get("compiled_us")
    if not best:
        return "no timed kernel"
    if mode == "compile" and comp:
        if comp / best < min_speedup:
            return (f"{best:.3g} us is not {min_speedup:.2f}x faster than torch.compile's "
                    f"{comp:.3g} us for this region (left to Inductor)")
        return ""
    if not eager or eager / best < min_speedup:
        return (f"measured {eager / best if eager else 0:.2f}x over eager is below the "
                f"{min_speedup:.2f}x gate (left to PyTorch)")
    return ""


def _integrable(store, t: dict) -> tuple[dict, str]:
    """Task row `t` with its best node in a language integration can put in for the task, and
    "" or why there is none. A task's own ABI language always goes in (a `.cu`/`.cpp` library
    the region op loads); on a GPU a Triton kernel does too (triton_region.py: Inductor
    launches it), so an `auto` search's Triton winner (Inductor's seed or a move from it) is
    what goes in. A CPU task's Triton candidates ran under Triton's interpreter, which no
    compiled model can call: there the best kernel in the task's own language goes in, gated on
    its own time."""
    backend = (t.get("task") or {}).get("backend") or "cuda"
    if t.get("best_lang") in (None, backend) or (t.get("best_lang") == "triton" and backend == "cuda"):
        return t, ""
    got = store.best_in_language(t["task_id"], backend)
    if got is None:
        return t, (f"its verified kernels are {t['best_lang']}, which kforge cannot put into a model yet "
                   f"(only {backend} kernels go in)")
    node, us = got
    return dict(t, best_node=node, best_us=us, best_lang=backend,
                speedup=(t["baseline_us"] / us) if t.get("baseline_us") and us else None), ""


def recorded_decision(info: dict, mode: str, inductor_mode: str | None) -> dict | None:
    """The whole-model decision recorded for `mode` / `inductor_mode`, or None."""
    from kforge_tui.integrate.decide import decision_key

    return ((info.get("end_to_end") or {}).get("decisions") or {}).get(decision_key(mode, inductor_mode))


def winners(run_dir, *, min_speedup: float = 1.02, ops: list[str] | None = None,
            mode: str = "compile", inductor_mode: str | None = None, decided: bool = True):
    """(task rows worth integrating with their winning source, skipped {task_id: reason},
    run info, number of tasks)."""
    from kforge_tui.regions.task import Task
    from kforge_tui.store import RunStore
    from kforge_tui.workload.select import matches

    store = RunStore.open(run_dir, readonly=True)
    try:
        info = store.run_info()
        rows, skipped = [], {}
        tasks = store.tasks()
        decision = recorded_decision(info, mode, inductor_mode) if decided else None
        dropped = {t["task_id"]: t.get("why", "") for t in (decision or {}).get("trials", [])
                   if not t.get("kept")}
        if ops:
            known = [Task.from_json(t["task"]) for t in tasks]
            unknown = [o for o in ops if not any(matches(k, o) for k in known)]
            if unknown:
                raise UsageError(f"no task of {run_dir} matches {', '.join(unknown)}; it has: "
                                 f"{', '.join(sorted({t['op'] for t in tasks}))}")
        for t in tasks:
            tid = t["task_id"]
            task = Task.from_json(t["task"])
            why = ""
            if ops and not any(matches(task, o) for o in ops):
                why = f"{t['op']} not selected"
            elif not t["verified"] or t["best_node"] is None:
                why = "no verified kernel"
            else:
                t, why = _integrable(store, t)
                why = why or _gate(t, mode, min_speedup)
            if not why and decided:
                if decision is None:
                    why = (f"the whole model has not been measured with it in {mode} mode "
                           f"({inductor_mode or 'default'}) yet: `kforge apply RUN_DIR MODEL` decides")
                elif tid not in decision.get("kept", []):
                    why = "dropped by the whole-model check: " + (dropped.get(tid) or "not tried")
            if why:
                skipped[tid] = why
                continue
            node = store.node(t["best_node"])
            if not node.get("source"):
                skipped[tid] = f"best node {t['best_node']} has no source"
            else:
                rows.append(dict(t, source=node["source"]))
        return rows, skipped, info, len(tasks)
    finally:
        store.close()


def spec_for(task_json: dict, lib_path: str, row: dict) -> dict:
    """What runtime.Kernel needs about one task: no kforge import is needed to use it."""
    from kforge_tui.regions.task import Task

    task = Task.from_json(task_json)
    return {"task_id": task.task_id, "key": task.key, "op": task.op, "kind": task.kind,
            "backend": task.backend, "graph": task.graph,
            "inputs": [m.to_json() for m in task.inputs],
            "outputs": [m.to_json() for m in task.outputs], "lib": str(lib_path),
            "dtype": task.dtype, "shape": list(task.shape), "speedup": row.get("speedup"),
            "baseline_us": row.get("baseline_us"), "compiled_us": row.get("compiled_us"),
            "best_us": row.get("best_us"), "node": row.get("best_node"),
            "calls": task.calls, "site_key": task.site_key, "site_keys": list(task.site_keys)}


def triton_spec(row: dict, cache_dir: Path) -> dict:
    """The spec of a Triton winner: its source checked again (it is about to be imported into
    this process) and written where Triton and Inductor read a kernel's source from."""
    import hashlib

    from kforge_tui.device import cuda_available
    from kforge_tui.sandbox import triton_check

    if not cuda_available():
        raise RuntimeError("a Triton kernel, and no CUDA GPU is visible here (Inductor launches "
                           "Triton kernels on a GPU only)")
    rep = triton_check.check_source(row["source"])
    if not rep.ok:
        raise RuntimeError(f"its source no longer passes the Triton check: {rep.diagnostics[0].text()}")
    path = cache_dir / "triton" / (f"{row['task_id']}_"
                                   f"{hashlib.sha1(row['source'].encode()).hexdigest()[:12]}.py")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(row["source"])
    return dict(spec_for(row["task"], "", row), lang="triton", source_path=str(path), device="cuda")


def build(source: str, task, arch: str, cache_dir: Path) -> str:
    """Compile one winner with the sandbox compiler (cached by hash in RUN_DIR/cache)."""
    from kforge_tui.sandbox.compile import compile_candidate_sync

    res = compile_candidate_sync(source, task.backend, arch, cache_dir, COMPILE_TIMEOUT_S,
                                 header=task.header())
    if not res.ok:
        why = res.message or ((res.log or "").strip().splitlines() or ["no compiler output"])[-1]
        raise RuntimeError(f"compile failed: {why[:200]}")
    return str(res.lib_path)


def prepare(run_dir, *, min_speedup: float = 1.02, ops: list[str] | None = None,
            arch: str | None = None, mode: str = "compile", inductor_mode: str | None = None,
            decided: bool = True) -> Prepared:
    """Build for this machine the winners of RUN_DIR that go in (`decided`: those the recorded
    whole-model decision kept; else every candidate the region figures admit)."""
    from kforge_tui.device import cuda_available, device_info
    from kforge_tui.regions.task import Task

    if mode not in rt.MODES:
        raise UsageError(f"mode must be one of {', '.join(rt.MODES)}, not {mode!r}")
    rows, skipped, info, n = winners(run_dir, min_speedup=min_speedup, ops=ops, mode=mode,
                                     inductor_mode=inductor_mode, decided=decided)
    prep = Prepared(skipped=skipped, n_tasks=n, device=info.get("device") or {}, mode=mode)
    cache = Path(run_dir) / "cache"
    for row in rows:
        task = Task.from_json(row["task"])
        if row.get("best_lang") == "triton" or task.backend == "triton":
            try:
                prep.specs.append(triton_spec(row, cache))
            except Exception as e:  # noqa: BLE001 - one bad winner must not stop the others
                prep.skipped[row["task_id"]] = f"{type(e).__name__}: {e}"
            continue
        if task.backend == "cuda" and not cuda_available():
            prep.skipped[row["task_id"]] = "a cuda kernel, and no CUDA GPU is visible here"
            continue
        if task.backend not in ("cuda", "cpu"):
            prep.skipped[row["task_id"]] = f"no integration for {task.backend} kernels here"
            continue
        try:
            lib = build(row["source"], task, arch or device_info(task.backend).arch, cache)
            prep.specs.append(spec_for(row["task"], lib, row))
        except Exception as e:  # one bad winner must not stop the others from going in
            prep.skipped[row["task_id"]] = f"{type(e).__name__}: {e}"
    if not prep.specs:
        why = "; ".join(f"{k}: {v}" for k, v in list(prep.skipped.items())[:3])
        prep.message = (f"no verified kernel to apply from {run_dir} ({n} task(s)"
                        + (f"; {why}" if why else "") + "); the model is unchanged")
    else:
        prep.message = f"{len(prep.specs)} of {n} task(s) integrated ({mode} mode)"
    return prep


def backend_of(prep: Prepared) -> str:
    return prep.specs[0]["backend"] if prep.specs else "cpu"


class Patch:
    """An applied run: which kernels are in and how often they ran. Undo with `remove()` or by
    leaving a `with` block (the model is then uncompiled again)."""

    def __init__(self, model, runtime: rt.Runtime | None, prep: Prepared):
        self.model = model
        self.runtime = runtime
        self.mode = prep.mode
        self.skipped = dict(prep.skipped)
        self.message = prep.message
        self.kernels: list[dict] = [
            {k: s.get(k) for k in ("task_id", "op", "kind", "shape", "dtype", "speedup",
                                   "baseline_us", "compiled_us", "best_us", "node", "backend")}
            | {"lang": s.get("lang") or s.get("backend")} for s in prep.specs]

    @property
    def active(self) -> bool:
        return self.runtime is not None and rt.runtime_of(self.model) is self.runtime

    @property
    def counts(self) -> dict[str, int]:
        """task_id -> calls that ran the kernel (live)."""
        return self.runtime.counts if self.runtime else {}

    @property
    def fallbacks(self) -> dict[str, int]:
        return self.runtime.fallbacks if self.runtime else {}

    def remove(self) -> None:
        if self.active:
            rt.uninstall(self.model)

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<kforge Patch: {self.message}>"


def apply(model, run_dir, *, mode: str = "compile", inductor_mode: str | None = None,
          min_speedup: float = 1.02, ops: list[str] | None = None, force: bool = False) -> Patch:
    """Compile `model` in place so that the kernels RUN_DIR's whole-model check kept run for the
    exact regions, shapes, dtypes and strides they won on; everything else is torch.compile's
    (or eager's).

    The kernels are those the recorded decision for this mode kept (the end of `optimize` and
    `kforge apply` record it; `kforge_tui.apply(..., example_inputs=...)` decides first when
    none is recorded); with none recorded nothing goes in.
    `force=True` puts in every candidate the region figures admit, with no whole-model decision
    (to debug a kernel inside the model; the model may then be slower than torch.compile).
    With nothing to apply in compile mode the model is still compiled (the user asked for the
    compiled model) and a warning says no kernel went in; in eager mode it is left unchanged.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"apply() needs a torch.nn.Module, got {type(model).__name__}")
    prep = prepare(run_dir, min_speedup=min_speedup, ops=ops, mode=mode, inductor_mode=inductor_mode,
                   decided=not force)
    if not prep.specs:
        warnings.warn(prep.message, stacklevel=2)
        rt.uninstall(model)
        if mode == "eager":
            return Patch(model, None, prep)
    runtime = rt.Runtime([rt.kernel_for(s) for s in prep.specs])
    rt.install(model, runtime, backend_of(prep), mode=mode, inductor_mode=inductor_mode)
    return Patch(model, runtime, prep)


def remove(model) -> None:
    """Undo apply() on `model` (a no-op when nothing is applied)."""
    rt.uninstall(model)
