"""Integration of verified winners into a live model (cpu backend, real g++, real run store).

The run directories here are built with the real store API and hand-written, honest C++
kernels for the catalogue's entry points; apply() compiles them with the sandbox compiler.
"""
from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kforge_tui.errors import UsageError
from kforge_tui.integrate import loader
from kforge_tui.integrate.patch import apply, remove
from kforge_tui.sandbox.result import EvalResult, Timing
from kforge_tui.store import RunStore
from kforge_tui.workload import catalogue

SOFTMAX_CPP = r"""#include <stdint.h>
#include <stddef.h>
#include <math.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const float* xr = x + o * n * inner + i;
      float* yr = y + o * n * inner + i;
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j * inner]);
      float s = 0.f;
      for (int64_t j = 0; j < n; ++j) { float e = expf(xr[j * inner] - m); yr[j * inner] = e; s += e; }
      float r = 1.f / s;
      for (int64_t j = 0; j < n; ++j) yr[j * inner] *= r;
    }
  return 0;
}
"""
SILU_CPP = r"""#include <stdint.h>
#include <stddef.h>
#include <math.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) y[i] = x[i] / (1.f + expf(-x[i]));
  return 0;
}
"""
RELU_CPP = r"""#include <stdint.h>
#include <stddef.h>
#include <math.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
"""
# A wrong kernel: proves outputs really come from the library, and that e2e notices a mismatch.
WRONG_SOFTMAX_CPP = r"""#include <stdint.h>
#include <stddef.h>
#include <math.h>
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  for (int64_t k = 0; k < outer * n * inner; ++k) y[k] = 42.0f;
  return 0;
}
"""
RMS_CPP = r"""#include <stdint.h>
#include <stddef.h>
#include <math.h>
extern "C" int kforge_launch(const float* x, const float* weight, float* y, int64_t rows, int64_t n,
                             float eps, float weight_offset) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n; float* yr = y + r * n;
    float ss = 0.f;
    for (int64_t j = 0; j < n; ++j) ss += xr[j] * xr[j];
    float inv = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * inv * (weight ? weight[j] + weight_offset : 1.f);
  }
  return 0;
}
"""

D = 64
ROWS = 4


class Tiny(nn.Module):
    """A small model with a module-backed op (nn.SiLU), functional softmax and a torch.relu."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.act = nn.SiLU()

    def forward(self, x):
        h = self.act(self.lin(x))
        h = torch.relu(h - 0.1)
        return F.softmax(h * 3.0, dim=-1)


class MyRMSNorm(nn.Module):
    """Spelled like HF LlamaRMSNorm: pure Python forward, no F.rms_norm to patch."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.norm = MyRMSNorm(D)

    def forward(self, x):
        return self.norm(self.lin(x))


def build_tiny(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny().eval()


def example(rows: int = ROWS) -> torch.Tensor:
    return torch.randn(rows, D, generator=torch.Generator().manual_seed(7))


def _task(op: str, inputs: dict, params: dict, output):
    return catalogue.make_task(op, inputs, params, output, backend="cpu")


def tiny_tasks(rows: int = ROWS) -> dict:
    x = torch.randn(rows, D)
    return {"softmax": _task("softmax", {"x": x}, {"dim": -1}, F.softmax(x, -1)),
            "silu": _task("silu", {"x": x}, {}, F.silu(x)),
            "relu": _task("relu", {"x": x}, {}, torch.relu(x))}


def rms_task(rows: int = ROWS):
    x = torch.randn(rows, D)
    w = torch.ones(D)
    return _task("rms_norm", {"x": x, "weight": w},
                 {"eps": 1e-6, "normalized_shape": [D], "variant": "llama"}, x)


def make_run(run_dir, winners, *, losers=()) -> str:
    """A run store with one task per entry: winners [(task, source, speedup)] get an "ok" node
    with those timings; `losers` get only failed nodes."""
    store = RunStore.create(run_dir, model="tests/test_integrate.py:Tiny", settings={},
                            device={"backend": "cpu", "arch": "native"}, proposer="builtin")
    try:
        for task, source, speedup, *eager_us in winners:
            store.add_task(task, budget=4)
            if eager_us:  # the task's eager baseline, as the worker would record it
                e = eager_us[0]
                store.set_baseline(task.task_id, {"eager": Timing(e, e, e, e, 50, "wall clock").__dict__})
            nid = store.add_node(task.task_id, None, action="write", proposer="hand",
                                 source=source, hand_written=True)
            e = eager_us[0] if eager_us else 10.0
            base = Timing(e, e, e, e, 50, "wall clock")
            t_us = e / speedup
            res = EvalResult("ok", "time", "ok", timing=Timing(t_us, t_us, t_us, t_us, 50, "wall clock"),
                             baseline=base)
            store.finish_node(nid, status="ok", message="ok", result=res.to_json(), reward=0.1,
                              time_us=t_us, speedup=speedup)
        for task in losers:
            store.add_task(task, budget=4)
            nid = store.add_node(task.task_id, None, action="write", proposer="hand",
                                 source=WRONG_SOFTMAX_CPP)
            res = EvalResult("verify_error", "verify", "values differ")
            store.finish_node(nid, status="verify_error", message="values differ",
                              result=res.to_json(), reward=-1.0)
        store.set_run_status("finished")
    finally:
        store.close()
    return str(run_dir)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    t = tiny_tasks()
    return make_run(tmp_path_factory.mktemp("run") / "r",
                    [(t["softmax"], SOFTMAX_CPP, 1.6), (t["silu"], SILU_CPP, 1.3),
                     (t["relu"], RELU_CPP, 0.9)])


def test_apply_outputs_match_and_kernels_are_called(tiny_run):
    model, x = build_tiny(), example()
    with torch.inference_mode():
        want = model(x)
    patch = apply(model, tiny_run)
    try:
        ids = {k["op"]: k["task_id"] for k in patch.kernels}
        assert set(ids) == {"softmax", "silu"}  # relu's 0.9x is gated out
        assert "below the 1.02x gate" in patch.skipped[tiny_tasks()["relu"].task_id]
        with torch.inference_mode():
            got = model(x)
        with torch.no_grad():
            got2 = model(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got2, want, rtol=1e-5, atol=1e-6)
        assert patch.counts == {ids["softmax"]: 2, ids["silu"]: 2}
        assert patch.fallbacks == {}
    finally:
        patch.remove()


def test_outputs_really_come_from_the_library(tmp_path):
    t = tiny_tasks()
    run = make_run(tmp_path / "r", [(t["softmax"], WRONG_SOFTMAX_CPP, 2.0)])
    model, x = build_tiny(), example()
    with apply(model, run) as patch, torch.inference_mode():
        got = model(x)
    assert torch.all(got == 42.0)
    assert patch.counts == {t["softmax"].task_id: 1}
    with torch.inference_mode():
        assert torch.allclose(model(x).sum(-1), torch.ones(ROWS))  # removed: PyTorch again


def test_remove_restores_functions_and_forward(tiny_run):
    model, x = build_tiny(), example()
    before = (F.softmax, F.silu, torch.softmax, torch.relu, F.layer_norm)
    code = type(model).forward.__code__
    patch = apply(model, tiny_run)
    assert F.softmax is not before[0] and F.silu is not before[1]
    assert "forward" in model.__dict__
    remove(model)
    assert (F.softmax, F.silu, torch.softmax, torch.relu, F.layer_norm) == before
    assert "forward" not in model.__dict__ and model.forward.__func__.__code__ is code
    assert all(m.__dict__.get("forward") is None for m in model.modules())
    with torch.inference_mode():
        model(x)
    assert sum(patch.counts.values()) == 0
    remove(model)  # twice is fine


def test_context_manager_and_reapply(tiny_run):
    model, x = build_tiny(), example()
    orig = F.softmax
    with apply(model, tiny_run) as p1:
        p2 = apply(model, tiny_run)  # replaces p1's install, not stacked on it
        with torch.inference_mode():
            model(x)
        assert not p1.active and p2.active
        assert sum(p2.counts.values()) == 2 and sum(p1.counts.values()) == 0
        p2.remove()
    assert F.softmax is orig and "forward" not in model.__dict__


def test_non_matching_shape_falls_back_and_is_reported(tiny_run):
    model = build_tiny()
    x = torch.randn(3, D)  # the run has [4, 64]
    with torch.inference_mode():
        want = model(x)
    with apply(model, tiny_run) as patch, torch.inference_mode():
        got = model(x)
    torch.testing.assert_close(got, want)
    assert sum(patch.counts.values()) == 0
    assert patch.fallbacks == {
        "silu [3, 64] float32: no verified kernel for this shape/dtype/params": 1,
        "softmax [3, 64] float32: no verified kernel for this shape/dtype/params": 1}


def test_other_model_in_process_is_untouched(tiny_run):
    patched, other, x = build_tiny(), build_tiny(1), example()
    with apply(patched, tiny_run) as patch, torch.inference_mode():
        other(x)
        F.softmax(x, dim=-1)
        assert sum(patch.counts.values()) == 0
        patched(x)
        assert sum(patch.counts.values()) == 2


def test_autograd_falls_back_to_pytorch(tiny_run):
    model, x = build_tiny(), example()
    with apply(model, tiny_run) as patch:
        out = model(x)  # grad mode on, the Linear's parameters require grad
        out[:, 0].sum().backward()
        assert model.lin.weight.grad is not None
        assert sum(patch.counts.values()) == 0
        assert all("autograd" in k for k in patch.fallbacks)
        assert sum(patch.fallbacks.values()) == 2


def test_non_contiguous_input_falls_back(tiny_run):
    sm = tiny_tasks()["softmax"].task_id
    model = build_tiny()
    with apply(model, tiny_run) as patch, torch.inference_mode():
        loader._STACK.append(patch.runtime)  # call the wrapper as the patched forward would
        try:
            xt = torch.randn(D, ROWS).t()  # [4, 64], not contiguous
            y = F.softmax(xt, dim=-1)
        finally:
            loader._STACK.pop()
    torch.testing.assert_close(y, torch.softmax(xt, -1))
    assert patch.counts[sm] == 0
    assert patch.fallbacks == {"softmax [4, 64] float32: non-contiguous input": 1}


@pytest.mark.slow
def test_torch_compile_does_not_crash_and_uses_pytorch(tiny_run):
    torch._dynamo.reset()
    model, x = build_tiny(), example()
    with torch.inference_mode():
        want = model(x)
    with apply(model, tiny_run) as patch:
        compiled = torch.compile(model, backend="eager")
        with torch.inference_mode():
            got = compiled(x)
        torch.testing.assert_close(got, want)
        # the traced graph holds PyTorch's ops: kernels are not called under torch.compile
        assert sum(patch.counts.values()) == 0
        with torch.inference_mode():
            model(x)  # the eager model still uses them
        assert sum(patch.counts.values()) == 2
    torch._dynamo.reset()


def test_rms_norm_module_forward_replacement(tmp_path):
    run = make_run(tmp_path / "r", [(rms_task(), RMS_CPP, 1.5)])
    torch.manual_seed(0)
    model = WithNorm().eval()
    x = example()
    with torch.inference_mode():
        want = model(x)
    with apply(model, run) as patch, torch.inference_mode():
        assert "forward" in model.norm.__dict__
        got = model(x)
        assert patch.counts == {rms_task().task_id: 1}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "forward" not in model.norm.__dict__


def test_no_verified_kernels_is_a_noop_that_says_so(tmp_path):
    t = tiny_tasks()
    run = make_run(tmp_path / "r", [], losers=[t["softmax"]])
    model, x = build_tiny(), example()
    orig = F.softmax
    with pytest.warns(UserWarning, match="no verified kernel to apply"):
        patch = apply(model, run)
    assert patch.kernels == [] and not patch.active and F.softmax is orig
    assert "forward" not in model.__dict__
    assert patch.skipped == {t["softmax"].task_id: "no verified kernel"}
    with torch.inference_mode():
        model(x)
    patch.remove()


def test_gate_leaves_everything_to_pytorch(tiny_run):
    model = build_tiny()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        patch = apply(model, tiny_run, min_speedup=5.0)
    assert patch.kernels == [] and any("no verified kernel" in str(x.message) for x in w)
    assert all("gate" in why for why in patch.skipped.values())


def test_gain_eaten_by_call_overhead_is_left_to_pytorch(tmp_path):
    t = tiny_tasks()
    # 1.5x on a 3 us op: 2 us kernel + ~2 us dispatch is slower than eager, so it stays PyTorch;
    # the same 1.5x on a 300 us op goes in.
    run = make_run(tmp_path / "r", [(t["softmax"], SOFTMAX_CPP, 1.5, 3.0),
                                    (t["silu"], SILU_CPP, 1.5, 300.0)])
    with apply(build_tiny(), run) as patch:
        assert [k["op"] for k in patch.kernels] == ["silu"]
        assert "per-call dispatch cost" in patch.skipped[t["softmax"].task_id]


def test_ops_filter_and_bad_input(tiny_run, tmp_path):
    model = build_tiny()
    with apply(model, tiny_run, ops=["silu"]) as patch:
        assert [k["op"] for k in patch.kernels] == ["silu"]
    with pytest.raises(UsageError, match="unknown op 'softmaxx'"):
        apply(model, tiny_run, ops=["softmaxx"])
    with pytest.raises(UsageError):
        apply(model, tmp_path / "no-such-run")
    with pytest.raises(UsageError, match="torch.nn.Module"):
        apply(lambda x: x, tiny_run)


def test_end_to_end_report(tiny_run):
    from kforge_tui.integrate.e2e import check_end_to_end
    from kforge_tui.workload.loader import LoadedModel

    model = build_tiny()
    loaded = LoadedModel(model=model, example_inputs=(example(),), spec="tiny", device="cpu")
    r = check_end_to_end(loaded, tiny_run, fresh_inputs=2, iters=5)
    t = tiny_tasks()
    assert r["within_tolerance"] is True and r["max_abs_err"] < 1e-5
    assert r["kernels_used"] == {t["softmax"].task_id: 3, t["silu"].task_id: 3}
    assert r["inputs_checked"] == 3 and r["fallbacks"] == {}
    assert r["eager_ms"] > 0 and r["patched_ms"] > 0
    assert r["speedup"] == pytest.approx(r["eager_ms"] / r["patched_ms"])
    assert t["relu"].task_id in r["skipped"]
    assert "forward" not in model.__dict__  # left unpatched


def test_end_to_end_reports_a_mismatch(tmp_path):
    from kforge_tui.integrate.e2e import check_end_to_end
    from kforge_tui.workload.loader import LoadedModel

    t = tiny_tasks()
    run = make_run(tmp_path / "r", [(t["softmax"], WRONG_SOFTMAX_CPP, 2.0)])
    loaded = LoadedModel(model=build_tiny(), example_inputs=(example(),), spec="tiny", device="cpu")
    r = check_end_to_end(loaded, run, fresh_inputs=1, iters=2)
    assert r["within_tolerance"] is False and r["max_abs_err"] > 40
    assert r["kernels_used"] == {t["softmax"].task_id: 2}


SOFTMAX_CU = r"""#include <cuda_runtime.h>
#include <stdint.h>
__global__ void k(const float* x, float* y, int64_t n) {
  const float* xr = x + blockIdx.x * n; float* yr = y + blockIdx.x * n;
  __shared__ float red[256];
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
  red[threadIdx.x] = m; __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); __syncthreads(); }
  m = red[0]; __syncthreads();
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(xr[j] - m);
  red[threadIdx.x] = sum; __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s]; __syncthreads(); }
  float r = 1.f / red[0];
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = expf(xr[j] - m) * r;
}
extern "C" int kforge_launch(const float* x, float* y, int64_t outer, int64_t n, int64_t inner,
                             cudaStream_t stream) {
  if (inner != 1) return 1;
  k<<<outer, 256, 0, stream>>>(x, y, n);
  return (int)cudaGetLastError();
}
"""


@pytest.mark.gpu
def test_cuda_kernel_in_a_live_model(tmp_path):
    """GPU machine: pytest -m gpu tests/test_integrate.py tests/test_export.py"""
    from kforge_tui.device import device_info

    x = torch.randn(ROWS, D, device="cuda")
    task = catalogue.make_task("softmax", {"x": x}, {"dim": -1}, F.softmax(x, -1), backend="cuda")
    store_dir = tmp_path / "r"
    run = make_run(store_dir, [(task, SOFTMAX_CU, 1.5, 300.0)])
    model = build_tiny().cuda()
    xs = example().cuda()
    with torch.inference_mode():
        want = model(xs)
    s = torch.cuda.Stream()
    with apply(model, run) as patch, torch.inference_mode(), torch.cuda.stream(s):
        got = model(xs)
        s.synchronize()
        assert patch.counts == {task.task_id: 1}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert device_info("cuda").arch.startswith("sm_")


class BoundActivation(nn.Module):
    """Holds the torch function itself, bound at construction, as HF's GELUTanh does with
    functools.partial(F.gelu, approximate="tanh"): patching F.silu later cannot reach it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.act = functools.partial(F.silu, inplace=False)

    def forward(self, x):
        return self.act(self.lin(x))


def test_functions_bound_at_construction_are_patched_and_restored(tiny_run):
    torch.manual_seed(0)
    model, x = BoundActivation().eval(), example()
    original = model.act
    with torch.inference_mode():
        want = model(x)
    patch = apply(model, tiny_run)
    try:
        silu_id = next(k["task_id"] for k in patch.kernels if k["op"] == "silu")
        with torch.inference_mode():
            got = model(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert patch.counts.get(silu_id) == 1  # the bound partial now reaches the kernel
    finally:
        patch.remove()
    assert model.act is original


SILU_MUL_CPP = r"""#include <stdint.h>
#include <stddef.h>
#include <math.h>
extern "C" int kforge_launch(const float* a, int64_t a_row_stride, const float* b, int64_t b_row_stride,
                             float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = a[r * a_row_stride + c];
      y[r * cols + c] = v / (1.f + expf(-v)) * b[r * b_row_stride + c];
    }
  return 0;
}
"""
HID, INTER = 16, 24


class GatedMLP(nn.Module):
    """Spelled like HF's LlamaMLP / Qwen3MoeMLP."""

    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HID, INTER, bias=False)
        self.up_proj = nn.Linear(HID, INTER, bias=False)
        self.down_proj = nn.Linear(INTER, HID, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LookalikeMLP(GatedMLP):
    """Same attributes, different computation: the replacement must not be trusted here."""

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))


class TwoMLPs(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = GatedMLP()
        self.other = LookalikeMLP()

    def forward(self, x):
        return self.mlp(x) + self.other(x)


def test_gated_mlp_silu_mul_is_dispatched_and_lookalikes_are_left_alone(tmp_path):
    torch.manual_seed(0)
    model, x = TwoMLPs().eval(), torch.randn(2, 5, HID)
    with torch.inference_mode():
        a, b = model.mlp.gate_proj(x), model.mlp.up_proj(x)
        want = model(x)
    task = _task("silu_mul", {"a": a, "b": b}, {}, F.silu(a) * b)
    run = make_run(tmp_path / "r", [(task, SILU_MUL_CPP, 1.5, 300.0)])
    patch = apply(model, run)
    try:
        assert "forward" in vars(model.mlp) and "forward" not in vars(model.other)
        with torch.inference_mode():
            got = model(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert patch.counts == {task.task_id: 1}  # only the real gated MLP used the kernel
    finally:
        patch.remove()
    assert "forward" not in vars(model.mlp)
