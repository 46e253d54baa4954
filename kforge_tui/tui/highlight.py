"""CUDA / C++ / Triton (Python) source rendering for the kernel pane: pygments via rich's `Syntax`.

Chosen over a tree-sitter query on TextArea because pygments ships a maintained CUDA lexer,
rich's `Syntax` already does line numbers and highlighted lines (the failing compiler line),
and the view is read-only; the editor screen is where TextArea is used.
"""
from __future__ import annotations

import difflib

from rich.syntax import Syntax
from rich.text import Text

LEXERS = {"cuda": "cuda", "cpu": "cpp", "cpp": "cpp", "c++": "cpp", "triton": "python"}


def lexer_for(backend: str | None, source: str = "") -> str:
    if backend in LEXERS:
        return LEXERS[backend]
    if "@triton.jit" in source or "def kforge_launch(" in source:
        return "python"
    return "cuda" if ("__global__" in source or "<<<" in source) else "cpp"


def syntax_theme(dark: bool) -> str:
    return "monokai" if dark else "default"


def render_source(source: str, *, lexer: str, dark: bool = True, error_line: int | None = None) -> Syntax:
    """Source with line numbers; `error_line` (1-based) is highlighted, as compilers report it."""
    return Syntax(source, lexer, theme=syntax_theme(dark), line_numbers=True, word_wrap=False,
                  highlight_lines={error_line} if error_line else None, background_color="default",
                  indent_guides=False)


def unified_diff(parent: str, child: str, *, parent_label: str, child_label: str) -> str:
    return "".join(difflib.unified_diff(parent.splitlines(keepends=True), child.splitlines(keepends=True),
                                        fromfile=parent_label, tofile=child_label, n=3))


def render_diff(parent: str, child: str, *, parent_label: str, child_label: str, dark: bool = True):
    text = unified_diff(parent, child, parent_label=parent_label, child_label=child_label)
    if not text:
        return Text("(identical to the parent)")
    return Syntax(text, "diff", theme=syntax_theme(dark), line_numbers=False, background_color="default")
