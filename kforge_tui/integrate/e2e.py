"""End-to-end check: eager PyTorch, torch.compile and kforge side by side, on the whole model.

Runs the original model (eager), the model compiled by torch.compile (the user's alternative,
same Inductor mode) and the model compiled with the kforge backend. Which kernels are in the
kforge model is decided here, on the model (decide.py): each verified winner is added in order
of expected gain and kept only if the whole forward gets faster beyond the noise. The decision
is recorded in the run store (per mode), and `apply` / `export` use it; a run whose check never
ran integrates nothing until `kforge apply` runs it.

Outputs are checked on the example inputs and fresh ones (accuracy.py). The three forwards are
timed on two clocks (measure.py): latency (synchronised single forwards) and throughput
(back-to-back forwards, CUDA events), median and spread of each, plus triton's do_bench of the
same forwards as a cross-check where triton and a GPU are there.
"""
from __future__ import annotations

import shlex

from kforge_tui.integrate import accuracy, decide, measure
from kforge_tui.integrate import runtime as rt
from kforge_tui.integrate.patch import prepare

# Above this spread of a side the report calls the timing noisy: a first forward measured 1.26x
# at 47 % / 60 % spread where `kforge apply` measured 1.00x at 0.2 % / 0.4 % (H200, 2026-11-30).
NOISY_SPREAD = measure.NOISY_SPREAD


def _ms(s: measure.Samples, name: str) -> dict:
    return {"median_ms": s.median(name), "spread": s.spread(name), "n": len(s.times[name])}


def check_end_to_end(loaded, run_dir, *, fresh_inputs: int = 1, min_speedup: float = 1.02,
                     ops: list[str] | None = None, mode: str = "compile",
                     inductor_mode: str | None = None, log=None, record: bool = True) -> dict:
    """Decide on the whole model which of RUN_DIR's winners go in (`mode`, Inductor mode), then
    compare eager, torch.compile and kforge side by side.

    Returns DESIGN.md's `apply --json` fields plus detail: max_abs_err, max_rel_err,
    within_tolerance, eager_ms, compile_ms, patched_ms (on the decision clock), speedup (eager /
    kforge), speedup_vs_compile, mode, kernels_used {task_id: calls}, fallbacks, skipped
    {task_id: why}, decision (every candidate's in-model gain or why it was dropped), latency
    and throughput {eager|compile|kforge: median_ms, spread, n}, do_bench_ms, clock_agreement
    (measure.agreement: the decision clock over do_bench, each forward). `loaded.model`
    itself is left as it was.
    """
    import torch

    model, inputs = loaded.model, loaded.example_inputs
    rt.uninstall(model)
    im = inductor_mode or "default"
    prep = prepare(run_dir, min_speedup=min_speedup, ops=ops, mode=mode, decided=False)
    base = {"run_dir": str(run_dir), "model": loaded.spec, "message": prep.message, "skipped": dict(prep.skipped),
            "kernels": [], "kernels_used": {}, "fallbacks": {}, "mode": mode, "inductor_mode": im,
            "op_impl": "C++" if rt.native_status()["native"] else "python",
            "verified_tasks": prep.n_tasks - sum(1 for w in prep.skipped.values() if w == "no verified kernel")}
    device_type = "cuda" if str(getattr(loaded, "device", "cpu")).startswith("cuda") else "cpu"
    # With no kernel kept the kforge model is torch.compile itself (what `apply` installs then,
    # runtime.install): the same compiled forward as the baseline, timed beside it all the same.
    dec = decide.decide(loaded, prep.specs, mode=mode, inductor_mode=inductor_mode, log=log)
    skipped = dict(base["skipped"])
    for t in dec.trials:
        if not t.kept:
            skipped[t.task_id] = t.why
    if record and dec.trials:  # the decision took minutes: a run killed in the timing keeps it
        _record(run_dir, dict(base, decision=dec.to_json(), skipped=skipped,
                              message="the whole-model decision is recorded; the end-to-end check that follows "
                                      f"it did not finish (`kforge apply {shlex.quote(str(run_dir))} "
                                      f"{shlex.quote(str(loaded.spec))}` re-runs it)"))
    kept_specs = [s for s in prep.specs if s["task_id"] in dec.kept]
    kforge = dec.fn
    runtime = dec.runtime
    sets = [inputs] + [accuracy.fresh_like(inputs, seed) for seed in range(1, fresh_inputs + 1)]
    with decide._recompile_room(), rt._trace.quiet_dynamo():
        try:
            state = accuracy.State(model)
            ref, dropped = [accuracy.forward(model, sets[0], state)], []
            for i, s in enumerate(sets[1:], 1):
                try:
                    ref.append(accuracy.forward(model, s, state))
                except Exception as e:  # noqa: BLE001 - the model's own forward refused new values
                    dropped.append(f"fresh inputs {i}: not used, the original model's forward raised "
                                   f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
                    sets[i] = None
            sets = [s for s in sets if s is not None]
            if runtime is not None:
                runtime.reset_counts()
            got = [accuracy.forward(kforge, s, state) for s in sets]
            calls = dict(runtime.counts) if runtime is not None else {}
            # under CUDA graphs (reduce-overhead) a forward is a graph replay: the op ran when the
            # graph was recorded, during the decision's first forwards, and is counted there
            for t in dec.trials:
                if t.kept and not calls.get(t.task_id):
                    calls[t.task_id] = t.calls
            fallbacks = runtime.fallbacks if runtime is not None else {}
            cmp = accuracy.judge(model, sets, ref, got, state)
            cmp["notes"] += dropped
            fns = {"eager": model}
            if mode == "compile":
                fns["compile"] = dec.base_fn
            fns["kforge"] = kforge
            if log is not None:
                log(f"end to end: outputs checked on {len(sets)} input set(s); timing {', '.join(fns)} "
                    "on the latency and throughput clocks" + (" and do_bench" if device_type == "cuda" else ""))
            lat = measure.latency(fns, inputs, device_type)
            thr = measure.throughput(fns, inputs, device_type, max_rounds=measure.NOISY_ROUNDS)
            db = measure.do_bench(fns, inputs, device_type)
            state.restore()  # the model is left as it was
        finally:
            if runtime is not None:
                rt._RUNTIMES.pop(id(runtime), None)
    clock = thr if measure.DECISION_CLOCK == "throughput" else lat
    med = {k: clock.median(k) for k in fns}
    spreads = {k: clock.spread(k) for k in fns}
    kernels = [{"task_id": s["task_id"], "op": s["op"], "shape": s["shape"], "dtype": s["dtype"],
                "op_speedup": s["speedup"],
                "sites": runtime.replaced.get(s["task_id"], 0) if runtime else 0,
                "calls": calls.get(s["task_id"], 0),
                "model_gain": next((t.gain for t in dec.trials if t.task_id == s["task_id"]), None)}
               for s in kept_specs]
    comp = med.get("compile")
    report = dict(base, **cmp, skipped=skipped, eager_ms=med["eager"], compile_ms=comp,
                  patched_ms=med["kforge"],
                  speedup=med["eager"] / med["kforge"] if med["kforge"] > 0 else None,
                  speedup_vs_compile=(comp / med["kforge"]) if comp and med["kforge"] > 0 else None,
                  eager_spread=spreads["eager"], compile_spread=spreads.get("compile"),
                  patched_spread=spreads["kforge"], noisy=max(spreads.values()) > NOISY_SPREAD,
                  kernels=kernels, kernels_used={k: n for k, n in calls.items() if n},
                  # nothing kept: kforge's forward is torch.compile's own callable, timed twice
                  same_forward=kforge is fns.get("compile", fns["eager"]),
                  fallbacks=fallbacks, inputs_checked=len(sets), iters=len(clock.times["eager"]),
                  clock=clock.clock,
                  latency={k: _ms(lat, k) for k in fns}, throughput={k: _ms(thr, k) for k in fns},
                  do_bench_ms=db, clock_agreement=measure.agreement(clock, db), decision=dec.to_json(),
                  method=(f"decision and speedups on the {clock.clock} clock "
                          + ("(back-to-back forwards, cuda events around each, one sync per block of "
                             f"{len(thr.times['eager']) // max(1, len(thr.blocks.get('eager') or [1]))})"
                             if clock.clock == "throughput" else "(synchronised single forwards, wall clock)")
                          + f"; {'/'.join(fns)} alternated"))
    if record:
        _record(run_dir, report)
    return report


def _record(run_dir, report: dict) -> None:
    """Keep the report as the run's end-to-end result, and its decision beside those of other
    modes (apply and export read them)."""
    from kforge_tui.store import RunStore

    try:
        store = RunStore.open(run_dir)
    except Exception:  # noqa: BLE001 - a read-only run dir: the report is still returned
        return
    try:
        prev = store.run_info().get("end_to_end") or {}
        decisions = dict(prev.get("decisions") or {})
        d = report.get("decision") or {}
        decisions[decide.decision_key(d.get("mode", report["mode"]), d.get("inductor_mode"))] = d
        store.set_end_to_end(dict(report, decisions=decisions))
    finally:
        store.close()


def check_with_fallback(loaded, run_dir, mode: str | None, inductor_mode: str | None, log=None) -> dict:
    """The end-to-end check in the asked mode; with none asked, compile mode, and eager mode
    (with the reason) when torch.compile cannot compile the model."""
    from kforge_tui.errors import UsageError

    if mode:
        report = check_end_to_end(loaded, run_dir, mode=mode, inductor_mode=inductor_mode, log=log)
        report["mode_reason"] = f"--mode {mode}"
        return report
    try:
        report = check_end_to_end(loaded, run_dir, mode="compile", inductor_mode=inductor_mode, log=log)
        report["mode_reason"] = "default: kernels inside torch.compile"
        return report
    except UsageError:
        raise
    except Exception as e:  # Inductor could not compile this model: the eager rewrite still can
        why = f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
        report = check_end_to_end(loaded, run_dir, mode="eager", log=log)
        report["mode_reason"] = f"{why}; fell back to eager mode"
        return report


def apply(model, run_dir, example_inputs, *, mode: str = "compile", inductor_mode: str | None = None,
          min_speedup: float = 1.02, ops: list[str] | None = None):
    """`patch.apply`, after deciding on `model` itself (with `example_inputs`: a tuple of args or
    a dict of kwargs) when RUN_DIR has no decision recorded for this mode."""
    import torch

    from kforge_tui.integrate import patch
    from kforge_tui.store import RunStore
    from kforge_tui.workload.loader import LoadedModel

    store = RunStore.open(run_dir, readonly=True)
    try:
        decided = patch.recorded_decision(store.run_info(), mode, inductor_mode) is not None
    finally:
        store.close()
    if not decided:
        flat = accuracy.tensors_of(example_inputs)
        device = next((t.device for _, t in flat), torch.device("cpu"))
        check_end_to_end(LoadedModel(model, example_inputs, type(model).__name__, str(device)), run_dir,
                         mode=mode, inductor_mode=inductor_mode, min_speedup=min_speedup, ops=ops)
    return patch.apply(model, run_dir, mode=mode, inductor_mode=inductor_mode, min_speedup=min_speedup, ops=ops)
