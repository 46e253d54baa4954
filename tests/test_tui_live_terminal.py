"""Issue 5's "done when", in a real terminal: `kforge optimize` (live TUI) under tmux at 100x30.

Keys only: watch the profile and tree fill in, open a node, edit it into a kernel that does not
compile, submit, see it fail in the tree and read the compiler's reason in the logs pane, edit the
failed node into an honest kernel, submit, see it verified with a speedup, quit (confirmed). The
pane is read with capture-pane at each step, as a person would read it, and the run store is
checked afterwards. Whole files go in the way a person pastes them: select all (f7) and a
bracketed paste from a tmux buffer.
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
from kforge_tui.store import RunStore

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)"),
              pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[1]
GOOD_CPP = (ROOT / "tests" / "fixtures" / "engine" / "softmax_cpu.cpp").read_text()
# parses (the static check passes it on to the compiler) but names an undeclared variable
BROKEN_CPP = GOOD_CPP.replace("yr[j] *= inv;", "yr[j] *= inv_typo;")
assert BROKEN_CPP != GOOD_CPP


class Term:
    """One tmux session running a command in a 100x30 pane, on a private tmux server.

    A private socket (-L) and no config (-f /dev/null): a tmux server shared with other sessions
    resizes windows to its clients' sizes, which made the pane 80x24 under a parallel test run.
    """

    def __init__(self, name: str, cmd: str) -> None:
        self.name = name
        self.tmux = ["tmux", "-L", name, "-f", "/dev/null"]
        subprocess.run(self.tmux + ["new-session", "-d", "-s", name, "-x", "100", "-y", "30", cmd], check=True)
        subprocess.run(self.tmux + ["set-option", "-g", "window-size", "manual"], check=True)
        subprocess.run(self.tmux + ["resize-window", "-t", name, "-x", "100", "-y", "30"], check=True)
        size = subprocess.run(self.tmux + ["display-message", "-p", "-t", name, "#{pane_width}x#{pane_height}"],
                              capture_output=True, text=True).stdout.strip()
        assert size == "100x30", f"tmux pane is {size}, not 100x30"
        self.socket = subprocess.run(self.tmux + ["display-message", "-p", "#{socket_path}"],
                                     capture_output=True, text=True).stdout.strip()

    def screen(self) -> str:
        return subprocess.run(self.tmux + ["capture-pane", "-t", self.name, "-p"], capture_output=True,
                              text=True).stdout

    def history(self) -> str:
        """The screen and what scrolled off it (a program's last lines can push a summary up)."""
        return subprocess.run(self.tmux + ["capture-pane", "-t", self.name, "-p", "-S", "-500"],
                              capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        for k in keys:  # one at a time: tmux would otherwise coalesce them into one paste-like burst
            subprocess.run(self.tmux + ["send-keys", "-t", self.name, k], check=True)
            time.sleep(0.15)

    def paste(self, text: str, tmp: Path) -> None:
        """Bracketed paste (-p) with newlines kept (-r), as a terminal pastes a clipboard."""
        f = tmp / f"paste-{time.monotonic_ns()}.cpp"
        f.write_text(text)
        subprocess.run(self.tmux + ["load-buffer", "-b", self.name, str(f)], check=True)
        subprocess.run(self.tmux + ["paste-buffer", "-p", "-r", "-d", "-b", self.name, "-t", self.name], check=True)

    def wait(self, pred, what: str, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        s = ""
        while time.monotonic() < end:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.2)
        raise AssertionError(f"never saw {what}; the screen was:\n{s}")

    def alive(self) -> bool:
        return subprocess.run(self.tmux + ["has-session", "-t", self.name], capture_output=True).returncode == 0

    def kill(self) -> None:
        subprocess.run(self.tmux + ["kill-server"], capture_output=True)  # our private server only
        if self.socket:
            Path(self.socket).unlink(missing_ok=True)


def tree_lines(screen: str) -> list[str]:
    """The search-tree pane's text: the left column between the tree's borders."""
    lines = screen.splitlines()
    top = next((i for i, ln in enumerate(lines) if "search tree [2]" in ln), None)
    if top is None:  # a modal screen (editor, dialog) covers the main screen
        return []
    out = []
    for ln in lines[top + 1:]:
        if ln.startswith("╰"):
            break
        out.append(ln[1:ln.index("│", 1)] if "│" in ln[1:] else ln[1:])
    return out


def hand_line(screen: str, status: str) -> str | None:
    for ln in tree_lines(screen):
        if re.search(r"#\d+ hand", ln) and status in ln:
            return ln
    return None


def test_live_tui_fix_a_failed_kernel_by_hand(tmp_path):
    run = tmp_path / "run"
    rc_file = tmp_path / "rc"
    # COLUMNS/LINES leak in from the test process (80x24) and Textual would believe them over the pty
    cmd = (f"unset COLUMNS LINES; cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} -m kforge_tui optimize "
           f"tests/fixtures/engine/softmax_model.py --device cpu --budget 3 --apply --run-dir {run}; "
           f"echo $? > {rc_file}; sleep 30")
    t = Term(f"kforge-live-{os.getpid()}", cmd)
    try:
        # 1. the profile and the tree fill in, and the budget of 3 is spent
        s = t.wait(lambda s: "operators [1]" in s and "softmax" in s and "64x4096" in s, "the profile", 90)
        s = t.wait(lambda s: re.search(r"softmax .* done .* 3/3", s) is not None, "the search finish", 120)
        assert "[cpu]" in s and "built-in" in s  # header line 1
        assert re.search(r"elapsed \d+:\d\d:\d\d", s), "header line 2 (elapsed, cand/min) is missing"
        tree = [ln for ln in tree_lines(s) if ln.strip()]
        assert len([ln for ln in tree if re.search(r"#\d+ ", ln)]) >= 3, tree
        assert not any("proposing" in ln for ln in tree), tree  # every node shows its final action

        # 2. open the last node of the tree; e opens the editor on its source
        t.keys("2", "End")
        s = t.wait(lambda s: re.search(r"#(\d+) cpp", s) is not None, "the opened node's source")
        opened = int(re.search(r"#(\d+) cpp", s).group(1))
        t.keys("e")
        s = t.wait(lambda s: re.search(r"editing #\d+ ", s) is not None and "#include" in s, "the editor")
        editing = int(re.search(r"editing #(\d+) ", s).group(1))  # checked against the store below

        # 3. replace it with a kernel that does not compile and submit it
        t.keys("F7")
        t.paste(BROKEN_CPP, tmp_path)
        t.wait(lambda s: "inv_typo" in s or "editing" not in s, "the pasted text")
        t.keys("C-s")
        s = t.wait(lambda s: hand_line(s, "✘") is not None, "the hand-written node fail in the tree", 60)
        assert "compile_error" in hand_line(s, "✘"), hand_line(s, "✘")

        # 4. move onto it (a child of the opened node: the new last line): the logs say why
        t.keys("End")
        s = t.wait(lambda s: "compile_error at stage compile" in s and "first error at source line" in s,
                   "the compiler tab for the failed node")  # (once the submit's toast has gone)
        assert "inv_typo" in s  # the compiler's own message names the undeclared variable
        assert "was not declared" in s or "error" in s
        failed = int(re.search(r"#(\d+) compile_error at stage compile", s).group(1))
        line = int(re.search(r"first error at source line (\d+)", s).group(1))
        assert "inv_typo" in BROKEN_CPP.splitlines()[line - 1]
        # the source pane scrolled to the failing line (below the pane's first screenful) and marks it
        assert line > 10
        t.wait(lambda s: re.search(rf"❱ *{line} +\S", s) is not None, f"source line {line} marked", 10)

        # 5. edit the failed node into an honest kernel, submit, see it verified with a speedup
        t.keys("e")
        t.wait(lambda s: f"editing #{failed}" in s, "the editor on the failed node")
        t.keys("F7")
        t.paste(GOOD_CPP, tmp_path)
        time.sleep(0.5)
        t.keys("C-s")
        s = t.wait(lambda s: hand_line(s, "✔") is not None, "the fixed node verified in the tree", 60)
        ok_line = hand_line(s, "✔")
        label_x = re.search(r"(\d+\.\d+)x", ok_line)
        assert label_x, ok_line  # a speedup vs eager on its label
        t.keys("End")
        s = t.wait(lambda s: re.search(r"speedup +\d+\.\d+x vs eager", s) is not None,
                   "the timing tab for the fixed node")
        shown = float(re.search(r"speedup +(\d+\.\d+)x vs eager", s).group(1))
        assert abs(shown - float(label_x.group(1))) <= 0.0051  # the logs pane shows the node the tree shows (3 vs 2 decimals)

        # 6. quit: the search is over, so q offers the end-to-end check headless runs do; y runs it,
        #    and the summary with its result is printed when the screen closes
        t.keys("q")
        t.wait(lambda s: "The search is over." in s, "the offer of the end-to-end check", 10)
        t.keys("y")
        end = time.monotonic() + 180
        while not rc_file.exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert rc_file.exists(), "kforge did not exit after y:\n" + t.screen()
        assert rc_file.read_text().strip() == "0"
        s = t.history()
        assert f"run {run}" in s and "end to end:" in s, s  # the summary table and the check's line
    finally:
        t.kill()

    with RunStore.open(run, readonly=True) as store:
        hand = [r for r in store.nodes() if r["hand_written"]]
        status = store.run_info()["status"]
        assert store.run_info()["end_to_end"] is not None  # the check ran, as it does headless
        # an edit of a re-timing (`confirm:#N`) is a child of the node it re-timed
        opened_action = store.node(opened)["action"]
    assert [(r["id"], r["status"], r["action"]) for r in hand] == [(failed, "compile_error", "hand"),
                                                                 (hand[1]["id"], "ok", "hand")]
    opened = retimed_node(opened_action) or opened
    assert editing == opened  # the editor names the kernel its child goes under
    assert hand[0]["parent_id"] == opened and hand[1]["parent_id"] == failed
    assert hand[0]["source"] == BROKEN_CPP and hand[1]["source"] == GOOD_CPP
    assert hand[1]["speedup"] and hand[1]["speedup"] > 0
    assert status == "finished"  # a complete search, checked: not "stopped", not left "running"
