"""Triton's JIT ahead of the GPU worker (sandbox/triton_precompile.py, issue 20).

The compile itself needs a GPU (`-m gpu`: the runner's first call then loads what was compiled
ahead). Here, without one, the server's protocol is tested with real processes: a child that
hangs is killed at its deadline while another job is answered, a failure is an answer and never
an exception, and a pool without a GPU compiles nothing ahead.
"""
from __future__ import annotations

import asyncio
import os
import time

import pytest
import torch

pytest.importorskip("triton")

from kforge_tui.regions.build import task_of  # noqa: E402
from kforge_tui.sandbox import triton_precompile  # noqa: E402
from kforge_tui.sandbox.pool import EvaluatorPool  # noqa: E402

META = [{"name": "x", "shape": [4, 8], "dtype": "float32", "stride": [8, 1]}]


async def test_a_hanging_compile_is_killed_at_its_deadline_while_another_is_answered(tmp_path):
    fifo = tmp_path / "never_written.py"
    os.mkfifo(fifo)  # opening it blocks: a child that never finishes
    pre = triton_precompile.Precompiler(tmp_path / "cache", jobs=2, timeout_s=3.0)
    try:
        t0 = time.monotonic()
        hung = asyncio.ensure_future(pre.compile(str(fifo), META, META))
        await asyncio.sleep(0.5)
        cache, rep = await pre.compile(str(tmp_path / "missing.py"), META, META)
        assert cache is None and not rep["ok"] and "No such file" in rep["error"], rep
        assert not hung.done()  # answered beside the hanging one, not after it
        cache, rep = await hung
        assert cache is None and rep["error"] == "timed out", rep
        assert 2.5 < time.monotonic() - t0 < 20
        assert pre.stats == {"compiled": 0, "failed": 2} and not pre.dead
    finally:
        proc = pre.proc
        await pre.close()
    assert proc is not None and proc.returncode is not None  # the server ends with its input


async def test_a_server_that_cannot_start_leaves_the_compile_to_the_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(triton_precompile, "die_with_parent", lambda *a: ["python3", "-c", "print('not json')"])
    pre = triton_precompile.Precompiler(tmp_path / "cache")
    cache, rep = await pre.compile(str(tmp_path / "x.py"), META, META)
    assert cache is None and "did not start" in rep["error"] and pre.dead
    cache, rep = await pre.compile(str(tmp_path / "x.py"), META, META)  # asked again: no retry storm
    assert cache is None and rep["error"] == pre.dead


async def test_a_server_that_cannot_warm_up_leaves_the_compile_to_the_worker(tmp_path):
    """A target the warm-up cannot compile for (not a CUDA one): cold children would be slower
    than the runner's own JIT, so nothing is compiled ahead, and the reason is kept."""
    pre = triton_precompile.Precompiler(tmp_path / "cache", arch="gfx90a")
    try:
        cache, rep = await pre.compile(str(tmp_path / "x.py"), META, META)
        assert cache is None and "warm-up failed" in rep["error"] and pre.dead, rep
        assert pre.warm and not pre.warm["ok"] and pre.warm["error"], pre.warm
        assert pre.proc is None  # the server is gone: no child is ever forked cold
    finally:
        await pre.close()


def test_only_a_pool_that_compiles_on_a_gpu_compiles_ahead_unless_told_not_to(tmp_path, monkeypatch):
    monkeypatch.delenv("KFORGE_TRITON_COMPILE_AHEAD", raising=False)
    assert EvaluatorPool("triton", cache_dir=tmp_path, device="cuda")._precompiler is not None  # on by default
    assert EvaluatorPool("triton", cache_dir=tmp_path, device="cpu")._precompiler is None
    monkeypatch.setenv("KFORGE_TRITON_COMPILE_AHEAD", "1")
    assert EvaluatorPool("triton", cache_dir=tmp_path, device="cpu")._precompiler is None
    assert EvaluatorPool("cuda", cache_dir=tmp_path, device="cuda")._precompiler is None
    assert EvaluatorPool("triton", cache_dir=tmp_path, device="cuda")._precompiler is not None
    monkeypatch.setenv("KFORGE_TRITON_COMPILE_AHEAD", "0")
    assert EvaluatorPool("triton", cache_dir=tmp_path, device="cuda")._precompiler is None
    monkeypatch.setenv("KFORGE_TRITON_COMPILE_AHEAD", "yes")
    from kforge_tui.errors import UsageError

    with pytest.raises(UsageError, match="KFORGE_TRITON_COMPILE_AHEAD='yes': expected 1 or 0"):
        EvaluatorPool("triton", cache_dir=tmp_path, device="cuda")


def test_jobs_have_their_own_directory_per_source_and_abi():
    a = triton_precompile.job_key("/c/triton/src/ab.py", META, META)
    assert a == triton_precompile.job_key("/elsewhere/ab.py", META, META)
    assert a != triton_precompile.job_key("/c/triton/src/cd.py", META, META)
    other = [dict(META[0], stride=[1, 4])]
    assert a != triton_precompile.job_key("/c/triton/src/ab.py", other, META)


@pytest.mark.gpu
async def test_gpu_the_runner_loads_what_was_compiled_ahead(tmp_path, monkeypatch):
    """The candidate's kernels are compiled before it queues; the runner's first call finds them
    in its cache (a load, far under the compile), and the verdict is the runner's as before."""
    from pathlib import Path

    src = (Path(__file__).parent / "cheats" / "triton" / "_honest_softmax.py").read_text()
    # rows of 64: the template's one block (at 1024 columns it leaves 960 of each row unwritten,
    # and the judge said so on an H100, 2026-12-07)
    task = task_of(lambda x: torch.softmax(x, -1), (torch.randn(4096, 64),), backend="triton")
    monkeypatch.delenv("KFORGE_TRITON_COMPILE_AHEAD", raising=False)  # on by default
    async with EvaluatorPool("triton", cache_dir=tmp_path, eval_timeout_s=120) as pool:
        await pool.baseline(task.to_json(), str(tmp_path))
        # the server started and warmed with the pool, before any candidate asked for it
        assert pool._precompiler_start is not None and await pool._precompiler_start is True
        assert pool._precompiler.stats["compiled"] == 0 and pool._precompiler.warm.get("ok")
        r = await pool.evaluate(task.to_json(), str(tmp_path), src)
        assert r.status == "ok", (r.status, r.message, r.log[-2000:])
        st = r.stage_s
        print(f"\ncompile ahead {st.get('compile_ahead')}, runner's first call {st.get('jit')}, compile_s {r.compile_s}")
        assert pool._precompiler.stats["compiled"] == 1 and st.get("compile_ahead")
        assert pool._precompiler.warm.get("ok"), pool._precompiler.warm  # compiled once before forking
        assert st["jit"] < 0.5 * r.compile_s, st
        assert not list((tmp_path / "triton" / "pre").iterdir())  # discarded after its evaluation
        bad = src.replace("tl.store(y_ptr + row * n_cols + offs,", "tl.store(y_ptr + row * n_cols + offs + 1,")
        r = await pool.evaluate(task.to_json(), str(tmp_path), bad)
        assert r.status != "ok", r.status  # compiled ahead all the same, judged by the runner
