"""kforge-tui: make unmodified PyTorch models faster with searched, verified kernels.

`apply(model, run_dir)` / `remove(model)` put a run's verified winners into a live model.
They are imported lazily so `import kforge_tui` stays cheap (the CLI imports it first).
"""
from __future__ import annotations

from kforge_tui._version import __version__
__all__ = ["apply", "remove", "__version__"]


def apply(model, run_dir, **kwargs):
    from kforge_tui.integrate.patch import apply as _apply

    return _apply(model, run_dir, **kwargs)


def remove(model):
    from kforge_tui.integrate.patch import remove as _remove

    return _remove(model)
