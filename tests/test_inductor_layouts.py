"""Kernels take their inputs as Inductor lays them out, so integrating one adds no copy kernel.

Inductor runs convolutions channels-last (layout optimisation: on the CPU with mkldnn, as on the
GPU) and lays the batch_norm+relu between them out to match, while the traced graph says NCHW.
The capture asks Inductor which strides each region really gets (regions/layout.py); a kernel
verified on those runs with no copy around it. The profiler counts Inductor's kernels of the
compiled model with and without kforge: the same, or fewer. The control is the same kernel
verified on the traced NCHW strides: Inductor then converts the layout there and back, and the
count goes up, so this test can fail.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kforge_tui.integrate import runtime as rt
from kforge_tui.integrate.patch import spec_for
from kforge_tui.sandbox.compile import compile_candidate_sync
from kforge_tui.workload.capture import trace_model
from kforge_tui.workload.loader import LoadedModel

# Writes zeros: how Inductor wires the op in does not depend on what the kernel computes.
ZERO_CPP = r"""#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
  float* y = (float*)outputs[0];
  for (long long i = 0; i < KF_OUT0_NUMEL; ++i) y[i] = 0.f;
  return 0;
}
"""


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        h = torch.relu(self.b2(self.c2(h)) + h)
        return self.fc(h.mean((2, 3)))


def _net():
    torch.manual_seed(0)
    return ConvNet().eval()


X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def bn_relu():
    if not torch.backends.mkldnn.is_available():
        pytest.skip("CPU Inductor lays convolutions out channels-last only with mkldnn")
    traced = trace_model(LoadedModel(_net(), (X,), "convnet", "cpu"), "cpu")
    return next(r.task for r in traced.records.values() if r.task.op == "batch_norm+relu")


def _inductor_kernels(fn) -> list[str]:
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}), torch.inference_mode():
        fn(X)
        fn(X)
        with torch.profiler.profile() as prof:
            fn(X)
    return sorted(e.name for e in prof.events() if "cpp_fused" in e.name)


def _patched(task, tmp_path: Path):
    res = compile_candidate_sync(ZERO_CPP, "cpu", "native", tmp_path, 120.0, header=task.header())
    assert res.ok, res.log
    runtime = rt.Runtime([rt.Kernel(spec_for(task.to_json(), str(res.lib_path), {}))])
    model = _net()
    rt.install(model, runtime, "cpu")
    return model, runtime


def test_the_capture_finds_inductors_channels_last_layout(bn_relu):
    x_in = max(bn_relu.inputs, key=lambda m: m.numel)
    assert bn_relu.traced_strides, "the task keeps the traced layout"
    c = x_in.shape[1]
    assert x_in.strides[1] == 1 and x_in.strides[3] == c, x_in.strides  # N, H, W, C in memory
    assert bn_relu.outputs[0].strides == x_in.strides
    assert bn_relu.site_key != bn_relu.key  # the rewrite finds it by its traced layout


def test_a_kernel_in_inductors_layout_adds_no_copy_and_one_in_the_traced_layout_does(bn_relu, tmp_path):
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        base = _inductor_kernels(torch.compile(_net(), dynamic=False))
        model, runtime = _patched(bn_relu, tmp_path)
        try:
            ours = _inductor_kernels(model)
            assert sum(runtime.counts.values()) == 3 and runtime.fallbacks == {}
        finally:
            rt.uninstall(model)
        traced = bn_relu.with_layouts(bn_relu.traced_strides["inputs"], bn_relu.traced_strides["outputs"])
        assert not traced.traced_strides and traced.key == bn_relu.site_key
        model, runtime = _patched(traced, tmp_path)
        try:
            theirs = _inductor_kernels(model)
            assert sum(runtime.counts.values()) == 3  # it runs, at the price of copies
        finally:
            rt.uninstall(model)
    assert base, "no Inductor kernel was profiled"
    assert len(ours) <= len(base), (ours, base)
    assert len(theirs) > len(base), (theirs, base)


class TwoSites(nn.Module):
    """One group_norm+silu traced NCHW after a convolution (Inductor: channels-last) and one on
    an input that is channels-last already: two traced layouts, one layout inside Inductor."""

    def __init__(self):
        super().__init__()
        self.c1, self.n1, self.n2 = nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.GroupNorm(8, 32)

    def forward(self, x, y):
        return nn.functional.silu(self.n1(self.c1(x))), nn.functional.silu(self.n2(y))


def test_sites_traced_in_two_layouts_that_inductor_lays_out_alike_are_one_task(tmp_path):
    """Found on diffusers' AutoencoderKL: the encoder's group_norms traced NCHW and the decoder's
    channels-last were two records of one task; the search took one, its calls were half counted
    and the kernel replaced only the sites of the record it came from."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("CPU Inductor lays convolutions out channels-last only with mkldnn")
    torch.manual_seed(0)
    args = (torch.randn(2, 32, 16, 16), torch.randn(2, 32, 16, 16).contiguous(memory_format=torch.channels_last))
    traced = trace_model(LoadedModel(TwoSites().eval(), args, "two_sites", "cpu"), "cpu")
    (rec,) = [r for r in traced.records.values() if r.task.op == "group_norm+silu"]
    assert rec.calls == 2 and len(rec.saved) == 2
    task = rec.task
    assert len(task.site_keys) == 2 and task.site_key in task.site_keys
    assert traced.record_of(task) is rec

    # the kernel (zeros: this checks wiring, not values) runs at both sites, with no fallback
    res = compile_candidate_sync(ZERO_CPP, "cpu", "native", tmp_path, 120.0, header=task.header())
    assert res.ok, res.log
    runtime = rt.Runtime([rt.Kernel(spec_for(task.to_json(), str(res.lib_path), {}))])
    torch.manual_seed(0)
    model = TwoSites().eval()
    rt.install(model, runtime, "cpu")
    try:
        with torch.inference_mode():
            a, b = model(*args)
        assert sum(runtime.counts.values()) == 2 and runtime.fallbacks == {}, (runtime.counts, runtime.fallbacks)
        assert not a.any() and not b.any()
    finally:
        rt.uninstall(model)


# ------------------------------------------------------------------ the same on the GPU

ZERO_CU = r"""#include "kforge_region.h"
__global__ void kf_zero(float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.f;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
  kf_zero<<<(unsigned)((KF_OUT0_NUMEL + 255) / 256), 256, 0, stream>>>((float*)outputs[0], KF_OUT0_NUMEL);
  return (int)cudaGetLastError();
}
"""


def _triton_kernels(fn, x) -> list[str]:
    with torch.inference_mode():
        fn(x)
        fn(x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(x)
            torch.cuda.synchronize()
    return sorted(e.name for e in prof.events() if e.name.startswith("triton_"))


@pytest.mark.gpu
def test_on_the_gpu_a_kernel_in_inductors_layout_adds_no_copy(tmp_path):
    from kforge_tui.device import device_info

    x = X.cuda()
    traced = trace_model(LoadedModel(_net().cuda(), (x,), "convnet", "cuda"), "cuda")
    task = next(r.task for r in traced.records.values() if r.task.op == "batch_norm+relu")
    assert task.traced_strides, "Inductor on the GPU lays the convolutions out channels-last"
    base = _triton_kernels(torch.compile(_net().cuda(), dynamic=False), x)
    counts = {}
    for name, t in (("inductor", task), ("traced", task.with_layouts(task.traced_strides["inputs"],
                                                                     task.traced_strides["outputs"]))):
        res = compile_candidate_sync(ZERO_CU, "cuda", device_info("cuda").arch, tmp_path, 300.0,
                                     header=t.header())
        assert res.ok, res.log
        runtime = rt.Runtime([rt.Kernel(spec_for(t.to_json(), str(res.lib_path), {}))])
        model = _net().cuda()
        rt.install(model, runtime, "cuda")
        try:
            counts[name] = _triton_kernels(model, x)
            assert sum(runtime.counts.values()) == 3 and runtime.fallbacks == {}
        finally:
            rt.uninstall(model)
    assert len(counts["inductor"]) <= len(base), (counts["inductor"], base)
    assert len(counts["traced"]) > len(base), (counts["traced"], base)
