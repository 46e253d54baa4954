"""Shared test set-up: GPU tests are marked `gpu` and skipped where no CUDA GPU is visible; the
suite never touches the user's own kforge files (its data directory with `runs.txt`, its config,
its compile cache) and leaves nothing in the work tree (the snapshot report goes to /tmp)."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Inductor's compile cache, fresh for this test session (and its subprocesses): a truncated .so
# left in the machine's shared /tmp/torchinductor_<user> by an earlier, killed process must not
# fail tests that compile the same graph.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor_dir = tempfile.mkdtemp(prefix="kforge-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_dir
    atexit.register(shutil.rmtree, _inductor_dir, True)


# The user's data directory holds runs.txt (every run `kforge runs` lists): test runs must not
# land there, whatever the environment says. The config and cache are private to the session too,
# unless the caller chose them (CI sets KFORGE_CACHE).
_home = tempfile.mkdtemp(prefix="kforge-tests-home-")
atexit.register(shutil.rmtree, _home, True)
os.environ["XDG_DATA_HOME"] = os.path.join(_home, "data")
os.environ.setdefault("KFORGE_CONFIG", os.path.join(_home, "config.toml"))
os.environ.setdefault("KFORGE_CACHE", os.path.join(_home, "cache"))


def pytest_configure(config):
    """pytest-textual-snapshot writes its failure report to the current directory by default: a
    failed snapshot left snapshot_report.html in the work tree."""
    if getattr(config.option, "snapshot_report", None) == "snapshot_report.html":
        config.option.snapshot_report = os.path.join(tempfile.gettempdir(),
                                                     f"kforge-snapshot-report-{os.getpid()}.html")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on a GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
