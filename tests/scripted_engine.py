"""Scripted stand-ins for the Engine's `evaluator=` and `proposer=` seams (tests of steering).

They make every command's effect exact and fast while the workload step, the run store, the
engine loop and the TUI stay real. Kept to the attributes the engine reads, so they do not follow
the sandbox's internals.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kforge_tui.search.proposers.base import Proposal


@dataclass
class Timing:
    median_us: float


@dataclass
class Result:
    status: str
    message: str
    speedup: float | None
    timing: Timing | None
    resources: dict = field(default_factory=dict)
    mismatch: None = None
    log: str = ""

    def to_json(self) -> dict:
        return {"status": self.status, "message": self.message, "speedup": self.speedup}


class ScriptedEvaluator:
    """Every candidate verifies at 1.25x after `delay` seconds (or fails with `fail`: a
    (status, message) every candidate gets)."""

    def __init__(self, delay: float = 0.05, fail: tuple[str, str] | None = None):
        self.delay, self.fail = delay, fail

    async def start(self):
        pass

    async def close(self):
        pass

    async def baseline(self, task_json, run_dir, with_compile=False):
        t = {"median_us": 10.0, "p10_us": 10.0, "p90_us": 10.0, "min_us": 10.0, "n": 5}
        return {"eager": t, "compiled": None, "floor_us": 1.0}

    async def evaluate(self, task_json, run_dir, source, on_stage=None):
        await asyncio.sleep(self.delay)
        if self.fail:
            return Result(self.fail[0], self.fail[1], None, None)
        return Result("ok", "1.25x", 1.25, Timing(8.0))


class ScriptedProposer:
    """`ideas` distinct kernels, then nothing new (exhausted); every `fail_every`-th call is a 429."""

    name = "scripted"

    def __init__(self, ideas: int = 1000, fail_every: int = 0):
        self.ideas, self.fail_every, self.made = ideas, fail_every, 0

    def can_expand(self, ctx) -> bool:
        return self.made < self.ideas

    async def propose(self, ctx) -> Proposal:
        self.made += 1
        if self.fail_every and self.made % self.fail_every == 0:
            return Proposal(None, "llm:improve", self.name, prompt="p", prompt_tokens=100,
                            error="HTTP 429 rate limited (after 4 attempts)")
        return Proposal(f"// kernel {self.made}\n", f"scripted:{self.made}", self.name, prompt="p",
                        response="r", prompt_tokens=100, completion_tokens=50, cost_usd=0.001)
