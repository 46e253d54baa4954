"""Follow a run owned by another process through its store, and steer it through the same store.

`kforge tui RUN_DIR` on a headless run cannot receive the engine's in-process events, so
`StoreFollower` turns what changed in the SQLite store (cheap `max_seq()` poll, then
`nodes(since_seq=...)`) into the same typed events the live engine emits; the TUI cannot tell the
difference. `StoreControl` writes UI commands into the store's `commands` table, which the
owning engine polls. No Textual here.
"""
from __future__ import annotations

from kforge_tui import events as ev

TERMINAL_RUN = ("finished", "stopped", "failed")


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
        self._seq = 0
        self._have_profile = False
        self._tasks: dict[str, dict] = {}  # last seen task rows
        self._nodes: dict[int, str] = {}  # node id -> last status seen
        self._actions: dict[int, str] = {}  # node id -> last action seen
        self._llm = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close:
            close()

    def poll(self) -> list[ev.Event]:
        out: list[ev.Event] = []
        info = self.store.run_info()
        if not self._started:
            self._started = True
            dev = info.get("device") or {}
            if isinstance(dev, str):
                dev = {"backend": dev, "name": dev}
            out.append(ev.RunStarted(run_dir=self.run_dir, model=str(info.get("model", "")),
                                     device=dev.get("backend", ""), device_name=dev.get("name", ""),
                                     proposer=str(info.get("proposer", "")),
                                     settings=info.get("settings") or {}, ts=_ts(info.get("created"))))
        if not self._have_profile:
            rows = self.store.profile()
            if rows:
                self._have_profile = True
                out.append(ev.ProfileReady(rows=rows))
        seq = self.store.max_seq()
        tasks = self.store.tasks()
        for t in tasks:
            self._task_events(t, out, before_nodes=True)
        if seq != self._seq:
            for row in self.store.nodes(since_seq=self._seq):
                self._node_events(row, out)
            self._seq = seq
        for t in tasks:
            self._task_events(t, out, before_nodes=False)
            self._tasks[t["task_id"]] = t
        self._llm_events(out)
        status = info.get("status")
        if status in TERMINAL_RUN and not self._finished:
            self._finished = True
            out.append(ev.RunFinished(summary={"tasks": tasks, "end_to_end": info.get("end_to_end")},
                                      ts=_ts(info.get("updated"))))
        return out

    # ------------------------------------------------------------------ helpers
    def _task_events(self, t: dict, out: list, *, before_nodes: bool) -> None:
        tid = t["task_id"]
        old = self._tasks.get(tid)
        if before_nodes:
            task = t.get("task") or {}
            if old is None or old.get("budget") != t.get("budget"):
                out.append(ev.TaskAdded(task_id=tid, op=t.get("op", ""), shape=list(t.get("shape") or []),
                                        dtype=t.get("dtype", ""), budget=int(t.get("budget") or 0),
                                        calls=int(task.get("calls", 0)), total_us=float(task.get("total_us", 0.0)),
                                        share=float(task.get("share", 0.0))))
            if t.get("baseline") and (old is None or old.get("baseline") != t.get("baseline")):
                b = t["baseline"]
                out.append(ev.TaskBaseline(task_id=tid, eager_us=_baseline_us(b, "eager") or 0.0,
                                           compiled_us=_baseline_us(b, "compiled"), floor_us=b.get("floor_us")))
            return
        if old is None or old.get("status") != t.get("status"):
            out.append(ev.TaskStatus(task_id=tid, status=t.get("status") or "waiting"))
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
            out.append(ev.NodeFinished(task_id=row["task_id"], node_id=nid, status=status,
                                       message=row.get("message") or "", time_us=row.get("time_us"),
                                       speedup=row.get("speedup"), reward=float(row.get("reward") or 0.0),
                                       ts=_ts(row.get("finished"))))
        self._nodes[nid] = status

    def _llm_events(self, out: list) -> None:
        tot = self.store.llm_totals() or {}
        dp = int(tot.get("prompt_tokens") or 0) - self._llm["prompt_tokens"]
        dc = int(tot.get("completion_tokens") or 0) - self._llm["completion_tokens"]
        dcost = float(tot.get("cost_usd") or 0.0) - self._llm["cost_usd"]
        if dp or dc or dcost:
            out.append(ev.LLMUsage(prompt_tokens=dp, completion_tokens=dc, cost_usd=dcost))
            self._llm = {"prompt_tokens": dp + self._llm["prompt_tokens"],
                         "completion_tokens": dc + self._llm["completion_tokens"],
                         "cost_usd": dcost + self._llm["cost_usd"]}


def _ts(value) -> float:
    """Store timestamps may be epoch floats or ISO strings; events want epoch seconds."""
    import time

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
    owning engine can dispatch with `getattr(control, name)(**args)`.
    """

    def __init__(self, store) -> None:
        self.store = store

    def _post(self, name: str, **args) -> None:
        self.store.post_command(name, args)

    def pause(self, task_id: str | None = None) -> None:
        self._post("pause", task_id=task_id)

    def resume(self, task_id: str | None = None) -> None:
        self._post("resume", task_id=task_id)

    def add_budget(self, task_id: str, extra: int) -> None:
        self._post("add_budget", task_id=task_id, extra=int(extra))

    def stop_task(self, task_id: str) -> None:
        self._post("stop_task", task_id=task_id)

    def submit_source(self, task_id: str, parent_id: int, source: str) -> None:
        self._post("submit_source", task_id=task_id, parent_id=int(parent_id), source=source)

    def repair(self, task_id: str, node_id: int) -> None:
        self._post("repair", task_id=task_id, node_id=int(node_id))

    def request_stop(self) -> None:
        self._post("request_stop")
