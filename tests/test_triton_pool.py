"""Triton candidates through the real evaluation path: `EvaluatorPool("triton")` (issue 13).

The engine process only parses (sandbox/triton_check.py) and stores the checked source; a worker
supervisor prepares the input sets and references, and a fresh runner process per candidate
loads it with sandbox/triton_loader.py (Triton's JIT in the load stage), runs the verification
calls under the torch-op guard and the timing loop, with the same poison, guards, replay checks,
edge cases, process-state census and adjacent baselines as a C candidate.

Here (no GPU) the pool runs Triton under its interpreter (TRITON_INTERPRET=1 in the worker's
environment only): shapes are tiny because the interpreter runs each program in numpy. The
timings are the interpreter's and mean nothing; that they are measured, checked and compared
with eager is what is tested. The GPU tests (`-m gpu`) run the real CUDA path.
"""
from __future__ import annotations

import asyncio
import functools
import os
import re
from pathlib import Path

import pytest
import pytest_asyncio
import torch

pytest.importorskip("triton")

from kforge_tui.regions.build import task_of  # noqa: E402
from kforge_tui.sandbox.pool import EvaluatorPool  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHEATS = Path(__file__).parent / "cheats" / "triton"
SOFTMAX = (CHEATS / "_honest_softmax.py").read_text()
TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 10, "budget_s": 0.03}

CHAIN = '''
# honest gelu(x * 2 + y).sigmoid() * tanh(x), y broadcast over the rows
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def chain(x_ptr, y_ptr, o_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, m, other=0.0)
    y = tl.load(y_ptr + offs % cols, m, other=0.0)
    v = x * 2.0 + y
    g = 0.5 * v * (1.0 + libdevice.erf(v * 0.7071067811865476))
    s = 1.0 / (1.0 + tl.exp(-g))
    tl.store(o_ptr + offs, s * libdevice.tanh(x), m)


def kforge_launch(inputs, outputs):
    x, y, o = inputs[0], inputs[1], outputs[0]
    n = x.numel()
    chain[(triton.cdiv(n, 512),)](x, y, o, n, x.shape[1], BLOCK=512)
    return 0
'''

LAYER_NORM = '''
# honest layer_norm over the last dim (biased variance, eps 1e-5), weight and bias
import triton
import triton.language as tl


@triton.jit
def layer_norm(x_ptr, w_ptr, b_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < cols
    x = tl.load(x_ptr + row * cols + offs, m, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / cols
    d = tl.where(m, x - mean, 0.0)
    var = tl.sum(d * d, 0) / cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, m, other=0.0)
    b = tl.load(b_ptr + offs, m, other=0.0)
    tl.store(y_ptr + row * cols + offs, d * rstd * w + b, m)


def kforge_launch(inputs, outputs):
    x, w, b, y = inputs[0], inputs[1], inputs[2], outputs[0]
    rows, cols = x.shape
    layer_norm[(rows,)](x, w, b, y, cols, 1e-5, BLOCK=32)
    return 0
'''

# passes every static rule: a host loop of launches that never ends (under the interpreter and
# on a GPU alike): the first call (the load stage) never returns
HANG = SOFTMAX.replace('''    softmax_rows[(rows,)](x, y, cols, BLOCK=BLOCK)''',
                       '''    for _ in range(1 << 40):
        softmax_rows[(rows,)](x, y, cols, BLOCK=BLOCK)''')


@functools.lru_cache(maxsize=None)
def softmax_task(rows=8, cols=64):
    return task_of(lambda x: torch.softmax(x, -1), (torch.randn(rows, cols),), backend="triton")


@functools.lru_cache(maxsize=None)
def chain_task():
    return task_of(lambda x, y: torch.nn.functional.gelu(x * 2 + y).sigmoid() * torch.tanh(x),
                   (torch.randn(16, 100), torch.randn(100)), backend="triton")


@functools.lru_cache(maxsize=None)
def layer_norm_task():
    return task_of(lambda x, w, b: torch.nn.functional.layer_norm(x, (32,), w, b),
                   (torch.randn(16, 32), torch.randn(32), torch.randn(32)), backend="triton")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory):
    p = EvaluatorPool("triton", cache_dir=tmp_path_factory.mktemp("cache"), timing=TIMING,
                      eval_timeout_s=20, device="cpu")
    await p.start()
    yield p
    await p.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("run"))


def explain(r) -> str:
    return f"{r.status} at {r.stage}: {r.message}\n{r.log[-2500:]}"


# ------------------------------------------------------------------------ honest candidates

async def test_pool_runs_triton_under_the_interpreter_in_the_worker_only(pool):
    assert pool.device_kind == "cpu" and pool.backend == "triton"
    assert "interpreter" in pool._workers[0].info["device"]
    assert os.environ.get("TRITON_INTERPRET") in (None, "", "0")  # the engine's own env untouched


async def test_honest_softmax_is_ok_with_timing_and_adjacent_baselines(pool, run_dir):
    task = softmax_task()
    b = await pool.baseline(task.to_json(), run_dir, with_compile=True)
    assert b.seed is None and "no Inductor seed" in b.note  # no GPU: no seed from the worker
    stages: list[str] = []
    rs = [await pool.evaluate(task.to_json(), run_dir, SOFTMAX + f"\n# variant {k}\n",
                              on_stage=stages.append) for k in range(2)]
    assert stages[:4] == ["static", "load", "verify", "time"]  # no compiler: Triton's JIT is in load
    for r in rs:
        assert r.status == "ok", explain(r)
        assert r.timing is not None and r.timing.n >= 6 and r.timing.median_us > 0, explain(r)
        assert "wall clock" in r.timing.method
        # eager and torch.compile timed again right after the candidate, on the same sets
        assert r.baseline is not None and r.compiled is not None, (b.floor_note, explain(r))
        assert r.speedup == pytest.approx(r.baseline.median_us / r.timing.median_us)
        assert "vs torch.compile" in r.message
        # the JIT (first call) is part of the load stage and reported as its compile time
        assert r.compile_s is not None and 0 < r.stage_s["jit"] <= r.stage_s["load"], r.stage_s
        c = r.checks
        assert c["runner"] == "fresh process per candidate"
        assert c["calls"] >= 8 and c["timed_checks"] >= 4 and c["replay_checks"] >= 2, c
        assert set(c["edge_cases"]) == {"large", "masked", "tiny", "zeros", "equal_rows"}, c
        assert c["edge_float64"], r.log
    assert rs[0].checks["runner_pid"] != rs[1].checks["runner_pid"]
    assert rs[0].baseline != rs[1].baseline  # measured with each candidate, not cached
    # the checked source is stored content-addressed; the per-candidate directories are gone
    srcs = list((pool.cache_dir / "triton" / "src").glob("*.py"))
    assert any(p.read_text() == SOFTMAX + "\n# variant 0\n" for p in srcs)
    assert not any((pool.cache_dir / "triton" / "runs").iterdir())


@pytest.mark.parametrize("name", ["chain", "layer_norm"])
async def test_honest_multi_input_regions_are_ok(pool, run_dir, name):
    task, src = {"chain": (chain_task(), CHAIN), "layer_norm": (layer_norm_task(), LAYER_NORM)}[name]
    r = await pool.evaluate(task.to_json(), run_dir, src)
    assert r.status == "ok", explain(r)
    assert r.timing and r.baseline and r.speedup and len(r.checks["edge_cases"]) >= 3


async def test_inductor_seed_evaluates_ok(pool, run_dir):
    """The seed the engine generates on the CPU (Inductor's own kernel on the ABI) passes the
    whole evaluation, as the root of a Triton search must."""
    from kforge_tui.search import inductor_seed

    task = layer_norm_task()
    src = inductor_seed.generate(task, "cpu").render()
    r = await pool.evaluate(task.to_json(), run_dir, src)
    assert r.status == "ok", explain(r) + "\n" + src


async def test_wrong_values_fail_verification(pool, run_dir):
    wrong = LAYER_NORM.replace("var + eps", "var + 1e-2")
    r = await pool.evaluate(layer_norm_task().to_json(), run_dir, wrong)
    assert r.status == "verify_error" and "values differ" in r.message, explain(r)
    assert r.mismatch is not None and r.timing is None


# ------------------------------------------------------------------------ failures and cheats

def cheat_files():
    return sorted(p for p in CHEATS.glob("*.py") if not p.name.startswith("_"))


# A runtime cheat's class (`# expect: runtime:CLASS |`) -> the verdicts that reject it for that
# class: the statuses, and words of the message. A write outside the output lands in a guard
# zone, or leaves the arena's mapping and faults (the H200 saw both for the same cheat).
RUNTIME_VERDICTS = {
    "unwritten": (("verify_error",), ("poison survived",)),
    "tolerance": (("verify_error",), ("beyond tolerance",)),
    "inputs": (("verify_error",), ("inputs modified",)),
    "outside": (("verify_error", "crash", "launch_error"),
                ("outside the output", "illegal memory access", "illegal address")),
    "torch_op": (("verify_error",), ("PyTorch op",)),
}


def rejected_for(what: str, r) -> bool:
    """Whether result `r` rejects a runtime cheat for its own class."""
    statuses, words = RUNTIME_VERDICTS.get(what.split()[0], ((), ()))
    return r.status in statuses and any(w in (r.message or "") for w in words)


@pytest.mark.parametrize("path", cheat_files(), ids=lambda p: p.stem)
async def test_cheat_is_rejected_end_to_end_for_its_reason(pool, run_dir, path):
    m = re.match(r"#\s*expect:\s*(static|runtime):(\S+)\s*\|", path.read_text().splitlines()[0])
    assert m, path.name
    kind, what = m.groups()
    r = await pool.evaluate(softmax_task().to_json(), run_dir, path.read_text())
    assert not r.ok and r.speedup is None
    if kind == "static":  # refused in the engine process: never written, never loaded
        assert r.status == "static_error" and r.stage == "static", explain(r)
        assert f"[{what}]" in r.log, r.log
        assert "load" not in r.stage_s
        return
    assert rejected_for(what, r), explain(r)


async def test_worker_checks_the_source_again(pool, run_dir, tmp_path):
    """The worker never trusts the wire: a source handed to it unchecked is checked there."""
    p = tmp_path / "unchecked.py"
    p.write_text((CHEATS / "read_environ.py").read_text())
    r = await pool.evaluate_built(softmax_task().to_json(), run_dir, str(p))
    assert r.status == "static_error" and "[import]" in r.message, explain(r)


@pytest.mark.parametrize("src,status,words", [
    ("def kforge_launch(inputs, outputs:\n    return 0\n", "static_error", ["not valid Python"]),
    (SOFTMAX.replace("BLOCK=BLOCK", "BLOCK=63"), "compile_error", []),
    (SOFTMAX.replace("(x, y, cols, BLOCK=BLOCK)", "(x, cols, BLOCK=BLOCK)"), "load_error", ["first call"]),
    (SOFTMAX.replace("    return 0\n", "    return 3\n"), "load_error", ["first call", "returned 3"]),
], ids=["syntax", "jit-error", "bad-launch", "nonzero-return"])
async def test_broken_candidates_are_recorded_failures(pool, run_dir, src, status, words):
    r = await pool.evaluate(softmax_task().to_json(), run_dir, src)
    if status == "compile_error":  # the interpreter reports a bad constexpr at the call
        assert r.status in ("compile_error", "load_error"), explain(r)
    else:
        assert r.status == status, explain(r)
    assert r.message and "\n" not in r.message and all(w in r.message for w in words), r.message


async def test_hanging_candidate_is_killed_and_the_next_one_evaluates(pool, run_dir):
    task = softmax_task()
    old = pool.eval_timeout_s
    pool.eval_timeout_s = 4
    try:
        r = await pool.evaluate(task.to_json(), run_dir, HANG)
    finally:
        pool.eval_timeout_s = old
    assert r.status == "timeout" and r.stage == "load", explain(r)
    assert "killed" in r.message
    ok = await pool.evaluate(task.to_json(), run_dir, SOFTMAX + "\n# after the hang\n")
    assert ok.status == "ok", explain(ok)
    assert pool.stats["restarts"] == 0, pool.stats  # one runner lost, not the supervisor


# ------------------------------------------------------------------------ GPU (real CUDA path)

@pytest.mark.gpu
async def test_gpu_triton_seed_baseline_and_candidates(tmp_path):
    """On the GPU: the compile baseline comes from Inductor's compile of the region and carries
    the seed; the seed, an honest candidate and a cheat go through the CUDA path."""
    from kforge_tui.search import inductor_seed

    task = task_of(lambda x: torch.softmax(x, -1), (torch.randn(4096, 1024),), backend="triton")
    async with EvaluatorPool("triton", cache_dir=tmp_path, eval_timeout_s=120) as pool:
        assert pool.device_kind == "cuda" and "interpreter" not in pool._workers[0].info["device"]
        b = await pool.baseline(task.to_json(), str(tmp_path), with_compile=True)
        assert b.compiled is not None and b.seed is not None, b.note
        inductor_seed.remember(task, b.seed)
        seed_src = inductor_seed.seed_for(task, generate_on_cpu=False).render()
        r = await pool.evaluate(task.to_json(), str(tmp_path), seed_src)
        assert r.status == "ok", explain(r)
        assert "cuda events" in r.timing.method and r.compiled is not None
        # the seed re-timed next to the compile baseline: the same kernel, within noise
        print(f"\nseed {r.timing.median_us:.1f} us vs torch.compile {r.compiled.median_us:.1f} us; "
              f"jit {r.stage_s.get('jit')}, stages {r.stage_s}")
        assert r.timing.median_us < 1.5 * r.compiled.median_us
        src = SOFTMAX.replace("BLOCK: tl.constexpr = 64", "BLOCK: tl.constexpr = 1024")
        r = await pool.evaluate(task.to_json(), str(tmp_path), src)
        assert r.status == "ok", explain(r)
        r = await pool.evaluate(task.to_json(), str(tmp_path),
                                (CHEATS / "partial_write.py").read_text().replace("BLOCK=64", "BLOCK=1024"))
        assert r.status == "verify_error" and "poison survived" in r.message, explain(r)


@pytest.mark.gpu
async def test_gpu_triton_illegal_address_is_a_crash_and_the_next_one_evaluates(tmp_path):
    task = task_of(lambda x: torch.softmax(x, -1), (torch.randn(256, 64),), backend="triton")
    bad = SOFTMAX.replace("tl.store(y_ptr + row * n_cols + offs,", "tl.store(y_ptr + row * n_cols + offs + (1 << 40),")
    async with EvaluatorPool("triton", cache_dir=tmp_path, eval_timeout_s=60) as pool:
        r = await pool.evaluate(task.to_json(), str(tmp_path), bad)
        assert r.status in ("crash", "verify_error"), explain(r)
        r = await pool.evaluate(task.to_json(), str(tmp_path), SOFTMAX)
        assert r.status == "ok", explain(r)
        assert pool.stats["restarts"] == 0


@pytest.mark.gpu
async def test_gpu_triton_throughput(tmp_path):
    """Issue 13's bar: >= 120 Triton candidates per minute, median latency <= 3 s (one GPU)."""
    import asyncio
    import statistics
    import time

    task = task_of(lambda x: torch.softmax(x, -1), (torch.randn(4096, 1024),), backend="triton")
    src = SOFTMAX.replace("BLOCK: tl.constexpr = 64", "BLOCK: tl.constexpr = 1024")
    async with EvaluatorPool("triton", cache_dir=tmp_path, eval_timeout_s=60) as pool:
        await pool.baseline(task.to_json(), str(tmp_path))
        lat = []

        async def one(k):
            t = time.perf_counter()
            r = await pool.evaluate(task.to_json(), str(tmp_path), src + f"\n# {k}\n")
            lat.append(time.perf_counter() - t - r.stage_s.get("queue", 0))
            assert r.status == "ok", explain(r)
        t0 = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(24)))
        per_min = 24 / (time.perf_counter() - t0) * 60
    print(f"\n{per_min:.0f} candidates/min, median latency {statistics.median(lat):.2f} s")
    assert per_min >= 120 and statistics.median(lat) <= 3.0


async def test_a_baseline_whose_first_prepare_fails_is_tried_again_without_the_seed(tmp_path, monkeypatch):
    """Inductor's seed (its kernels run apart from their wrapper) is the riskiest part of a Triton
    baseline: a first prepare that fails (as a seed's device-side assert would, H100 2026-12-05,
    qwen_moe's grouped_mm) costs the region its seed, on a fresh worker, not its search."""
    from kforge_tui.errors import WorkFailed
    from kforge_tui.sandbox import pool as pool_mod

    real, sent = pool_mod._Worker.request, []

    async def first_prepare_fails(self, payload, timeout, on_event=None):
        if payload.get("cmd") == "prepare":
            sent.append(dict(payload))
            if len(sent) == 1:
                return {"ok": False, "error": "AcceleratorError: CUDA error: device-side assert triggered"}
        return await real(self, payload, timeout, on_event)

    monkeypatch.setattr(pool_mod._Worker, "request", first_prepare_fails)
    task = task_of(lambda x: torch.softmax(x, -1), (torch.randn(8, 64),), backend="triton")
    async with EvaluatorPool("triton", cache_dir=tmp_path / "c", timing=TIMING, device="cpu") as p:
        restarts = p.stats["restarts"]
        b = await p.baseline(task.to_json(), str(tmp_path), with_compile=True)
        assert b.eager.median_us > 0
        assert [s["no_seed"] for s in sent] == [None, "AcceleratorError: CUDA error: device-side assert triggered"]
        assert p.stats["restarts"] > restarts  # the second try ran on a fresh worker
        sent.clear()  # a failure that is not the seed's: the same error twice, then the reason
        monkeypatch.setattr(pool_mod._Worker, "request", lambda self, payload, timeout, on_event=None:
                            _failed(sent, payload))
        with pytest.raises(WorkFailed, match="baseline of .* failed: the reference raised"):
            await p.baseline(task.to_json(), str(tmp_path / "other"), with_compile=True)
        assert len(sent) == 2
        sent.clear()  # a hang is not the seed's either: one try, one restart, then the reason
        restarts = p.stats["restarts"]
        monkeypatch.setattr(pool_mod._Worker, "request", lambda self, payload, timeout, on_event=None:
                            _hangs(sent, payload))
        with pytest.raises(WorkFailed, match="baseline of .* failed: timeout"):
            await p.baseline(task.to_json(), str(tmp_path / "third"), with_compile=True)
        assert len(sent) == 1 and p.stats["restarts"] == restarts + 1


async def _hangs(sent, payload):
    sent.append(payload)
    raise asyncio.TimeoutError


async def _failed(sent, payload):
    sent.append(payload)
    return {"ok": False, "error": "the reference raised"}
