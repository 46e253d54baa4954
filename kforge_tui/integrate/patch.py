"""Put a run's verified winners into a live model: `apply(model, run_dir)` / `remove(model)`.

This module decides *which* kernels go in (read from the run store, gated by measured speedup,
built with the sandbox compiler); `loader.py` does the routing at call time and is the part
that also ships inside exports. The model's source is never edited and no new class is needed:
see loader.py for the mechanism and why.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from kforge_tui.errors import UsageError
from kforge_tui.integrate import loader

COMPILE_TIMEOUT_S = 300.0
# What a call through the wrapper costs beyond the kernel time the search measured (key lookup
# and checks ~0.9 us, output alloc/free ~1.2 us, ctypes call ~1.3 us: ~4 us over eager's own
# dispatch, measured on the loaded 2-core CI CPU). On cuda the host cost overlaps device work
# unless the model is launch-bound; the end-to-end check is the final word.
CALL_OVERHEAD_US = {"cpu": 4.0, "cuda": 2.0}


@dataclass
class Prepared:
    """Kernel specs ready for loader.Kernel, and why the other tasks were left to PyTorch."""

    specs: list[dict] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # task_id -> reason
    n_tasks: int = 0
    device: dict = field(default_factory=dict)  # the run's device facts (what it was verified on)
    message: str = ""


def winners(run_dir, *, min_speedup: float = 1.02, ops: list[str] | None = None):
    """(task rows worth integrating with their winning source, skipped {task_id: reason}, run info)."""
    from kforge_tui.store import RunStore
    from kforge_tui.workload import catalogue

    if ops is not None:
        for op in ops:
            catalogue.get(op)  # UsageError naming the known ops
    store = RunStore.open(run_dir, readonly=True)
    try:
        info = store.run_info()
        rows, skipped = [], {}
        tasks = store.tasks()
        for t in tasks:
            tid = t["task_id"]
            if ops is not None and t["op"] not in ops:
                skipped[tid] = f"op {t['op']} not selected"
            elif not t["verified"] or t["best_node"] is None:
                skipped[tid] = "no verified kernel"
            elif t["op"] not in loader.OP_INPUTS:
                skipped[tid] = f"no call-site integration for {t['op']} yet"
            elif (t["speedup"] or 0.0) < min_speedup:
                skipped[tid] = (f"measured speedup {t['speedup'] or 0:.2f}x is below the "
                                f"{min_speedup:.2f}x gate (left to PyTorch so the model is not slowed)")
            elif _with_overhead(t) < min_speedup:
                skipped[tid] = (f"speedup {t['speedup']:.2f}x falls to {_with_overhead(t):.2f}x once the "
                                f"~{_overhead(t):.0f} us per-call dispatch cost is added: below the "
                                f"{min_speedup:.2f}x gate, left to PyTorch")
            else:
                node = store.node(t["best_node"])
                if not node.get("source"):
                    skipped[tid] = f"best node {t['best_node']} has no source"
                else:
                    rows.append(dict(t, source=node["source"]))
        return rows, skipped, info, len(tasks)
    finally:
        store.close()


def _overhead(t: dict) -> float:
    return CALL_OVERHEAD_US.get((t.get("task") or {}).get("backend", "cpu"), 2.0)


def _with_overhead(t: dict) -> float:
    """The task's speedup once the wrapper's per-call cost is added to the kernel's time."""
    base, best = t.get("baseline_us"), t.get("best_us")
    if not base or not best:
        return t["speedup"] or 0.0
    return base / (best + _overhead(t))


def spec_for(task_json: dict, lib_path: str, row: dict) -> dict:
    """What loader.Kernel needs about one task: no kforge import is needed to use it."""
    from kforge_tui.task import Task
    from kforge_tui.workload import catalogue

    task = Task.from_json(task_json)
    sig = catalogue.signature(task)
    return {"task_id": task.task_id, "op": task.op, "backend": task.backend,
            "signature": [[p.name, p.kind] for p in sig.params],
            "scalars": catalogue.scalar_args(task),
            "inputs": [m.to_json() for m in task.inputs], "output": task.output.to_json(),
            "params": task.params, "lib": str(lib_path), "dtype": task.dtype,
            "shape": list(task.shape), "speedup": row.get("speedup"),
            "baseline_us": row.get("baseline_us"), "best_us": row.get("best_us"),
            "node": row.get("best_node")}


def build(source: str, backend: str, arch: str, cache_dir: Path) -> str:
    """Compile one winner with the sandbox compiler (cached by hash in RUN_DIR/cache)."""
    from kforge_tui.sandbox.compile import compile_candidate_sync

    res = compile_candidate_sync(source, backend, arch, cache_dir, COMPILE_TIMEOUT_S)
    if not res.ok:
        why = res.message or ((res.log or "").strip().splitlines() or ["no compiler output"])[-1]
        raise RuntimeError(f"compile failed: {why[:200]}")
    return str(res.lib_path)


def prepare(run_dir, *, min_speedup: float = 1.02, ops: list[str] | None = None,
            arch: str | None = None) -> Prepared:
    """Choose the winners of RUN_DIR worth integrating and build them for this machine."""
    from kforge_tui.device import cuda_available, device_info

    rows, skipped, info, n = winners(run_dir, min_speedup=min_speedup, ops=ops)
    prep = Prepared(skipped=skipped, n_tasks=n, device=info.get("device") or {})
    cache = Path(run_dir) / "cache"
    for row in rows:
        tj = row["task"]
        backend = tj.get("backend", "cpu")
        if backend == "cuda" and not cuda_available():
            prep.skipped[row["task_id"]] = "a cuda kernel, and no CUDA GPU is visible here"
            continue
        try:
            lib = build(row["source"], backend, arch or device_info(backend).arch, cache)
            prep.specs.append(spec_for(tj, lib, row))
        except Exception as e:  # one bad winner must not stop the others from going in
            prep.skipped[row["task_id"]] = f"{type(e).__name__}: {e}"
    if not prep.specs:
        why = "; ".join(f"{k}: {v}" for k, v in list(prep.skipped.items())[:3])
        prep.message = (f"no verified kernel to apply from {run_dir} ({n} task(s)"
                        + (f"; {why}" if why else "") + "); the model is unchanged")
    else:
        prep.message = f"{len(prep.specs)} of {n} task(s) integrated"
    return prep


class Patch:
    """An applied run: which kernels are active and how often they were called. Undo with
    `remove()` or by leaving a `with` block."""

    def __init__(self, model, runtime: loader.Runtime | None, prep: Prepared):
        self.model = model
        self.runtime = runtime
        self.skipped = dict(prep.skipped)
        self.message = prep.message
        self.kernels: list[dict] = [
            {k: s[k] for k in ("task_id", "op", "shape", "dtype", "params", "speedup", "baseline_us",
                               "best_us", "node", "backend")} for s in prep.specs]

    @property
    def active(self) -> bool:
        return self.runtime is not None and loader.runtime_of(self.model) is self.runtime

    @property
    def counts(self) -> dict[str, int]:
        """task_id -> calls that ran the kernel (live)."""
        return self.runtime.counts if self.runtime else {}

    @property
    def fallbacks(self) -> dict[str, int]:
        """'op [shape] dtype: reason' -> calls of a patched op that went to PyTorch."""
        return self.runtime.fallbacks if self.runtime else {}

    def remove(self) -> None:
        if self.active:
            loader.uninstall(self.model)

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<kforge Patch: {self.message}>"


def apply(model, run_dir, *, min_speedup: float = 1.02, ops: list[str] | None = None) -> Patch:
    """Make `model` call RUN_DIR's verified kernels for the exact op/shape/dtype they won on.

    With nothing to apply this is a no-op that says so (a warning and `Patch.message`); the
    CLI turns that into exit 1.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"apply() needs a torch.nn.Module, got {type(model).__name__}")
    prep = prepare(run_dir, min_speedup=min_speedup, ops=ops)
    if not prep.specs:
        warnings.warn(prep.message, stacklevel=2)
        loader.uninstall(model)
        return Patch(model, None, prep)
    runtime = loader.Runtime([loader.Kernel(s) for s in prep.specs])
    loader.install(model, runtime)
    return Patch(model, runtime, prep)


def remove(model) -> None:
    """Undo apply() on `model` (a no-op when nothing is applied)."""
    loader.uninstall(model)
