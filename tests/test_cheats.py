"""The cheat corpus (issue 17): every cheat is rejected by the layer its header names, for the
right reason, and every honest kernel passes.

Each file in tests/cheats/ starts with

    // expect: STATUS[, STATUS] | reason[, reason]
    // layer: static | link-check | runtime   (several, comma-separated, when each must catch it)

and says in a comment why it must be rejected. Two kinds of test:

- layers (no worker, CPU machine; the CUDA cheats are compiled with nvcc, not run):
  * "static": check_source refuses it and its report names a reason;
  * "link-check": the library builds and the binary check refuses it (status static_error,
    stage link-check, a reason in the message) - even when the source check is skipped, so it
    is a second line of defence; a cheat whose *first* layer is link-check must pass the source
    check (it was built to get past it);
  * "runtime": it passes both the source and the binary checks (otherwise it would not test the
    runtime), and only the worker can catch it.
- end to end, through the real pool (static, compile + binary check, worker, verify, time): the
  status is one of STATUS and the one-line message names a reason. CPU here; CUDA with
  `python3 -m pytest -m gpu tests/test_cheats.py` on a GPU machine.

The runtime phrases agreed with the worker/verify owner: "poison survived", "values differ",
"inputs modified", "wrote outside the output", "replay", "worker state changed",
"floating-point environment changed", "edge-case inputs".
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import re
import shutil
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from kforge_tui.regions.build import task_of
from kforge_tui.sandbox.compile import compile_candidate
from kforge_tui.sandbox.static import check_source

CHEATS = Path(__file__).parent / "cheats"
HONEST = CHEATS / "honest"
CPU_CHEATS = sorted(CHEATS.glob("*.cpp"))
CUDA_CHEATS = sorted(CHEATS.glob("*.cu"))
FAST_TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 20, "budget_s": 0.05}
HAVE_NVCC = shutil.which(os.environ.get("KFORGE_NVCC") or "nvcc") is not None
CUDA_ARCH = "sm_90"
LAYERS = ("static", "link-check", "runtime")


# ------------------------------------------------------------------------------ corpus

def expectation(path: Path) -> tuple[list[str], list[str]]:
    m = re.match(r"//\s*expect:\s*(.+?)\s*\|\s*(.+)", path.read_text().splitlines()[0])
    assert m, f"{path.name}: first line must be '// expect: STATUS | reason'"
    return ([s.strip() for s in m.group(1).split(",")], [s.strip() for s in m.group(2).split(",")])


def layers(path: Path) -> list[str]:
    """The layers that must each catch the cheat, in order (`// layer: static, link-check`)."""
    line = path.read_text().splitlines()[1]
    m = re.match(r"//\s*layer:\s*([^(]+)", line)
    assert m, f"{path.name}: second line must be '// layer: static|link-check|runtime'"
    out = [s.strip() for s in m.group(1).split(",") if s.strip()]
    assert out and all(x in LAYERS for x in out), f"{path.name}: unknown layer in {line!r}"
    assert "runtime" not in out or out == ["runtime"], f"{path.name}: runtime is the last resort"
    return out


def _named(text: str, reasons: list[str]) -> bool:
    return any(r.lower() in text.lower() for r in reasons)


@functools.lru_cache(maxsize=None)
def softmax_task(backend: str, shape=(32, 256), dtype=torch.float32):
    x = torch.randn(*shape).to(dtype)
    return task_of(lambda x: torch.softmax(x, -1), (x,), backend=backend)


def cheat_task(path: Path):
    return softmax_task("cuda", (256, 4096)) if path.suffix == ".cu" else softmax_task("cpu")


@functools.lru_cache(maxsize=None)
def honest_task(name: str, backend: str):
    """The task each honest kernel in tests/cheats/honest was written for (shapes match the
    kernels' hard-coded group counts and eps)."""
    g = torch.Generator().manual_seed(0)
    F = torch.nn.functional
    if name.startswith("softmax"):
        return softmax_task(backend, (4096, 256) if backend == "cuda" else (32, 256))
    if name == "group_norm_f32":
        if backend == "cuda":
            x, w, b = torch.randn(1, 512, 128, 128, generator=g), torch.randn(512), torch.randn(512)
            return task_of(lambda x, w, b: F.group_norm(x, 32, w, b, eps=1e-6), (x, w, b), backend)
        x, w, b = torch.randn(2, 32, 8, 8, generator=g), torch.randn(32), torch.randn(32)
        return task_of(lambda x, w, b: F.group_norm(x, 8, w, b, eps=1e-5), (x, w, b), backend)
    if name == "adaptive_avg_pool2d_f32":
        if backend == "cuda":
            return task_of(lambda x: F.adaptive_avg_pool2d(x, 1), (torch.randn(32, 2048, 7, 7),), backend)
        return task_of(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), (torch.randn(4, 16, 7, 7),), backend)
    op, _, dt = name.partition("_")
    x = (torch.randn(8, 1000, generator=g) * 3).to(torch.bfloat16 if dt == "bf16" else torch.float32)
    fn = F.silu if op == "silu" else F.gelu
    return task_of(lambda x: fn(x), (x,), backend)


CPU_HONEST = sorted(p.stem for p in HONEST.glob("*.cpp"))
CUDA_HONEST = sorted(p.stem for p in HONEST.glob("*.cu"))


def test_corpus_covers_the_issue():
    """At least 30 cheats over both backends, every header well formed, every layer used on each
    backend, and a comment saying why each must be rejected."""
    cheats = CPU_CHEATS + CUDA_CHEATS
    assert len(cheats) >= 30 and len(CPU_CHEATS) >= 15 and len(CUDA_CHEATS) >= 15
    for path in cheats:
        statuses, reasons = expectation(path)
        ls = layers(path)
        assert statuses and reasons and all(s for s in reasons), path.name
        assert "Rejected" in path.read_text() or "rejected" in path.read_text(), path.name
        assert '#include "kforge_region.h"' in path.read_text(), path.name
        if ls[0] in ("static", "link-check"):
            assert statuses == ["static_error"], path.name
        else:
            assert "static_error" not in statuses, path.name
            assert statuses != ["ok"] or reasons == ["neutralised"], path.name
    for suffix in (".cpp", ".cu"):
        used = {x for p in cheats if p.suffix == suffix for x in layers(p)}
        assert set(LAYERS) <= used, (suffix, used)


# ------------------------------------------------------------------------------ layers

def _build_all(paths: list[Path], cache: Path) -> dict:
    """Every cheat compiled with its header, the source check skipped (the binary check's view),
    concurrently; {path: CompileResult}."""
    async def build_all():
        sem = asyncio.Semaphore(max(2, os.cpu_count() or 2))

        async def one(path):
            backend = "cuda" if path.suffix == ".cu" else "cpu"
            async with sem:
                return await compile_candidate(path.read_text(), backend,
                                               CUDA_ARCH if backend == "cuda" else "native", cache,
                                               timeout_s=300, header=cheat_task(path).header())

        return await asyncio.gather(*(one(p) for p in paths))

    for p in paths:
        cheat_task(p)  # trace the tasks before the event loop starts
    return dict(zip(paths, asyncio.run(build_all())))


@pytest.fixture(scope="module")
def cpu_builds(tmp_path_factory):
    return _build_all(CPU_CHEATS, tmp_path_factory.mktemp("cpu_builds"))


@pytest.fixture(scope="module")
def cuda_builds(tmp_path_factory):
    return _build_all(CUDA_CHEATS, tmp_path_factory.mktemp("cuda_builds")) if HAVE_NVCC else {}


def _check_layers(path: Path, builds) -> None:
    statuses, reasons = expectation(path)
    ls = layers(path)
    task = cheat_task(path)
    report = check_source(path.read_text(), task.signature())
    if ls[0] == "static":
        assert not report.ok, f"{path.name}: the source check let it through"
        assert _named(report.text(), reasons), f"{path.name}: {report.text()}"
        assert _named(report.diagnostics[0].text(), reasons), \
            f"{path.name}: first diagnostic (the one-line message) names no reason: {report.text()}"
    else:
        assert report.ok, f"{path.name} is meant to get past the source check: {report.text()}"
    build = builds.get(path)
    if build is None:
        pytest.skip("nvcc is not installed: the binary layer of the CUDA cheats is not checked")
    if "link-check" in ls:
        assert build.status == "static_error" and build.stage == "link-check", \
            f"{path.name}: {build.status} {build.message}\n{build.log[-1500:]}"
        assert build.lib_path is None and "\n" not in build.message
        found = build.log.split("--- binary check (link-check) ---")[-1]
        assert _named(found, reasons), f"{path.name}: {found}"
        if ls[0] == "link-check":  # this one-line message is what the user sees
            assert _named(build.message, reasons), f"{path.name}: {build.message}"
    elif ls == ["runtime"]:
        assert build.status == "ok", f"{path.name}: {build.status} {build.message}\n{build.log[-1500:]}"


@pytest.mark.parametrize("path", CPU_CHEATS, ids=lambda p: p.stem)
def test_cpu_cheat_layers(cpu_builds, path):
    _check_layers(path, cpu_builds)


@pytest.mark.slow
@pytest.mark.parametrize("path", CUDA_CHEATS, ids=lambda p: p.stem)
def test_cuda_cheat_layers_compile_only(cuda_builds, path):
    _check_layers(path, cuda_builds)


@pytest.mark.parametrize("name", CPU_HONEST)
def test_cpu_honest_kernels_compute_the_reference(tmp_path, name):
    """The honest kernels pass both checks and compute the region's reference (called here with
    ctypes, independently of the worker)."""
    from kforge_tui.sandbox.compile import compile_candidate_sync

    task = honest_task(name, "cpu")
    src = (HONEST / f"{name}.cpp").read_text()
    report = check_source(src, task.signature())
    assert report.ok, report.text()
    r = compile_candidate_sync(src, "cpu", "native", tmp_path, header=task.header())
    assert r.ok, f"{r.status} {r.message}\n{r.log[-2000:]}"
    g = torch.Generator().manual_seed(3)
    ins = []
    for m in task.inputs:
        t = torch.randn(m.shape, generator=g) * 2
        ins.append(t.to(getattr(torch, m.dtype)))
    outs = [torch.empty(m.shape, dtype=getattr(torch, m.dtype)) for m in task.outputs]
    lib = ctypes.CDLL(r.lib_path)
    fn = lib.kforge_launch
    fn.restype, fn.argtypes = ctypes.c_int, task.signature().argtypes()
    assert fn(*task.signature().call_args(ins, outs)) == 0
    want = task.reference(ins)
    for got, ref in zip(outs, want):
        tol = dict(rtol=1.6e-2, atol=1e-2) if got.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.float(), ref.float(), **tol)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not installed")
@pytest.mark.parametrize("name", CUDA_HONEST)
def test_cuda_honest_kernels_pass_both_checks_compile_only(tmp_path, name):
    from kforge_tui.sandbox.compile import compile_candidate_sync

    task = honest_task(name, "cuda")
    src = (HONEST / f"{name}.cu").read_text()
    report = check_source(src, task.signature())
    assert report.ok, report.text()
    r = compile_candidate_sync(src, "cuda", CUDA_ARCH, tmp_path, header=task.header())
    assert r.ok, f"{r.status} {r.message}\n{r.log[-2000:]}"
    assert r.link_check_ms is not None and r.link_check_ms < 50


# -------------------------------------------------------------------------- end to end

def _pool(backend: str, cache, **kw):
    from kforge_tui.sandbox.pool import EvaluatorPool

    return EvaluatorPool(backend, cache_dir=cache, **kw)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cpu_pool(tmp_path_factory):
    pool = _pool("cpu", tmp_path_factory.mktemp("cache"), timing=FAST_TIMING, eval_timeout_s=60)
    await pool.start()
    yield pool
    await pool.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cpu_pool_production(tmp_path_factory):
    """The production timing loop (bench.DEFAULT_TIMING): for cheats about how many calls the
    sandbox makes (`// timing: production`), which FAST_TIMING's 20-call cap would under-count."""
    pool = _pool("cpu", tmp_path_factory.mktemp("cache_prod"), eval_timeout_s=60)
    await pool.start()
    yield pool
    await pool.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("run"))


def _assert_rejected(path: Path, r) -> None:
    statuses, reasons = expectation(path)
    if statuses == ["ok"]:  # `ok | neutralised`: its trick needs a tell that no longer exists
        assert r.status == "ok", f"{path.name}: {r.status} ({r.message})"
        assert r.checks["timed_checks"] >= r.timing.n, r.checks  # every timed call was checked
        return
    assert r.status in statuses, f"{path.name}: {r.status} ({r.message})"
    assert _named(r.message, reasons), f"{path.name}: {r.message}"
    assert "\n" not in r.message and r.speedup is None


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("path", CPU_CHEATS, ids=lambda p: p.stem)
async def test_cpu_cheat_rejected(cpu_pool, cpu_pool_production, run_dir, path):
    pool = cpu_pool_production if "// timing: production" in path.read_text() else cpu_pool
    r = await pool.evaluate(cheat_task(path).to_json(), run_dir, path.read_text())
    _assert_rejected(path, r)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", CPU_HONEST)
async def test_cpu_honest_passes(cpu_pool, run_dir, name):
    task = honest_task(name, "cpu")
    r = await cpu_pool.evaluate(task.to_json(), run_dir, (HONEST / f"{name}.cpp").read_text())
    assert r.status == "ok", f"{name}: {r.status} {r.message}\n{r.log[-2000:]}"
    assert r.timing is not None and r.timing.median_us > 0 and r.timing.n >= 6
    assert r.baseline is not None and r.speedup is not None and r.speedup > 0
    assert r.floor_us is not None and r.timing.median_us >= r.floor_us * 0.98
    assert set(r.stage_s) >= {"static", "compile", "load", "verify", "time"}


# ------------------------------------------------------------------------ cuda (GPU machine)

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cuda_pool(tmp_path_factory):
    pool = _pool("cuda", tmp_path_factory.mktemp("cuda_cache"), eval_timeout_s=60)
    await pool.start()
    yield pool
    await pool.close()


@pytest.mark.gpu
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("path", CUDA_CHEATS, ids=lambda p: p.stem)
async def test_cuda_cheat_rejected(cuda_pool, run_dir, path):
    r = await cuda_pool.evaluate(cheat_task(path).to_json(), run_dir, path.read_text())
    _assert_rejected(path, r)


@pytest.mark.gpu
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", CUDA_HONEST)
async def test_cuda_honest_passes(cuda_pool, run_dir, name):
    task = honest_task(name, "cuda")
    r = await cuda_pool.evaluate(task.to_json(), run_dir, (HONEST / f"{name}.cu").read_text())
    assert r.status == "ok", f"{name}: {r.status} {r.message}\n{r.log[-2000:]}"
    assert r.timing.median_us >= r.floor_us * 0.98 and r.speedup > 0


# ------------------------------------------------------------- outside the sandbox (issue 21)

OUTSIDE = sorted(p for p in CPU_CHEATS if re.search(r"^//\s*outside:", p.read_text(), re.M))


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: p.stem)
def test_cpu_cheat_really_cheats_outside_the_sandbox(path):
    """Issue 21: a cheat counts only when it cheats outside the sandbox. tests/cheats/outside.py
    builds it without checks and calls it in a plain process: wrong rows, or a result cache
    that is faster on repeated inputs."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(CHEATS / "outside.py"), path.stem], capture_output=True,
                         text=True, timeout=300, env={k: v for k, v in os.environ.items()
                                                      if not k.startswith("KFORGE_WORKER")})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cheats"], got
