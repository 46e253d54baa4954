"""What one evaluation returns: the contract between the sandbox, the search and the store.

Stages run in order static -> compile -> load -> verify -> time; the first that fails sets
`status` to "<stage>_error" (or "timeout" / "crash" / "impossible_timing") and the rest do
not run. Every field is JSON-serialisable so the store can keep it and the TUI show it.

"infra_error" is not a candidate failure: the evaluation itself could not run (out of memory
even with one input set after retries, a runner that could not start). The engine must not
record it against the candidate, send it to repair, or charge it to the budget; it may submit
the same source again later.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

from kforge_tui.errors import WorkFailed

STAGES = ("static", "compile", "load", "verify", "time")
OK = "ok"
FAIL_STATUSES = ("static_error", "compile_error", "load_error", "verify_error", "time_error",
                 "timeout", "crash", "impossible_timing", "proposal_error")
INFRA_STATUSES = ("infra_error",)  # not the candidate's doing: never charged, never repaired


@dataclass
class Timing:
    """Device-event (cuda) or wall-clock (cpu) times of one callable, in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    n: int
    method: str = ""  # e.g. "cuda events, L2 flushed, 4 input sets rotated"
    # "device" (cuda: event time with the host kept ahead, no host time inside) or "wall" (cpu)
    clock: str = ""

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
        if self.max_abs_err != self.max_abs_err and not self.first:  # not about values
            return f"{self.reason} on {self.input_set}"
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
    baseline: Timing | None = None  # eager, timed right after the candidate in the same worker
    compiled: Timing | None = None  # torch.compile of the region, timed the same way (when known)
    floor_us: float | None = None
    compile_s: float | None = None
    stage_s: dict = field(default_factory=dict)  # seconds spent per stage
    cached: bool = False
    # what verification ran: {"sets": n, "calls": n, "edge_cases": [...], "replay_checks": n,
    # "timed_checks": n, "fresh_timed": n, "runner": "fresh process per candidate", ...}
    checks: dict = field(default_factory=dict)
    worker: str = ""  # who evaluated it, "<node>/<worker>": "local/cuda0", "10.0.0.7:1d63c0b3/cuda1"

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def infra(self) -> bool:
        """The evaluation could not run; nothing is known about the candidate."""
        return self.status in INFRA_STATUSES

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
        for k in ("timing", "baseline", "compiled"):
            if d.get(k):
                d[k] = Timing(**d[k])
        return cls(**d)


@dataclass
class Baseline:
    """Reference timings of a task, measured in the worker that times candidates."""

    eager: Timing
    compiled: Timing | None = None  # torch.compile (default mode), when asked
    eager_of: str = ""  # what eager ran: the op the model calls (patterns.native_eager) or the graph
    floor_us: float | None = None
    floor_note: str = ""
    bandwidth_gbs: float | None = None
    peak_tflops: float | None = None  # measured matrix rate for the task dtype (None on cpu)
    floor_bound: str = ""  # "memory" | "compute"
    sets: int | None = None  # input sets rotated (follows free memory)
    note: str = ""  # where the inputs came from, memory plan, retries
    # Triton tasks on a GPU: Inductor's kernel for the region on the candidate ABI
    # (search.inductor_seed.Seed.to_json(); the engine `remember`s it), else None
    seed: dict | None = None


class EvaluatorLost(WorkFailed):
    """Where candidates run is gone for good (a Ray cluster that stopped answering): raised by
    `evaluate`/`baseline` instead of a result, since nothing is known about the candidate. The
    engine stops the run; in-flight candidates are lost, never charged; `kforge resume` goes on."""


class Evaluator(Protocol):
    """Submit a candidate, get a result. Implemented by sandbox.pool.EvaluatorPool (worker
    processes here) and cluster.executor.RayEvaluator (Ray actors across nodes).

    Kept this narrow so the pool can later be spread over machines without touching the search.
    `on_stage(stage)` is called as the candidate enters each stage (for live UIs).
    """

    async def baseline(self, task_json: dict, run_dir: str, with_compile: bool = False) -> Baseline: ...

    async def evaluate(self, task_json: dict, run_dir: str, source: str,
                       on_stage=None) -> EvalResult: ...

    async def close(self) -> None: ...
