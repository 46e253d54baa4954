"""The run summary: what `kforge show` prints, the engine returns at the end of a run and the TUI
prints when it closes. Read from the store only, so every consumer tells the same story.

Its own module (not report.py) because the engine needs it and report.py runs the engine.
"""
from __future__ import annotations


def show_json(run_dir: str, store=None) -> dict:
    """DESIGN.md `show --json`: {"tasks": [{op, shape, dtype, baseline_us, best_us, speedup, verified,
    best_node, evaluated, budget, ...}], ...}."""
    from kforge_tui.store import RunStore

    own = store is None
    store = store or RunStore.open(run_dir, readonly=True)
    try:
        info = store.run_info()
        tasks = []
        for t in store.tasks():
            b = t.get("baseline") or {}
            eager = (b.get("eager") or {}).get("median_us")
            compiled = (b.get("compiled") or {}).get("median_us")
            best_us = t.get("best_us")
            tasks.append({
                "task_id": t["task_id"], "op": t["op"], "shape": t["shape"], "dtype": t["dtype"],
                "baseline_us": eager, "compiled_us": compiled, "floor_us": b.get("floor_us"),
                "best_us": best_us, "speedup": t.get("speedup"),
                "speedup_vs_compile": (compiled / best_us) if (compiled and best_us) else None,
                "verified": bool(t.get("verified")), "best_node": t.get("best_node"),
                "evaluated": t.get("evaluated", 0), "budget": t.get("budget"), "status": t.get("status"),
            })
        return {"run_dir": str(run_dir), "model": info.get("model"), "status": info.get("status"),
                "device": info.get("device"), "proposer": info.get("proposer"),
                "llm": store.llm_totals(), "tasks": tasks, "end_to_end": info.get("end_to_end")}
    finally:
        if own:
            store.close()


def fmt_us(v) -> str:
    return "—" if v is None else (f"{v / 1000:.2f} ms" if v >= 10000 else f"{v:.1f} µs")


def fmt_x(v) -> str:
    return "—" if not v else f"{v:.2f}×"


def format_show(data: dict) -> str:
    head = f"{'op':<20} {'shape':<22} {'dtype':<9} {'eager':>10} {'compile':>10} {'best':>10} " \
           f"{'vs eager':>8} {'vs comp.':>8} {'floor':>10} {'evals':>7}  status"
    lines = [f"run {data['run_dir']}  model {data.get('model')}  [{data.get('status')}]", head,
             "─" * len(head)]
    for t in data["tasks"]:
        shape = "x".join(str(s) for s in (t["shape"] or []))
        mark = "✓" if t["verified"] else "✗"
        lines.append(f"{t['op']:<20} {shape:<22} {t['dtype']:<9} {fmt_us(t['baseline_us']):>10} "
                     f"{fmt_us(t.get('compiled_us')):>10} {fmt_us(t['best_us']):>10} "
                     f"{fmt_x(t['speedup']):>8} {fmt_x(t.get('speedup_vs_compile')):>8} "
                     f"{fmt_us(t.get('floor_us')):>10} {t['evaluated']:>3}/{t['budget']:<3}  "
                     f"{mark} {t.get('status') or ''}")
    e2e = data.get("end_to_end")
    if e2e:
        lines.append("")
        lines.append(format_end_to_end(e2e))
    llm = data.get("llm") or {}
    if llm.get("calls"):
        lines.append(f"LLM: {llm['calls']} calls, {llm.get('prompt_tokens', 0)}+{llm.get('completion_tokens', 0)} "
                     f"tokens, ${llm.get('cost_usd', 0):.4f}")
    return "\n".join(lines)


def format_end_to_end(r: dict) -> str:
    used = r.get("kernels_used") or {}
    ok = "within tolerance" if r.get("within_tolerance") else "MISMATCH"
    if r.get("eager_ms") is None:
        lines = [f"end to end: {r.get('message') or 'no kernel applied'}"]
    else:
        spread = ""
        if r.get("eager_spread") is not None and r.get("patched_spread") is not None:
            spread = f", spread {r['eager_spread']:.0%} / {r['patched_spread']:.0%}"
        comp = ""
        if r.get("compile_ms") is not None:
            comp = (f", torch.compile {r['compile_ms']:.3f} ms "
                    f"({fmt_x(r.get('speedup_vs_compile'))} vs compile)")
        lines = [f"end to end: eager {r['eager_ms']:.3f} ms{comp} → kforge {r['patched_ms']:.3f} ms "
                 f"({fmt_x(r.get('speedup'))} vs eager{spread}); max abs err "
                 f"{r.get('max_abs_err', float('nan')):.3g} ({ok})"]
        if r.get("mode"):
            lines.append(f"  mode: {r['mode']}" + (f" ({r['mode_reason']})" if r.get("mode_reason") else "")
                         + (f", Inductor mode {r['inductor_mode']}" if r.get("inductor_mode") not in
                            (None, "default") else ""))
        if r.get("noisy"):
            lines.append(f"  noisy timing even after {r.get('iters')} pairs: read the speedup as rough; "
                         "re-run `kforge apply RUN_DIR MODEL` on a quiet machine")
    clocks = []
    for clock in ("throughput", "latency"):
        c = r.get(clock) or {}
        if c.get("kforge") and c.get("compile"):
            clocks.append(f"{clock} {c['compile']['median_ms']:.3f} → {c['kforge']['median_ms']:.3f} ms "
                          f"({c['compile']['median_ms'] / c['kforge']['median_ms']:.2f}×)")
    db = r.get("do_bench_ms") or {}
    if db.get("compile") and db.get("kforge"):
        clocks.append(f"do_bench {db['compile']:.3f} → {db['kforge']:.3f} ms ({db['compile'] / db['kforge']:.2f}×)")
    if clocks:
        lines.append("  torch.compile → kforge: " + "; ".join(clocks)
                     + (f" (decided on {r['clock']})" if r.get("clock") else ""))
    for t in (r.get("decision") or {}).get("trials", []):
        lines.append(f"  {'kept' if t.get('kept') else 'dropped'} {t.get('op') or t['task_id']}: {t.get('why', '')}")
    for tid, n in used.items():
        lines.append(f"  kernel {tid}: {n} calls")
    falls = sorted((r.get("fallbacks") or {}).items(), key=lambda kv: -kv[1])
    for what, n in falls[:3]:
        lines.append(f"  fell back to PyTorch ({n} calls): {what}")
    if len(falls) > 3:
        lines.append(f"  … and {len(falls) - 3} more call sites fell back ({sum(n for _, n in falls[3:])} calls; "
                     "`kforge apply --json` lists them)")
    tried = {t["task_id"] for t in (r.get("decision") or {}).get("trials", [])}
    for tid, why in (r.get("skipped") or {}).items():
        if tid not in tried:
            lines.append(f"  left to PyTorch / Inductor {tid}: {why}")
    return "\n".join(lines)


def format_next_steps(data: dict) -> str:
    """What to do after this run, for the lines printed when the TUI closes."""
    run = data["run_dir"]
    if not any(t["verified"] for t in data["tasks"]):
        return "kforge: no verified kernel was found for any op"
    if data.get("status") not in ("finished",) and any(
            (t.get("evaluated") or 0) < (t.get("budget") or 0) and t.get("status") != "done" for t in data["tasks"]):
        return f"kforge: the search was stopped early; `kforge resume {run}` continues it to the budget"
    if not data.get("end_to_end"):
        return (f"kforge: the end-to-end check did not run; `kforge apply {run} MODEL` checks and times the "
                "patched model, `kforge export` packages the kernels")
    return f"kforge: `kforge export {run} OUT_DIR` packages the kernels (torch only)"
