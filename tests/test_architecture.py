"""House rules that keep the design honest: the engine is UI-free, the CLI starts fast."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kforge_tui"
ENGINE_MODULES = ["kforge_tui.engine", "kforge_tui.store", "kforge_tui.report", "kforge_tui.events",
                  "kforge_tui.search.mcts", "kforge_tui.sandbox.pool", "kforge_tui.cli"]


def test_no_textual_import_outside_tui():
    offenders = []
    for path in PKG.rglob("*.py"):
        if "tui" in path.relative_to(PKG).parts[:1]:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "textual" or n.startswith("textual.") for n in names):
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert offenders == [], f"engine code imports Textual: {offenders}"


def test_engine_import_does_not_load_textual():
    code = ("import sys, importlib\n"
            f"for m in {ENGINE_MODULES!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
            "assert not bad, bad\nprint('clean')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "clean" in r.stdout, r.stderr[-2000:]


def test_cli_help_is_fast_and_lists_contract_commands():
    r = subprocess.run([sys.executable, "-m", "kforge_tui", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    for cmd in ("doctor", "profile", "optimize", "resume", "tui", "runs", "show", "apply", "export"):
        assert cmd in r.stdout
    # --help must not import torch/litellm/textual (a slow start on every call)
    code = ("import sys; sys.argv=['kforge','--help']\nfrom kforge_tui import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch','litellm','textual') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


def test_cli_without_command_is_usage_error():
    r = subprocess.run([sys.executable, "-m", "kforge_tui"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
