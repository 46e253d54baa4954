"""The TUI in a real terminal (tmux): open a run, press keys, read the screen as a person would."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge_tui.tui.demo import write_store

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")
ROOT = Path(__file__).resolve().parents[1]


def capture(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-t", session, "-p"], capture_output=True, text=True).stdout


def wait_for(session: str, *needles: str, timeout: float = 30.0) -> str:
    """The first screen that shows every needle at once (a loaded machine paints in parts)."""
    end = time.time() + timeout
    screen = ""
    while time.time() < end:
        screen = capture(session)
        if all(n in screen for n in needles):
            return screen
        time.sleep(0.2)
    missing = [n for n in needles if n not in screen]
    raise AssertionError(f"{missing!r} never appeared; screen was:\n{screen}")


@pytest.mark.slow
def test_follow_run_in_tmux(tmp_path):
    write_store(tmp_path / "run", 8)
    session = f"kforge-test-{os.getpid()}"
    cmd = (f"cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} -c "
           f"'from kforge_tui.tui.app import run_follow; raise SystemExit(run_follow(\"{tmp_path / 'run'}\"))'")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", cmd], check=True)
    try:
        screen = wait_for(session, "operators")
        wait_for(session, "★", "softmax", "layer_norm", "NVIDIA H200")
        subprocess.run(["tmux", "send-keys", "-t", session, "f"], check=True)  # next failure
        screen = wait_for(session, "first error at source line 7")
        subprocess.run(["tmux", "send-keys", "-t", session, "?"], check=True)
        wait_for(session, "kforge keys")
        subprocess.run(["tmux", "send-keys", "-t", session, "Escape"], check=True)
        end = time.time() + 10  # tmux and Textual both wait a moment to tell escape from alt+key
        while "kforge keys" in capture(session) and time.time() < end:
            time.sleep(0.2)
        assert "kforge keys" not in capture(session)
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        end = time.time() + 15
        while time.time() < end and subprocess.run(["tmux", "has-session", "-t", session],
                                                   capture_output=True).returncode == 0:
            time.sleep(0.2)
        assert subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0, \
            "q did not quit a finished run"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
