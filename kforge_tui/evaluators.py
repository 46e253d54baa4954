"""What evaluates a run's candidates, as the engine sees it: one `EvaluatorPool` per kernel
language behind the one Evaluator interface (`PoolPerLanguage`), and the slots that bound
evaluations in flight (user work first). The sandbox itself is in sandbox/; a Ray cluster's
evaluator (cluster/) stands in for `PoolPerLanguage`.

An `auto` run on a GPU (search/languages.py) proposes Triton and CUDA candidates for the same
region: each goes to the pool of its language, one evaluation per GPU across the pools so that
two candidates never share a GPU while timed.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from kforge_tui.errors import UsageError


class _Slots:
    """At most `n` evaluations in flight over all tasks. What the user asked for (a hand-written
    kernel, a repair) waits at the front of the queue: it is what a person is watching for."""

    def __init__(self, n: int) -> None:
        from collections import deque

        self._free = n
        self._front: deque = deque()
        self._back: deque = deque()

    async def acquire(self, front: bool = False) -> None:
        if self._free > 0 and not self._front and not self._back:
            self._free -= 1
            return
        queue = self._front if front else self._back
        fut = asyncio.get_running_loop().create_future()
        queue.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot as we were cancelled: pass it on
            elif fut in queue:
                queue.remove(fut)
            raise

    def release(self) -> None:
        for queue in (self._front, self._back):
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(None)
                    return
        self._free += 1

    async def __aenter__(self) -> "_Slots":
        await self.acquire()
        return self

    async def __aexit__(self, *exc) -> None:
        self.release()


def kernel_backends(device: str, requested: str | None) -> list[str]:
    """The kernel languages a run searches: the device's own by default; on a GPU `triton`, or
    `auto` for both CUDA and Triton (each region becomes one task per language)."""
    if requested in (None, "", device):
        return [device]
    if requested == "auto":
        return ["cuda", "triton"] if device == "cuda" else [device]
    if requested == "triton":
        return ["triton"]
    if requested == "cuda" and device != "cuda":
        raise UsageError("--backend cuda needs --device cuda (a CUDA GPU)")
    if requested in ("cuda", "cpu"):
        return [requested]
    raise UsageError(f"--backend must be cuda, triton, auto or cpu, not {requested!r}")


def device_of(backend: str) -> str:
    """The device a kernel language runs on (Triton: the GPU, or the CPU under its interpreter)."""
    if backend == "triton":
        from kforge_tui.device import cuda_available

        return "cuda" if cuda_available() else "cpu"
    return backend


def default_parallel(device: str) -> int:
    """Candidates in flight when the user gives no --parallel. On a GPU, enough to keep every
    worker busy while others compile, and no more: past that a candidate only waits longer for
    the same worker (latency = in flight / rate); never more than the CPU cores that compile
    them. H200 box, 2026-12-02 (`bench/eval_throughput.py --n 40`, compile 1.7-2.0 s, the worker
    0.26-0.32 s a candidate): 6 in flight 144-161/min at 2.0-2.3 s latency, 8: 163/min at 2.6 s,
    10: 165-169/min at 3.2 s. On the cpu 2 (the cores time candidates too)."""
    if device != "cuda":
        return 2
    import os

    from kforge_tui.sandbox.pool import _gpu_count

    return max(4, min(os.cpu_count() or 4, 8 * _gpu_count()))


class PoolPerLanguage:
    """One EvaluatorPool per kernel language of the run, behind the one Evaluator interface: a
    task goes to the pool of its backend (engine routes each candidate by its language,
    search/languages.route)."""

    def __init__(self, backends: list[str]):
        from kforge_tui.sandbox.pool import EvaluatorPool, _gpu_count

        self.pools = {b: EvaluatorPool(b, cache_dir=compile_cache_dir(), **_knobs(b)) for b in backends}
        # Each pool has one worker per GPU: with two pools (cuda and triton) two candidates
        # could share a GPU while timed. One evaluation per GPU across the pools, held only
        # while a worker runs it (the pools' device gate): compiles stay parallel.
        # Each pool's worker keeps its prepared tasks (input sets, references) on the device:
        # each plans with an equal share of the device's memory (supervisor.Budget).
        if len(self.pools) > 1:
            gate = asyncio.Semaphore(_gpu_count())
            for p in self.pools.values():
                p.device_gate = gate
                p.memory = {**p.memory, "share": 1 / len(self.pools)}

    def _for(self, task_json: dict):
        return self.pools.get(task_json.get("backend")) or next(iter(self.pools.values()))

    async def start(self) -> None:
        for p in self.pools.values():
            await p.start()

    async def baseline(self, task_json: dict, run_dir: str, with_compile: bool = False):
        return await self._for(task_json).baseline(task_json, run_dir, with_compile=with_compile)

    async def evaluate(self, task_json: dict, run_dir: str, source: str, on_stage=None):
        return await self._for(task_json).evaluate(task_json, run_dir, source, on_stage=on_stage)

    async def close(self) -> None:
        for p in self.pools.values():
            await p.close()


# Triton with no GPU runs under its interpreter (numpy, program by program): its times mean
# nothing there and a candidate takes seconds a call, so the timing loop is the shortest that
# still exercises it, and a candidate gets ten minutes (CI runs the seeded path this way).
INTERPRETER_TIMING = {"warmup": 1, "min_iters": 3, "max_iters": 4, "budget_s": 0.01}


def _knobs(backend: str) -> dict:
    from kforge_tui.sandbox.pool import triton_device

    if backend == "triton" and triton_device() == "cpu":
        return {"timing": dict(INTERPRETER_TIMING), "eval_timeout_s": 600.0}
    return {}


def compile_cache_dir() -> Path:
    from kforge_tui.config import cache_dir, private_dir

    return private_dir(private_dir(cache_dir()) / "compile")  # compiled candidates of the user's model
