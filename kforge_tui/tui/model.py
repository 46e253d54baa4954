"""The UI's picture of a run, folded from the typed event stream (no Textual here).

Keeping the state separate from the widgets lets the app apply a whole batch of events cheaply
and then touch only the widgets whose data changed (`Dirty`), which is what keeps a 2,000-node
tree responsive while eight evaluations stream stage changes.

Figures are summary.TaskFigures', the class the store applies too: each task's pooled eager and
torch.compile references, every speedup as the reference over the node's time, and the winner
(★: the fastest quiet figure). `settle()` recomputes them once per batch for the tasks the batch
touched, so a replay of 2,000 nodes costs one pass, not one per node.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from kforge_tui import events as ev
from kforge_tui.summary import NodeFigure, Reference, TaskFigures, fmt_s

FAILED_PREFIXES = ("static", "compile", "load", "verify", "time", "timeout", "crash", "impossible",
                   "proposal")
IN_FLIGHT_STAGES = ("queued", "proposing", "static", "compile", "load", "verify", "time", "pending")
RUN_ENDS = ("finished", "stopped", "failed", "interrupted")


def is_failure(status: str) -> bool:
    return status not in IN_FLIGHT_STAGES and status not in ("ok", "lost")


@dataclass
class NodeState:
    node_id: int
    task_id: str
    parent_id: int | None
    action: str
    proposer: str
    status: str = "queued"  # a stage while in flight, then "ok" or a failure status
    message: str = ""
    time_us: float | None = None
    speedup: float | None = None  # the pooled reference over time_us (TaskView.figures)
    spread: float | None = None
    noisy: bool = False
    children: list[int] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return is_failure(self.status)

    @property
    def in_flight(self) -> bool:
        return self.status in IN_FLIGHT_STAGES


@dataclass
class TaskView:
    """The UI's picture of one task (an op or region at one shape): a row of the profile table."""

    task_id: str
    op: str
    shape: list
    dtype: str
    budget: int
    calls: int = 0
    total_us: float = 0.0
    share: float = 0.0
    status: str = "waiting"
    detail: str = ""
    floor_us: float | None = None
    best_node: int | None = None
    best_us: float | None = None
    best_speedup: float | None = None
    noisy_leader: int | None = None  # the fastest figure when it is too noisy to be ★
    evaluated: int = 0
    failed: int = 0
    run_ended: str = ""  # the run's end ("interrupted", "stopped", ...) while this op still had work
    history: list[float] = field(default_factory=list)  # best speedup after each finished node
    node_ids: list[int] = field(default_factory=list)  # creation order
    figures: TaskFigures = field(default_factory=TaskFigures)
    ref_seen: Reference | None = None  # the reference the labels were last drawn with
    eager_of: str = ""  # what the eager reference ran: the op the model calls, or the region's graph

    @property
    def eager(self) -> Reference:
        return self.figures.reference("eager")

    @property
    def compiled(self) -> Reference:
        return self.figures.reference("compiled")

    @property
    def eager_us(self) -> float | None:
        return self.eager.median_us

    @property
    def compiled_us(self) -> float | None:
        return self.compiled.median_us

    @property
    def speedup_vs_compile(self) -> float | None:
        return self.compiled.over(self.best_us)

    @property
    def exhausted(self) -> bool:
        return self.status == "done" and self.detail.startswith(ev.EXHAUSTED)

    @property
    def state(self) -> str:
        """What the row says: the status, with "exhausted" told apart from a spent budget and
        "interrupted" for an op whose run ended before it did."""
        if self.run_ended and not self.finished:
            return "interrupted"
        return "exhausted" if self.exhausted else self.status

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed", "stopped")

    @property
    def reason(self) -> str:
        """One line on why the op is where it is (shown under its tree)."""
        if self.run_ended and not self.finished:
            return "interrupted: the run ended before this op did; `kforge resume RUN_DIR` continues it"
        if self.status == "done":
            return self.detail if self.exhausted else f"done: {self.detail or 'budget spent'}"
        if self.status in ("failed", "stopped", "paused", "stopping"):
            return self.detail if self.detail.startswith(self.status) else \
                (f"{self.status}: {self.detail}" if self.detail else self.status)
        return ""


@dataclass
class Dirty:
    """What one batch of events changed, so the app redraws only that."""

    header: bool = False
    tasks: set[str] = field(default_factory=set)
    new_tasks: bool = False
    nodes: set[int] = field(default_factory=set)  # added or changed
    best: set[str] = field(default_factory=set)
    refs: set[str] = field(default_factory=set)  # the task's reference moved: every speedup with it
    logs: bool = False

    def any(self) -> bool:
        return bool(self.header or self.tasks or self.new_tasks or self.nodes or self.best or self.logs
                    or self.refs)


@dataclass
class LogEntry:
    ts: float
    level: str
    message: str


class RunModel:
    """Folds events into run/task/node state. `apply` is O(1) per event; `settle` once per batch."""

    def __init__(self) -> None:
        self.run_dir: str | None = None
        self.model = ""
        self.device = ""
        self.device_name = ""
        self.proposer = ""
        self.settings: dict = {}
        self.started: float | None = None  # when the running process started (or resumed)
        self.finished: float | None = None
        self.end_status = ""  # how the run ended: finished | stopped | failed | interrupted
        self.phase = ""
        self.phase_detail = ""
        self.phase_started: float | None = None
        self.search_ended: float | None = None  # phase "done": the search is over, rates freeze
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_usd = 0.0
        self.llm_calls = 0
        self.llm_failures = 0
        self.llm_last_error = ""
        self.workers: dict[str, int] = {}  # Ray cluster runs: evaluation workers per node
        self.profile_rows: list[dict] = []
        self.tasks: dict[str, TaskView] = {}
        self.nodes: dict[int, NodeState] = {}
        self.in_flight: set[int] = set()
        self.evaluated_here = 0  # candidates this run's process evaluated since it started (cand/min)
        self.logs: deque[LogEntry] = deque(maxlen=500)
        self.summary: dict | None = None
        self._unsettled: set[str] = set()

    @property
    def running(self) -> bool:
        return self.started is not None and self.finished is None

    @property
    def searching(self) -> bool:
        """The run is before or in its search (not done searching, not integrating, not over)."""
        return self.running and self.search_ended is None and self.phase not in ("integrate", "failed")

    @property
    def paused(self) -> bool:
        """Every op that still has work is paused (pause-all, or each one by hand)."""
        active = [t for t in self.tasks.values() if not t.finished]
        return bool(active) and all(t.status == "paused" for t in active)

    def _end(self, now: float | None) -> float:
        if self.finished is not None:
            return self.finished
        if self.search_ended is not None:
            return self.search_ended
        return now if now is not None else time.time()

    def elapsed(self, now: float | None = None) -> float:
        if self.started is None:
            return 0.0
        return max(0.0, self._end(now) - self.started)

    def phase_elapsed(self, now: float | None = None) -> float:
        if self.phase_started is None:
            return 0.0
        end = self.finished if self.finished is not None else (now if now is not None else time.time())
        return max(0.0, end - self.phase_started)

    def per_minute(self, now: float | None = None) -> float:
        """Candidates this process evaluated since it started (or resumed), over its elapsed time:
        restored nodes and other processes' work do not count."""
        mins = self.elapsed(now) / 60.0
        return self.evaluated_here / mins if mins > 1e-6 and self.evaluated_here else 0.0

    def apply(self, e: ev.Event, dirty: Dirty) -> None:
        handler = getattr(self, "_on_" + type(e).__name__, None)
        if handler is not None:
            handler(e, dirty)

    def settle(self, d: Dirty) -> None:
        """Recompute the figures of the tasks the batch touched: references, speedups, the winner."""
        for tid in self._unsettled:
            t = self.tasks.get(tid)
            if t is None:
                continue
            best, leader = t.figures.best(), t.figures.leader()
            ref = t.eager
            new_best = best.node_id if best else None
            if new_best != t.best_node:
                if t.best_node is not None:
                    d.nodes.add(t.best_node)
                if new_best is not None:
                    d.nodes.add(new_best)
                d.best.add(tid)
            t.best_node = new_best
            t.best_us = best.time_us if best else None
            t.best_speedup = ref.over(t.best_us)
            t.noisy_leader = leader.node_id if leader is not None and leader is not best else None
            t.history = t.figures.history(t.node_ids)
            for nid in t.node_ids:
                n = self.nodes.get(nid)
                if n is None:
                    continue
                if n.action == "root":  # the reference itself: what every speedup divides
                    n.time_us, n.speedup = ref.median_us, (1.0 if ref.median_us else None)
                    continue
                n.speedup = ref.over(n.time_us) if n.status == "ok" else None
                n.noisy = n.status == "ok" and t.figures.noisy(t.figures.nodes.get(nid))
            if t.ref_seen != ref:
                t.ref_seen = ref
                d.refs.add(tid)
            d.tasks.add(tid)
        self._unsettled.clear()

    def mark_stopping(self, task_id: str) -> None:
        """A stop was just sent from this view: the row says so before the owner answers."""
        t = self.tasks.get(task_id)
        if t is not None and not t.finished:
            t.status, t.detail = "stopping", "stopping: the stop was sent; in-flight candidates finish"

    # ------------------------------------------------------------------ handlers
    def _on_RunStarted(self, e: ev.RunStarted, d: Dirty) -> None:
        self.run_dir, self.model, self.device = e.run_dir, e.model, e.device
        self.device_name, self.proposer, self.settings = e.device_name, e.proposer, dict(e.settings)
        self.started, self.finished, self.search_ended, self.end_status = e.ts, None, None, ""
        self.evaluated_here = 0
        for t in self.tasks.values():
            t.run_ended = ""
        d.header = True
        d.tasks.update(self.tasks)

    def _on_Phase(self, e: ev.Phase, d: Dirty) -> None:
        prev, prev_ts = self.phase, self.phase_started
        self.phase, self.phase_detail, self.phase_started = e.name, e.detail, e.ts
        took = f" ({prev} took {fmt_s(e.ts - prev_ts)})" if prev and prev_ts is not None and \
            prev not in ("done", "interrupted") else ""
        self.logs.append(LogEntry(e.ts, "phase", f"[{e.name}] {e.detail}".rstrip() + took))
        d.logs = True
        if e.name == "done":
            self.search_ended = self.search_ended or e.ts
        elif e.name == "search":
            self.search_ended = None
        elif e.name == "interrupted":
            self._ended("interrupted", e.ts, d)
        d.header = True

    def _ended(self, how: str, ts: float, d: Dirty) -> None:
        """The run ended (or its process died): rows with work left say so; nothing is in flight."""
        self.finished, self.end_status = ts, how
        for nid in list(self.in_flight):
            n = self.nodes.get(nid)
            if n is not None and how == "interrupted":
                n.status, n.message = "lost", "in flight when the run's process died"
                d.nodes.add(nid)
        self.in_flight.clear()
        for t in self.tasks.values():
            if not t.finished:
                t.run_ended = how
                d.tasks.add(t.task_id)

    def _on_ProfileReady(self, e: ev.ProfileReady, d: Dirty) -> None:
        self.profile_rows = list(e.rows)

    def _on_TaskAdded(self, e: ev.TaskAdded, d: Dirty) -> None:
        t = self.tasks.get(e.task_id)
        if t is None:
            self.tasks[e.task_id] = TaskView(e.task_id, e.op, list(e.shape), e.dtype, e.budget,
                                              e.calls, e.total_us, e.share)
            d.new_tasks = True
        else:
            t.budget, t.calls, t.total_us, t.share = e.budget, e.calls, e.total_us, e.share
        d.tasks.add(e.task_id)

    def _on_TaskBaseline(self, e: ev.TaskBaseline, d: Dirty) -> None:
        t = self.tasks.get(e.task_id)
        if t:
            base = e.baseline or {"eager": {"median_us": e.eager_us},
                                  "compiled": {"median_us": e.compiled_us} if e.compiled_us else None,
                                  "floor_us": e.floor_us}
            t.figures.set_baseline(base)
            t.eager_of = base.get("eager_of") or ""
            t.floor_us = e.floor_us
            root = self.nodes.get(t.node_ids[0]) if t.node_ids else None
            self._unsettled.add(e.task_id)
            if root is not None:
                d.nodes.add(root.node_id)
            d.tasks.add(e.task_id)

    def _on_TaskStatus(self, e: ev.TaskStatus, d: Dirty) -> None:
        t = self.tasks.get(e.task_id)
        if t:
            if t.status == "stopping" and e.status in ("searching", "paused", "waiting"):
                return  # the stop sent from here has not reached the owner yet: keep saying so
            if e.detail or e.status != t.status:  # a follower's bare status keeps the stored reason
                t.detail = e.detail
            t.status = e.status
            d.tasks.add(e.task_id)
            d.header = True

    def _on_TaskBudget(self, e: ev.TaskBudget, d: Dirty) -> None:
        t = self.tasks.get(e.task_id)
        if t:
            t.budget = e.budget
            d.tasks.add(e.task_id)

    def _on_NodeAdded(self, e: ev.NodeAdded, d: Dirty) -> None:
        known = self.nodes.get(e.node_id)
        if known is not None:  # sent again once the proposal names its action (reserved as "proposing")
            if (known.action, known.proposer) != (e.action, e.proposer):
                known.action, known.proposer = e.action, e.proposer
                d.nodes.add(e.node_id)
            return
        root = e.action == "root"
        n = NodeState(e.node_id, e.task_id, e.parent_id, e.action, e.proposer,
                      status="ok" if root else "queued")
        self.nodes[e.node_id] = n
        parent = self.nodes.get(e.parent_id) if e.parent_id is not None else None
        if parent is not None:
            parent.children.append(e.node_id)
        t = self.tasks.get(e.task_id)
        if t:
            t.node_ids.append(e.node_id)
        if not root:
            self.in_flight.add(e.node_id)
        d.nodes.add(e.node_id)
        d.header = True

    def _on_NodeStage(self, e: ev.NodeStage, d: Dirty) -> None:
        n = self.nodes.get(e.node_id)
        if n and n.in_flight:
            n.status = e.stage
            d.nodes.add(e.node_id)

    def _on_NodeFinished(self, e: ev.NodeFinished, d: Dirty) -> None:
        n = self.nodes.get(e.node_id)
        if n is None:
            return
        was_done = not n.in_flight or n.action == "root"
        n.status, n.message, n.time_us, n.spread = e.status, e.message, e.time_us, e.spread
        self.in_flight.discard(e.node_id)
        d.nodes.add(e.node_id)
        d.header = True
        t = self.tasks.get(e.task_id)
        if t is not None and n.action != "root":
            t.figures.update(NodeFigure(n.node_id, n.parent_id, n.action, e.status, e.time_us, e.spread,
                                        e.eager_us, e.compiled_us, e.eager_clock, e.compiled_clock))
            self._unsettled.add(e.task_id)
        if was_done or n.action.startswith("confirm:"):
            return  # a re-timing is not a candidate (it only changes the figures)
        if e.status == "lost":
            return
        if self.started is not None and e.ts >= self.started:
            self.evaluated_here += 1
        if t:
            t.evaluated += 1
            if n.failed:
                t.failed += 1
            d.tasks.add(e.task_id)

    def _on_BestImproved(self, e: ev.BestImproved, d: Dirty) -> None:
        """The engine's own running best (its ratios): the figures decide what is shown."""

    def _on_LLMUsage(self, e: ev.LLMUsage, d: Dirty) -> None:
        """Running totals: shown as they come (adding them up counted every call again)."""
        self.prompt_tokens, self.completion_tokens, self.cost_usd = e.prompt_tokens, e.completion_tokens, e.cost_usd
        self.llm_calls, self.llm_failures, self.llm_last_error = e.calls, e.failures, e.last_error
        d.header = True

    def _on_Workers(self, e: ev.Workers, d: Dirty) -> None:
        self.workers, d.header = dict(e.nodes), True

    def _on_LogLine(self, e: ev.LogLine, d: Dirty) -> None:
        self.logs.append(LogEntry(e.ts, e.level, e.message))
        d.logs = True

    def _on_RunFinished(self, e: ev.RunFinished, d: Dirty) -> None:
        self.summary = e.summary
        status = (e.summary or {}).get("status") or ("failed" if (e.summary or {}).get("error") else "finished")
        self._ended(status, e.ts, d)
        d.header = True
