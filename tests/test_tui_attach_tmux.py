"""Issue 15's "done when": `kforge tui RUN_DIR` attached, in a real terminal (tmux), to a headless
`kforge optimize` running in another process, steers it, and the owner obeys every command.

Keys only: pause the whole search, add budget to the op, open a kernel, edit it and submit it as
a hand-written child, resume, stop the op. After each command the run store (which only the
owning process writes, apart from the command table) is read to confirm the owner obeyed.
Everything is real: the CLI, the engine, the compiler, SQLite, tmux.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge_tui.figures import retimed_node
from kforge_tui.store import RunStore, owner_pid
from test_tui_live_terminal import Term

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)"),
              pytest.mark.slow, pytest.mark.timeout(420)]
ROOT = Path(__file__).resolve().parents[1]


def store(run: Path):
    return RunStore.open(run, readonly=True)


def candidates(run: Path) -> list[dict]:
    with store(run) as s:
        return [n for n in s.nodes() if n["parent_id"] is not None]


def wait(pred, what: str, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"never saw {what}")


def test_attached_tui_steers_a_headless_run(tmp_path):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(tmp_path / "data"))
    log = open(tmp_path / "owner.log", "w")
    owner = subprocess.Popen([sys.executable, "-m", "kforge_tui", "optimize", "tests/fixtures/models/tiny.py",
                              "--device", "cpu", "--headless", "--ops", "conv", "--budget", "40", "--parallel", "1",
                              "--run-dir", str(run), "--no-apply"], cwd=ROOT, env=env, stdout=log, stderr=log)
    t = None
    try:
        wait(lambda: (run / "run.db").exists() and owner_pid(run) == owner.pid, "the headless run start")
        t = Term(f"kforge-attach-{os.getpid()}",
                 f"unset COLUMNS LINES; cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} -m kforge_tui tui {run}; "
                 "sleep 30")
        t.wait(lambda s: "operators [1]" in s, "the attached TUI", 60)

        # 1. pause everything as soon as the op shows up: the owner takes the command when its
        #    search starts, so at most the candidate it launched first is evaluated
        t.wait(lambda s: re.search(r"search tree \[2\] [A-Za-z_]", s) is not None, "the op in the TUI", 180)
        t.wait(lambda s: state(s) not in ("starting", "finished"), "the real phase in the header", 30)
        t.keys("p")
        tid = tasks(run)[0]["task_id"]
        wait(lambda: store_status(run, tid) == "paused", "the owner to pause the op", 120)
        s = t.wait(lambda s: state(s) == "paused", "paused in the header", 15)
        assert re.search(r"\bpaused\b", s.split("search tree")[0].split("operators")[1]), "paused in the row"
        wait(lambda: candidates(run) and all(n["status"] != "pending" for n in candidates(run)),
             "the first candidate to finish", 60)
        settled = len(candidates(run))
        time.sleep(3.0)
        assert len(candidates(run)) == settled, "the owner kept searching while paused"

        # 2. add budget: the default step of 16 reaches the owner, which writes the new budget
        with store(run) as s:
            before = s.task(tid)["budget"]
        t.keys("b")
        t.wait(lambda s: "Extra candidates for" in s, "the budget prompt", 10)
        t.keys("Enter")
        wait(lambda: store_budget(run, tid) == before + 16, "the owner to raise the budget", 30)
        t.wait(lambda s: f"/{before + 16}" in s, "the new budget in the table", 15)

        # 3. open a kernel, edit it, submit it: the owner evaluates it as a hand-written child
        t.keys("2", "g" if any(n["status"] == "ok" for n in candidates(run)) else "f")
        s = t.wait(lambda s: re.search(r"#(\d+) (cpp|cuda)", s) is not None, "an opened kernel", 15)
        parent = int(re.search(r"#(\d+) (cpp|cuda)", s).group(1))
        with store(run) as st:
            parent = retimed_node(st.node(parent)["action"]) or parent  # a re-timing's edit is N's child
            mine = st.node(parent)["source"] + "\n// tuned by hand in the attached TUI\n"
        t.keys("e")
        t.wait(lambda s: f"editing #{parent}" in s, "the editor")
        t.keys("F7")
        t.paste(mine, tmp_path)
        time.sleep(0.5)
        t.keys("C-s")
        hand = wait(lambda: [n for n in candidates(run) if n["hand_written"] and n["status"] != "pending"],
                    "the owner to evaluate the hand-written kernel", 120)
        assert hand[0]["parent_id"] == parent and hand[0]["source"] == mine
        (saved,) = (run / "edits").iterdir()  # kept on disk before it was sent
        assert saved.read_text() == mine

        # 4. resume, then stop the op: the owner searches on, then ends the run
        t.keys("p")
        wait(lambda: store_status(run, tid) in ("searching", "done"), "the owner to resume", 30)
        t.keys("s")
        wait(lambda: owner.poll() is not None, "the owner to finish after the stop", 120)
        assert owner.returncode in (0, 1), (tmp_path / "owner.log").read_text()[-3000:]
        with store(run) as s:
            assert s.task(tid)["status"] in ("stopped", "done") and s.run_info()["status"] in ("finished", "stopped")
            assert s.untaken_commands() == []  # every command reached the owner
        t.wait(lambda s: state(s) == "finished", "the end of the run in the TUI", 30)
        t.keys("q")  # the run is over: no question; the summary is printed as the screen closes
        t.wait(lambda s: "operators [1]" not in s and f"run {run}" in s, "the TUI to quit with the summary", 20)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=30)
        if t is not None:
            t.kill()
        log.close()


def state(screen: str) -> str:
    """The run's state word: the first word of the header's second line."""
    lines = screen.splitlines()
    return lines[1].split()[0] if len(lines) > 1 and lines[1].split() else ""


def tasks(run: Path) -> list[dict]:
    with store(run) as s:
        return s.tasks()


def store_status(run: Path, tid: str) -> str:
    with store(run) as s:
        return s.task(tid)["status"]


def store_budget(run: Path, tid: str) -> int:
    with store(run) as s:
        return s.task(tid)["budget"]
