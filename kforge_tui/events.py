"""Typed engine events: the one stream both the TUI and the headless reporter consume.

The engine emits these through an `EventCallback`; the TUI wraps each in a Textual
message, the headless reporter prints progress, and `StoreFollower` (follow.py) synthesises the
same events by polling a run store written by another process. The kinds that no store table
holds (`STORED`: phases, log lines, task status with its reason) are also appended to the store's
`events` table by the engine, so an attached TUI shows them too. Plain dataclasses, no UI imports.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable


@dataclass
class Event:
    ts: float = field(default_factory=time.time, kw_only=True)

    def to_json(self) -> dict:
        d = asdict(self)
        d["type"] = type(self).__name__
        return d


@dataclass
class RunStarted(Event):
    run_dir: str
    model: str
    device: str  # "cuda" | "cpu"
    device_name: str  # "NVIDIA H200" or the CPU model
    proposer: str  # LLM model string or "built-in"
    settings: dict = field(default_factory=dict)


@dataclass
class Phase(Event):
    """Coarse progress: loading, profiling, capturing, baselines, searching, integrating.

    "done" is sent when no op is searching any more (the live engine may still serve edits and
    repairs, and goes back to "search" when more budget is given), and again at the very end.
    """

    name: str  # "load" | "profile" | "capture" | "baseline" | "search" | "done" | "integrate";
    # follow.StoreFollower adds "interrupted" (the owner died) and never stores it
    detail: str = ""


@dataclass
class ProfileReady(Event):
    rows: list[dict]  # ProfileRow.to_json() of workload/profile.py


@dataclass
class TaskAdded(Event):
    task_id: str
    op: str
    shape: list
    dtype: str
    budget: int
    calls: int = 0
    total_us: float = 0.0
    share: float = 0.0


@dataclass
class TaskBaseline(Event):
    task_id: str
    eager_us: float
    compiled_us: float | None
    floor_us: float | None
    baseline: dict | None = None  # the stored baseline (timings with spread and clock), when known


@dataclass
class TaskStatus(Event):
    task_id: str
    # waiting | searching | paused | done | failed | stopped, or "stopping" (a stop was taken and
    # in-flight candidates finish; never written to the tasks table)
    status: str
    detail: str = ""  # why: "budget", "target", "time", EXHAUSTED + "...", "paused by the user"


EXHAUSTED = "exhausted"  # TaskStatus.detail of a "done" op whose proposer has nothing left to try


@dataclass
class TaskBudget(Event):
    """The budget of an op changed (a UI added candidates)."""

    task_id: str
    budget: int


@dataclass
class NodeAdded(Event):
    task_id: str
    node_id: int
    parent_id: int | None
    action: str  # "root", "family:warp_per_row", "set:vec=8", "llm:improve", "llm:repair", "hand"
    proposer: str


@dataclass
class NodeStage(Event):
    task_id: str
    node_id: int
    stage: str  # queued | proposing | static | compile | load | verify | time


@dataclass
class NodeFinished(Event):
    task_id: str
    node_id: int
    status: str  # "ok" or a failure status of sandbox/result.py
    message: str
    time_us: float | None
    speedup: float | None  # the sandbox's own ratio (over the eager time measured with it); UIs
    reward: float  # show summary.TaskFigures' pooled reference over time_us instead
    spread: float | None = None  # the candidate's own timing spread, (p90 - p10) / median
    eager_us: float | None = None  # eager, timed side by side with the candidate
    compiled_us: float | None = None  # torch.compile, timed side by side (when the task has it)
    eager_clock: str = ""  # what clock those were read on, when the sandbox labels them
    compiled_clock: str = ""


@dataclass
class BestImproved(Event):
    task_id: str
    node_id: int
    time_us: float
    speedup: float
    iteration: int


@dataclass
class LLMUsage(Event):
    """Running totals of the run's LLM use (not increments): consumers show them as they come."""

    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    calls: int = 0
    failures: int = 0  # calls that gave no usable code (HTTP 429/5xx after retries, prose, ...)
    last_error: str = ""


@dataclass
class LogLine(Event):
    level: str  # info | warning | error
    message: str


@dataclass
class Workers(Event):
    """Evaluation workers per node of a Ray cluster run, sent when they change (a node joins,
    leaves, or a worker dies): {"10.0.0.7:1d63c0b3": 4, ...}. Local runs send none."""

    nodes: dict = field(default_factory=dict)


@dataclass
class RunFinished(Event):
    summary: dict  # {"tasks": [...], "end_to_end": {...} | None}


EventCallback = Callable[[Event], None]

EVENT_TYPES = {cls.__name__: cls for cls in (RunStarted, Phase, ProfileReady, TaskAdded, TaskBaseline,
                                             TaskStatus, TaskBudget, NodeAdded, NodeStage, NodeFinished,
                                             BestImproved, LLMUsage, LogLine, Workers, RunFinished)}
STORED = (Phase, LogLine, TaskStatus, Workers)  # appended to the store's events table by the engine


def event_from_json(d: dict) -> Event:
    d = dict(d)
    cls = EVENT_TYPES[d.pop("type")]
    return cls(**d)


class forward_log:
    """Route a library logger's records to `log(message, level)` (the engine's LogLine events)
    while active."""

    def __init__(self, name: str, log: Callable[[str, str], None]):
        import logging

        self.logger = logging.getLogger(name)

        class _Handler(logging.Handler):
            def emit(self, record):
                log(record.getMessage(), "warning" if record.levelno >= logging.WARNING else "info")

        self.handler = _Handler()
        self.old_level = self.logger.level

    def __enter__(self):
        import logging

        self.logger.addHandler(self.handler)
        if self.logger.getEffectiveLevel() > logging.INFO:
            self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.old_level)
