"""The KFORGE_* settings a runner reads. A runner's environment names nothing of the sandbox
(issue 21: the zygote drops those variables), so the zygote keeps what it read here first."""
from __future__ import annotations

import os

SETTINGS: dict[str, str] = {}


def keep() -> None:
    """In the zygote, before it drops the variables."""
    SETTINGS.update({k: v for k, v in os.environ.items() if k.startswith("KFORGE_")})


def setting(name: str) -> str | None:
    return os.environ.get(name) or SETTINGS.get(name)
