"""Issue 15's architecture and packaging rules, checked on the source so they cannot drift back.

- the engine does not import report.py (report.py runs the engine: that was an import cycle);
- the engine's and the UI's task state classes have their own names (three `TaskState`s
  meant three different things);
- the stylesheet and themes sit in themes/ at the top and ship as package data of
  kforge_tui.themes (a wheel without them crashed the TUI), every package is listed for the
  wheel, `requires-python` matches `tomllib`, and user paths come from platformdirs.
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
    engine = classes(PKG / "engine.py") | classes(PKG / "search" / "state.py")  # the engine's own state
    assert "SearchState" in engine and "TaskState" not in engine
    ui = set().union(*(classes(p) for p in (PKG / "tui").rglob("*.py")))
    assert "TaskView" in ui and "TaskState" not in ui


def test_themes_at_the_top_ship_inside_the_package():
    """DESIGN.md's layout: themes/ at the top of the repository; the wheel ships it as the package
    kforge_tui.themes (tests/test_wheel_install.py opens the TUI from a wheel)."""
    from kforge_tui.tui import themes

    assert themes.THEMES_DIR == ROOT / "themes" and themes.CSS_PATH.is_file()
    assert {t.name for t in themes.load_themes()} == {"kforge-dark", "kforge-light", "kforge-ansi"}
    st = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert st["package-dir"] == {"kforge_tui.themes": "themes"} and "kforge_tui.themes" in st["packages"]
    assert set(st["package-data"]["kforge_tui.themes"]) == {"*.tcss", "*.toml"}
    assert not (PKG / "themes").exists()  # one copy: the one that ships


def test_every_package_directory_is_listed_for_the_wheel():
    """pyproject lists the packages (find cannot map themes/): a new subpackage must be added
    there, or the wheel silently lacks it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    dirs = {".".join(p.parent.relative_to(ROOT).parts) for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    assert dirs <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(dirs - listed)}"


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
