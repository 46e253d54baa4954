"""The KFORGE_* settings the sandbox reads. A runner's environment names nothing of the sandbox
(issue 21: the zygote drops those variables), so the zygote keeps what it read here first.
The workers' developer settings are parsed here too, so the pool can refuse a bad value in the
engine's process (one line, exit 2) before a worker would die of it."""
from __future__ import annotations

import os

from kforge_tui.errors import UsageError

SETTINGS: dict[str, str] = {}


def keep() -> None:
    """In the zygote, before it drops the variables."""
    SETTINGS.update({k: v for k, v in os.environ.items() if k.startswith("KFORGE_")})


def setting(name: str) -> str | None:
    return os.environ.get(name) or SETTINGS.get(name)


def _flag(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError(raw)
    return raw == "1"


# name -> (parse, what a value must be)
WORKER_SETTINGS = {
    "KFORGE_RUNNER_SPARES": (int, "a whole number of spare runners, e.g. 3"),
    "KFORGE_SPARES_BESIDE_TIMING": (_flag, "1 or 0"),
    # Triton candidates compiled before they queue for the GPU worker (sandbox/triton_precompile.py)
    "KFORGE_TRITON_COMPILE_AHEAD": (_flag, "1 or 0"),
}


def worker_setting(name: str, default):
    """A worker's developer setting from the environment, `default` when unset."""
    parse, expected = WORKER_SETTINGS[name]
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return parse(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r}: expected {expected}") from None


def check_worker_settings() -> None:
    for name in WORKER_SETTINGS:
        worker_setting(name, None)
