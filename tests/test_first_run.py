"""A new user's first minutes (issue 22): CPU defaults small enough for a 2-core machine and said up
front, refusals that come at once, the summary last on the screen, the extras the samples need,
and a test suite that stays out of the user's own files.

The README's first command itself is timed by `.ci/run` in a fresh virtual environment (it must
finish in under 3 minutes on CI's 2-core machine); these tests check what makes that true.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kforge_tui import cli
from kforge_tui.config import data_dir
from kforge_tui.doctor import run_checks
from kforge_tui.tui.demo import write_store

ROOT = Path(__file__).resolve().parents[1]


def settings(*argv: str, device: str):
    args = cli.build_parser().parse_args(["optimize", "m.py", *argv])
    return cli._settings_from_args(args, device=device)[0]


def test_cpu_defaults_are_a_small_search_without_the_end_to_end_check():
    s = settings(device="cpu")
    assert (s.top, s.budget, s.end_to_end) == (3, 6, False)
    g = settings(device="cuda")
    assert (g.top, g.budget, g.end_to_end) == (5, 50, True)
    asked = settings("--top", "5", "--budget", "50", "--apply", device="cpu")  # flags still win
    assert (asked.top, asked.budget, asked.end_to_end) == (5, 50, True)
    assert settings("--no-apply", device="cuda").end_to_end is False


def test_the_plan_is_said_before_anything_loads():
    s = settings(device="cpu")
    args = cli.build_parser().parse_args(["optimize", "m.py"])
    plan = cli._plan(s, args)
    assert plan.startswith("plan: the 3 heaviest regions, 6 candidates each, no end-to-end check")
    assert " min on this CPU" in plan


def test_doctor_checks_the_sample_model_extras(monkeypatch):
    checks = {c.name: c for c in run_checks()}
    assert "sample models" in checks and "transformers" in checks["sample models"].detail
    import importlib.metadata as md

    real = md.version

    def missing(pkg):
        if pkg == "diffusers":
            raise md.PackageNotFoundError(pkg)
        return real(pkg)

    monkeypatch.setattr(md, "version", missing)
    c = {c.name: c for c in run_checks()}["sample models"]
    assert not c.ok and "diffusers" in c.detail and "[models]" in c.fix


def test_a_missing_extra_says_which_to_install():
    hint = cli._hint("sample_models/resnet50.py: importing it raised ModuleNotFoundError: No module named "
                     "'transformers'")
    assert "[models]" in hint and "kforge doctor" in hint
    assert cli._hint("model file not found: x.py") == ""


def test_the_summary_is_the_last_thing_on_the_screen(tmp_path):
    """Native extensions chatter at interpreter exit (triton's nanobind listed ~27 leaked objects
    after the TUI's summary): kforge's entry point silences stderr once its output is done."""
    write_store(tmp_path / "run", 3)
    script = ("import atexit, os, sys\n"
              "atexit.register(lambda: os.write(2, b'nanobind: leaked 27 instances!\\n'))\n"
              f"sys.argv = ['kforge', 'show', {str(tmp_path / 'run')!r}]\n"
              "from kforge_tui.cli import entry\nentry()\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert "softmax" in p.stdout
    assert "nanobind" not in p.stderr


def test_the_suite_never_touches_the_users_data_dir():
    """Its runs were listed in the user's ~/.local/share/kforge/runs.txt."""
    home = Path.home().resolve()
    assert not str(data_dir().resolve()).startswith(str(home / ".local")), data_dir()
    assert "kforge-tests-home-" in str(data_dir())
    assert os.environ["KFORGE_CONFIG"] != str(home / ".config" / "kforge" / "config.toml")


def test_a_failed_optimize_registers_no_run(tmp_path):
    data = tmp_path / "data"
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(data))
    p = subprocess.run([sys.executable, "-m", "kforge_tui", "optimize", "tests/fixtures/models/tiny_typo.py",
                        "--headless", "--device", "cpu", "--run-dir", str(tmp_path / "run")], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 2 and "model file not found" in p.stderr, p.stderr
    runs = data / "kforge" / "runs.txt"
    assert not runs.exists() or str(tmp_path / "run") not in runs.read_text()
