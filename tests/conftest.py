"""Shared test set-up: GPU tests are marked `gpu` and skipped where no CUDA GPU is visible."""
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
