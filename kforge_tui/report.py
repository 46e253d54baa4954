"""Headless consumer of the engine's events, and the text/JSON views of a run (`show`, `apply`).

The headless reporter is the TUI's twin for nohup/tmux/CI: one line per meaningful change
(best speedup improved, op finished) and a periodic progress line per op, so a log stays
readable; a final table, or JSON with `--json` (DESIGN.md's `show --json` fields).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

from kforge_tui import events as ev


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


def _fmt_us(v) -> str:
    return "—" if v is None else (f"{v / 1000:.2f} ms" if v >= 10000 else f"{v:.1f} µs")


def _fmt_x(v) -> str:
    return "—" if not v else f"{v:.2f}×"


def format_show(data: dict) -> str:
    head = f"{'op':<20} {'shape':<22} {'dtype':<9} {'eager':>10} {'compile':>10} {'best':>10} " \
           f"{'vs eager':>8} {'vs comp.':>8} {'floor':>10} {'evals':>7}  status"
    lines = [f"run {data['run_dir']}  model {data.get('model')}  [{data.get('status')}]", head,
             "─" * len(head)]
    for t in data["tasks"]:
        shape = "x".join(str(s) for s in (t["shape"] or []))
        mark = "✓" if t["verified"] else "✗"
        lines.append(f"{t['op']:<20} {shape:<22} {t['dtype']:<9} {_fmt_us(t['baseline_us']):>10} "
                     f"{_fmt_us(t.get('compiled_us')):>10} {_fmt_us(t['best_us']):>10} "
                     f"{_fmt_x(t['speedup']):>8} {_fmt_x(t.get('speedup_vs_compile')):>8} "
                     f"{_fmt_us(t.get('floor_us')):>10} {t['evaluated']:>3}/{t['budget']:<3}  "
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
        lines = [f"end to end: eager {r['eager_ms']:.3f} ms → patched {r['patched_ms']:.3f} ms "
                 f"({_fmt_x(r.get('speedup'))}{spread}); max abs err {r.get('max_abs_err', float('nan')):.3g} ({ok})"]
        if r.get("noisy"):
            lines.append(f"  noisy timing even after {r.get('iters')} pairs: read the speedup as rough; "
                         "re-run `kforge apply RUN_DIR MODEL` on a quiet machine")
    for tid, n in used.items():
        lines.append(f"  kernel {tid}: {n} calls")
    falls = sorted((r.get("fallbacks") or {}).items(), key=lambda kv: -kv[1])
    for what, n in falls[:3]:
        lines.append(f"  fell back to PyTorch ({n} calls): {what}")
    if len(falls) > 3:
        lines.append(f"  … and {len(falls) - 3} more call sites fell back ({sum(n for _, n in falls[3:])} calls; "
                     "`kforge apply --json` lists them)")
    for tid, why in (r.get("skipped") or {}).items():
        lines.append(f"  left to PyTorch {tid}: {why}")
    return "\n".join(lines)


class HeadlessReporter:
    """Prints progress from events. Thread-safe enough: called on the engine's loop only."""

    def __init__(self, out=None, interval_s: float = 10.0, quiet: bool = False):
        self.out = out or sys.stderr
        self.interval = interval_s
        self.quiet = quiet
        self.tasks: dict[str, dict] = {}
        self._last = 0.0
        self._t0 = time.time()
        self.evaluated = 0

    def __call__(self, e: ev.Event) -> None:
        if isinstance(e, ev.TaskAdded):
            self.tasks[e.task_id] = {"op": e.op, "shape": e.shape, "dtype": e.dtype, "budget": e.budget,
                                     "done": 0, "best": None, "status": "waiting", "eager": None}
        elif isinstance(e, ev.TaskBaseline) and e.task_id in self.tasks:
            self.tasks[e.task_id]["eager"] = e.eager_us
            self._print(f"baseline {e.task_id}: eager {_fmt_us(e.eager_us)}, torch.compile "
                        f"{_fmt_us(e.compiled_us)}, floor {_fmt_us(e.floor_us)}")
        elif isinstance(e, ev.NodeFinished) and e.task_id in self.tasks:
            self.tasks[e.task_id]["done"] += 1
            self.evaluated += 1
        elif isinstance(e, ev.BestImproved) and e.task_id in self.tasks:
            self.tasks[e.task_id]["best"] = e.speedup
            self._print(f"best {e.task_id}: {e.speedup:.2f}× ({_fmt_us(e.time_us)}, node {e.node_id}, "
                        f"candidate {e.iteration})")
        elif isinstance(e, ev.TaskStatus) and e.task_id in self.tasks:
            self.tasks[e.task_id]["status"] = e.status
            if e.status in ("done", "failed", "stopped"):
                self._print(f"{e.status} {e.task_id}: {e.detail}")
        elif isinstance(e, ev.Phase):
            self._print(f"[{e.name}] {e.detail}".rstrip())
        elif isinstance(e, ev.LogLine):
            self._print(e.message if e.level == "info" else f"{e.level}: {e.message}")
        elif isinstance(e, ev.RunStarted):
            self._print(f"run {e.run_dir} — {e.model} on {e.device_name} ({e.device}), proposer {e.proposer}")
        now = time.time()
        if now - self._last >= self.interval and any(t["status"] == "searching" for t in self.tasks.values()):
            self._last = now
            self._progress()

    def _progress(self) -> None:
        mins = max((time.time() - self._t0) / 60, 1e-6)
        for tid, t in self.tasks.items():
            if t["status"] not in ("searching", "paused"):
                continue
            width = 20
            filled = int(width * min(t["done"], t["budget"]) / max(t["budget"], 1))
            bar = "█" * filled + "·" * (width - filled)
            self._print(f"  {t['op']:<18} [{bar}] {t['done']:>3}/{t['budget']:<3} best {_fmt_x(t['best'])}")
        self._print(f"  {self.evaluated} candidates, {self.evaluated / mins:.1f}/min")

    def _print(self, msg: str) -> None:
        if not self.quiet:
            print(f"kforge: {msg}", file=self.out, flush=True)


def run_headless(settings, *, json_out: bool = False, resume: bool = False) -> int:
    from kforge_tui.engine import Engine

    reporter = HeadlessReporter()
    engine = Engine(settings, reporter)
    try:
        summary = asyncio.run(engine.run())
    except KeyboardInterrupt:
        print(f"kforge: interrupted; resume with `kforge resume {engine.run_dir}`", file=sys.stderr)
        return 130
    if json_out:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(format_show(summary))
    verified = [t for t in summary["tasks"] if t["verified"]]
    if not verified:
        print("kforge: no verified kernel was found for any op", file=sys.stderr)
        return 1
    return 0
