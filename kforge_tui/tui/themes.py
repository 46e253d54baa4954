"""Themes are data (themes/themes.toml at the top of the repository) turned into Textual `Theme`s;
the stylesheet sits beside them.

A wheel ships the folder as the package `kforge_tui.themes` (pyproject maps it), so the files are
found next to the installed package, or at the top of a source checkout.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

from textual.theme import Theme

_PACKAGE = Path(__file__).resolve().parents[1]
THEMES_DIR = next((d for d in (_PACKAGE / "themes", _PACKAGE.parent / "themes") if (d / "themes.toml").is_file()),
                  _PACKAGE.parent / "themes")
CSS_PATH = THEMES_DIR / "kforge.tcss"
ALIASES = {"dark": "kforge-dark", "light": "kforge-light", "ansi": "kforge-ansi"}
DEFAULT = "kforge-dark"


def load_themes(path: Path = THEMES_DIR / "themes.toml") -> list[Theme]:
    data = tomllib.loads(path.read_text())
    return [Theme(name=name, **fields) for name, fields in data.items()]


def resolve(name: str | None, available) -> str:
    """`--theme dark|light|ansi` or any registered Textual theme name; UsageError otherwise."""
    from kforge_tui.errors import UsageError

    if not name:
        return DEFAULT
    full = ALIASES.get(name, name)
    if full not in available:
        raise UsageError(f"unknown theme {name!r}; choose one of: dark, light, ansi, "
                         + ", ".join(sorted(available)))
    return full
