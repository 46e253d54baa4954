"""The evaluator a run uses: the sandbox's EvaluatorPool, one per kernel language searched.

An `auto` run on a GPU (search/languages.py) proposes Triton and CUDA candidates for the same
region: each goes to the pool of its language, one evaluation per GPU across the pools so that
two candidates never share a GPU while timed.
"""
from __future__ import annotations

import asyncio
from pathlib import Path


class PoolPerLanguage:
    """One EvaluatorPool per kernel language of the run, behind the one Evaluator interface: a
    task goes to the pool of its backend (engine routes each candidate by its language,
    search/languages.route)."""

    def __init__(self, backends: list[str]):
        from kforge_tui.sandbox.pool import EvaluatorPool, _gpu_count

        self.pools = {b: EvaluatorPool(b, cache_dir=compile_cache_dir(), **_knobs(b)) for b in backends}
        # Each pool has one worker per GPU: with two pools (cuda and triton) two candidates
        # could share a GPU while timed. One evaluation per GPU across the pools.
        self._gate = asyncio.Semaphore(_gpu_count()) if len(self.pools) > 1 else None

    def _for(self, task_json: dict):
        return self.pools.get(task_json.get("backend")) or next(iter(self.pools.values()))

    async def start(self) -> None:
        for p in self.pools.values():
            await p.start()

    async def baseline(self, task_json: dict, run_dir: str, with_compile: bool = False):
        if self._gate is None:
            return await self._for(task_json).baseline(task_json, run_dir, with_compile=with_compile)
        async with self._gate:
            return await self._for(task_json).baseline(task_json, run_dir, with_compile=with_compile)

    async def evaluate(self, task_json: dict, run_dir: str, source: str, on_stage=None):
        if self._gate is None:
            return await self._for(task_json).evaluate(task_json, run_dir, source, on_stage=on_stage)
        async with self._gate:
            return await self._for(task_json).evaluate(task_json, run_dir, source, on_stage=on_stage)

    async def close(self) -> None:
        for p in self.pools.values():
            await p.close()


def compile_cache_dir() -> Path:
    from kforge_tui.config import cache_dir, private_dir

    return private_dir(private_dir(cache_dir()) / "compile")  # compiled candidates of the user's model


# Triton with no GPU runs under its interpreter (numpy, program by program): its times mean
# nothing there and a candidate takes seconds a call, so the timing loop is the shortest that
# still exercises it, and a candidate gets ten minutes (CI runs the seeded path this way).
INTERPRETER_TIMING = {"warmup": 1, "min_iters": 3, "max_iters": 4, "budget_s": 0.01}


def _knobs(backend: str) -> dict:
    from kforge_tui.sandbox.pool import triton_device

    if backend == "triton" and triton_device() == "cpu":
        return {"timing": dict(INTERPRETER_TIMING), "eval_timeout_s": 600.0}
    return {}
