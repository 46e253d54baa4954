"""Headless consumer of the engine's events: `kforge optimize --headless` and runs without a terminal.

The TUI's twin for nohup/tmux/CI: one line per meaningful change (best speedup improved, op
finished) and a periodic progress line per op, so a log stays readable; then the final table
(summary.py), or JSON with `--json` (DESIGN.md's `show --json` fields).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

from kforge_tui import events as ev
from kforge_tui.summary import fmt_us, fmt_x, format_show


class HeadlessReporter:
    """Prints progress from events. Thread-safe enough: called on the engine's loop only."""

    def __init__(self, out=None, interval_s: float = 10.0, quiet: bool = False):
        self.out = out or sys.stderr
        self.interval = interval_s
        self.quiet = quiet
        self.tasks: dict[str, dict] = {}
        self._last = 0.0
        self._phase = ""
        self._t0 = time.time()
        self.evaluated = 0

    def __call__(self, e: ev.Event) -> None:
        if isinstance(e, ev.TaskAdded):
            self.tasks[e.task_id] = {"op": e.op, "shape": e.shape, "dtype": e.dtype, "budget": e.budget,
                                     "done": 0, "best": None, "status": "waiting", "eager": None}
        elif isinstance(e, ev.TaskBaseline) and e.task_id in self.tasks:
            self.tasks[e.task_id]["eager"] = e.eager_us
            self._print(f"baseline {e.task_id}: eager {fmt_us(e.eager_us)}, torch.compile "
                        f"{fmt_us(e.compiled_us)}, floor {fmt_us(e.floor_us)}")
        elif isinstance(e, ev.NodeFinished) and e.task_id in self.tasks:
            self.tasks[e.task_id]["done"] += 1
            self.evaluated += 1
        elif isinstance(e, ev.BestImproved) and e.task_id in self.tasks:
            self.tasks[e.task_id]["best"] = e.speedup
            self._print(f"best {e.task_id}: {e.speedup:.2f}× ({fmt_us(e.time_us)}, node {e.node_id}, "
                        f"candidate {e.iteration})")
        elif isinstance(e, ev.TaskStatus) and e.task_id in self.tasks:
            self.tasks[e.task_id]["status"] = e.status
            if e.status in ("done", "failed", "stopped"):
                self._print(f"{e.status} {e.task_id}: {e.detail}")
        elif isinstance(e, ev.Phase):
            if e.name != self._phase:  # "done" comes when the search ends and again at the very end
                self._print(f"[{e.name}] {e.detail}".rstrip())
            self._phase = e.name
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
            self._print(f"  {t['op']:<18} [{bar}] {t['done']:>3}/{t['budget']:<3} best {fmt_x(t['best'])}")
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
