"""Issue 22's "done when", in real terminals (tmux): a live run (`kforge optimize` with its TUI) and
a view attached to it from another terminal (`kforge tui RUN_DIR`), driven by keys only.

1. Stop an op from the attached view: its row says `stopping` at once (both views), `stopped`
   once its in-flight candidate lands.
2. `kill -9` the owner: the attached view says `interrupted` within 5 s, and no worker process of
   the owner is left running.
3. `kforge resume` (a live TUI again): the stopped op stays stopped while the others search on
   (stored control state, not a command that died with the owner).
4. A hand edit to the stopped op, from the attached view: in the tree at once as a queued node,
   evaluated within 10 s while the other op keeps searching (it goes to the front of the queue).
5. Closing the attached view says the run goes on in its process, and how to reattach.

Everything is real: the CLI, the engine, the compiler, the sandbox workers, SQLite, tmux.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge_tui.errors import UsageError
from kforge_tui.figures import retimed_node
from kforge_tui.store import RunStore, owner_pid
from test_tui_attach_tmux import wait
from test_tui_live_terminal import Term

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)"),
              pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def store(run: Path):
    return RunStore.open(run, readonly=True)


def tasks(run: Path) -> list[dict]:
    try:
        with store(run) as s:
            return s.tasks()
    except UsageError:  # the store is being created
        return []


def candidates(run: Path, tid: str) -> list[dict]:
    with store(run) as s:
        return [n for n in s.nodes(tid) if n["parent_id"] is not None and not n["action"].startswith("confirm:")]


def state(screen: str) -> str:
    lines = screen.splitlines()
    return lines[1].split()[0] if len(lines) > 1 and lines[1].split() else ""


def row(screen: str, op: str) -> str:
    """The operator table's row of `op` (the first one)."""
    table = screen.split("operators [1]")[1].split("╰")[0] if "operators [1]" in screen else ""
    return next((ln for ln in table.splitlines() if re.match(rf"│ {re.escape(op)}\s", ln)), "")


def searching_since(run: Path, t: float) -> bool:
    with store(run) as s:
        return any(e.get("type") == "Phase" and e.get("name") == "search" and e["ts"] >= t for e in s.events())


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (its workers, their zygotes and runners)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def running(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def survivors(pids) -> list[str]:
    """The processes of `pids` still running, as 'pid state command' (what a failure names)."""
    out = []
    for p in sorted(pids):
        if running(p):
            try:
                cmd = (Path("/proc") / str(p) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                st = (Path("/proc") / str(p) / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            out.append(f"{p} {st} {cmd[:160]}")
    return out


def joined(t: Term) -> str:
    """The pane and its history with wrapped lines joined (a long run directory wraps at 100)."""
    return subprocess.run(t.tmux + ["capture-pane", "-t", t.name, "-p", "-J", "-S", "-500"], capture_output=True,
                          text=True).stdout


def kforge_cmd(args: str, rc: Path) -> str:
    return (f"unset COLUMNS LINES; cd {ROOT} && PYTHONPATH={ROOT} {PY} -m kforge_tui {args}; "
            f"echo $? > {rc}; sleep 60")


def test_live_and_attached_views_tell_the_truth_about_the_run(tmp_path):
    run = tmp_path / "run"
    live = view = None
    try:
        live = Term(f"kforge-truth-live-{os.getpid()}", kforge_cmd(
            f"optimize tests/fixtures/models/tiny.py --device cpu --top 2 --budget 400 --parallel 2 "
            f"--no-apply --run-dir {run}", tmp_path / "live.rc"))
        wait(lambda: (run / "run.db").exists() and len(tasks(run)) == 2, "the live run's two ops", 240)
        first, second = tasks(run)
        op = first["op"]
        wait(lambda: len(candidates(run, first["task_id"])) >= 1 and len(candidates(run, second["task_id"])) >= 1,
             "both ops searching", 240)
        view = Term(f"kforge-truth-view-{os.getpid()}", kforge_cmd(f"tui {run}", tmp_path / "view.rc"))
        s = view.wait(lambda s: state(s) == "search" and "searching" in row(s, op), "the attached view of the search", 60)

        # 1. stop the first op (selected on opening) from the attached view
        view.keys("s")
        s = view.wait(lambda s: "stopping" in row(s, op) or "stopped" in row(s, op), "stopping in the row", 3)
        live.wait(lambda s: "stopping" in row(s, op) or "stopped" in row(s, op), "stopping in the live view", 5)
        wait(lambda: tasks(run)[0]["status"] == "stopped", "the owner to stop the op", 60)
        view.wait(lambda s: "stopped" in row(s, op), "stopped in the attached view", 10)

        # 2. kill -9 the owner: the attached view says so within 5 s; its workers die with it
        owner = owner_pid(run)
        assert owner and owner > 0
        workers = descendants(owner)
        assert workers, "the owner has no worker processes to check"
        os.kill(owner, signal.SIGKILL)
        t0 = time.monotonic()
        s = view.wait(lambda s: state(s) == "interrupted", "interrupted in the attached header", 5)
        assert time.monotonic() - t0 < 5.0
        assert f"interrupted — kforge resume {str(run)[:60]}" in s.splitlines()[1]  # (the pane cuts the rest)
        assert "in flight" not in s.splitlines()[1]  # no clock running on, no work pretended
        end = time.monotonic() + 10
        while time.monotonic() < end and any(running(p) for p in workers):
            time.sleep(0.2)
        assert not any(running(p) for p in workers), f"still running 10 s after the owner's kill: {survivors(workers)}"

        # 3. resume: the stopped op stays stopped, the other searches on
        stopped_before = len(candidates(run, first["task_id"]))
        other_before = len(candidates(run, second["task_id"]))
        live.kill()
        resumed = time.time()
        live = Term(f"kforge-truth-live2-{os.getpid()}", kforge_cmd(f"resume {run}", tmp_path / "live2.rc"))
        wait(lambda: owner_pid(run) not in (None, owner), "the resumed owner", 60)
        view.wait(lambda s: state(s) == "search", "the attached view following the resumed run", 60)
        wait(lambda: searching_since(run, resumed), "the resumed run's search", 120)
        # the other op searches on (or its proposer has nothing left: the built-in space is finite)
        wait(lambda: tasks(run)[1]["status"] == "done" or len(
            [n for n in candidates(run, second["task_id"]) if n["status"] not in ("pending", "lost")]) > other_before + 1,
            "the other op to search on after the resume", 180)
        assert tasks(run)[0]["status"] == "stopped"
        assert len(candidates(run, first["task_id"])) == stopped_before, "the stopped op searched again"
        live.wait(lambda s: "stopped" in row(s, op), "stopped in the resumed live view", 30)
        view.wait(lambda s: "stopped" in row(s, op), "stopped in the attached view", 10)

        # 4. a hand edit to the stopped op, from the attached view: queued at once, evaluated in 10 s
        best = tasks(run)[0]["best_node"]  # the op is stopped: its best stays put
        assert best is not None, "the stopped op has no verified kernel to edit"
        view.keys("2", "g")
        view.wait(lambda s: f"#{best} cpp" in s, f"the best kernel #{best} open", 15)
        with store(run) as st:
            parent = retimed_node(st.node(best)["action"]) or best  # a re-timing's edit is N's child
            mine = st.node(parent)["source"] + "\n// tuned by hand in the attached view\n"
        view.keys("e")
        view.wait(lambda s: f"editing #{parent}" in s, "the editor", 15)
        view.keys("F7")
        view.paste(mine, tmp_path)
        view.wait(lambda s: "tuned by hand" in s, "the pasted kernel", 10)
        view.keys("C-s")
        t0 = time.monotonic()
        hand = lambda: [n for n in candidates(run, first["task_id"]) if n["hand_written"]]  # noqa: E731
        wait(hand, "the hand-written node in the store", 3)
        view.wait(lambda s: re.search(r"#\d+ hand", s.split("search tree")[-1].split("tree [2]")[-1]),
                  "the queued node in the tree", 5)
        done = wait(lambda: [n for n in hand() if n["status"] not in ("pending",)], "its evaluation", 10)
        assert time.monotonic() - t0 < 10.0
        assert done[0]["parent_id"] == parent and done[0]["source"] == mine
        assert tasks(run)[0]["status"] == "stopped"  # evaluated, and the op still stopped

        # 5. close the attached view: the run goes on, and the line says how to come back
        view.keys("q")
        view.wait(lambda s: "keeps going" in s, "the question", 10)
        view.keys("y")
        s = wait(lambda: "the run goes on in process" in (h := joined(view)) and h, "the closing line", 20)
        assert f"`kforge tui {run}` reattaches" in s and "no verified kernel" not in s
        assert wait(lambda: (rc := tmp_path / "view.rc").exists() and rc.read_text().strip(), "the exit code", 10) == "0"
        assert owner_pid(run) is not None  # the owner did not notice
    finally:
        pid = owner_pid(run) if (run / "owner.lock").exists() else None
        for t in (view, live):
            if t is not None:
                t.kill()
        if pid and pid > 0 and running(pid):
            os.kill(pid, signal.SIGKILL)
