"""A candidate's evaluation deadline follows the bytes its checks must go over: the base for a
small region, more for a region whose input sets fill an arena hashed on every checked call
(a 262144x256 float32 embedding ran out of a fixed 60 s in the harness's own checks), and a
candidate that runs past it is told so with the deadline and the sets' size."""
from __future__ import annotations

import asyncio
import functools
import subprocess
from types import SimpleNamespace

import pytest
import pytest_asyncio
import torch

from kforge_tui.regions.build import task_of
from kforge_tui.regions.task import Task
from kforge_tui.sandbox.compile import compile_flags
from kforge_tui.sandbox.inputs import ArenaWatch
from kforge_tui.sandbox.pool import (SUPERVISOR_GRACE_S, WATCH_COPY_LIMIT, EvaluatorPool, _Worker,
                                     describe_deadline, eval_deadline)

GIB = 2**30
TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 12, "budget_s": 0.03}
SLEEPER = r'''
#include "kforge_region.h"
#include <time.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    struct timespec ts = {30, 0};  /* far past the test's deadline: only a kill ends it */
    nanosleep(&ts, 0);
    return 0;
}
'''


@functools.lru_cache(maxsize=None)
def small_task():
    return task_of(lambda x: torch.softmax(x, -1), (torch.randn(16, 128),), backend="cpu")


# ------------------------------------------------------------------------ the arithmetic

def test_the_pool_knows_where_the_arena_watch_starts_hashing():
    # the pool keeps its own copy (it imports no torch): the two must not drift apart
    assert WATCH_COPY_LIMIT == ArenaWatch.COPY_LIMIT


def test_an_arena_compared_bitwise_keeps_the_base_deadline():
    for n in (0, 64 << 10, 100 << 20, WATCH_COPY_LIMIT):
        assert eval_deadline(60, n, 4, "cpu") == 60
        assert eval_deadline(6, n, 4, "cuda") == 6


def test_multi_gib_sets_grow_the_deadline_in_proportion_to_their_bytes():
    base = 60
    extra = {g: eval_deadline(base, g * GIB, 4, "cpu") - base for g in (1, 2, 4, 8)}
    assert extra[1] > 0
    for g in (2, 4, 8):  # proportional, to the second the deadline is rounded up to
        assert abs(extra[g] - g * extra[1]) <= g, extra
    # more sets mean more checked calls over the same bytes
    assert eval_deadline(base, 2 * GIB, 8, "cpu") > eval_deadline(base, 2 * GIB, 4, "cpu")
    # the GPU hashes at memory speed: less for the same bytes, still more than the base
    assert base < eval_deadline(base, 2 * GIB, 4, "cuda") < eval_deadline(base, 2 * GIB, 4, "cpu")
    # 0 seconds a GiB: a fixed deadline, as asked
    assert eval_deadline(base, 8 * GIB, 4, "cpu", s_per_gib=0) == base


def test_the_measured_embedding_regions_fit_their_deadlines():
    """Honest kernels on the shared 2-core box (pool.CHECK_S_PER_GIB): 4 sets of a 262144x256
    float32 table (the held-out region, a 1.0 GiB arena) took 384 s, of 131072x256 (0.5 GiB)
    266 s. The base's 60 s covered neither; the deadline must cover both."""
    assert eval_deadline(60, GIB, 4, "cpu") > 384
    assert eval_deadline(60, GIB // 2, 4, "cpu") > 266


def test_a_compiled_hash_gives_a_shorter_deadline_that_still_covers_the_measured_table():
    """With the worker's hash compiled (CHECK_S_PER_GIB): the 262144x256 table in 4 sets (a 2.03
    GiB arena) took 19-36 s an evaluation on the CI box (2026-12-07). Where the worker did not
    say (a Ray slot's upper bound, an old worker) or its hash is eager, the eager rate stands."""
    arena = int(2.03 * GIB)
    fast = eval_deadline(60, arena, 4, "cpu", hash_compiled=True)
    assert 60 + 36 < fast < eval_deadline(60, arena, 4, "cpu", hash_compiled=False)
    assert eval_deadline(60, arena, 4, "cpu") == eval_deadline(60, arena, 4, "cpu", hash_compiled=False)
    assert eval_deadline(60, GIB, 4, "cpu", hash_compiled=False) > 384  # the eager measurement


def test_the_verdict_names_the_deadline_and_the_arena():
    d = eval_deadline(60, 2 * GIB, 4, "cpu")
    said = describe_deadline(d, 60, 2 * GIB, 4)
    assert said.startswith(f"no result after {d:g} s (deadline 60 s + {d - 60:.0f} s for checks")
    assert "2 GiB arena of 4 input sets" in said
    assert describe_deadline(6, 6, 300 << 10, 4) == \
        "no result after 6 s (deadline 6 s; a 0.293 MiB arena of 4 input sets)"
    assert describe_deadline(60) == "no result after 60 s"  # nothing known of the sets


# ------------------------------------------------------------------------ the pool's plumbing

def _pool_with_fake_worker(tmp_path, arena_bytes: int, sets: int, hash_compiled=None, **kw):
    """An EvaluatorPool whose one worker prepares a task of `arena_bytes` in `sets` sets and then
    never answers the evaluation: what the pool asked, and with which timeout, is recorded."""
    pool = EvaluatorPool("cpu", cache_dir=tmp_path, timing=TIMING, **kw)
    w = _Worker("cpu", 0)
    w.proc = SimpleNamespace(returncode=None)
    asked: list = []

    async def request(payload, timeout, on_event=None):
        asked.append((payload, timeout))
        if payload["cmd"] == "prepare":
            return {"ok": True, "arena_bytes": arena_bytes, "sets": sets, "hash_compiled": hash_compiled}
        raise asyncio.TimeoutError

    async def restart(worker):
        pass

    w.request = request
    pool._restart = restart
    pool._workers = [w]
    pool._idle = asyncio.Queue()
    pool._idle.put_nowait(w)
    pool._started = True
    return pool, asked


async def test_the_pool_sends_the_deadline_of_the_task_s_arena_and_waits_for_it(tmp_path):
    pool, asked = _pool_with_fake_worker(tmp_path, 4 * GIB, 4, eval_timeout_s=60)
    r = await pool.evaluate_built(small_task().to_json(), str(tmp_path), str(tmp_path / "k.so"))
    (prep, _), (ev, waited) = asked
    d = eval_deadline(60, 4 * GIB, 4, "cpu")
    assert prep["cmd"] == "prepare" and ev["cmd"] == "evaluate"
    assert ev["deadline_s"] == d > 60 and ev["deadline_base_s"] == 60
    assert waited == d + SUPERVISOR_GRACE_S  # the supervisor is not killed before its own deadline
    # the supervisor never answered: the verdict still says which deadline and which sets
    assert r.status == "timeout", r.message
    assert r.message.startswith(f"no result after {d:g} s (deadline 60 s + "), r.message
    assert "4 GiB arena of 4 input sets" in r.message and "worker killed and restarted" in r.message


async def test_the_pool_gives_the_compiled_hash_s_deadline_where_the_worker_says_so(tmp_path):
    pool, asked = _pool_with_fake_worker(tmp_path, 4 * GIB, 4, hash_compiled=True, eval_timeout_s=60)
    await pool.evaluate_built(small_task().to_json(), str(tmp_path), str(tmp_path / "k.so"))
    assert asked[1][0]["deadline_s"] == eval_deadline(60, 4 * GIB, 4, "cpu", hash_compiled=True)
    assert asked[1][0]["deadline_s"] < eval_deadline(60, 4 * GIB, 4, "cpu")


async def test_a_fixed_deadline_is_kept_when_asked(tmp_path):
    pool, asked = _pool_with_fake_worker(tmp_path, 4 * GIB, 4, eval_timeout_s=60, eval_s_per_gib=0)
    r = await pool.evaluate_built(small_task().to_json(), str(tmp_path), str(tmp_path / "k.so"))
    assert asked[1][0]["deadline_s"] == 60 and asked[1][1] == 60 + SUPERVISOR_GRACE_S
    assert r.status == "timeout" and "(deadline 60 s; a 4 GiB arena of 4 input sets)" in r.message, r.message


# ------------------------------------------------------------------------ a real worker

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prepared(tmp_path_factory):
    """A cpu pool with the small task prepared (its sets built, a spare runner started)."""
    run_dir = str(tmp_path_factory.mktemp("run"))
    pool = EvaluatorPool("cpu", cache_dir=tmp_path_factory.mktemp("cache"), timing=TIMING,
                         eval_timeout_s=120)
    await pool.start()
    b = await pool.baseline(small_task().to_json(), run_dir)
    yield pool, run_dir, b
    await pool.close()


@pytest.fixture(scope="module")
def sleeper(tmp_path_factory):
    """The sleeping kernel, built with g++ and the project's flags (no source check: nanosleep
    is what it is for)."""
    d = tmp_path_factory.mktemp("sleeper")
    (d / "kforge_region.h").write_text(small_task().header())
    (d / "kernel.cpp").write_text(SLEEPER)
    flags = [f for f in compile_flags("cpu", "native") if f != "-Wl,-z,defs"]
    r = subprocess.run(["g++", *flags, "kernel.cpp", "-o", "kernel.so"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(d / "kernel.so")


@pytest.mark.asyncio(loop_scope="module")
async def test_a_small_task_gets_the_base_deadline(prepared):
    pool, _, b = prepared
    tid = Task.from_json(pool._task_json(small_task().to_json())).task_id
    arena, sets, _ = pool._workers[0].sizes[tid]  # what the worker said when it prepared the task
    assert sets == b.sets and 0 < arena <= WATCH_COPY_LIMIT
    assert eval_deadline(pool.eval_timeout_s, arena, sets, pool.device_kind) == pool.eval_timeout_s


@pytest.mark.asyncio(loop_scope="module")
async def test_a_candidate_sleeping_past_its_deadline_is_told_the_deadline_and_the_sets(prepared, sleeper):
    pool, run_dir, b = prepared
    pool.eval_timeout_s = 3  # tiny: the kernel sleeps 30 s on its first call
    try:
        r = await pool.evaluate_built(small_task().to_json(), run_dir, sleeper)
    finally:
        pool.eval_timeout_s = 120
    assert r.status == "timeout" and r.stage == "verify", f"{r.status} {r.stage}: {r.message}"
    assert r.message.startswith("no result after 3 s (deadline 3 s; a "), r.message
    assert f"MiB arena of {b.sets} input sets) in the verify stage; the kernel's process was killed" \
        in r.message, r.message
    assert pool.stats["restarts"] == 0  # the supervisor killed the kernel's process, not the pool it


def test_a_ray_slot_waits_past_the_deadline_its_remote_pool_gives_a_large_region():
    """The cluster's wait before a slot counts as lost follows the same rule on an upper bound of
    the arena: a fixed wait would cut off remote evaluations of GiB-sized regions the remote pool
    still allows to run."""
    from kforge_tui.cluster.executor import RayEvaluator
    from kforge_tui.regions.meta import TensorMeta

    ray = RayEvaluator("local", "cpu", pool_kwargs={"eval_timeout_s": 60.0, "prepare_timeout_s": 600.0})
    fixed = 60.0 + 600.0 + 2 * SUPERVISOR_GRACE_S
    assert ray._eval_wait(small_task().to_json()) == fixed
    table, ids = TensorMeta("w", (262144, 256), "float32"), TensorMeta("i", (2, 32), "int64")
    big = Task("embedding", "compute", {"inputs": ["w", "i"], "nodes": [], "outputs": []}, (table, ids),
               (TensorMeta("y", (2, 32, 256), "float32"),))
    wait = ray._eval_wait(big.to_json())
    per_set = table.nbytes + ids.nbytes + 2 * 32 * 256 * 4
    remote = eval_deadline(60.0, 4 * per_set, 4, "cpu")  # what the remote pool gives 4 sets
    assert wait - (600.0 + 2 * SUPERVISOR_GRACE_S) >= remote > 60.0
    ray = RayEvaluator("local", "cpu", pool_kwargs={"eval_timeout_s": 60.0, "eval_s_per_gib": 0})
    assert ray._eval_wait(big.to_json()) == fixed  # a fixed deadline asked for: a fixed wait
