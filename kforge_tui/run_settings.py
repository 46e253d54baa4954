"""What one `optimize` run is asked to do (`OptimizeSettings`), where its directory goes, and how
a stopped run's settings come back for `resume`. Plain data: the CLI, the engine, the TUI and the
headless reporter all read it, and the store keeps it as JSON.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path


@dataclass
class OptimizeSettings:
    model: str
    device: str | None = None
    ops: list[str] | None = None
    top: int = 5
    budget: int = 50
    llm: str | None = None
    api_base: str | None = None
    parallel: int = 0  # 0: from the hardware
    run_dir: str | None = None
    run_root: str = "kforge_runs"
    time_limit_s: float | None = None
    target_speedup: float | None = None
    compile_baseline: bool | None = None  # None: on for cuda
    backend: str | None = None  # kernel language: cuda | triton | auto (both) | cpu; None: the device's
    end_to_end: bool = True
    seed: int = 0
    max_calls: int = 3
    serve: bool = False  # keep serving UI commands after the search ends (live TUI)
    resume: bool = False
    cluster: str | None = None  # where candidates are evaluated: None here, "ray" or "ray://HOST:PORT"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "OptimizeSettings":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


def default_run_dir(settings: OptimizeSettings) -> Path:
    """`<run_root>/<model stem>-<date>-<time>`, with `-2`, `-3`, ... when that path is taken: two
    runs started in the same second (a script, a test suite) must not share a run directory."""
    stem = Path(settings.model.split(":")[0]).stem or "model"
    base = Path(settings.run_root).expanduser() / f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def reserve_run_dir(settings: OptimizeSettings) -> Path:
    """A new default run directory, created (0700) by this process: `mkdir` either makes it or
    fails, so of two runs that picked the same name in the same second only one gets it and the
    other takes the next."""
    for _ in range(1000):
        path = default_run_dir(settings)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return path
    raise OSError(f"no free run directory under {settings.run_root}")


def settings_for_resume(run_dir: str) -> OptimizeSettings:
    from kforge_tui.store import RunStore

    store = RunStore.open(run_dir, readonly=True)
    try:
        info = store.run_info()
    finally:
        store.close()
    s = OptimizeSettings.from_json(info.get("settings") or {})
    s.run_dir, s.resume = str(run_dir), True
    return s
