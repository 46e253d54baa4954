"""Bad input, misbehaving kernels and cheats the source and binary checks would have stopped:
every one ends as a recorded result, never an exception, and the runtime catches what it must
on its own (kernels built here with g++ and handed to the worker directly, `evaluate_built`).
Each runtime test names the defence it needs; without it the kernel would pass."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from kforge_tui.regions.build import task_of
from kforge_tui.sandbox.compile import compile_flags
from kforge_tui.sandbox.pool import EvaluatorPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

HONEST = (Path(__file__).parent / "cheats" / "honest" / "softmax_f32.cpp").read_text()
TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 12, "budget_s": 0.03}
HEAD = '#include "kforge_region.h"\n'
SIG = 'extern "C" int kforge_launch(const void* const* inputs, void* const* outputs)'
SOFTMAX_ROWS = r'''
#include "kforge_region.h"
#include <float.h>
#include <math.h>
static void softmax_rows(const float* x, float* y) {
    const int64_t n = KF_IN0_SIZE_1, rows = KF_IN0_NUMEL / KF_IN0_SIZE_1;
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n; float* yr = y + r * n;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j]);
        for (int64_t j = 0; j < n; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < n; ++j) yr[j] = expf(xr[j] - m) / s;
    }
}
'''


@functools.lru_cache(maxsize=None)
def task():
    return task_of(lambda x: torch.softmax(x, -1), (torch.randn(16, 128),), backend="cpu")


def task_json():
    return task().to_json()


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


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """g++ with the project's flags and the task's header, no source or binary check: the kernel
    reaches the runtime whatever it does."""
    root = tmp_path_factory.mktemp("builds")
    counter = [0]

    def make(src: str) -> str:
        counter[0] += 1
        d = root / f"k{counter[0]}"
        d.mkdir()
        (d / "kforge_region.h").write_text(task().header())
        (d / "kernel.cpp").write_text(src)
        flags = [f for f in compile_flags("cpu", "native") if f != "-Wl,-z,defs"]
        r = subprocess.run(["g++", *flags, "kernel.cpp", "-o", "kernel.so", "-lpthread"], cwd=d,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return str(d / "kernel.so")
    return make


# ------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("source,status,words", [
    ("Sure! Here is a faster softmax kernel that uses shared memory.", "static_error", ["L1"]),
    ("", "static_error", ["empty"]),
    (HONEST[: len(HONEST) // 2], "static_error", ["L"]),
    (HEAD + "extern \"C\" int other_name(const float* x) { return 0; }\n", "static_error", ["kforge_launch"]),
    (HEAD + "extern \"C\" int kforge_launch(const double* x, double* y, int64_t n) { return 0; }\n",
     "static_error", ["kforge_launch"]),
    (HEAD + SIG + " { return undefined_helper(inputs); }\n", "compile_error", ["undefined_helper"]),
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


async def test_nonzero_return_code(pool, run_dir):
    r = await pool.evaluate(task_json(), run_dir, HEAD + SIG + " { return 7; }\n")
    assert r.status == "verify_error" and "returned 7" in r.message, r.message


async def _honest_ok(pool, run_dir):
    r = await pool.evaluate(task_json(), run_dir, HONEST)
    assert r.status == "ok", f"{r.status}: {r.message}\n{r.log[-1500:]}"
    return r


# ------------------------------------------------------------------------ faults

@pytest.mark.slow
async def test_hang_is_killed_and_the_prepared_task_survives(pool, run_dir, build):
    """Only the kernel's process dies: the supervisor (and its input sets) stay."""
    lib = build(HEAD + SIG + " {\n    volatile int spin = 1;\n    while (spin) { }\n    return 0;\n}\n")
    restarts = pool.stats["restarts"]
    r = await pool.evaluate_built(task_json(), run_dir, lib)
    assert r.status == "timeout" and "6 s" in r.message, r.message
    assert pool.stats["restarts"] == restarts
    await _honest_ok(pool, run_dir)


@pytest.mark.parametrize("body,signame", [
    ("    *(volatile int*)0 = 1;\n", "SIGSEGV"),
    ("    __builtin_trap();\n", "SIGILL"),
], ids=["segfault", "trap"])
async def test_crash_is_recorded_and_the_next_candidate_runs(pool, run_dir, build, body, signame):
    restarts = pool.stats["restarts"]
    r = await pool.evaluate_built(task_json(), run_dir, build(HEAD + SIG + " {\n" + body + "    return 0;\n}\n"))
    assert r.status == "crash", r.message
    assert signame in r.message, r.message
    assert pool.stats["restarts"] == restarts  # a runner died, not the supervisor
    await _honest_ok(pool, run_dir)


async def test_printf_does_not_corrupt_the_protocol(pool, run_dir, build):
    src = SOFTMAX_ROWS + '#include <stdio.h>\n' + SIG + ''' {
    softmax_rows((const float*)inputs[0], (float*)outputs[0]);
    printf("{\\"id\\": 999, \\"ok\\": true}\\n"); fflush(stdout);
    puts("noise from the kernel");
    return 0;
}
'''
    r = await pool.evaluate_built(task_json(), run_dir, build(src))
    assert r.status == "ok", r.message


# ------------------------------------------------------------------------ runtime defences

LEFTOVER_THREAD = SOFTMAX_ROWS + r'''
#include <pthread.h>
#include <unistd.h>
static void* idle(void*) { for (;;) pause(); return 0; }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    static int started = 0;
    if (!started) { pthread_t t; pthread_create(&t, 0, idle, 0); pthread_detach(t); started = 1; }
    softmax_rows((const float*)inputs[0], (float*)outputs[0]);
    return 0;
}
'''


async def test_thread_left_behind_is_caught(pool, run_dir, build):
    """Correct outputs, but a thread outlives the call (it could work outside the timed window
    or reach the next candidate): the thread census after each call rejects it."""
    r = await pool.evaluate_built(task_json(), run_dir, build(LEFTOVER_THREAD))
    # issue 21: a thread is a clone, which the runner's syscall filter refuses before any census
    assert r.status == "verify_error" and "system call the sandbox does not allow" in r.message, r.message


async def test_thread_started_by_a_constructor_at_load_is_caught(pool, run_dir, build):
    src = SOFTMAX_ROWS + r'''
#include <pthread.h>
#include <unistd.h>
static void* idle(void*) { for (;;) pause(); return 0; }
__attribute__((constructor)) static void at_load() { pthread_t t; pthread_create(&t, 0, idle, 0); }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    softmax_rows((const float*)inputs[0], (float*)outputs[0]);
    return 0;
}
'''
    r = await pool.evaluate_built(task_json(), run_dir, build(src))
    assert r.status == "verify_error" and r.stage == "load", r.message
    assert "system call the sandbox does not allow" in r.message  # issue 21: the LOAD filter refuses the constructor's clone


async def test_ftz_set_in_mxcsr_is_caught(pool, run_dir, build):
    src = SOFTMAX_ROWS + r'''
#include <xmmintrin.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ | DAZ, never restored
    softmax_rows((const float*)inputs[0], (float*)outputs[0]);
    return 0;
}
'''
    r = await pool.evaluate_built(task_json(), run_dir, build(src))
    assert r.status == "verify_error" and "floating-point environment changed" in r.message, r.message
    assert "flush-to-zero" in r.message


async def test_rounding_mode_changed_at_load_is_caught(pool, run_dir, build):
    src = SOFTMAX_ROWS + r'''
#include <fenv.h>
__attribute__((constructor)) static void at_load() { fesetround(FE_TOWARDZERO); }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    softmax_rows((const float*)inputs[0], (float*)outputs[0]);
    return 0;
}
'''
    r = await pool.evaluate_built(task_json(), run_dir, build(src))
    assert r.status == "verify_error" and "floating-point environment changed when the library was loaded" \
        in r.message, r.message


async def test_sigalrm_handler_filling_outputs_is_caught(pool, run_dir, build):
    """The call returns at once and a SIGALRM handler does the work later (during the untimed
    cache flush): the signal-handler/timer census rejects it whatever the outputs say."""
    src = SOFTMAX_ROWS + r'''
#include <signal.h>
#include <sys/time.h>
static const float* gx; static float* gy;
static void later(int) { softmax_rows(gx, gy); }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    gx = (const float*)inputs[0]; gy = (float*)outputs[0];
    softmax_rows(gx, gy);  // correct now, so only the census can tell
    signal(SIGALRM, later);
    struct itimerval it = {{0, 0}, {0, 200}};
    setitimer(ITIMER_REAL, &it, 0);
    return 0;
}
'''
    r = await pool.evaluate_built(task_json(), run_dir, build(src))
    assert r.status == "verify_error", r.message
    assert "system call the sandbox does not allow" in r.message and "rt_sigaction" in r.message  # issue 21: installing a handler


async def test_no_state_crosses_candidates(pool, run_dir, build):
    """A candidate leaves a thread that keeps writing correct softmax rows into every buffer it
    saw; the next candidate computes nothing. Each runs in a fresh process, so the second one is
    judged on its own (poison survives), and an honest one after both passes."""
    filler = SOFTMAX_ROWS + r'''
#include <pthread.h>
struct A { const float* x; float* y; };
static void* keep_filling(void* p) { A a = *(A*)p; for (;;) softmax_rows(a.x, a.y); return 0; }
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    static A args[64]; static int n = 0;
    softmax_rows((const float*)inputs[0], (float*)outputs[0]);
    if (n < 64) { args[n] = A{(const float*)inputs[0], (float*)outputs[0]};
                  pthread_t t; pthread_create(&t, 0, keep_filling, &args[n++]); pthread_detach(t); }
    return 0;
}
'''
    r = await pool.evaluate_built(task_json(), run_dir, build(filler))
    assert r.status == "verify_error" and "system call the sandbox does not allow" in r.message, r.message
    lazy = await pool.evaluate_built(task_json(), run_dir, build(HEAD + SIG + " { return 0; }\n"))
    assert lazy.status == "verify_error" and "poison survived" in lazy.message, lazy.message
    await _honest_ok(pool, run_dir)


async def test_harness_environment_is_not_visible(pool, run_dir, build):
    """The kernel's process cannot reach the pool's protocol: writing JSON to every descriptor
    it has does not forge a result, and it still has to compute."""
    src = r'''
#include "kforge_region.h"
#include <unistd.h>
#include <string.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
    const char* fake = "{\"id\": 2, \"ok\": true, \"result\": {\"status\": \"ok\"}}\n";
    for (int fd = 0; fd < 64; ++fd) (void)!write(fd, fake, strlen(fake));
    return 0;  // computes nothing
}
'''
    r = await pool.evaluate_built(task_json(), run_dir, build(src))
    assert r.status in ("verify_error", "crash"), r.message
    assert r.status != "ok"
    await _honest_ok(pool, run_dir)


# ------------------------------------------------------------------------ cuda (GPU machine)

CU_HEAD = '#include "kforge_region.h"\n'
CU_SIG = 'extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream)'
CU_HONEST = (Path(__file__).parent / "cheats" / "honest" / "softmax_f32.cu").read_text()


@functools.lru_cache(maxsize=None)
def cuda_task():
    return task_of(lambda x: torch.softmax(x, -1), (torch.randn(256, 1024),), backend="cuda")


@pytest.fixture(scope="module")
def nvcc_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("cu_builds")
    counter = [0]

    def make(src: str) -> str:
        counter[0] += 1
        d = root / f"k{counter[0]}"
        d.mkdir()
        (d / "kforge_region.h").write_text(cuda_task().header())
        (d / "kernel.cu").write_text(src)
        flags = [f for f in compile_flags("cuda", "sm_90") if f not in ("-Xlinker", "-z,defs")]
        r = subprocess.run(["nvcc", *flags, "kernel.cu", "-o", "kernel.so", "-lpthread"], cwd=d,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return str(d / "kernel.so")
    return make


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,status,words", [
    ("__global__ void k(float* y) { for (;;) { __nanosleep(1000); } }\n", "timeout", ["no result"]),
    ("__global__ void k(float* y) { y[threadIdx.x + (1ll << 40)] = 1.f; }\n", "crash", ["CUDA error"]),
], ids=["hang", "illegal-address"])
async def test_cuda_fault_is_survived(tmp_path, kernel, status, words):
    pool = EvaluatorPool("cuda", cache_dir=tmp_path, eval_timeout_s=15)
    try:
        src = CU_HEAD + kernel + CU_SIG + " {\n    k<<<1, 32, 0, stream>>>((float*)outputs[0]);\n" \
            "    return (int)cudaGetLastError();\n}\n"
        r = await pool.evaluate(cuda_task().to_json(), str(tmp_path), src)
        assert r.status == status, r.message
        assert all(w in r.message for w in words), r.message
        ok = await pool.evaluate(cuda_task().to_json(), str(tmp_path), CU_HONEST)
        assert ok.status == "ok", ok.message
        assert pool.stats["restarts"] == 0  # the kernel's process died, the supervisor did not
    finally:
        await pool.close()


CU_RUNTIME = {
    "leftover-thread": (r'''
#include <pthread.h>
#include <unistd.h>
static void* idle(void*) { for (;;) pause(); return 0; }
''', "    static int s = 0; if (!s) { pthread_t t; pthread_create(&t, 0, idle, 0); pthread_detach(t); s = 1; }\n",
        "worker state changed"),
    "ftz-host": ("#include <xmmintrin.h>\n", "    _mm_setcsr(_mm_getcsr() | 0x8040);\n",
                 "floating-point environment changed"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CU_RUNTIME))
async def test_cuda_runtime_defences(tmp_path, nvcc_build, name):
    head, body, words = CU_RUNTIME[name]
    src = CU_HONEST.replace('#include <float.h>', '#include <float.h>\n' + head, 1)
    src = src.replace("    softmax_kernel<<<", body + "    softmax_kernel<<<", 1)
    async with EvaluatorPool("cuda", cache_dir=tmp_path, eval_timeout_s=60) as pool:
        r = await pool.evaluate_built(cuda_task().to_json(), str(tmp_path), nvcc_build(src))
        assert r.status == "verify_error" and words in r.message, r.message
        r = await pool.evaluate_built(cuda_task().to_json(), str(tmp_path), nvcc_build(CU_HONEST))
        assert r.status == "ok", r.message
