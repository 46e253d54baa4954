"""How a UI reaches an engine.

`EngineControl` is the set of commands. Three implementations: the engine itself (same thread),
`EngineThread` (the engine on its own thread and asyncio loop, as the TUI runs it) and
`follow.StoreControl` (a run owned by another process: commands go through the run store's
`commands` table, which that engine polls).
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Protocol

COMMANDS = ("pause", "resume", "add_budget", "stop_task", "submit_source", "repair", "request_stop")


class EngineControl(Protocol):
    def pause(self, task_id: str | None = None) -> None: ...  # None: the whole search

    def resume(self, task_id: str | None = None) -> None: ...

    def add_budget(self, task_id: str, extra: int) -> None: ...

    def stop_task(self, task_id: str) -> None: ...

    def submit_source(self, task_id: str, parent_id: int, source: str) -> None:
        """A hand-written (edited) kernel: becomes a child of parent_id marked 'hand'."""

    def repair(self, task_id: str, node_id: int) -> None:
        """Ask the proposer for a repair of a failed node (feeds its error back)."""

    def request_stop(self, end_to_end: bool | None = None) -> None:
        """Finish in-flight evaluations, then end the run; `end_to_end` overrides the setting."""


class EngineThread:
    """Runs an engine on its own thread and event loop; an EngineControl usable from any thread.

    Why: the engine writes SQLite, spawns compilers and talks to worker processes; on the UI's
    loop every such call would stall key presses. `run()` is what the thread executes (the TUI
    calls it from a Textual thread worker); each control call is handed to the engine's loop
    and waited for, so an error in it reaches the caller. `cancel()` stops the run as Ctrl-C
    would (the store says "stopped"); `request_stop()` lets it finish (end-to-end check included).
    """

    def __init__(self, make_engine: Callable[[Callable], Any], sink: Callable) -> None:
        self._make_engine = make_engine
        self._sink = sink
        self.engine = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        self._cancelled = False

    @property
    def running(self) -> bool:
        return self._ready.is_set() and not self._done.is_set()

    def run(self):
        """The engine's whole run on this thread; returns its summary (raises what it raises)."""
        try:
            return asyncio.run(self._main())
        except asyncio.CancelledError:
            if self._cancelled:
                return None  # stopped on request: the store says "stopped", nothing failed
            raise
        finally:
            self._done.set()
            self._ready.set()  # nobody waits forever on an engine that failed to start

    async def _main(self):
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.engine = self._make_engine(self._sink)
        self._ready.set()
        return await self.engine.run()

    def join(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def cancel(self) -> None:
        self._ready.wait(5.0)
        if not self._done.is_set() and self._loop is not None and self._task is not None:
            self._cancelled = True
            self._loop.call_soon_threadsafe(self._task.cancel)

    def call(self, name: str, *args, timeout: float = 30.0):
        """Run `engine.<name>(*args)` on the engine's loop and wait for it."""
        if name not in COMMANDS:
            raise ValueError(f"not an engine command: {name}")
        self._ready.wait(timeout)
        if not self.running:
            raise RuntimeError("the engine is not running")

        async def apply():
            return getattr(self.engine, name)(*args)

        return asyncio.run_coroutine_threadsafe(apply(), self._loop).result(timeout)

    def pause(self, task_id: str | None = None) -> None:
        self.call("pause", task_id)

    def resume(self, task_id: str | None = None) -> None:
        self.call("resume", task_id)

    def add_budget(self, task_id: str, extra: int) -> None:
        self.call("add_budget", task_id, extra)

    def stop_task(self, task_id: str) -> None:
        self.call("stop_task", task_id)

    def submit_source(self, task_id: str, parent_id: int, source: str) -> None:
        self.call("submit_source", task_id, parent_id, source)

    def repair(self, task_id: str, node_id: int) -> None:
        self.call("repair", task_id, node_id)

    def request_stop(self, end_to_end: bool | None = None) -> None:
        self.call("request_stop", end_to_end)
