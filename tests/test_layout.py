"""Issue 15's architecture and packaging rules, checked on the source so they cannot drift back.

- the engine does not import report.py (report.py runs the engine: that was an import cycle);
- the engine's and the UI's task state classes have their own names (three `TaskState`s
  meant three different things);
- the stylesheet and themes are inside the package and declared as package data (a wheel
  without them crashed the TUI), `requires-python` matches `tomllib`, and user paths come from
  platformdirs.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kforge_tui"


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def classes(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}


def test_engine_does_not_import_the_headless_reporter():
    assert "kforge_tui.report" not in imported_modules(PKG / "engine.py")
    assert "kforge_tui.summary" in imported_modules(PKG / "engine.py")
    assert "kforge_tui.engine" not in imported_modules(PKG / "summary.py")


def test_engine_and_ui_task_state_have_distinct_names():
    assert "SearchState" in classes(PKG / "engine.py") and "TaskState" not in classes(PKG / "engine.py")
    ui = set().union(*(classes(p) for p in (PKG / "tui").rglob("*.py")))
    assert "TaskView" in ui and "TaskState" not in ui


def test_themes_ship_inside_the_package():
    from kforge_tui.tui import themes

    assert themes.THEMES_DIR == PKG / "themes" and themes.CSS_PATH.is_file()
    assert {t.name for t in themes.load_themes()} == {"kforge-dark", "kforge-light", "kforge-ansi"}
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = meta["tool"]["setuptools"]["package-data"]["kforge_tui"]
    assert "themes/*.tcss" in data and "themes/*.toml" in data
    assert not (ROOT / "themes").exists()  # one copy: the one that ships


def test_python_version_and_user_paths():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == ">=3.11"  # tomllib
    assert any(d.startswith("platformdirs") for d in meta["dependencies"])
    for path in PKG.rglob("*.py"):
        assert "XDG_" not in path.read_text(), f"{path}: hand-written XDG paths (use platformdirs)"


def test_source_pane_highlights_triton_candidates_as_python():
    from kforge_tui.tui.highlight import lexer_for, render_diff

    assert lexer_for("triton", "") == "python"
    assert lexer_for(None, "@triton.jit\ndef k(x):\n    pass\n") == "python"
    assert lexer_for("cuda", "") == "cuda" and lexer_for("cpu", "") == "cpp"
    diff = render_diff("def kforge_launch(inputs, outputs):\n    return 0\n",
                       "def kforge_launch(inputs, outputs):\n    return 1\n",
                       parent_label="#3", child_label="#4")
    assert "-    return 0" in diff.code and "+    return 1" in diff.code
