"""Register the tree-sitter CUDA grammar on a TextArea so the editor colours CUDA/C++.

Textual's TextArea has no C/C++/CUDA highlighting built in. The CUDA grammar's highlight query
says `; inherits: cpp` (and cpp's inherits c), so the query is the three files concatenated.
"""
from __future__ import annotations

import functools
import os

LANG = "cuda"


@functools.lru_cache(maxsize=1)
def _grammar():
    try:
        import tree_sitter_c
        import tree_sitter_cpp
        import tree_sitter_cuda
        from tree_sitter import Language, Query

        query = "\n".join(open(os.path.join(os.path.dirname(m.__file__), "queries", "highlights.scm")).read()
                          for m in (tree_sitter_c, tree_sitter_cpp, tree_sitter_cuda))
        lang = Language(tree_sitter_cuda.language())
        Query(lang, query)  # fail here (and fall back to plain text) rather than inside the widget
        return lang, query
    except Exception:
        return None


def register_cuda(area) -> str | None:
    """Returns the language name to set on `area`, or None when the grammar is unavailable."""
    g = _grammar()
    if g is None:
        return None
    area.register_language(LANG, g[0], g[1])
    return LANG
