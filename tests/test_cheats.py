"""The cheat corpus: each cheat must be rejected for the right reason; honest kernels must pass.

Each file in tests/cheats/ starts with `// expect: STATUS[, STATUS] | reason[, reason]`; the test
runs it end to end through the real pool (static check, g++/nvcc, worker, verify, time) and
asserts the status and that the one-line message names one of the reasons.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from kforge_tui.sandbox.pool import EvaluatorPool
from kforge_tui.workload import catalogue

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHEATS = Path(__file__).parent / "cheats"
FAST_TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 20, "budget_s": 0.05}


def expectation(path: Path) -> tuple[list[str], list[str]]:
    m = re.match(r"//\s*expect:\s*(.+?)\s*\|\s*(.+)", path.read_text().splitlines()[0])
    assert m, f"{path.name}: first line must be '// expect: STATUS | reason'"
    return ([s.strip() for s in m.group(1).split(",")], [s.strip() for s in m.group(2).split(",")])


def softmax_task(backend: str, shape=(32, 256), dtype=torch.float32):
    x = torch.randn(*shape).to(dtype)
    return catalogue.make_task("softmax", {"x": x}, {"dim": -1}, torch.softmax(x, -1), backend=backend)


def honest_tasks(backend: str) -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, 8, 8, generator=g)
    w, b = torch.randn(32, generator=g), torch.randn(32, generator=g)
    gn = catalogue.make_task("group_norm", {"x": x, "weight": w, "bias": b}, {"groups": 8, "eps": 1e-5},
                             torch.nn.functional.group_norm(x, 8, w, b), backend=backend)
    xp = torch.randn(4, 16, 7, 7, generator=g)
    pool = catalogue.make_task("adaptive_avg_pool2d", {"x": xp}, {"output_size": [3, 2]},
                               torch.nn.functional.adaptive_avg_pool2d(xp, (3, 2)), backend=backend)
    out = {"softmax_f32": softmax_task(backend), "softmax_omp_tasks": softmax_task(backend),
           "group_norm_f32": gn, "adaptive_avg_pool2d_f32": pool}
    for op in ("silu", "gelu"):
        for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            xe = (torch.randn(8, 1000, generator=g) * 3).to(dt)
            out[f"{op}_{name}"] = catalogue.make_task(op, {"x": xe}, {}, xe, backend=backend)
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cpu_pool(tmp_path_factory):
    pool = EvaluatorPool("cpu", cache_dir=tmp_path_factory.mktemp("cache"), timing=FAST_TIMING,
                         eval_timeout_s=60)
    await pool.start()
    yield pool
    await pool.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("run"))


@pytest.mark.parametrize("path", sorted(CHEATS.glob("*.cpp")), ids=lambda p: p.stem)
async def test_cpu_cheat_rejected(cpu_pool, run_dir, path):
    statuses, reasons = expectation(path)
    r = await cpu_pool.evaluate(softmax_task("cpu").to_json(), run_dir, path.read_text())
    assert r.status in statuses, f"{path.name}: {r.status} ({r.message})"
    assert any(x.lower() in r.message.lower() for x in reasons), f"{path.name}: {r.message}"
    assert r.speedup is None


@pytest.mark.parametrize("name", sorted(honest_tasks("cpu")))
async def test_cpu_honest_passes(cpu_pool, run_dir, name):
    task = honest_tasks("cpu")[name]
    src = (CHEATS / "honest" / f"{name}.cpp").read_text()
    r = await cpu_pool.evaluate(task.to_json(), run_dir, src)
    assert r.status == "ok", f"{name}: {r.status} {r.message}\n{r.log[-2000:]}"
    assert r.timing is not None and r.timing.median_us > 0 and r.timing.n >= 6
    assert r.baseline is not None and r.speedup is not None and r.speedup > 0
    assert r.floor_us is not None and r.timing.median_us >= r.floor_us * 0.98
    assert set(r.stage_s) >= {"static", "compile", "load", "verify", "time"}


# ------------------------------------------------------------------------ cuda (GPU machine)

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cuda_pool(tmp_path_factory):
    pool = EvaluatorPool("cuda", cache_dir=tmp_path_factory.mktemp("cuda_cache"), eval_timeout_s=60)
    await pool.start()
    yield pool
    await pool.close()


@pytest.mark.gpu
@pytest.mark.parametrize("path", sorted(CHEATS.glob("*.cu")), ids=lambda p: p.stem)
async def test_cuda_cheat_rejected(cuda_pool, run_dir, path):
    statuses, reasons = expectation(path)
    r = await cuda_pool.evaluate(softmax_task("cuda", shape=(256, 4096)).to_json(), run_dir, path.read_text())
    assert r.status in statuses, f"{path.name}: {r.status} ({r.message})"
    assert any(x.lower() in r.message.lower() for x in reasons), f"{path.name}: {r.message}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax_f32", "group_norm_f32", "adaptive_avg_pool2d_f32"])
async def test_cuda_honest_passes(cuda_pool, run_dir, name):
    g = torch.Generator().manual_seed(1)
    if name == "softmax_f32":
        task = softmax_task("cuda", shape=(4096, 256))
    elif name == "group_norm_f32":
        x = torch.randn(1, 512, 128, 128, generator=g)
        w, b = torch.randn(512, generator=g), torch.randn(512, generator=g)
        task = catalogue.make_task("group_norm", {"x": x, "weight": w, "bias": b},
                                   {"groups": 32, "eps": 1e-6}, x, backend="cuda")
    else:
        x = torch.randn(32, 2048, 7, 7, generator=g)
        task = catalogue.make_task("adaptive_avg_pool2d", {"x": x}, {"output_size": [1, 1]},
                                   torch.nn.functional.adaptive_avg_pool2d(x, 1), backend="cuda")
    src = (CHEATS / "honest" / f"{name}.cu").read_text()
    r = await cuda_pool.evaluate(task.to_json(), run_dir, src)
    assert r.status == "ok", f"{name}: {r.status} {r.message}\n{r.log[-2000:]}"
    assert r.timing.median_us >= r.floor_us * 0.98 and r.speedup > 0
