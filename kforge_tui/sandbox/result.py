"""What one evaluation returns: the contract between the sandbox, the search and the store.

Stages run in order static -> compile -> load -> verify -> time; the first that fails sets
`status` to "<stage>_error" (or "timeout" / "crash" / "impossible_timing") and the rest do
not run. Every field is JSON-serialisable so the store can keep it and the TUI show it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

STAGES = ("static", "compile", "load", "verify", "time")
OK = "ok"
FAIL_STATUSES = ("static_error", "compile_error", "load_error", "verify_error", "time_error",
                 "timeout", "crash", "impossible_timing", "proposal_error")


@dataclass
class Timing:
    """Device-event (cuda) or wall-clock (cpu) times of one callable, in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    n: int
    method: str = ""  # e.g. "cuda events, L2 flushed, 4 input sets rotated"

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread reported next to every median."""
        return (self.p90_us - self.p10_us) / self.median_us if self.median_us else 0.0


@dataclass
class Mismatch:
    """A verification failure a person can debug from."""

    input_set: str  # "captured[0]", "random[2]", "timed-run output", "inputs modified", ...
    max_abs_err: float
    max_rel_err: float
    mismatched: int
    total: int
    first: list[dict] = field(default_factory=list)  # [{"index": [..], "expected": x, "got": y}]
    reason: str = ""  # "values differ", "unwritten elements (poison survived)", "NaN where reference finite", ...

    @property
    def share(self) -> float:
        return self.mismatched / self.total if self.total else 0.0

    def summary(self) -> str:
        return (f"{self.reason or 'mismatch'} on {self.input_set}: {self.mismatched}/{self.total} "
                f"({self.share:.1%}) elements, max abs {self.max_abs_err:.3g}, max rel {self.max_rel_err:.3g}")


@dataclass
class EvalResult:
    status: str  # "ok" or one of FAIL_STATUSES
    stage: str  # last stage reached
    message: str = ""  # one line, for tables and trees
    log: str = ""  # full text: static diagnostics, compiler output, worker stderr
    error_line: int | None = None  # 1-based source line of the first static/compile error
    resources: dict = field(default_factory=dict)  # registers, smem_bytes, spill_stores, spill_loads, stack_bytes
    mismatch: Mismatch | None = None
    timing: Timing | None = None
    baseline: Timing | None = None  # eager, timed in the same worker run
    floor_us: float | None = None
    compile_s: float | None = None
    stage_s: dict = field(default_factory=dict)  # seconds spent per stage
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def speedup(self) -> float | None:
        if self.ok and self.timing and self.baseline and self.timing.median_us > 0:
            return self.baseline.median_us / self.timing.median_us
        return None

    def to_json(self) -> dict:
        d = asdict(self)
        d["speedup"] = self.speedup
        return d

    @classmethod
    def from_json(cls, d: dict) -> "EvalResult":
        d = dict(d)
        d.pop("speedup", None)
        if d.get("mismatch"):
            d["mismatch"] = Mismatch(**d["mismatch"])
        for k in ("timing", "baseline"):
            if d.get(k):
                d[k] = Timing(**d[k])
        return cls(**d)


@dataclass
class Baseline:
    """Reference timings of a task, measured in the worker that times candidates."""

    eager: Timing
    compiled: Timing | None = None  # torch.compile (default mode), when asked
    floor_us: float | None = None
    floor_note: str = ""
    bandwidth_gbs: float | None = None


class Evaluator(Protocol):
    """Submit a candidate, get a result. Implemented by sandbox.pool.EvaluatorPool.

    Kept this narrow so the pool can later be spread over machines without touching the search.
    `on_stage(stage)` is called as the candidate enters each stage (for live UIs).
    """

    async def baseline(self, task_json: dict, run_dir: str, with_compile: bool = False) -> Baseline: ...

    async def evaluate(self, task_json: dict, run_dir: str, source: str,
                       on_stage=None) -> EvalResult: ...

    async def close(self) -> None: ...
