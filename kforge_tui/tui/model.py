"""The UI's picture of a run, folded from the typed event stream (no Textual here).

Keeping the state separate from the widgets lets the app apply a whole batch of events cheaply
and then touch only the widgets whose data changed (`Dirty`), which is what keeps a 2,000-node
tree responsive while eight evaluations stream stage changes.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from kforge_tui import events as ev

FAILED_PREFIXES = ("static", "compile", "load", "verify", "time", "timeout", "crash", "impossible",
                   "proposal")
IN_FLIGHT_STAGES = ("queued", "proposing", "static", "compile", "load", "verify", "time", "pending")


def is_failure(status: str) -> bool:
    return status not in IN_FLIGHT_STAGES and status != "ok"


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
    speedup: float | None = None
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
    eager_us: float | None = None
    compiled_us: float | None = None
    floor_us: float | None = None
    best_node: int | None = None
    best_us: float | None = None
    best_speedup: float | None = None
    evaluated: int = 0
    failed: int = 0
    history: list[float] = field(default_factory=list)  # best speedup after each finished node
    node_ids: list[int] = field(default_factory=list)  # creation order

    @property
    def speedup_vs_compile(self) -> float | None:
        if self.best_us and self.compiled_us:
            return self.compiled_us / self.best_us
        return None

    @property
    def exhausted(self) -> bool:
        return self.status == "done" and self.detail.startswith(ev.EXHAUSTED)

    @property
    def state(self) -> str:
        """What the row says: the status, with "exhausted" told apart from a spent budget."""
        return "exhausted" if self.exhausted else self.status

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed", "stopped")

    @property
    def reason(self) -> str:
        """One line on why the op is where it is (shown under its tree)."""
        if self.status == "done":
            return self.detail if self.exhausted else f"done: {self.detail or 'budget spent'}"
        if self.status in ("failed", "stopped", "paused"):
            return f"{self.status}: {self.detail}" if self.detail else self.status
        return ""


@dataclass
class Dirty:
    """What one batch of events changed, so the app redraws only that."""

    header: bool = False
    tasks: set[str] = field(default_factory=set)
    new_tasks: bool = False
    nodes: set[int] = field(default_factory=set)  # added or changed
    best: set[str] = field(default_factory=set)
    logs: bool = False

    def any(self) -> bool:
        return bool(self.header or self.tasks or self.new_tasks or self.nodes or self.best or self.logs)


class RunModel:
    """Folds events into run/task/node state. `apply` is O(1) per event."""

    def __init__(self) -> None:
        self.run_dir: str | None = None
        self.model = ""
        self.device = ""
        self.device_name = ""
        self.proposer = ""
        self.settings: dict = {}
        self.started: float | None = None
        self.finished: float | None = None
        self.phase = ""
        self.phase_detail = ""
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
        self.finish_times: deque[float] = deque(maxlen=4096)
        self.logs: deque[ev.LogLine] = deque(maxlen=500)
        self.summary: dict | None = None

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

    def per_minute(self, now: float | None = None) -> float:
        """Candidates finished per minute over the last five minutes of the search (or all of it)."""
        if not self.finish_times:
            return 0.0
        end = self._end(now)
        window = min(300.0, max(1.0, end - (self.started or self.finish_times[0])))
        n = sum(1 for t in self.finish_times if t >= end - window)
        return n * 60.0 / window

    def apply(self, e: ev.Event, dirty: Dirty) -> None:
        handler = getattr(self, "_on_" + type(e).__name__, None)
        if handler is not None:
            handler(e, dirty)

    # ------------------------------------------------------------------ handlers
    def _on_RunStarted(self, e: ev.RunStarted, d: Dirty) -> None:
        self.run_dir, self.model, self.device = e.run_dir, e.model, e.device
        self.device_name, self.proposer, self.settings = e.device_name, e.proposer, dict(e.settings)
        self.started, self.finished, self.search_ended = e.ts, None, None
        d.header = True

    def _on_Phase(self, e: ev.Phase, d: Dirty) -> None:
        self.phase, self.phase_detail = e.name, e.detail
        if e.name == "done":
            self.search_ended = self.search_ended or e.ts
        elif e.name == "search":
            self.search_ended = None
        d.header = True

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
            t.eager_us, t.compiled_us, t.floor_us = e.eager_us, e.compiled_us, e.floor_us
            d.tasks.add(e.task_id)

    def _on_TaskStatus(self, e: ev.TaskStatus, d: Dirty) -> None:
        t = self.tasks.get(e.task_id)
        if t:
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
                      status="ok" if root else "queued", speedup=1.0 if root else None)
        self.nodes[e.node_id] = n
        parent = self.nodes.get(e.parent_id) if e.parent_id is not None else None
        if parent is not None:
            parent.children.append(e.node_id)
        t = self.tasks.get(e.task_id)
        if t:
            t.node_ids.append(e.node_id)
            if root and t.eager_us is not None:
                n.time_us = t.eager_us
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
        n.status, n.message, n.time_us, n.speedup = e.status, e.message, e.time_us, e.speedup
        self.in_flight.discard(e.node_id)
        d.nodes.add(e.node_id)
        d.header = True
        if was_done:
            return
        t = self.tasks.get(e.task_id)
        if n.action.startswith("confirm:"):
            # a side-by-side re-timing of a finished search (engine._confirm): not a candidate,
            # but it replaces its parent's figure in the choice of the winner
            if t:
                self._winner(t, d)
            return
        self.finish_times.append(e.ts)
        if t:
            t.evaluated += 1
            if n.failed:
                t.failed += 1
            if e.status == "ok" and e.speedup is not None:
                self._winner(t, d)
            t.history.append(t.best_speedup or 0.0)
            d.tasks.add(e.task_id)

    def _winner(self, t: TaskView, d: Dirty) -> None:
        """The store's rule (store._TASKS_SQL): each verified candidate with its re-timing when
        it has one, a candidate whose re-timing failed left out; the re-timing row wins."""
        best = None  # (speedup, node)
        nodes = [self.nodes[i] for i in t.node_ids if i in self.nodes]
        confirms: dict[int, list] = {}
        for c in nodes:
            if c.action.startswith("confirm:") and not c.in_flight and c.status != "lost":
                confirms.setdefault(c.parent_id, []).append(c)
        for n in nodes:
            if n.action == "root" or n.action.startswith("confirm:") or n.status != "ok" \
                    or n.speedup is None:
                continue
            conf = confirms.get(n.node_id, [])
            if any(c.status != "ok" for c in conf):
                continue
            cand = max(((c.speedup, c) for c in conf if c.speedup is not None), default=(n.speedup, n),
                       key=lambda x: x[0])
            if best is None or cand[0] > best[0]:
                best = cand
        if best is not None and best[1].node_id != t.best_node:
            self._set_best(t, best[1].node_id, best[1].time_us, best[0], d)

    def _on_BestImproved(self, e: ev.BestImproved, d: Dirty) -> None:
        t = self.tasks.get(e.task_id)
        if t:
            self._winner(t, d)
            if t.history and t.best_speedup is not None:
                t.history[-1] = max(t.history[-1], t.best_speedup)

    def _set_best(self, t: TaskView, node_id: int, time_us, speedup, d: Dirty) -> None:
        old = t.best_node
        t.best_node, t.best_us, t.best_speedup = node_id, time_us, speedup
        d.best.add(t.task_id)
        d.tasks.add(t.task_id)
        d.nodes.add(node_id)
        if old is not None:
            d.nodes.add(old)

    def _on_LLMUsage(self, e: ev.LLMUsage, d: Dirty) -> None:
        """Running totals: shown as they come (adding them up counted every call again)."""
        self.prompt_tokens, self.completion_tokens, self.cost_usd = e.prompt_tokens, e.completion_tokens, e.cost_usd
        self.llm_calls, self.llm_failures, self.llm_last_error = e.calls, e.failures, e.last_error
        d.header = True

    def _on_Workers(self, e: ev.Workers, d: Dirty) -> None:
        self.workers, d.header = dict(e.nodes), True

    def _on_LogLine(self, e: ev.LogLine, d: Dirty) -> None:
        self.logs.append(e)
        d.logs = True

    def _on_RunFinished(self, e: ev.RunFinished, d: Dirty) -> None:
        self.finished = e.ts
        self.summary = e.summary
        d.header = True
