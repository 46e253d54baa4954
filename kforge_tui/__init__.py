"""kforge-tui: make unmodified PyTorch models faster with searched, verified kernels.

`apply(model, run_dir)` / `remove(model)` put a run's verified winners into a live model.
They are imported lazily so `import kforge_tui` stays cheap (the CLI imports it first).
"""
from __future__ import annotations

from kforge_tui._version import __version__
__all__ = ["apply", "remove", "__version__"]


def apply(model, run_dir, example_inputs=None, **kwargs):
    """Compile `model` in place with the kernels RUN_DIR's whole-model check kept. With
    `example_inputs` and no decision recorded for this mode, decide on `model` first."""
    if example_inputs is not None:
        from kforge_tui.integrate.e2e import apply as _decide_and_apply

        return _decide_and_apply(model, run_dir, example_inputs, **kwargs)
    from kforge_tui.integrate.patch import apply as _apply

    return _apply(model, run_dir, **kwargs)


def remove(model):
    from kforge_tui.integrate.patch import remove as _remove

    return _remove(model)
