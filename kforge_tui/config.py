"""Settings: defaults < user config file (TOML) < environment < command-line flags.

The config file is `$XDG_CONFIG_HOME/kforge/config.toml` (default `~/.config/kforge/config.toml`),
or the file named by `KFORGE_CONFIG`. Every key is optional:

    llm = "openai/gpt-4.1"            # any litellm provider string; absent: built-in proposer
    api_base = "http://127.0.0.1:8000/v1"
    budget = 50                       # candidates per task
    top = 5                           # hot ops to optimise
    parallel = 4                      # evaluations in flight
    theme = "kforge-dark"
    run_root = "~/kforge_runs"
    device = "cuda"
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from kforge_tui.errors import UsageError

ENV = {  # setting -> environment variable
    "llm": "KFORGE_LLM",
    "api_base": "KFORGE_API_BASE",
    "budget": "KFORGE_BUDGET",
    "top": "KFORGE_TOP",
    "parallel": "KFORGE_PARALLEL",
    "theme": "KFORGE_THEME",
    "run_root": "KFORGE_RUN_ROOT",
    "device": "KFORGE_DEVICE",
}


@dataclass
class Config:
    llm: str | None = None
    api_base: str | None = None
    budget: int = 50
    top: int = 5
    parallel: int = 0  # 0: pick from the hardware
    theme: str = "kforge-dark"
    run_root: str = "kforge_runs"
    device: str | None = None


def config_path() -> Path:
    if os.environ.get("KFORGE_CONFIG"):
        return Path(os.environ["KFORGE_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "kforge" / "config.toml"


def load_config(overrides: dict | None = None) -> Config:
    """Merge the layers; flags arrive as `overrides` (None values mean 'not given')."""
    cfg = Config()
    types = {f.name: f.type for f in fields(Config)}
    path = config_path()
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError) as e:
            raise UsageError(f"config file {path} is not valid TOML: {e}") from None
        unknown = set(data) - set(types)
        if unknown:
            raise UsageError(f"config file {path}: unknown key(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(types)}")
        for k, v in data.items():
            setattr(cfg, k, _coerce(k, v, types[k], str(path)))
    for k, var in ENV.items():
        if os.environ.get(var):
            setattr(cfg, k, _coerce(k, os.environ[var], types[k], var))
    for k, v in (overrides or {}).items():
        if v is not None and k in types:
            setattr(cfg, k, v)
    return cfg


def _coerce(key: str, value, typ, where: str):
    if "int" in str(typ):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise UsageError(f"{where}: {key} must be a whole number, not {value!r}") from None
    return str(value)
