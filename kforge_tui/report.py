"""Headless consumer of the engine's events: `kforge optimize --headless` and runs without a terminal.

The TUI's twin for nohup/tmux/CI: one line per phase (with how long the last one took), one per
meaningful change (the best of an op changed, an op finished) and a periodic progress line per op,
so a log stays readable; then the final table (summary.py, with every phase's time), or JSON with
`--json` (DESIGN.md's `show --json` fields). Speedups are summary.TaskFigures' (the pooled
reference over the node's time), as on every other screen.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

from kforge_tui import events as ev
from kforge_tui.summary import NodeFigure, TaskFigures, fmt_s, fmt_us, fmt_x, format_next_steps, format_show


class HeadlessReporter:
    """Prints progress from events. Thread-safe enough: called on the engine's loop only."""

    def __init__(self, out=None, interval_s: float = 10.0, quiet: bool = False):
        self.out = out or sys.stderr
        self.interval = interval_s
        self.quiet = quiet
        self.tasks: dict[str, dict] = {}
        self._last = 0.0
        self._phase = ""
        self._phase_t0 = time.time()
        self._t0 = time.time()
        self.evaluated = 0  # candidates this process evaluated (restored ones not counted)
        self._nodes: dict[int, tuple[str, int | None]] = {}  # node id -> (action, parent id)

    def __call__(self, e: ev.Event) -> None:
        if isinstance(e, ev.TaskAdded):
            self.tasks[e.task_id] = {"op": e.op, "shape": e.shape, "dtype": e.dtype, "budget": e.budget,
                                     "done": 0, "best": None, "status": "waiting", "figures": TaskFigures()}
        elif isinstance(e, ev.TaskBaseline) and e.task_id in self.tasks:
            self.tasks[e.task_id]["figures"].set_baseline(
                e.baseline or {"eager": {"median_us": e.eager_us},
                               "compiled": {"median_us": e.compiled_us} if e.compiled_us else None})
            of = (e.baseline or {}).get("eager_of")
            self._print(f"baseline {e.task_id}: eager {fmt_us(e.eager_us)}"
                        + (f" ({of})" if of else "") + ", torch.compile "
                        f"{fmt_us(e.compiled_us)}, floor {fmt_us(e.floor_us)}")
        elif isinstance(e, ev.TaskBudget) and e.task_id in self.tasks:
            self.tasks[e.task_id]["budget"] = e.budget
        elif isinstance(e, ev.NodeAdded):
            self._nodes[e.node_id] = (e.action, e.parent_id)
        elif isinstance(e, ev.NodeFinished) and e.task_id in self.tasks:
            self._finished(e)
        elif isinstance(e, ev.TaskStatus) and e.task_id in self.tasks:
            self.tasks[e.task_id]["status"] = e.status
            if e.status in ("done", "failed", "stopped", "stopping"):
                self._print(f"{e.status} {e.task_id}: {e.detail}")
        elif isinstance(e, ev.Phase):
            if e.name != self._phase:  # "done" comes when the search ends and again at the very end
                took = f" ({self._phase} took {fmt_s(e.ts - self._phase_t0)})" \
                    if self._phase and self._phase != "done" else ""
                self._print(f"[{e.name}] {e.detail}".rstrip() + took)
                self._phase_t0 = e.ts
            self._phase = e.name
        elif isinstance(e, ev.LogLine):
            self._print(e.message if e.level == "info" else f"{e.level}: {e.message}")
        elif isinstance(e, ev.RunStarted):
            self._t0 = e.ts
            self._print(f"run {e.run_dir} — {e.model} on {e.device_name} ({e.device}), proposer {e.proposer}")
        now = time.time()
        if now - self._last >= self.interval and any(t["status"] == "searching" for t in self.tasks.values()):
            self._last = now
            self._progress()

    def _finished(self, e: ev.NodeFinished) -> None:
        t = self.tasks[e.task_id]
        action, parent = self._nodes.get(e.node_id, ("", -1))
        if action == "root":
            return
        f: TaskFigures = t["figures"]
        before = f.best()
        f.update(NodeFigure(e.node_id, parent, action, e.status, e.time_us, e.spread, e.eager_us,
                            e.compiled_us, e.eager_clock, e.compiled_clock))
        if not action.startswith("confirm:") and e.status != "lost":
            t["done"] += 1
            if e.ts >= self._t0:
                self.evaluated += 1
        best = f.best()
        if best is not None and (before is None or best.node_id != before.node_id):
            ref = f.reference()
            t["best"] = ref.over(best.time_us)
            self._print(f"best {e.task_id}: {fmt_x(t['best'])} = eager {fmt_us(ref.median_us)} / "
                        f"{fmt_us(best.time_us)} (node {best.node_id})")

    def _progress(self) -> None:
        mins = max((time.time() - self._t0) / 60, 1e-6)
        for tid, t in self.tasks.items():
            if t["status"] not in ("searching", "paused"):
                continue
            width = 20
            filled = int(width * min(t["done"], t["budget"]) / max(t["budget"], 1))
            bar = "█" * filled + "·" * (width - filled)
            best = t["figures"].best()
            x = t["figures"].reference().over(best.time_us) if best else None
            self._print(f"  {t['op']:<18} [{bar}] {t['done']:>3}/{t['budget']:<3} best {fmt_x(x)}")
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
    if verified and not json_out:
        print(format_next_steps(summary), file=sys.stderr)
    if not verified:
        print("kforge: no verified kernel was found for any op", file=sys.stderr)
        return 1
    return 0
