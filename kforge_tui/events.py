"""Typed engine events: the one stream both the TUI and the headless reporter consume.

The engine emits these through an `EventCallback`; the TUI wraps each in a Textual
message, the headless reporter prints progress, and `StoreFollower` (store.py) synthesises the
same events by polling a run store written by another process. Plain dataclasses, no UI imports.
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
    """Coarse progress before the search: loading, profiling, capturing, baselines."""

    name: str  # "load" | "profile" | "capture" | "baseline" | "search" | "integrate" | "done"
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


@dataclass
class TaskStatus(Event):
    task_id: str
    status: str  # waiting | searching | paused | done | failed | stopped
    detail: str = ""


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
    speedup: float | None
    reward: float


@dataclass
class BestImproved(Event):
    task_id: str
    node_id: int
    time_us: float
    speedup: float
    iteration: int


@dataclass
class LLMUsage(Event):
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


@dataclass
class LogLine(Event):
    level: str  # info | warning | error
    message: str


@dataclass
class RunFinished(Event):
    summary: dict  # {"tasks": [...], "end_to_end": {...} | None}


EventCallback = Callable[[Event], None]

EVENT_TYPES = {cls.__name__: cls for cls in (RunStarted, Phase, ProfileReady, TaskAdded, TaskBaseline,
                                             TaskStatus, NodeAdded, NodeStage, NodeFinished,
                                             BestImproved, LLMUsage, LogLine, RunFinished)}


def event_from_json(d: dict) -> Event:
    d = dict(d)
    cls = EVENT_TYPES[d.pop("type")]
    return cls(**d)
