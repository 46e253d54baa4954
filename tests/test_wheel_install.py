"""A plain install, as most users make it: build the wheel, install it (not editable) into a fresh
virtual environment, and open `kforge tui` on a run in a real terminal (tmux).

Issue 15: the themes and stylesheet were read from the repository root and never packaged, so
the TUI crashed from a wheel. The venv sees the system's site-packages for the dependencies
(torch above all: a bare `pip install torch` would pull a multi-GB CUDA build), and pip installs
with --no-index, so the test needs no network; kforge itself must come from the wheel.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.wheel, pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def test_wheel_in_a_fresh_venv_opens_the_tui(tmp_path):
    src = tmp_path / "src"  # what a source checkout ships, without build leftovers
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("kforge_tui", "themes"):  # themes/ sits at the top, shipped as kforge_tui.themes
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path / "dist"), str(src)])
    (wheel,) = (tmp_path / "dist").glob("kforge_tui-*.whl")

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-index",
         "-q", str(wheel)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COLUMNS", "LINES")}
    where = run([str(venv / "bin" / "python"), "-c", "import kforge_tui; print(kforge_tui.__file__)"],
                cwd=tmp_path, env=env).stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout's
    themes = run([str(venv / "bin" / "python"), "-c", "from kforge_tui.tui import themes; print(themes.CSS_PATH)"],
                 cwd=tmp_path, env=env).stdout.strip()
    assert themes.startswith(str(venv)) and themes.endswith("kforge_tui/themes/kforge.tcss"), themes

    rundir = tmp_path / "run"
    run([str(venv / "bin" / "python"), "-c",
         f"from kforge_tui.tui.demo import write_store; write_store({str(rundir)!r}, 6)"], cwd=tmp_path, env=env)
    name = f"kforge-wheel-{os.getpid()}"
    tmux = ["tmux", "-L", name, "-f", "/dev/null"]
    log = tmp_path / "tui.log"
    cmd = f"{venv / 'bin' / 'kforge'} tui {rundir}; echo exit=$? > {log}; sleep 30"  # Textual draws on stderr
    subprocess.run(tmux + ["new-session", "-d", "-s", name, "-x", "100", "-y", "30", "-c", str(tmp_path), cmd],
                   check=True, env=env)
    try:
        screen = ""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            screen = subprocess.run(tmux + ["capture-pane", "-t", name, "-p"], capture_output=True, text=True).stdout
            if "★" in screen and "operators" in screen:
                break
            time.sleep(0.3)
        assert "★" in screen and "softmax" in screen and "NVIDIA H200" in screen, f"the TUI did not open:\n{screen}"
        subprocess.run(tmux + ["send-keys", "-t", name, "q"], check=True)
        end = time.monotonic() + 30
        while time.monotonic() < end and "exit=" not in (log.read_text() if log.exists() else ""):
            time.sleep(0.2)
        assert "exit=0" in log.read_text(), log.read_text()
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
