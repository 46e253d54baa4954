"""The steps of `python -m bench`, one module each: bench/steps/<name>.py (a dash in the step's
name is an underscore in the module's).

A step module defines

    HELP = "one line: what it measures"          shown by `python -m bench --help`
    def add_arguments(group) -> None: ...        optional; its own options, on an argparse group
                                                 (names must not collide with another step's)
    def run(ctx: Context) -> report.Table: ...   the work

`ctx.rest` holds the command's arguments after `--` (allowed when one step is named): a step
that wraps a script hands them on. `run` prints progress to stderr (stdout is the table's), writes what it makes (run directories,
logs, raw JSON) under `ctx.dir`, and returns one `report.Table`; the runner prints it, writes
`<out>/<name>.json` with the machine, date and command, and exits 1 when a table is not ok. It
raises `report.StepError` for what cannot run here (no GPU) or as asked. Step modules import
torch and kforge_tui inside `run`, never at module level, so `--help` stays instant.

`STEPS` is the order `--help` lists them in and `all` runs them in.
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import ROOT, StepError

STEPS = ("kernels", "regions", "models", "level2", "sweep", "throughput", "search-time", "cheats", "op-overhead",
         "arena-clock", "clock-check", "tui-latency")


def load(name: str):
    return importlib.import_module(f"bench.steps.{name.replace('-', '_')}")


@dataclass
class Context:
    """What a step gets: its parsed options, where to write, and the common settings."""

    args: argparse.Namespace
    out: Path  # the run's output folder (the runner writes <name>.json here)
    dir: Path  # this step's own folder under it, for what the step makes
    device: str  # cuda | cpu
    small: bool  # --small: CPU-sized shapes and budgets, for a dry run
    rest: list[str] = field(default_factory=list)  # the arguments after `--` (one step only)

    def env(self, **extra) -> dict:
        """The environment for the commands a step runs: this checkout first on the path, no
        network lookups by litellm, unbuffered output (logs of killed runs stay complete)."""
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        if self.device == "cuda" and not self.small:
            env.setdefault("KFORGE_SAMPLE_SIZE", "gpu")
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def sh(self, argv: list[str], log: str, timeout: float | None = None, capture: bool = False,
           **env) -> subprocess.CompletedProcess:
        """Run a command from the repository root with its output in `<dir>/<log>`; with
        `capture`, stdout comes back in the result instead (a `--json` answer) and only stderr
        goes to the log."""
        self.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.dir / log, "w") as f:
            try:
                r = subprocess.run(argv, cwd=ROOT, env=self.env(**env), text=True,
                                   stdout=subprocess.PIPE if capture else f,
                                   stderr=f if capture else subprocess.STDOUT, timeout=timeout or self.args.timeout)
            except subprocess.TimeoutExpired:
                r = subprocess.CompletedProcess(argv, 124, "", "")
        print(f"  {' '.join(Path(a).name if i < 2 else a for i, a in enumerate(argv[:5]))} ... rc={r.returncode} "
              f"{time.perf_counter() - t0:.0f}s (log {self.dir / log})", file=sys.stderr, flush=True)
        return r

    def kforge(self, *args: str, log: str, timeout: float | None = None, capture: bool = False,
               **env) -> subprocess.CompletedProcess:
        return self.sh([sys.executable, "-m", "kforge_tui", *args], log, timeout, capture, **env)

    def budget(self, full: int, small: int) -> int:
        return self.args.budget or (small if self.small else full)

    def top(self, full: int, small: int) -> int:
        return self.args.top or (small if self.small else full)

    def need_gpu(self, why: str) -> None:
        if self.device != "cuda":
            raise StepError(f"needs a CUDA GPU: {why}", 2)


__all__ = ["STEPS", "Context", "StepError", "load"]
