"""Shared knobs of the sample models: hub offline, the size knob, and the device default.

Kept separate so each sample file stays the library model plus its real dimensions.
"""
from __future__ import annotations

import os

# Random weights only: nothing may reach the network (air-gapped GPU servers, CI).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SIZES = ("ci", "gpu")


def size_for(device: str, size: str | None = None) -> str:
    """KFORGE_SAMPLE_SIZE, else "gpu" on cuda and "ci" on cpu."""
    size = size or os.environ.get("KFORGE_SAMPLE_SIZE") or ("gpu" if str(device).startswith("cuda") else "ci")
    if size not in SIZES:
        raise ValueError(f"KFORGE_SAMPLE_SIZE must be one of {', '.join(SIZES)}, not {size!r}")
    return size


def seeded(seed: int = 0):
    import torch

    torch.manual_seed(seed)
