"""The run summary: what `kforge show` prints, the engine returns at the end of a run and the TUI
prints when it closes. Read from the store only, so every consumer tells the same story; the
figures and their rules are figures.py's (re-exported here for the screens).

Its own module (not report.py) because the engine needs it and report.py runs the engine.
"""
from __future__ import annotations

import os
import shutil
import time

from kforge_tui.figures import (  # noqa: F401 (the screens read them from here)
    IN_FLIGHT, NOISY_SPREAD, NodeFigure, Reference, TaskFigures, figure_fields, fmt_ms, fmt_pct, fmt_s,
    fmt_us, fmt_x, pool, spread_of,
)


# ----------------------------------------------------------------------------- phases

PHASE_LABELS = {"load": "load", "capture": "capture", "profile": "profile", "baseline": "baselines",
                "search": "search", "integrate": "end-to-end check"}
ENDS = ("done", "failed", "interrupted")


def phase_times(phases: list[tuple[str, float]], end: float | None) -> list[tuple[str, float]]:
    """How long each phase took, from the phase events' times: a phase lasts until the next one
    starts (or `end`); repeats (a resume, more budget after the search) add up; the idle time
    after the search ("done") counts for nothing."""
    totals: dict[str, float] = {}
    for (name, ts), nxt in zip(phases, [*phases[1:], (None, end)]):
        if name in ENDS or nxt[1] is None:
            continue
        totals[name] = totals.get(name, 0.0) + max(0.0, nxt[1] - ts)
    order = [p for p in PHASE_LABELS if p in totals] + [p for p in totals if p not in PHASE_LABELS]
    return [(p, totals[p]) for p in order]


def format_phases(rows: list[dict]) -> str:
    return "phases: " + ", ".join(f"{PHASE_LABELS.get(r['phase'], r['phase'])} {fmt_s(r['seconds'])}"
                                  for r in rows) if rows else ""


def _stored_phases(store, live: bool) -> list[dict]:
    ph = [(e.get("name", ""), float(e.get("ts") or 0)) for e in store.events() if e.get("type") == "Phase"]
    if not ph:
        return []
    info = store.run_info()
    end = time.time() if live else max(info.get("updated") or 0, (store.heartbeat() or {}).get("beat") or 0,
                                       ph[-1][1])
    return [{"phase": p, "seconds": round(s, 2)} for p, s in phase_times(ph, end)]


# ----------------------------------------------------------------------------- show --json

def show_json(run_dir: str, store=None) -> dict:
    """DESIGN.md `show --json`: {"tasks": [{op, shape, dtype, baseline_us, best_us, speedup, verified,
    best_node, evaluated, budget, ...}], ...}. `baseline_us` and `compiled_us` are the pooled
    references, `speedup` is `baseline_us / best_us` (and `speedup_vs_compile` `compiled_us /
    best_us`), exactly."""
    from kforge_tui.store import RunStore, owner_pid

    own = store is None
    store = store or RunStore.open(run_dir, readonly=True)
    try:
        info = store.run_info()
        tasks = []
        for t in store.tasks():
            ref, comp = t["reference"]["eager"], t["reference"]["compiled"]
            best_us = t.get("best_us")
            tasks.append({
                "task_id": t["task_id"], "op": t["op"], "shape": t["shape"], "dtype": t["dtype"],
                "baseline_us": ref["median_us"], "baseline_spread": ref["spread"], "baseline_n": ref["n"],
                "baseline_clock": ref["clock"], "compiled_us": comp["median_us"],
                "compiled_spread": comp["spread"], "compiled_clock": comp["clock"],
                "floor_us": t.get("floor_us"), "best_us": best_us, "best_spread": t.get("best_spread"),
                "seed_us": t.get("seed_us"), "seed_node": t.get("seed_node"), "best_lang": t.get("best_lang"),
                "speedup": t.get("speedup"), "speedup_vs_compile": t.get("speedup_vs_compile"),
                "verified": bool(t.get("verified")), "best_node": t.get("best_node"),
                "leader_node": t.get("leader_node"), "noisy_leader": t.get("noisy_leader"),
                "evaluated": t.get("evaluated", 0), "budget": t.get("budget"), "status": t.get("status"),
                "control": t.get("control") or {},
                # what tells regions of one op and shape apart (region_details)
                "source": (t.get("task") or {}).get("source") or "",
                "inputs": (t.get("task") or {}).get("inputs") or [],
                # why its candidates failed, most frequent first (for a task with nothing verified)
                "failures": store.failures(t["task_id"]) if t.get("failed") else [],
            })
        live = info.get("status") == "running" and owner_pid(store.run_dir) is not None
        status = info.get("status")
        if status == "running" and not live:
            status = "interrupted"  # nobody runs it any more (killed): `kforge resume` continues it
        return {"run_dir": str(run_dir), "model": info.get("model"), "status": status,
                "owner_pid": owner_pid(store.run_dir) if live else None,
                "device": info.get("device"), "proposer": info.get("proposer"),
                "llm": store.llm_totals(), "tasks": tasks, "phases": _stored_phases(store, live),
                "end_to_end": info.get("end_to_end")}
    finally:
        if own:
            store.close()


# ----------------------------------------------------------------------------- text

def terminal_width(default: int = 100) -> int:
    """$COLUMNS, else the terminal's width, else `default` (pipes, CI)."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
        if cols > 0:
            return cols
    except ValueError:
        pass
    try:
        return os.get_terminal_size(1).columns
    except OSError:
        return shutil.get_terminal_size((default, 24)).columns


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else (s[:max(n - 1, 0)] + "…" if n > 0 else "")


def format_table(cols: list[tuple[str, str, list[str]]], width: int, squeeze: str,
                 drop: tuple[str, ...] = ()) -> list[str]:
    """Columns (key, header, cells) laid out in `width`: drop the columns named in `drop` (in
    that order) while it does not fit, then shorten the `squeeze` column (ending it with …).
    Headers and cells right-aligned except the first column and the last."""
    cols = list(cols)
    widths = {k: max([len(h), *map(len, cells)]) for k, h, cells in cols}

    def total():
        return sum(widths[k] for k, _, _ in cols) + 2 * (len(cols) - 1)

    for k in drop:
        if total() <= width:
            break
        cols = [c for c in cols if c[0] != k]
    if total() > width and squeeze in widths:
        widths[squeeze] = max(8, widths[squeeze] - (total() - width))
    rows = []
    n = max((len(c[2]) for c in cols), default=0)
    for i in range(-1, n):
        parts = []
        for j, (k, h, cells) in enumerate(cols):
            text = _clip(h if i < 0 else cells[i], widths[k])
            left = j == 0 or j == len(cols) - 1 or k == squeeze
            parts.append(text.ljust(widths[k]) if left else text.rjust(widths[k]))
        rows.append("  ".join(parts).rstrip())
    return rows


def _shape(t: dict) -> str:
    return "x".join(str(s) for s in (t.get("shape") or []))


def _where(t: dict) -> str:
    """`file.py:17` of the model source line the region comes from (Task.source)."""
    return (t.get("source") or "").split(" ", 1)[0]


def _present(t: dict) -> list[dict]:
    return [m for m in t.get("inputs") or [] if m.get("shape") is not None]


def _input_shapes(t: dict) -> str:
    shapes = ", ".join("x".join(map(str, m["shape"])) or "scalar" for m in _present(t))
    return f"inputs {shapes}" if shapes else ""


def _dtype(t: dict) -> str:
    return t.get("dtype") or ""


def _layout(t: dict) -> str:
    """How the inputs lie in memory, in words: a region traced once NCHW and once channels-last."""
    from kforge_tui.regions.meta import TensorMeta

    metas = [TensorMeta.from_json(dict(m, name="")) for m in _present(t)]
    if not metas:
        return ""
    if all(m.contiguous for m in metas):
        return "contiguous"
    big = max(metas, key=lambda m: m.numel)
    if len(big.shape) == 4:
        _, c, h, w = big.shape
        if big.strides == (h * w * c, 1, w * c, c):
            return "channels-last"
    return "strided"


def region_details(tasks: list[dict]) -> list[str]:
    """What tells each region apart from the others of its op and shape ("" when none shares
    them): two `index 2000x64` rows read the same while their graphs, dtypes or strides differ.
    The model source line, the input shapes, the dtype and the layout are said, in that order,
    where they differ within such a group, until every row reads differently; rows still alike
    get their place among them (#2)."""
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault((t.get("op"), _shape(t)), []).append(i)
    out = [""] * len(tasks)
    for group in groups.values():
        parts: list[list[str]] = [[] for _ in group]
        for feature in (_where, _input_shapes, _dtype, _layout):
            if len({tuple(p) for p in parts}) == len(group):
                break
            values = [feature(tasks[i]) for i in group]
            if len(set(values)) > 1:
                for p, v in zip(parts, values):
                    p.extend([v] if v else [])
        texts = [", ".join(p) for p in parts]
        for k, i in enumerate(group):
            nth = f"#{texts[:k + 1].count(texts[k])}" if texts.count(texts[k]) > 1 else ""
            out[i] = ", ".join(x for x in (texts[k], nth) if x)
    return out


def region_names(tasks: list[dict]) -> dict[str, str]:
    """task_id -> `op shape`, and what tells the region apart where another reads the same: how
    the end-to-end lines name a region, as the table's op and shape columns do."""
    return {t["task_id"]: " ".join(x for x in (t.get("op") or t["task_id"], _shape(t)) if x)
            + (f" ({d})" if d else "") for t, d in zip(tasks, region_details(tasks))}


def _status_cell(t: dict) -> str:
    """The search's status, marked "slower" when its verified best loses to the region's bar
    (torch.compile where it was timed, else eager): the search ended, but no kernel gains."""
    bar = t.get("speedup_vs_compile") if t.get("compiled_us") else t.get("speedup")
    slower = t["verified"] and bar is not None and bar < 1.0
    return (("✓ " if t["verified"] else "✗ ") + (t.get("status") or "") + (", slower" if slower else "")
            + (" (noisy leader)" if t.get("noisy_leader") else ""))


def failure_lines(tasks: list[dict]) -> list[str]:
    """For each region with no verified kernel and failed candidates: how many failed, by
    status, and the newest message of the most frequent status (what to fix first)."""
    out = []
    for t, d in zip(tasks, region_details(tasks)):
        fails = t.get("failures") or []
        if t.get("verified") or not fails:
            continue
        counts = ", ".join(f"{f['n']} {f['status']}" for f in fails)
        msg = " ".join(str(fails[0].get("message") or "").split())
        name = " ".join(x for x in (t.get("op"), _shape(t)) if x) + (f" ({d})" if d else "")
        out.append(f"{name}: nothing verified ({counts})"
                   + (f"; latest {fails[0]['status']}: {msg}" if msg else ""))
    return out


def format_show(data: dict, width: int | None = None) -> str:
    """The per-op table, fitted to `width` (default: the terminal's): columns that do not fit
    go (floor first), then long op names are shortened; shapes are never cut."""
    width = width or terminal_width()
    ts = data["tasks"]
    ops = [t["op"] + (f" ({d})" if d else "") for t, d in zip(ts, region_details(ts))]
    cols = [("op", "op", ops), ("shape", "shape", [_shape(t) for t in ts]),
            ("dtype", "dtype", [t["dtype"] for t in ts]),
            ("eager", "eager", [fmt_us(t["baseline_us"]) for t in ts]),
            ("spread", "±", [fmt_pct(t.get("baseline_spread")) for t in ts]),
            ("compile", "compile", [fmt_us(t.get("compiled_us")) for t in ts]),
            ("best", "best", [fmt_us(t["best_us"]) for t in ts]),
            ("x", "vs eager", [fmt_x(t["speedup"]) for t in ts]),
            ("xc", "vs comp.", [fmt_x(t.get("speedup_vs_compile")) for t in ts]),
            ("floor", "floor", [fmt_us(t.get("floor_us")) for t in ts]),
            ("evals", "evals", [f"{t['evaluated']}/{t['budget']}" for t in ts]),
            ("status", "status", [_status_cell(t) for t in ts])]
    if not any(t.get("compiled_us") for t in ts):
        cols = [c for c in cols if c[0] not in ("compile", "xc")]
    head = _clip(f"[{data.get('status')}] run {data['run_dir']}  model {data.get('model')}", width)
    table = format_table(cols, width, "op", drop=("floor", "spread", "dtype", "xc", "compile"))
    lines = [head, table[0], "─" * min(width, max(len(r) for r in table)), *table[1:]]
    clocks = {c for t in ts for c in (t.get("baseline_clock"), t.get("compiled_clock")) if c}
    if clocks:
        lines.append("clocks: " + ", ".join(sorted(clocks)) + " (each reference as its row labels it)")
    refs = "eager, compile: the pooled references" if any(c[0] == "compile" for c in cols) else \
        "eager: the pooled reference"
    lines.append(_clip(f"{refs} (median of every side-by-side timing); vs eager = eager / best", width))
    lines.extend(_clip(x, width) for x in failure_lines(ts))
    if data.get("phases"):
        lines.append(format_phases(data["phases"]))
    e2e = data.get("end_to_end")
    if e2e:
        lines.append("")
        lines.append(format_end_to_end(e2e, ts))
    llm = data.get("llm") or {}
    if llm.get("calls"):
        lines.append(f"LLM: {llm['calls']} calls, {llm.get('prompt_tokens', 0)}+{llm.get('completion_tokens', 0)} "
                     f"tokens, ${llm.get('cost_usd', 0):.4f}")
    return "\n".join(lines)


def format_end_to_end(r: dict, tasks: list[dict] | None = None) -> str:
    """The end-to-end report in lines; regions are named as the table names them, from the
    run's `tasks` (show_json's rows; read from the report's run when not given)."""
    used = r.get("kernels_used") or {}
    names = _report_names(r, _run_tasks(r.get("run_dir")) if tasks is None else tasks)
    ok = "within tolerance" if r.get("within_tolerance") else "MISMATCH"
    if r.get("eager_ms") is None:
        lines = [f"end to end: {r.get('message') or 'no kernel applied'}"]
    else:
        spread = ""
        if r.get("eager_spread") is not None and r.get("patched_spread") is not None:
            spread = f", spread {r['eager_spread']:.0%} / {r['patched_spread']:.0%}"
        comp = vs_comp = ""
        if r.get("compile_ms") is not None:  # both ratios are kforge's, so both follow it
            comp = f", torch.compile {fmt_ms(r['compile_ms'])}"
            vs_comp = f"{fmt_x(r.get('speedup_vs_compile'))} vs torch.compile, "
        lines = [f"end to end: eager {fmt_ms(r['eager_ms'])}{comp} → kforge {fmt_ms(r['patched_ms'])} "
                 f"({vs_comp}{fmt_x(r.get('speedup'))} vs eager{spread}); max abs err "
                 f"{r.get('max_abs_err', float('nan')):.3g} ({ok})"]
        if r.get("mode"):
            lines.append(f"  mode: {r['mode']}" + (f" ({r['mode_reason']})" if r.get("mode_reason") else "")
                         + (f", Inductor mode {r['inductor_mode']}" if r.get("inductor_mode") not in
                            (None, "default") else ""))
        if r.get("mode") == "compile" and r.get("compile_ms") is not None and not r.get("kernels"):
            lines.append("  no kernel is in the kforge model: it is torch.compile itself, so any difference "
                         "from torch.compile above is the clock's noise")
        if r.get("noisy"):
            lines.append(f"  noisy timing even after {r.get('iters')} pairs: read the speedup as rough; "
                         f"re-run `kforge apply {_arg(r.get('run_dir'))} {_arg(r.get('model'))}` on a quiet machine")
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
                     + (f" (decided on {r['clock']}" + (", and not slower with cold caches" if any(
                         t.get("cold_gain") for t in (r.get("decision") or {}).get("trials", [])) else "") + ")"
                        if r.get("clock") else ""))
    agree = r.get("clock_agreement")
    if agree:
        names = {"eager": "eager", "compile": "torch.compile", "kforge": "kforge"}
        clock = r.get("clock") or "decision"
        if agree.get("speedup"):
            sp = agree["speedup"]
            verdict = (f"agree within {agree['within']:.0%}" if agree["agrees"] else
                       f"DISAGREE by {abs(agree['off'] - 1):.0%} (over {agree['within']:.0%}): read both figures")
            lines.append(f"  kforge over {names[agree['against']]}: {sp['clock']:.2f}× on the {clock} clock, "
                         f"{sp['do_bench']:.2f}× on triton's do_bench of the same forwards ({verdict})")
        each = ", ".join(f"{names.get(k, k)} {v:.2f}" for k, v in agree["ratios"].items())
        lines.append(f"  {clock} clock / do_bench, each forward: {each} (do_bench clears the cache between "
                     "forwards and runs each alone: a host- or cache-bound forward reads differently there)")
    for t in (r.get("decision") or {}).get("trials", []):
        lines.append(f"  {'kept' if t.get('kept') else 'dropped'} {names[t['task_id']]}: {t.get('why', '')}")
    for tid, n in used.items():
        lines.append(f"  kernel {names.get(tid, tid)}: {n} calls")
    falls = sorted((r.get("fallbacks") or {}).items(), key=lambda kv: -kv[1])
    for what, n in falls[:3]:
        lines.append(f"  fell back to PyTorch ({n} calls): {what}")
    if len(falls) > 3:
        lines.append(f"  … and {len(falls) - 3} more call sites fell back ({sum(n for _, n in falls[3:])} calls; "
                     "`kforge apply --json` lists them)")
    tried = {t["task_id"] for t in (r.get("decision") or {}).get("trials", [])}
    for tid, why in (r.get("skipped") or {}).items():
        if tid not in tried:
            lines.append(f"  left to PyTorch / Inductor {names.get(tid, tid)}: {why}")
    return "\n".join(lines)


def _run_tasks(run_dir: str | None) -> list[dict]:
    """The task rows of the run at `run_dir` ([] when there is none to read)."""
    from kforge_tui.errors import KforgeError

    if not run_dir:
        return []
    try:
        return show_json(run_dir)["tasks"]
    except KforgeError:  # not a run store (any more): the report's own trials name what they can
        return []


def _report_names(r: dict, tasks: list[dict]) -> dict[str, str]:
    """region_names of the run's tasks and of any region only the report describes (its trials
    and kernels carry op and shape)."""
    rows = {t["task_id"]: t for t in tasks}
    for x in [*(r.get("decision") or {}).get("trials", []), *(r.get("kernels") or [])]:
        rows.setdefault(x["task_id"], x)
    return region_names(list(rows.values()))


def _arg(s: str | None) -> str:
    import shlex

    return shlex.quote(str(s)) if s else "MODEL"


def format_next_steps(data: dict) -> str:
    """What to do after this run, with the run's own directory and model (no placeholders)."""
    run, model = _arg(data["run_dir"]), _arg(data.get("model"))
    if data.get("status") == "interrupted":
        return f"kforge: the run was interrupted (its process is gone); `kforge resume {run}` continues it"
    if not any(t["verified"] for t in data["tasks"]):
        return "kforge: no verified kernel was found for any op"
    if data.get("status") not in ("finished",) and any(
            (t.get("evaluated") or 0) < (t.get("budget") or 0) and t.get("status") not in ("done", "stopped")
            for t in data["tasks"]):
        return f"kforge: the search was stopped early; `kforge resume {run}` continues it to the budget"
    if not data.get("end_to_end"):
        return (f"kforge: the end-to-end check did not run; `kforge apply {run} {model}` checks and times "
                f"the patched model, `kforge export {run} OUT_DIR` packages the kernels")
    return f"kforge: `kforge export {run} OUT_DIR` packages the kernels (torch only)"


def format_attached_close(data: dict, pid: int | None) -> str:
    """Closing `kforge tui` on a run another process still runs: it goes on; how to come back."""
    run = _arg(data["run_dir"])
    done = sum(t.get("evaluated") or 0 for t in data["tasks"])
    return (f"kforge: the run goes on in process {pid} ({len(data['tasks'])} ops, {done} candidates so far); "
            f"`kforge tui {run}` reattaches, `kforge show {run}` prints its results")


__all__ = ["NOISY_SPREAD", "NodeFigure", "Reference", "TaskFigures", "figure_fields", "fmt_us", "fmt_x",
           "format_show", "format_next_steps", "phase_times", "show_json"]
