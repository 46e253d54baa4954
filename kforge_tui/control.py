"""Commands a UI sends to a running search. The engine implements this in-process; for a run
owned by another process (`kforge tui RUN_DIR` on a headless run) the TUI writes the same
commands into the run store's `commands` table, which that engine polls.
"""
from __future__ import annotations

from typing import Protocol


class EngineControl(Protocol):
    def pause(self, task_id: str | None = None) -> None: ...  # None: the whole search

    def resume(self, task_id: str | None = None) -> None: ...

    def add_budget(self, task_id: str, extra: int) -> None: ...

    def stop_task(self, task_id: str) -> None: ...

    def submit_source(self, task_id: str, parent_id: int, source: str) -> None:
        """A hand-written (edited) kernel: becomes a child of parent_id marked 'hand'."""

    def repair(self, task_id: str, node_id: int) -> None:
        """Ask the proposer for a repair of a failed node (feeds its error back)."""

    def request_stop(self) -> None: ...  # finish in-flight evaluations, then end the run
