"""Kernel quality (issue 7): the best kernel each `kforge optimize` run found, against eager PyTorch,
torch.compile, Liger-Kernel (where it has the op) and the memory-roofline floor.

    python bench/kernel_quality.py RUN_DIR [RUN_DIR ...] [--json OUT] [--reference FILE]

The best kernel is taken from each run's store (never re-derived) and evaluated again through
the product's own sandbox (`EvaluatorPool`): verification plus side-by-side timing with eager in
the same worker (CUDA events, L2 flushed, inputs rotated, median). torch.compile and the floor
come from the run's stored baseline (timed by the run's worker the same way; timed now if the run
skipped torch.compile); Liger is timed in this process with the same timing loop
(sandbox/bench.py) on the same kind of input sets. Ratios are what to read: each row's times come
from one process on one GPU within seconds of each other.

A rival timed in-harness pays its Python launch cost whenever the host cannot run ahead of the
GPU (a loaded host, Liger's autograd wrapper), so the verdict uses the stricter of that figure
and a reference figure for the same op, shape and dtype (`--reference`, by default
bench/reference_h200.json on an H200: DESIGN.md's do_bench figures); `†` marks a column where the
reference was the stricter one.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def liger_callable(task):
    """A closure running Liger's kernel for a region task bound to a named pattern (`fn(named)`
    with the pattern's inputs by name), or None where Liger has no such op."""
    from kforge_tui.regions import patterns

    b = patterns.binding_of(task) if hasattr(task, "graph") else None
    if b is None:
        return None
    return _liger_for_pattern(b.op_task)


def named_inputs(task, inputs: list) -> dict:
    """The pattern's named inputs (x, weight, ...) viewed out of the region's input tensors."""
    from kforge_tui.regions import patterns

    b = patterns.binding_of(task)
    out = {}
    for m in b.op_task.inputs:
        ref = b.inputs.get(m.name)
        if ref is None:
            out[m.name] = None
            continue
        i, off = ref
        src = inputs[i]
        out[m.name] = src.as_strided(tuple(m.shape), tuple(m.strides), src.storage_offset() + off)
    return out


def _liger_for_pattern(task):
    try:
        from liger_kernel.transformers import functional as LF
    except Exception as e:  # not installed: the column says so
        print(f"liger-kernel unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    p = task.params
    if task.op == "softmax" and p.get("dim") in (-1, len(task.shape) - 1) and task.output.dtype == task.dtype:
        return lambda t: LF.liger_softmax(t["x"])
    if task.op == "layer_norm" and t_has(task, "weight") and t_has(task, "bias"):
        return lambda t: LF.liger_layer_norm(t["x"], t["weight"], t["bias"], p["eps"])
    if task.op == "rms_norm" and t_has(task, "weight"):
        mode = "gemma" if p.get("variant") == "gemma" else "llama"
        off = 1.0 if p.get("variant") == "gemma" else 0.0
        return lambda t: LF.liger_rms_norm(t["x"], t["weight"], p["eps"], offset=off, casting_mode=mode,
                                           in_place=False)
    if task.op == "group_norm" and t_has(task, "weight") and t_has(task, "bias"):
        c = task.shape[1]
        return lambda t: LF.liger_group_norm(t["x"], t["weight"], t["bias"], c, p["groups"], p["eps"])
    if task.op == "silu_mul":
        return lambda t: LF.liger_swiglu(t["a"], t["b"])
    return None


def t_has(task, name):
    try:
        return task.input(name).present
    except KeyError:
        return False


def time_liger(task, run_dir, fn):
    """Liger timed in this process (CUDA events, L2 flushed, median) on the region's first
    captured call; its output is checked once against the region's reference."""
    import torch

    from kforge_tui.regions.task import load_calls
    from kforge_tui.workload.profile import _Timer, random_inputs

    calls = load_calls(run_dir, task.capture_id)[:1]
    inputs = ([x.cuda() if x is not None else None for x in calls[0]["inputs"]] if calls
              else random_inputs(task, "cuda"))
    named = named_inputs(task, inputs)
    with torch.inference_mode():
        try:
            got = fn(named)
            torch.cuda.synchronize()
        except Exception as e:
            return None, f"refused: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
        want = task.reference(inputs)[0]
        ok = torch.allclose(got.float().reshape(want.shape), want.float(), atol=4e-5, rtol=4e-4) \
            if want.dtype == torch.float32 else torch.allclose(got.float().reshape(want.shape),
                                                              want.float(), atol=3e-2, rtol=6e-2)
        t = _Timer("cuda")(lambda: fn(named), budget_s=0.4)
    return t, ("" if ok else "output differs beyond tolerance")


async def evaluate_run(run_dir: str, rows: list, with_liger: bool) -> None:
    from kforge_tui.evaluators import compile_cache_dir
    from kforge_tui.sandbox.pool import EvaluatorPool
    from kforge_tui.store import RunStore
    from kforge_tui.regions.task import Task

    store = RunStore.open(run_dir, readonly=True)
    pool = EvaluatorPool("cuda", cache_dir=compile_cache_dir())
    await pool.start()
    try:
        for t in store.tasks():
            task = Task.from_json(t["task"])
            row = {"run": run_dir, "task": task.task_id, "op": task.op, "shape": task.shape,
                   "dtype": task.dtype, "evaluated": t["evaluated"], "budget": t["budget"]}
            rows.append(row)
            base = t.get("baseline") or {}
            if not (base.get("compiled") or {}).get("median_us"):
                # the run did not time torch.compile: do it now, in the pool's worker
                b = await pool.baseline(task.to_json(), run_dir, with_compile=True)
                base = {"eager": {"median_us": b.eager.median_us},
                        "compiled": {"median_us": b.compiled.median_us} if b.compiled else None,
                        "floor_us": b.floor_us, "floor_note": b.floor_note}
            row["eager_us"] = (base.get("eager") or {}).get("median_us")
            row["compile_us"] = (base.get("compiled") or {}).get("median_us")
            row["floor_us"], row["floor_note"] = base.get("floor_us"), base.get("floor_note", "")
            if t["best_node"] is None:
                row["best_us"], row["note"] = None, "no verified kernel in the run"
            else:
                src = store.node(t["best_node"])["source"]
                res = await pool.evaluate(task.to_json(), run_dir, src)
                if not res.ok:
                    row["best_us"], row["note"] = None, f"best kernel failed re-evaluation: {res.message}"
                else:
                    row["best_us"] = res.timing.median_us
                    row["spread"] = res.timing.spread
                    row["eager_side_by_side_us"] = res.baseline.median_us
                    row["speedup"] = res.speedup
            if with_liger:
                fn = liger_callable(task)
                if fn is None:
                    row["liger_us"], row["liger_note"] = None, "no such op"
                else:
                    row["liger_us"], row["liger_note"] = await asyncio.to_thread(time_liger, task, run_dir, fn)
    finally:
        await pool.close()
        store.close()


def _x(a, b):
    return f"{a / b:6.2f}×" if (a and b) else "     —"


def load_reference(path: str | None) -> list[dict]:
    if not path:
        return []
    return json.loads(Path(path).read_text())["rows"]


def default_reference() -> str | None:
    """DESIGN.md's figures when the GPU is the one they were measured on."""
    try:
        import torch

        name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    except Exception:
        name = ""
    ref = ROOT / "bench" / "reference_h200.json"
    return str(ref) if "H200" in name and ref.exists() else None


def apply_reference(rows: list, reference: list[dict]) -> None:
    """Per row, keep the in-harness rival figures and set the stricter ones used for the verdict
    (`*_rival_us`, plus `*_from_reference` when the reference figure was lower)."""
    for r in rows:
        ref = next((x for x in reference if x["op"] == r["op"] and list(x["shape"]) == list(r["shape"])
                    and x["dtype"] == r["dtype"]), {})
        for k in ("compile", "liger"):
            ours, theirs = r.get(f"{k}_us"), ref.get(f"{k}_us")
            use = min(x for x in (ours, theirs) if x) if (ours or theirs) else None
            r[f"{k}_rival_us"] = use
            r[f"{k}_from_reference"] = bool(theirs) and use == theirs and theirs != ours


def render(rows: list) -> str:
    head = (f"{'op':<19} {'shape':<20} {'dtype':<8} {'floor µs':>9} {'best µs':>9} {'×eager':>7} "
            f"{'×compile':>9} {'×liger':>8} {'÷floor':>7}  beats all")
    out = [head, "-" * len(head)]
    wins, logs = 0, []
    for r in rows:
        best = r.get("best_us")
        eager_ref = r.get("eager_side_by_side_us") or r.get("eager_us")
        comp = r.get("compile_rival_us", r.get("compile_us"))
        lig = r.get("liger_rival_us", r.get("liger_us"))
        beats = bool(best) and best < (r.get("eager_us") or 0) and best < (comp or math.inf) \
            and best < (lig or math.inf)
        wins += beats
        if best and eager_ref:
            logs.append(math.log(eager_ref / best))
        shape = "x".join(str(s) for s in r["shape"])
        floor_mark = "*" if "twice" in (r.get("floor_note") or "") else " "
        out.append(f"{r['op']:<19} {shape:<20} {r['dtype']:<8} {(r.get('floor_us') or 0):8.1f}{floor_mark} "
                   f"{(best or 0):9.1f} {_x(eager_ref, best):>7} "
                   f"{_x(comp, best) + ('†' if r.get('compile_from_reference') else ' '):>9} "
                   f"{_x(lig, best) + ('†' if r.get('liger_from_reference') else ' '):>8} "
                   f"{_x(best, r.get('floor_us')):>7}  "
                   f"{'yes' if beats else 'no'} {r.get('note', '')}{' liger: ' + r['liger_note'] if r.get('liger_note') else ''}")
    gm = math.exp(sum(logs) / len(logs)) if logs else 0.0
    out.append("* floor counts the input read twice (group larger than L2); "
               "† reference figure (stricter than the in-harness one)")
    out.append(f"geomean speedup over eager {gm:.2f}× over {len(logs)} cases; {wins}/{len(rows)} beat eager, "
               f"torch.compile and Liger")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--no-liger", action="store_true")
    ap.add_argument("--reference", default=None,
                    help="rival figures to hold against (default: bench/reference_h200.json on an H200)")
    args = ap.parse_args()
    rows: list = []
    t0 = time.time()
    for rd in args.run_dirs:
        asyncio.run(evaluate_run(rd, rows, not args.no_liger))
    apply_reference(rows, load_reference(args.reference or default_reference()))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    print(f"# kernel quality, {time.strftime('%Y-%m-%d')}, {len(rows)} cases, {time.time() - t0:.0f} s")
    print(render(rows))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    sys.exit(main())
