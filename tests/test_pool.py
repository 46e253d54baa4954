"""EvaluatorPool end to end on the cpu backend: stages, parallel compiles queueing for one
worker, baselines, worker recycling, captured inputs and the Evaluator contract."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from kforge_tui.sandbox.pool import EvaluatorPool
from kforge_tui.sandbox.result import Baseline, EvalResult
from kforge_tui.task import capture_dir, save_call
from kforge_tui.workload import catalogue

HONEST = (Path(__file__).parent / "cheats" / "honest" / "softmax_f32.cpp").read_text()
TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 12, "budget_s": 0.03}


def softmax_task(shape=(32, 200)):
    x = torch.randn(*shape)
    return catalogue.make_task("softmax", {"x": x}, {"dim": -1}, torch.softmax(x, -1))


def variant(k: int) -> str:
    return HONEST + f"\n// variant {k}\n"


async def test_parallel_candidates_stages_and_stats(tmp_path):
    task = softmax_task()
    stages: dict[int, list[str]] = {}
    async with EvaluatorPool("cpu", cache_dir=tmp_path / "cache", timing=TIMING, compile_jobs=2) as pool:
        async def one(k):
            stages[k] = []
            return await pool.evaluate(task.to_json(), str(tmp_path), variant(k),
                                       on_stage=lambda s, k=k: stages[k].append(s))
        results = await asyncio.gather(*(one(k) for k in range(4)))
        assert all(isinstance(r, EvalResult) and r.status == "ok" for r in results), \
            [r.message for r in results]
        assert all(stages[k] == ["static", "compile", "load", "verify", "time"] for k in stages)
        assert pool.stats["evaluations"] == 4 and pool.stats["in_flight"] == 0
        r = await pool.evaluate(task.to_json(), str(tmp_path), variant(0))
        assert r.status == "ok" and r.cached  # same source: compile cache hit
        assert max(x.stage_s["queue"] for x in results) > 0  # someone waited for the single worker
        b = await pool.baseline(task.to_json(), str(tmp_path))
        assert isinstance(b, Baseline) and b.eager.median_us > 0 and b.floor_us and b.bandwidth_gbs
        assert "GB/s" in b.floor_note
        assert (tmp_path / "cache" / "bandwidth.json").exists()
        assert results[0].to_json()["speedup"] == results[0].speedup


async def test_worker_is_recycled_every_n_evaluations(tmp_path):
    task = softmax_task()
    async with EvaluatorPool("cpu", cache_dir=tmp_path, timing=TIMING, restart_every=2) as pool:
        pids = []
        for k in range(3):
            r = await pool.evaluate(task.to_json(), str(tmp_path), variant(k))
            assert r.status == "ok", r.message
            pids.append(pool._workers[0].proc.pid)
        assert pool.stats["restarts"] == 1 and pids[0] == pids[0] and pids[2] != pids[0]


async def test_captured_inputs_are_verified(tmp_path):
    """A kernel right on random N(0,1) data but wrong on the captured (large-valued) call fails
    on captured[0]: captures are really used."""
    x = torch.randn(32, 200) * 50 + 100  # exp overflows without max-subtraction
    task = catalogue.make_task("softmax", {"x": x}, {"dim": -1}, torch.softmax(x, -1))
    save_call(capture_dir(tmp_path, task.task_id) / "call_0.pt", {"x": x}, {"dim": -1}, torch.softmax(x, -1))
    naive = HONEST.replace("m = fmaxf(m, xr[j * inner]);", "m = 0.f;")
    async with EvaluatorPool("cpu", cache_dir=tmp_path / "c", timing=TIMING) as pool:
        r = await pool.evaluate(task.to_json(), str(tmp_path), naive)
        assert r.status == "verify_error" and r.mismatch.input_set == "captured[0]", r.message
        assert "1 captured calls" in r.log
        ok = await pool.evaluate(task.to_json(), str(tmp_path), HONEST)
        assert ok.status == "ok", ok.message


@pytest.mark.slow
async def test_baseline_with_torch_compile(tmp_path):
    task = softmax_task((16, 64))
    async with EvaluatorPool("cpu", cache_dir=tmp_path, timing=TIMING) as pool:
        b = await pool.baseline(task.to_json(), str(tmp_path), with_compile=True)
    assert b.eager.median_us > 0
    assert b.compiled is not None or "torch.compile unavailable" in b.floor_note
