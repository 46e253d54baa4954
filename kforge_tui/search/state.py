"""The engine's live state of one task's search, and the store rows it is rebuilt from on resume.

Kept apart from engine.py (the orchestration) so that the state a search carries is readable in
one place; the UI has its own view of a task (tui `TaskView`)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field

from kforge_tui.regions.task import Task
from kforge_tui.search.proposers.base import NodeView


@dataclass
class SearchState:
    """The engine's live state of one task's search (the UI has its own `TaskView`)."""

    task: Task
    tree: object  # search.mcts.Tree
    views: dict[int, NodeView] = field(default_factory=dict)
    inflight: set = field(default_factory=set)
    paused: bool = False
    stopped: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    baseline: dict | None = None
    best_speedup: float = 0.0
    iteration: int = 0
    started: float = field(default_factory=time.time)
    status: str = "waiting"  # the last status written to the store (store.TASK_STATUSES)
    exhausted: str = ""  # set when no node at all could be expanded in this round of search
    infra_failures: int = 0  # infrastructure failures in a row (not charged; 3 stop the task)
    confirm_of: dict = field(default_factory=dict)  # re-timing node id -> the node it re-timed


def _view(row: dict) -> NodeView:
    """A store node row as the proposers see it (its failure log where it failed)."""
    result = row.get("result") or {}
    log = ""
    if row.get("status") not in ("ok", "pending", None):
        mm = result.get("mismatch") if isinstance(result, dict) else None
        log = (str(mm) + "\n" if mm else "") + (result.get("log", "") if isinstance(result, dict) else "")
        log = log or row.get("message") or ""
    return NodeView(row["id"], row.get("parent_id"), row.get("action") or "", row.get("source"),
                    params=row.get("params") or {}, status=row.get("status") or "pending",
                    message=row.get("message") or "", time_us=row.get("time_us"), speedup=row.get("speedup"),
                    resources=(result.get("resources") if isinstance(result, dict) else None) or {},
                    error_log=log)


def _baseline_json(b) -> dict:
    return b if isinstance(b, dict) else asdict(b)
