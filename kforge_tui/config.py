"""Settings: defaults < user config file (TOML) < environment < command-line flags; and where kforge
keeps its user files (platformdirs: the platform's config, cache and data directories).

The config file is `config.toml` in the user config directory (`~/.config/kforge/` on Linux),
or the file named by `KFORGE_CONFIG`. Every key is optional:

    llm = "openai/gpt-4.1"            # any litellm provider string; absent: built-in proposer
    api_base = "http://127.0.0.1:8000/v1"
    budget = 50                       # candidates per task (default 50 on a GPU, 6 on the CPU)
    top = 5                           # hot ops to optimise (default 5 on a GPU, 3 on the CPU)
    parallel = 4                      # evaluations in flight
    theme = "kforge-dark"
    run_root = "~/kforge_runs"
    device = "cuda"
    cluster = "ray"                   # evaluate on a Ray cluster (RAY_ADDRESS), or "ray://HOST:PORT"

    [keymap]                          # binding id = key(s); `?` in the TUI lists the ids
    pause-all = "space"
    zoom = "Z"
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import platformdirs

from kforge_tui.errors import UsageError

APP = "kforge"

ENV = {  # setting -> environment variable
    "llm": "KFORGE_LLM",
    "api_base": "KFORGE_API_BASE",
    "budget": "KFORGE_BUDGET",
    "top": "KFORGE_TOP",
    "parallel": "KFORGE_PARALLEL",
    "theme": "KFORGE_THEME",
    "run_root": "KFORGE_RUN_ROOT",
    "device": "KFORGE_DEVICE",
    "cluster": "KFORGE_CLUSTER",
}


@dataclass
class Config:
    llm: str | None = None
    api_base: str | None = None
    budget: int | None = None  # None: the device's default (cli.GPU_DEFAULTS / CPU_DEFAULTS)
    top: int | None = None
    parallel: int = 0  # 0: pick from the hardware
    theme: str = "kforge-dark"
    run_root: str = "kforge_runs"
    device: str | None = None
    cluster: str | None = None  # "local" (None), "ray", "ray://HOST:PORT": cluster.parse_cluster
    keymap: dict[str, str] = field(default_factory=dict)  # TUI binding id -> key(s)


def config_path() -> Path:
    if os.environ.get("KFORGE_CONFIG"):
        return Path(os.environ["KFORGE_CONFIG"]).expanduser()
    return platformdirs.user_config_path(APP, appauthor=False) / "config.toml"


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make it owner-only: runs and caches hold the user's tensors."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def cache_dir() -> Path:
    """Compile cache: `KFORGE_CACHE`, else the platform's user cache directory."""
    base = os.environ.get("KFORGE_CACHE")
    return Path(base).expanduser() if base else platformdirs.user_cache_path(APP, appauthor=False)


def data_dir() -> Path:
    """kforge's own records (the list of runs): the platform's user data directory."""
    return platformdirs.user_data_path(APP, appauthor=False)


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
    if "dict" in str(typ):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise UsageError(f"{where}: {key} must be a table of name = \"key\" strings")
        return {str(k): v for k, v in value.items()}
    if "int" in str(typ):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise UsageError(f"{where}: {key} must be a whole number, not {value!r}") from None
    return str(value)
