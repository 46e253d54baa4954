"""Winners inside torch.compile: the kforge backend, its custom op and the graph rewrite, on the
CPU with Inductor's C++ backend (real g++, real run store, real compiled model).

The run directories are built with the real store API and hand-written, honest C++ kernels for
the regions' generic entry point; apply() compiles them with the sandbox compiler.
"""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kforge_tui.errors import UsageError
from kforge_tui.integrate import runtime as rt
from kforge_tui.integrate.patch import apply, remove
from kforge_tui.regions.build import tasks_of
from kforge_tui.sandbox.result import EvalResult, Timing
from kforge_tui.store import RunStore

D = 64
ROWS = 4

# The fused chain of Tiny.forward after the linear: silu, -0.1, relu, *3, softmax (one region).
CHAIN_CPP = r"""#include "kforge_region.h"
#include <math.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
  const float* x = (const float*)inputs[0];
  float* y = (float*)outputs[0];
  const int64_t rows = KF_IN0_SIZE_0, n = KF_IN0_SIZE_1;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * KF_IN0_STRIDE_0;
    float* yr = y + r * KF_OUT0_STRIDE_0;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      float v = xr[j] / (1.f + expf(-xr[j])) - 0.1f;
      v = (v > 0.f ? v : 0.f) * 3.f;
      yr[j] = v;
      m = fmaxf(m, v);
    }
    float s = 0.f;
    for (int64_t j = 0; j < n; ++j) { float e = expf(yr[j] - m); yr[j] = e; s += e; }
    for (int64_t j = 0; j < n; ++j) yr[j] /= s;
  }
  return 0;
}
"""
# A wrong kernel: proves outputs really come from the library, and that e2e notices a mismatch.
WRONG_CPP = r"""#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
  float* y = (float*)outputs[0];
  for (int64_t k = 0; k < KF_OUT0_NUMEL; ++k) y[k] = 42.0f;
  return 0;
}
"""


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.act = nn.SiLU()

    def forward(self, x):
        h = self.act(self.lin(x))
        h = torch.relu(h - 0.1)
        return F.softmax(h * 3.0, dim=-1)


def build_tiny(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny().eval()


def example(rows: int = ROWS) -> torch.Tensor:
    return torch.randn(rows, D, generator=torch.Generator().manual_seed(7))


def chain_task(rows: int = ROWS):
    tasks = tasks_of(build_tiny(), (example(rows),))
    return next(t for t in tasks if t.kind == "reduction")


def make_run(run_dir, winners) -> str:
    """A run store with one task per winner (task, source, eager_us, compiled_us, best_us)."""
    store = RunStore.create(run_dir, model="tests/test_integrate.py:Tiny", settings={},
                            device={"backend": "cpu", "arch": "native"}, proposer="builtin")
    try:
        for task, source, eager, comp, best in winners:
            store.add_task(task, budget=4)
            t = lambda v: Timing(v, v, v, v, 50, "wall clock").__dict__  # noqa: E731
            store.set_baseline(task.task_id, {"eager": t(eager), "compiled": t(comp) if comp else None})
            nid = store.add_node(task.task_id, None, action="write", proposer="hand",
                                 source=source, hand_written=True)
            res = EvalResult("ok", "time", "ok", timing=Timing(best, best, best, best, 50, "wall clock"),
                             baseline=Timing(eager, eager, eager, eager, 50, "wall clock"))
            store.finish_node(nid, status="ok", message="ok", result=res.to_json(), reward=0.1,
                              time_us=best, speedup=eager / best)
        store.set_run_status("finished")
    finally:
        store.close()
    return str(run_dir)


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run") / "r", [(chain_task(), CHAIN_CPP, 20.0, 15.0, 5.0)])


def _eager(model, x):
    with torch.inference_mode():
        return model._call_impl(x) if False else model.forward(x)


@pytest.mark.parametrize("mode", ["compile", "eager"])
def test_apply_runs_the_kernel_inside_the_compiled_model(chain_run, mode):
    model, x = build_tiny(), example()
    ref = _eager(model, x)
    patch = apply(model, chain_run, mode=mode, force=True)
    try:
        assert patch.active and patch.mode == mode and len(patch.kernels) == 1
        assert model._compiled_call_impl is not None  # compiled in place (nn.Module.compile)
        with torch.inference_mode():
            got = model(x)
            model(x)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        tid = patch.kernels[0]["task_id"]
        assert patch.counts[tid] == 2 and patch.runtime.replaced[tid] == 1
    finally:
        patch.remove()
    assert model._compiled_call_impl is None
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref)


def test_outputs_really_come_from_the_library(tmp_path):
    run = make_run(tmp_path / "r", [(chain_task(), WRONG_CPP, 20.0, 15.0, 5.0)])
    model, x = build_tiny(), example()
    with apply(model, run, force=True) as patch, torch.inference_mode():
        assert torch.all(model(x) == 42.0)
        assert sum(patch.counts.values()) == 1


def test_other_shapes_and_training_graphs_keep_pytorch(chain_run):
    model = build_tiny()
    with apply(model, chain_run, force=True) as patch:
        x8 = example(8)  # another shape: dynamo recompiles, the region's key differs, no kernel
        with torch.inference_mode():
            torch.testing.assert_close(model(x8), _eager(model, x8), rtol=1e-5, atol=1e-6)
        x = example().requires_grad_(True)  # a training graph: kernels have no backward
        y = model(x)
        y.sum().backward()
        assert x.grad is not None
        assert sum(patch.counts.values()) == 0


def test_gate_keeps_inductor_when_the_kernel_does_not_beat_it(tmp_path):
    # faster than eager (20 -> 12 us) but slower than torch.compile's 10 us: compile mode leaves
    # the region to Inductor; eager mode takes it
    run = make_run(tmp_path / "r", [(chain_task(), CHAIN_CPP, 20.0, 10.0, 12.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = apply(build_tiny(), run, mode="compile", force=True)
    assert not p.kernels and "torch.compile" in next(iter(p.skipped.values()))
    p.remove()
    p = apply(build_tiny(), run, mode="eager", force=True)
    assert len(p.kernels) == 1
    p.remove()


def test_bad_input(tmp_path, chain_run):
    with pytest.raises(UsageError):
        apply("not a model", chain_run)
    with pytest.raises(UsageError, match="no task"):
        apply(build_tiny(), chain_run, ops=["no_such_region"])
    with pytest.raises(UsageError, match="mode"):
        apply(build_tiny(), chain_run, mode="fast")
    remove(build_tiny())  # a no-op on a model never patched


def test_end_to_end_report_compares_eager_compile_and_kforge(chain_run):
    from kforge_tui.integrate.e2e import check_end_to_end
    from kforge_tui.workload.loader import LoadedModel

    lm = LoadedModel(model=build_tiny(), example_inputs=(example(),), spec="t", device="cpu")
    rep = check_end_to_end(lm, chain_run)
    assert rep["mode"] == "compile" and rep["within_tolerance"]
    assert rep["eager_ms"] > 0 and rep["compile_ms"] > 0 and rep["patched_ms"] > 0
    assert rep["speedup_vs_compile"] == pytest.approx(rep["compile_ms"] / rep["patched_ms"])
    for clock in ("latency", "throughput"):
        assert set(rep[clock]) == {"eager", "compile", "kforge"}
        assert all(v["median_ms"] > 0 and v["n"] >= 12 for v in rep[clock].values())
    assert rep["clock"] == "throughput" and rep["patched_ms"] == rep["throughput"]["kforge"]["median_ms"]
    # the one candidate was tried on the whole model: kept, or dropped with the measured reason
    (trial,) = rep["decision"]["trials"]
    assert trial["calls"] == 1 and trial["gain"] is not None
    assert trial["kept"] == bool(rep["kernels_used"]) and trial["why"]
    assert rep["same_forward"] == (not trial["kept"])  # kept: kforge's own compiled forward
    if not trial["kept"]:  # slower on its trial, or kept there and not confirmed (decide.confirm)
        why = rep["skipped"][trial["task_id"]]
        assert "no faster in the model" in why or "not confirmed" in why, why
    assert lm.model._compiled_call_impl is None  # the user's model is left as it was
    # the decision is recorded: apply() now puts in exactly what it kept
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = apply(build_tiny(), chain_run)
    assert [k["task_id"] for k in p.kernels] == rep["decision"]["kept"]
    p.remove()


def test_a_check_killed_in_its_final_timing_keeps_the_decision(tmp_path, monkeypatch):
    """The decision took minutes (a swin_t apply was killed at 600 s and lost it): it is recorded
    before the final timing, and the summary says the check did not finish and how to re-run it."""
    from kforge_tui.integrate import measure
    from kforge_tui.integrate.e2e import check_end_to_end
    from kforge_tui.store import RunStore
    from kforge_tui.summary import format_end_to_end
    from kforge_tui.workload.loader import LoadedModel

    run = make_run(tmp_path / "r", [(chain_task(), CHAIN_CPP, 20.0, 15.0, 5.0)])
    lm = LoadedModel(model=build_tiny(), example_inputs=(example(),), spec="models/tiny.py", device="cpu")

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure, "latency", killed)
    with pytest.raises(KeyboardInterrupt):
        check_end_to_end(lm, run)
    with RunStore.open(run, readonly=True) as s:
        e2e = s.run_info()["end_to_end"]
    (trial,) = e2e["decisions"]["compile/default"]["trials"]
    assert trial["task_id"] == chain_task().task_id and trial["why"]
    text = format_end_to_end(e2e)
    assert "did not finish" in text and f"kforge apply {run} models/tiny.py" in text, text
    assert ("kept " if trial["kept"] else "dropped ") in text


def test_end_to_end_reports_a_mismatch(tmp_path):
    from kforge_tui.integrate.e2e import check_end_to_end
    from kforge_tui.workload.loader import LoadedModel

    run = make_run(tmp_path / "r", [(chain_task(), WRONG_CPP, 20.0, 15.0, 5.0)])
    lm = LoadedModel(model=build_tiny(), example_inputs=(example(),), spec="t", device="cpu")
    rep = check_end_to_end(lm, run)
    # the wrong kernel never ships: the whole-model check drops it for its outputs
    (trial,) = rep["decision"]["trials"]
    assert not trial["kept"] and "changes the model's outputs" in trial["why"]
    assert rep["kernels_used"] == {} and rep["within_tolerance"]


def test_export_is_a_package_that_compiles_in_place_with_only_torch(chain_run, tmp_path):
    from kforge_tui.integrate.export import export_run

    import inspect

    out = export_run(chain_run, tmp_path / "tiny_kernels", force=True)
    MODEL_SRC = inspect.getsource(Tiny)  # noqa: N806
    code = f"""
import sys, torch
sys.path.insert(0, {str(tmp_path)!r})
import importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('kforge_tui', 'litellm', 'textual'):
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import torch.nn as nn, torch.nn.functional as F
D, ROWS = {D}, {ROWS}
{MODEL_SRC}
def build_tiny(seed=0):
    torch.manual_seed(seed)
    return Tiny().eval()
def example(rows=ROWS):
    return torch.randn(rows, D, generator=torch.Generator().manual_seed(7))
import tiny_kernels
m = build_tiny(); x = example()
with torch.inference_mode():
    ref = m(x)
tiny_kernels.apply(m)
with torch.inference_mode():
    got = m(x)
torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
print('used', sum(tiny_kernels.counts().values()))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "used 1" in p.stdout
    assert (out / "_kforge" / "runtime.py").exists() and (out / "_kforge" / "partition.py").exists()


# ------------------------------------------------------------------ cuda (GPU machine)

CUDA_CHAIN = r"""#include "kforge_region.h"
__global__ void k(const float* x, float* y, int rows, int n) {
  int r = blockIdx.x;
  if (r >= rows || threadIdx.x != 0) return;
  const float* xr = x + r * n; float* yr = y + r * n;
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) { float v = xr[j] / (1.f + expf(-xr[j])) - 0.1f;
    v = (v > 0.f ? v : 0.f) * 3.f; yr[j] = v; m = fmaxf(m, v); }
  float s = 0.f;
  for (int j = 0; j < n; ++j) { float e = expf(yr[j] - m); yr[j] = e; s += e; }
  for (int j = 0; j < n; ++j) yr[j] /= s;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
  k<<<KF_IN0_SIZE_0, 32, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], KF_IN0_SIZE_0,
                                      KF_IN0_SIZE_1);
  return (int)cudaGetLastError();
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("inductor_mode", [None, "reduce-overhead"])
def test_cuda_kernel_inside_compiled_model_and_cuda_graphs(tmp_path, inductor_mode):
    model = build_tiny().cuda()
    x = example().cuda()
    task = next(t for t in tasks_of(model, (x,), backend="cuda") if t.kind == "reduction")
    store = RunStore.create(tmp_path / "r", model="t", settings={},
                            device={"backend": "cuda", "arch": "sm_90"}, proposer="builtin")
    store.close()
    run = make_run(tmp_path / "r2", [(task, CUDA_CHAIN, 20.0, 15.0, 5.0)])
    ref = _eager(model, x)
    with apply(model, run, inductor_mode=inductor_mode, force=True) as patch, torch.inference_mode():
        for _ in range(4):  # reduce-overhead records a CUDA graph after warm-up runs
            got = model(x).clone()
        torch.cuda.synchronize()
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        assert sum(patch.counts.values()) >= 1


# ------------------------------------------------------------------ the whole model decides

def _chain(x):
    for _ in range(10):  # forty pointwise ops: eager makes forty passes over x, a kernel one
        x = torch.abs(torch.relu(x * 1.5 + 0.5) - 0.25)
    return x


class TwoChains(nn.Module):
    """Two pointwise regions split by a matmul: one gets a fast kernel, the other a slow one."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512, 256) / 23.0)

    def forward(self, x):
        return _chain(_chain(x) @ self.w)


# relu as (v + |v|) / 2 and no inner loop: branch-free, so g++ vectorises the fast kernel
_STEP = "v = v * 1.5f + 0.5f; v = (v + fabsf(v)) * 0.5f; v = fabsf(v - 0.25f);"
_CHAIN_BODY = "\n".join(["    " + _STEP] * 10)
FAST_CHAIN = r"""#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
  const float* __restrict x = (const float*)inputs[0];
  float* __restrict y = (float*)outputs[0];
  for (long long i = 0; i < KF_OUT0_NUMEL; ++i) {
    float v = x[i];
""" + _CHAIN_BODY + r"""
    y[i] = v;
  }
  return 0;
}
"""
# Right, and slow: the chain 100 times over (a volatile zero keeps the compiler from hoisting it).
SLOW_CHAIN = r"""#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
  const float* x = (const float*)inputs[0];
  float* y = (float*)outputs[0];
  volatile float zero = 0.f;
  for (long long i = 0; i < KF_OUT0_NUMEL; ++i) {
    float out = 0.f;
    for (int r = 0; r < 100; ++r) {
      float v = x[i] + zero;
""" + _CHAIN_BODY + r"""
      out = v;
    }
    y[i] = out;
  }
  return 0;
}
"""


def _two_chains_run(tmp_path):
    torch.manual_seed(0)
    model, x = TwoChains().eval(), torch.randn(2048, 512)
    first, second = [t for t in tasks_of(model, (x,)) if t.kind == "pointwise"]
    # region figures that admit both as candidates: the model alone tells them apart
    run = make_run(tmp_path / "r", [(first, FAST_CHAIN, 400.0, None, 100.0), (second, SLOW_CHAIN, 400.0, None, 100.0)])
    return model, x, first, second, run


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared 2-core box PyTorch's OpenMP pool spinning between ops
    competes with a kernel's own threads, and the figures would say more about the box than
    about the kernels (the decision on such a box rightly drops them; here we test the rule)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_the_model_keeps_the_kernel_that_makes_it_faster_and_drops_the_one_that_does_not(tmp_path, one_thread):
    from kforge_tui.integrate.e2e import check_end_to_end
    from kforge_tui.workload.loader import LoadedModel

    model, x, first, second, run = _two_chains_run(tmp_path)
    rep = check_end_to_end(LoadedModel(model, (x,), "two_chains", "cpu"), run, mode="eager")
    trials = {t["task_id"]: t for t in rep["decision"]["trials"]}
    assert trials[first.task_id]["kept"] and trials[first.task_id]["gain"] > 1.2, trials
    slow = trials[second.task_id]
    assert not slow["kept"] and slow["gain"] < 1.0 and "no faster in the model" in slow["why"], slow
    assert rep["within_tolerance"] and rep["kernels_used"] == {first.task_id: 2}
    assert rep["speedup"] > 1.0  # eager mode: kforge against the eager model, on the decision clock
    # recorded: apply puts in the one the model kept, and nothing in a mode not yet measured
    p = apply(TwoChains().eval(), run, mode="eager")
    assert [k["task_id"] for k in p.kernels] == [first.task_id]
    assert "whole-model check" in p.skipped[second.task_id]
    p.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = apply(TwoChains().eval(), run, mode="compile")
    assert not p.kernels and all("has not been measured" in w for w in p.skipped.values()), p.skipped
    p.remove()


def test_a_run_whose_check_never_ran_integrates_nothing_until_it_does(tmp_path, one_thread):
    import kforge_tui

    model, x, first, second, run = _two_chains_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = apply(model, run, mode="eager")
    assert not p.kernels and "kforge apply" in p.skipped[first.task_id]
    # the public face decides on the model itself when given its inputs, then applies
    with torch.inference_mode():
        ref = model(x)
    p = kforge_tui.apply(model, run, example_inputs=(x,), mode="eager")
    try:
        assert first.task_id in [k["task_id"] for k in p.kernels]
        with torch.inference_mode():
            torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-4)
        assert p.counts[first.task_id] >= 1
    finally:
        p.remove()


def test_with_no_kernel_to_apply_the_compiled_model_is_torch_compile_itself(tmp_path, one_thread):
    """Nothing kept in compile mode: what apply installs is torch.compile in that Inductor mode,
    not kforge's backend with an empty table (never slower than torch.compile by construction),
    and remove() still gives the model back as it was."""
    from kforge_tui.integrate import runtime as rt

    model, x, first, second, run = _two_chains_run(tmp_path)
    with torch.inference_mode():
        ref = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = apply(model, run, mode="compile")  # no whole-model decision recorded: nothing goes in
    try:
        assert not p.kernels
        _runtime, _prev, backend = rt._INSTALLED[id(model)]
        assert backend is None  # no KforgeBackend: nn.Module.compile with Inductor itself
        assert model._compiled_call_impl is not None
        with torch.inference_mode():
            torch.testing.assert_close(model(x), ref)
    finally:
        p.remove()
    assert model._compiled_call_impl is None and id(model) not in rt._INSTALLED


TRITON_SRC = "import triton\n\ndef kforge_launch(inputs, outputs):\n    pass\n"


def _two_language_run(run_dir, nodes) -> str:
    """A run with chain_task and one candidate per (source, time_us) in `nodes`."""
    task = chain_task()
    store = RunStore.create(run_dir, model="tests/test_integrate.py:Tiny", settings={},
                            device={"backend": "cpu", "arch": "native"}, proposer="builtin")
    try:
        store.add_task(task, budget=4)
        t = lambda v: Timing(v, v, v, v, 50, "wall clock")  # noqa: E731
        store.set_baseline(task.task_id, {"eager": t(20.0).__dict__, "compiled": t(15.0).__dict__})
        for source, best in nodes:
            nid = store.add_node(task.task_id, None, action="write", proposer="hand", source=source,
                                 hand_written=True)
            res = EvalResult("ok", "time", "ok", timing=t(best), baseline=t(20.0))
            store.finish_node(nid, status="ok", message="ok", result=res.to_json(), reward=0.1,
                              time_us=best, speedup=20.0 / best)
        store.set_run_status("finished")
    finally:
        store.close()
    return str(run_dir)


def test_a_winner_in_a_language_integration_cannot_build_gives_way_to_the_best_that_it_can(tmp_path):
    """An `auto` search's best may be a Triton seed variant on a cuda task: it was handed to the
    compiler of the task's language (H200, 2026-12-04: ResNet-50's two best batch_norm+relu
    kernels, 1.04x and 1.12x torch.compile, 'kernel.cu(1): error: expected a declaration'). The
    best kernel in the task's own language goes in instead, gated on its own time."""
    from kforge_tui.integrate.patch import winners

    run = _two_language_run(tmp_path / "both", [(TRITON_SRC, 4.0), (CHAIN_CPP, 10.0)])
    rows, skipped, _, _ = winners(run, decided=False)
    assert skipped == {} and len(rows) == 1, skipped
    assert rows[0]["source"] == CHAIN_CPP and rows[0]["best_us"] == 10.0 and rows[0]["speedup"] == 2.0
    slow = _two_language_run(tmp_path / "slow", [(TRITON_SRC, 4.0), (CHAIN_CPP, 14.9)])
    rows, skipped, _, _ = winners(slow, decided=False)  # its own 14.9 us is not 1.02x under 15
    assert rows == [] and "14.9 us is not 1.02x faster than torch.compile" in next(iter(skipped.values()))
    only = _two_language_run(tmp_path / "only", [(TRITON_SRC, 4.0)])
    rows, skipped, _, _ = winners(only, decided=False)
    assert rows == [] and "verified kernels are triton" in next(iter(skipped.values()))


@pytest.mark.slow
def test_a_kept_set_the_confirmation_does_not_bear_out_does_not_go_in(tmp_path, one_thread, monkeypatch):
    """The kept set is timed against the baseline once more (decide.confirm); when that reads no
    gain, nothing goes in and every trial says why."""
    from kforge_tui.integrate import decide, measure
    from kforge_tui.integrate.e2e import check_end_to_end
    from kforge_tui.workload.loader import LoadedModel

    model, x, first, second, run = _two_chains_run(tmp_path)
    asked = []

    def not_again(base, current, *a, **k):
        asked.append((base, current))
        return measure.Verdict(False, 1.0, 6, 12, "+0.0 % on the whole forward (needs > 0.5 %)")

    monkeypatch.setattr(decide, "confirm", not_again)
    rep = check_end_to_end(LoadedModel(model, (x,), "two_chains", "cpu"), run, mode="eager")
    trials = {t["task_id"]: t for t in rep["decision"]["trials"]}
    assert len(asked) == 1 and asked[0][0] is model  # eager mode: the baseline is the model itself
    assert not trials[first.task_id]["kept"] and "not confirmed" in trials[first.task_id]["why"], trials
    assert rep["decision"]["kept"] == [] and rep["kernels_used"] == {} and rep["kernels"] == [] and rep["same_forward"]
    assert rep["decision"]["confirmed"] == 1.0


def test_eager_mode_judges_each_kernel_against_the_aten_graph_and_ships_only_past_the_module(chain_run, monkeypatch):
    """In eager mode kforge runs dynamo's aten graph eagerly, which costs more than the module's
    own forward with no kernel at all (1.37x on a BERT, CPU 2026-12-07): a trial measured
    against the module charged every kernel for that graph and none was ever kept. Each trial
    now faces the same graph with no kernel; the kept set must still beat the module itself."""
    from kforge_tui.integrate import decide as D
    from kforge_tui.integrate import measure
    from kforge_tui.integrate.patch import prepare
    from kforge_tui.workload.loader import LoadedModel

    model, x = build_tiny(), example()
    specs = prepare(chain_run, mode="eager", decided=False).specs
    assert len(specs) == 1
    pairs = []

    def faster(current, trial, *a, trial_first=False, **kw):
        pairs.append((current, trial, trial_first))
        return measure.Verdict(not trial_first, 1.2, 12, 12, "stub verdict")

    monkeypatch.setattr(measure, "faster_in_model", faster)
    d = D.decide(LoadedModel(model, (x,), "tiny", "cpu"), specs, mode="eager")
    (trial_base, trial, _), (confirm_base, kept, first) = pairs
    assert trial_base is not model and trial is not model  # the aten graph, without and with the kernel
    assert confirm_base is model and kept is trial and first  # the kept set against the module
    assert d.kept == [] and d.fn is model  # not confirmed: the model stays the user's
