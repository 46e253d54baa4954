"""Bad input and misbehaving kernels end as recorded failed evaluations, never as exceptions,
and the pool keeps working afterwards (real g++, real worker processes, real signals)."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio
import torch

from kforge_tui.sandbox.pool import EvaluatorPool
from kforge_tui.workload import catalogue

pytestmark = pytest.mark.asyncio(loop_scope="module")

HONEST = (Path(__file__).parent / "cheats" / "honest" / "softmax_f32.cpp").read_text()
TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 12, "budget_s": 0.03}
HEAD = "#include <stdint.h>\n"
SIG = "extern \"C\" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner)"


def task_json():
    x = torch.randn(16, 128)
    return catalogue.make_task("softmax", {"x": x}, {"dim": -1}, x).to_json()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory):
    p = EvaluatorPool("cpu", cache_dir=tmp_path_factory.mktemp("cache"), timing=TIMING,
                      eval_timeout_s=6, compile_timeout_s=60)
    await p.start()
    yield p
    await p.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("run"))


@pytest.mark.parametrize("source,status,words", [
    ("Sure! Here is a faster softmax kernel that uses shared memory.", "static_error", ["L1"]),
    ("", "static_error", ["empty"]),
    (HONEST[: len(HONEST) // 2], "static_error", ["L"]),
    (HEAD + "extern \"C\" int other_name(const float* x) { return 0; }\n", "static_error", ["kforge_launch"]),
    (HEAD + "extern \"C\" int kforge_launch(const double* x, double* y, int64_t n) { return 0; }\n",
     "static_error", ["kforge_launch"]),
    (HEAD + SIG + " { return undefined_helper(x); }\n", "compile_error", ["undefined_helper"]),
], ids=["prose", "empty", "truncated", "missing-entry", "wrong-signature", "compile-error"])
async def test_bad_source_is_a_recorded_failure(pool, run_dir, source, status, words):
    r = await pool.evaluate(task_json(), run_dir, source)
    assert r.status == status, r.message
    assert r.message and "\n" not in r.message
    assert all(w in r.message for w in words), r.message
    assert r.timing is None and r.speedup is None


async def test_non_text_source(pool, run_dir):
    r = await pool.evaluate(task_json(), run_dir, None)  # type: ignore[arg-type]
    assert r.status == "static_error" and "not text" in r.message


async def test_bad_task_json(pool, run_dir):
    r = await pool.evaluate({"op": "softmax"}, run_dir, HONEST)
    assert r.status == "static_error" and r.message.startswith("bad task")


async def test_missing_compiler(pool, run_dir, monkeypatch):
    monkeypatch.setenv("KFORGE_CXX", "/nonexistent/g++")
    r = await pool.evaluate(task_json(), run_dir, HONEST + "\n// missing-compiler variant\n")
    assert r.status == "compile_error" and "not found" in r.message, r.message


async def test_compile_timeout(tmp_path, run_dir):
    p = EvaluatorPool("cpu", cache_dir=tmp_path, timing=TIMING, compile_timeout_s=0.05)
    try:
        r = await p.evaluate(task_json(), run_dir, HONEST + "\n// compile-timeout variant\n")
    finally:
        await p.close()
    assert r.status == "timeout" and r.stage == "compile", r.message
    assert "time" in r.message.lower()


async def test_nonzero_return_code(pool, run_dir):
    r = await pool.evaluate(task_json(), run_dir, HEAD + SIG + " { return 7; }\n")
    assert r.status == "verify_error" and "returned 7" in r.message


async def test_printf_does_not_corrupt_the_protocol(pool, run_dir):
    src = HONEST.replace("#include <stdint.h>", "#include <stdint.h>\nextern \"C\" int printf(const char*, ...);\n"
                         "extern \"C\" int puts(const char*);", 1)
    src = src.replace("    return 0;\n}", "    printf(\"{\\\"id\\\": 999, \\\"ok\\\": true}\\n\");\n"
                      "    puts(\"noise from the kernel\");\n    return 0;\n}")
    r = await pool.evaluate(task_json(), run_dir, src)
    if r.status == "static_error":  # the static check may refuse stdio: then fd safety is moot here
        pytest.skip(f"static check refuses printf: {r.message}")
    assert r.status == "ok", r.message


async def _honest_ok(pool, run_dir):
    r = await pool.evaluate(task_json(), run_dir, HONEST)
    assert r.status == "ok", f"{r.status}: {r.message}\n{r.log[-1500:]}"
    return r


@pytest.mark.slow
async def test_hang_is_killed_and_the_next_candidate_runs(pool, run_dir):
    src = HEAD + SIG + " {\n    volatile int spin = 1;\n    while (spin) { }\n    return 0;\n}\n"
    restarts = pool.stats["restarts"]
    r = await pool.evaluate(task_json(), run_dir, src)
    assert r.status == "timeout" and "6 s" in r.message, r.message
    assert pool.stats["restarts"] == restarts + 1
    await _honest_ok(pool, run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("body,signame", [
    ("    *(volatile int*)0 = 1;\n", "SIGSEGV"),
    ("    __builtin_trap();\n", "SIGILL"),
], ids=["segfault", "trap"])
async def test_crash_is_recorded_and_the_next_candidate_runs(pool, run_dir, body, signame):
    src = HEAD + SIG + " {\n" + body + "    return 0;\n}\n"
    r = await pool.evaluate(task_json(), run_dir, src)
    assert r.status == "crash", r.message
    assert signame in r.message, r.message
    await _honest_ok(pool, run_dir)


# ------------------------------------------------------------------------ cuda (GPU machine)
CU_SIG = ("#include <cuda_runtime.h>\n#include <stdint.h>\n"
          "extern \"C\" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,"
          " cudaStream_t stream)")
CU_HONEST = (Path(__file__).parent / "cheats" / "honest" / "softmax_f32.cu").read_text()


def cuda_task_json():
    x = torch.randn(256, 1024)
    return catalogue.make_task("softmax", {"x": x}, {"dim": -1}, x, backend="cuda").to_json()


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,status,words", [
    # nvcc 13 -O3 removed a spin on a volatile local (seen on the H200, 2026-11-30); a sleep
    # is a side effect the compiler must keep, so this one really never returns
    ("__global__ void k(float* y) { for (;;) { __nanosleep(1000); } }\n",
     "timeout", ["no result"]),
    ("__global__ void k(float* y) { y[threadIdx.x + (1ll << 40)] = 1.f; }\n", "crash", ["CUDA error"]),
], ids=["hang", "illegal-address"])
async def test_cuda_fault_is_survived(tmp_path, kernel, status, words):
    pool = EvaluatorPool("cuda", cache_dir=tmp_path, eval_timeout_s=15)
    try:
        src = CU_SIG.replace("extern", kernel + "extern", 1) + \
            " {\n    k<<<1, 32, 0, stream>>>(y);\n    return (int)cudaGetLastError();\n}\n"
        r = await pool.evaluate(cuda_task_json(), str(tmp_path), src)
        assert r.status == status, r.message
        assert all(w in r.message for w in words), r.message
        ok = await pool.evaluate(cuda_task_json(), str(tmp_path), CU_HONEST)
        assert ok.status == "ok", ok.message
        assert pool.stats["restarts"] >= 1
    finally:
        await pool.close()
