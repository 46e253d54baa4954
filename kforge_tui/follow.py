"""Follow a run owned by another process through its store, and steer it through the same store.

`kforge tui RUN_DIR` on a headless run cannot receive the engine's in-process events, so
`StoreFollower` turns what changed in the SQLite store (cheap `max_seq()` poll, then
`nodes(since_seq=...)` and the `events` table) into the same typed events the live engine emits;
the TUI cannot tell the difference. Every poll also asks whether the owner still lives (its
`flock`, and its heartbeat for an owner on another host): a run whose process died says
`interrupted` within one poll, instead of a clock that runs on. `StoreControl` writes UI commands
into the store's `commands` table, which the owning engine polls — on its own read-write
connection, because the follower's is read-only. No Textual here.
"""
from __future__ import annotations

import socket
import time

from kforge_tui import events as ev

TERMINAL_RUN = ("finished", "stopped", "failed")
STALE_S = 15.0  # a heartbeat this old from another host: its owner is gone (its flock may not reach us)


def _baseline_us(baseline: dict | None, key: str) -> float | None:
    t = (baseline or {}).get(key)
    if isinstance(t, dict):
        return t.get("median_us")
    return None


class StoreFollower:
    """`poll()` returns the events that describe what changed since the last poll.

    The first poll replays the whole run (a finished run opens fully populated); later polls cost
    one `max_seq()` query plus, when something changed, the changed rows only.
    """

    def __init__(self, run_dir, store=None) -> None:
        if store is None:
            from kforge_tui.store import RunStore  # lazily: the UI may start before a run exists

            store = RunStore.open(run_dir, readonly=True)
        self.store = store
        self.run_dir = str(run_dir)
        self._started = False
        self._finished = False
        self._seq = -1
        self._event_id = 0
        self._phase_seen = False
        self._have_profile = False
        self._tasks: dict[str, dict] = {}  # last seen task rows
        self._shown: dict[str, str] = {}  # task id -> the status last sent ("stopping" included)
        self._nodes: dict[int, str] = {}  # node id -> last status seen
        self._actions: dict[int, str] = {}  # node id -> last action seen
        self._llm: dict = {}
        self._status: str | None = None  # the run's status at the last full poll
        self._dead = False  # the run says "running" but its process is gone
        self._announced = False

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close:
            close()

    def owner_alive(self) -> bool:
        """The process running this run still lives: it holds the owner lock (checked at once,
        even mid-write), or (another host, or a store from before owner locks) it beat lately."""
        from kforge_tui.store import owner_pid

        beat = self.store.heartbeat() or {}
        fresh = time.time() - float(beat.get("beat") or 0) < STALE_S
        if owner_pid(self.run_dir) is not None:
            return fresh or not beat or beat.get("host") == socket.gethostname()
        return fresh and beat.get("host") not in (None, socket.gethostname())

    def poll(self) -> list[ev.Event]:
        out: list[ev.Event] = []
        revived = False
        if self._status == "running":  # every poll, written to or not: a killed owner writes nothing
            alive = self.owner_alive()
            if not alive and not self._dead:
                self._dead, self._announced = True, False
            elif alive and self._dead:
                self._dead, revived = False, True  # `kforge resume` took it over
        seq = self.store.max_seq()
        if seq == self._seq and not revived:
            return self._announce(out)  # nothing was written since the last poll
        info = self.store.run_info()
        status = info.get("status")
        self._status = status
        if status in TERMINAL_RUN:
            self._dead = False
        if not self._started or revived or (self._finished and status not in TERMINAL_RUN):  # first, or resumed
            self._started, self._finished = True, False
            dev = info.get("device") or {}
            if isinstance(dev, str):
                dev = {"backend": dev, "name": dev}
            from kforge_tui.store import owner_pid

            beat = self.store.heartbeat() or {}
            # the running process's own start: elapsed and cand/min are that process's (a new
            # owner that has not beaten yet started about now)
            pid = owner_pid(self.run_dir) if status == "running" else None
            started = (beat.get("started") if beat.get("pid") == pid else time.time()) if pid else None
            out.append(ev.RunStarted(run_dir=self.run_dir, model=str(info.get("model", "")),
                                     device=dev.get("backend", ""), device_name=dev.get("name", ""),
                                     proposer=str(info.get("proposer", "")),
                                     settings=info.get("settings") or {},
                                     ts=_ts(started or info.get("created"))))
            if status == "running" and not self.owner_alive():
                self._dead, self._announced = True, False  # opened after the owner died
        if not self._have_profile:
            rows = self.store.profile()
            if rows:
                self._have_profile = True
                out.append(ev.ProfileReady(rows=rows))
        tasks = self.store.tasks()
        for t in tasks:
            self._task_events(t, out, before_nodes=True)
        for row in self.store.nodes(since_seq=max(self._seq, 0)):
            self._node_events(row, out)
        self._seq = seq
        for t in tasks:
            self._task_events(t, out, before_nodes=False)
            self._tasks[t["task_id"]] = t
        self._stored_events(out, tasks, status)
        if any(isinstance(e, ev.Phase) for e in out):
            self._announced = False  # a replayed phase would read as the truth: say it again after it
        self._llm_events(out)
        if status in TERMINAL_RUN and not self._finished:
            from kforge_tui.summary import show_json

            self._finished = True
            out.append(ev.RunFinished(summary=show_json(self.run_dir, store=self.store),
                                      ts=_ts(info.get("updated"))))
        return self._announce(out)

    # ------------------------------------------------------------------ helpers
    def _announce(self, out: list) -> list:
        """A dead owner is said once, after anything replayed from the store, as a phase."""
        if self._dead and not self._announced:
            self._announced = True
            beat = (self.store.heartbeat() or {}).get("beat")  # when it last lived
            out.append(ev.Phase(name="interrupted", ts=float(beat) if beat else time.time(),
                                detail=f"the run's process is gone; `kforge resume {self.run_dir}` continues it"))
        return out

    def _task_events(self, t: dict, out: list, *, before_nodes: bool) -> None:
        tid = t["task_id"]
        old = self._tasks.get(tid)
        if before_nodes:
            task = t.get("task") or {}
            if old is None:
                out.append(ev.TaskAdded(task_id=tid, op=t.get("op", ""), shape=list(t.get("shape") or []),
                                        dtype=t.get("dtype", ""), budget=int(t.get("budget") or 0),
                                        calls=int(task.get("calls", 0)), total_us=float(task.get("total_us", 0.0)),
                                        share=float(task.get("share", 0.0))))
            elif old.get("budget") != t.get("budget"):
                out.append(ev.TaskBudget(task_id=tid, budget=int(t.get("budget") or 0)))
            if t.get("baseline") and (old is None or old.get("baseline") != t.get("baseline")):
                b = t["baseline"]
                out.append(ev.TaskBaseline(task_id=tid, eager_us=_baseline_us(b, "eager") or 0.0,
                                           compiled_us=_baseline_us(b, "compiled"), floor_us=b.get("floor_us"),
                                           baseline={k: v for k, v in b.items() if k != "seed"}))
            return
        status = t.get("status") or "waiting"
        if (t.get("control") or {}).get("stopped") and status in ("searching", "paused", "waiting"):
            status = "stopping"  # stored at once by whoever sent it; "stopped" once it lands
        if self._shown.get(tid) != status:
            self._shown[tid] = status
            out.append(ev.TaskStatus(task_id=tid, status=status))
        best = t.get("best_node")
        if best is not None and (old is None or old.get("best_node") != best) and t.get("speedup"):
            out.append(ev.BestImproved(task_id=tid, node_id=best, time_us=float(t.get("best_us") or 0.0),
                                       speedup=float(t["speedup"]), iteration=int(t.get("evaluated") or 0)))

    def _node_events(self, row: dict, out: list) -> None:
        nid = row["id"]
        status = row.get("status") or "pending"
        action = row.get("action", "")
        if nid not in self._nodes or self._actions.get(nid) != action:  # reserved as "proposing", then named
            self._actions[nid] = action
            out.append(ev.NodeAdded(task_id=row["task_id"], node_id=nid, parent_id=row.get("parent_id"),
                                    action=action, proposer=row.get("proposer") or "",
                                    ts=_ts(row.get("created"))))
        if row.get("action") == "root":
            self._nodes[nid] = status
            return
        if status != "pending" and self._nodes.get(nid) != status:
            from kforge_tui.summary import figure_fields

            out.append(ev.NodeFinished(task_id=row["task_id"], node_id=nid, status=status,
                                       message=row.get("message") or "", time_us=row.get("time_us"),
                                       speedup=row.get("speedup"), reward=float(row.get("reward") or 0.0),
                                       ts=_ts(row.get("finished")), **figure_fields(row.get("result"))))
        self._nodes[nid] = status

    def _stored_events(self, out: list, tasks: list[dict], status: str | None) -> None:
        """Phases, log lines and task reasons the engine appended to the store (events.STORED)."""
        kinds = {cls.__name__: cls for cls in ev.STORED}
        for d in self.store.events(since_id=self._event_id):
            self._event_id = d.pop("id")
            cls = kinds.get(d.pop("type", None))
            if cls is None:
                continue
            known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
            try:
                out.append(cls(**known))
            except TypeError:  # a record from another kforge version: skip it, keep following
                continue
            self._phase_seen = self._phase_seen or cls is ev.Phase
        if not self._phase_seen and tasks and status not in TERMINAL_RUN:
            self._phase_seen = True  # a store from before stored events: the search is what runs
            out.append(ev.Phase(name="search"))

    def _llm_events(self, out: list) -> None:
        tot = self.store.llm_totals() or {}
        if tot.get("calls") and tot != self._llm:
            self._llm = tot
            out.append(ev.LLMUsage(prompt_tokens=int(tot.get("prompt_tokens") or 0),
                                   completion_tokens=int(tot.get("completion_tokens") or 0),
                                   cost_usd=float(tot.get("cost_usd") or 0.0), calls=int(tot["calls"]),
                                   failures=int(tot.get("failures") or 0),
                                   last_error=tot.get("last_error") or ""))


def _ts(value) -> float:
    """Store timestamps may be epoch floats or ISO strings; events want epoch seconds."""
    if value is None:
        return time.time()
    if isinstance(value, (int, float)):
        return float(value)
    try:
        from datetime import datetime

        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return time.time()


class StoreControl:
    """EngineControl for a run owned by another process: each call becomes a store command.

    Command names are the EngineControl method names and args its keyword arguments, so the
    owning engine can dispatch with `getattr(control, name)(**args)`. A command the owner has not
    taken when it exits stays in the table for the next owner (`kforge resume`, or a TUI that
    resumes the run): nothing sent is lost. Opens its own read-write connection on first use.
    """

    def __init__(self, run_dir) -> None:
        self.run_dir = str(run_dir)
        self._store = None

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def _post(self, name: str, **args) -> None:
        self._post_store().post_command(name, args)

    def _control(self, task_id: str | None, **flags) -> None:
        """Stops and pauses are also stored state at once: every view shows them, and they hold
        even if the owner dies before it takes the command (the next `kforge resume` reads them)."""
        self._post_store().set_control(task_id, **flags)

    def _post_store(self):
        if self._store is None:
            from kforge_tui.store import RunStore

            self._store = RunStore.open(self.run_dir)
        return self._store

    def pause(self, task_id: str | None = None) -> None:
        self._control(task_id, paused=True)
        self._post("pause", task_id=task_id)

    def resume(self, task_id: str | None = None) -> None:
        self._control(task_id, paused=False)
        self._post("resume", task_id=task_id)

    def add_budget(self, task_id: str, extra: int) -> None:
        self._post("add_budget", task_id=task_id, extra=int(extra))

    def stop_task(self, task_id: str) -> None:
        self._control(task_id, stopped=True)
        self._post("stop_task", task_id=task_id)

    def submit_source(self, task_id: str, parent_id: int, source: str) -> None:
        self._post("submit_source", task_id=task_id, parent_id=int(parent_id), source=source)

    def repair(self, task_id: str, node_id: int) -> None:
        self._post("repair", task_id=task_id, node_id=int(node_id))

    def request_stop(self, end_to_end: bool | None = None) -> None:
        self._post("request_stop", end_to_end=end_to_end)
