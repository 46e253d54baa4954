"""A verified Triton winner inside torch.compile (integrate/triton_region.py): its launches are
inlined into the graph as Inductor's own user-defined Triton kernel, with no region op.

On the CPU the graph rewrite is checked on the graph the kforge backend really gets (the model
then runs its original graph: no GPU to launch on); on a GPU (`-m gpu`) the winner runs in the
compiled model, in default mode and under CUDA graphs, and the profiler shows its kernel.
"""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")

from kforge_tui.integrate import runtime as rt  # noqa: E402
from kforge_tui.integrate.patch import spec_for  # noqa: E402
from kforge_tui.integrate.triton_region import TritonLoadError  # noqa: E402
from kforge_tui.regions import trace as _trace  # noqa: E402
from kforge_tui.regions.build import tasks_of  # noqa: E402
from test_integrate import build_tiny, chain_task, example, make_run  # noqa: E402

# Tiny's chain after the linear (silu, -0.1, relu, *3, softmax over rows of 64), one program a row.
CHAIN_TRITON = '''import torch
import triton
import triton.language as tl


@triton.jit
def kf_chain_kernel(x_ptr, y_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    v = x / (1.0 + tl.exp(-x)) - 0.1
    v = tl.maximum(v, 0.0) * 3.0
    v = tl.where(mask, v, float("-inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    e = tl.where(mask, e, 0.0)
    tl.store(y_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=mask)


def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    kf_chain_kernel[(x.shape[0],)](x, y, N=x.shape[1], BLOCK=64, num_warps=2, num_stages=1)
    return 0
'''
# Python that follows the values: no trace of it can stand for every call.
DATA_DEPENDENT = CHAIN_TRITON.replace("    x, y = inputs[0], outputs[0]\n",
                                      "    x, y = inputs[0], outputs[0]\n    if x.sum().item() > 0:\n"
                                      "        return 0\n")


def _kernel(tmp_path, source: str, task, device: str):
    path = tmp_path / "chain.py"
    path.write_text(source)
    spec = dict(spec_for(task.to_json(), "", {}), lang="triton", source_path=str(path), device=device)
    return rt.kernel_for(spec)


def _rewritten_graph(model, x, runtime, backend: str) -> dict:
    """The graph the kforge backend hands Inductor, rewritten; the model runs its original one."""
    seen = {}

    def hook(gm, example_inputs, is_inference, kwargs):
        original = copy.deepcopy(gm)
        seen["replaced"] = rt.rewrite(gm, runtime, backend)
        seen["gm"] = gm
        return _trace.eager_runner(original)

    with torch.inference_mode():
        torch.compile(model, backend=_trace.make_backend(hook), dynamic=False)(x)
    return seen


def test_a_triton_winner_replaces_its_region_with_inductors_own_kernel_node(tmp_path):
    task = chain_task()
    k = _kernel(tmp_path, CHAIN_TRITON, task, "cpu")
    runtime = rt.Runtime([k])
    seen = _rewritten_graph(build_tiny(), example(), runtime, "cpu")
    assert seen["replaced"] == 1
    nodes = list(seen["gm"].graph.nodes)
    targets = [str(n.target) for n in nodes if n.op == "call_function"]
    assert not any(rt.OP_NS in t for t in targets), "a Triton kernel needs no region op"
    for op in ("silu", "relu", "softmax", "exp"):  # the region's aten ops are gone
        assert not any(f"aten.{op}" in t for t in targets), (op, targets)
    hops = [n for n in nodes if n.target is torch.ops.higher_order.triton_kernel_wrapper_functional]
    assert len(hops) == 1
    hop = hops[0]
    # the output buffer is the kernel's to write; the region's input is read only (the sandbox
    # verified it), so it is neither cloned before the launch nor copied back after it
    assert hop.kwargs["tensors_to_clone"] == ["y_ptr"]
    assert not any(n.target is torch.ops.aten.copy_.default for n in nodes)
    x_val = hop.meta["eager_input_vals"][1]["kwargs"]["x_ptr"]
    assert tuple(x_val.stride()) == k.inputs[0][2]  # Inductor hands it over in these strides
    (out,) = [n for n in nodes if n.op == "output"][0].args[0]
    assert out.args[0] is hop and out.args[1] == "y_ptr"  # the model's result is the kernel's output
    assert runtime.counts == {task.task_id: 1}  # its call sites: Inductor launches it


def test_a_launcher_a_trace_cannot_follow_is_refused_with_the_reason(tmp_path):
    task = chain_task()
    k = _kernel(tmp_path, DATA_DEPENDENT, task, "cpu")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = torch.empty(task.inputs[0].shape)
    with pytest.raises(TritonLoadError, match="cannot be traced into the graph"):
        k.subgraph([mode.from_tensor(x) if not hasattr(x, "fake_mode") else x])


def test_a_source_without_its_entry_point_does_not_load(tmp_path):
    with pytest.raises(TritonLoadError, match="has no kforge_launch"):
        _kernel(tmp_path, CHAIN_TRITON.replace("def kforge_launch", "def launch"), chain_task(), "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("inductor_mode", [None, "reduce-overhead"])
def test_a_triton_winner_runs_inside_the_compiled_model(tmp_path, inductor_mode):
    from torch.profiler import ProfilerActivity, profile

    from kforge_tui.integrate.patch import apply

    model = build_tiny().cuda()
    x = example().cuda()
    task = next(t for t in tasks_of(model, (x,), backend="cuda") if t.kind == "reduction")
    run = make_run(tmp_path / "r", [(task, CHAIN_TRITON, 20.0, 15.0, 5.0)])
    with torch.inference_mode():
        ref = model(x).clone()
    with apply(model, run, inductor_mode=inductor_mode, force=True) as patch, torch.inference_mode():
        assert patch.kernels and patch.kernels[0]["lang"] == "triton", patch.skipped
        for _ in range(4):  # reduce-overhead records a CUDA graph after warm-up runs
            got = model(x).clone()
        torch.cuda.synchronize()
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model(x)
            torch.cuda.synchronize()
        names = [e.key for e in prof.key_averages()]
        assert patch.counts == {task.task_id: 1}
    if inductor_mode is None:  # under CUDA graphs a replay shows no kernel names
        assert any("kf_chain_kernel" in n for n in names), names
    assert not any(rt.OP_NS in n for n in names), names


# One buffer, two written pointers: the second half of the row through the second.
HALVES_TWICE = '''import torch
import triton
import triton.language as tl


@triton.jit
def kf_halves(x_ptr, a_ptr, b_ptr, N: tl.constexpr, HALF: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, HALF)
    tl.store(a_ptr + row * N + cols, tl.load(x_ptr + row * N + cols))
    tl.store(b_ptr + HALF + row * N + cols, tl.load(x_ptr + row * N + HALF + cols))


def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    kf_halves[(x.shape[0],)](x, y, y, N=x.shape[1], HALF=x.shape[1] // 2)
    return 0
'''


def _traced(k, task):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kforge_tui.sandbox.triton_loader import libdevice_as_installed

    # other tests of this process may have run candidates under the interpreter (its libdevice)
    with FakeTensorMode(), libdevice_as_installed():
        return k.subgraph([torch.empty_strided(s, st, dtype=dt) for s, dt, st in k.inputs])


def _rope(x, cos, sin):
    h = x.view(2, 8, 3, 16).transpose(1, 2)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return h * cos + torch.cat((-h[..., 8:], h[..., :8]), -1) * sin


def test_a_launch_writing_one_buffer_through_two_arguments_is_refused(tmp_path):
    """Traced, each written argument is a functional copy of its own, so the writes through one
    of the two are lost: refused with the reason, not left to the model's accuracy check."""
    task = chain_task()
    k = _kernel(tmp_path, HALVES_TWICE, task, "cpu")
    with pytest.raises(TritonLoadError, match="passes one buffer as a_ptr, b_ptr"):
        _traced(k, task)
    once = HALVES_TWICE.replace("(x, y, y, N=", "(x, y, N=").replace("x_ptr, a_ptr, b_ptr,", "x_ptr, a_ptr,") \
        .replace("tl.store(b_ptr + HALF", "tl.store(a_ptr + HALF")
    _traced(_kernel(tmp_path, once, task, "cpu"), task)  # the same kernel, the buffer passed once


def test_inductors_cat_kernel_is_seeded_with_each_buffer_once_and_traces(tmp_path, monkeypatch):
    """qwen_moe's QK-norm + RoPE (H100 2026-12-06): Inductor's cat kernel writes a buffer's two
    halves through out_ptr0 and out_ptr1. The seed passed the buffer twice, and in the model
    the second half was never written (93 % of the logits off): the seed now passes it once, the
    second pointer an offset from the first."""
    from kforge_tui.regions.build import task_of
    from kforge_tui.search import inductor_seed

    monkeypatch.setenv("KFORGE_FUSE_CAT", "1")  # one region, as on a GPU
    task = task_of(_rope, (torch.randn(2, 8, 48), torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16)),
                   backend="triton")
    seed = inductor_seed.generate(task, "cpu")
    launches = [ln for ln in seed.launches if ln.kind == "kernel"]
    assert any(p.endswith("_KFOFF") for ln in launches for p in ln.extra)  # the cat writes at an offset
    for ln in launches:
        bufs = [a for a in ln.args if isinstance(a, str)]
        assert len(bufs) == len(set(bufs)), (ln.kernel, ln.args)
    gm = _traced(_kernel(tmp_path, seed.render(), task, "cpu"), task)
    assert [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.triton_kernel_wrapper_functional]


def test_a_gemm_seed_traces_to_the_library_call_and_its_kernel_with_no_copy(tmp_path, monkeypatch):
    """linear + gelu on a 3-d input: the seed's `mm(out=<output at mm's shape>)` on views of x
    and of the transposed weight. Traced with views functionalised away, both views became
    copies and the output a scatter into a fresh buffer: three copy kernels a call in the model
    (gemma's linear+mul: 1.06x on the region clock, -8.5 % in the model, H100 2026-12-06).
    Now: views, mm, a view of its result, the epilogue kernel in place on it."""
    from kforge_tui.regions.build import task_of
    from kforge_tui.search import inductor_seed

    monkeypatch.setenv("KFORGE_EPILOGUES", "1")  # linear + gelu: one region, as on a GPU
    w = torch.randn(24, 8)
    task = task_of(lambda x: torch.nn.functional.gelu(torch.nn.functional.linear(x, w), approximate="tanh"),
                   (torch.randn(2, 4, 8),), backend="triton")
    k = _kernel(tmp_path, inductor_seed.generate(task, "cpu").render(), task, "cpu")
    gm = _traced(k, task)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.mm.default in targets
    copies = [str(t) for t in targets if any(c in str(t) for c in ("copy", "scatter", "clone", "empty"))]
    assert not copies, copies
    (out,) = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert tuple(out.meta["val"].shape) == (2, 4, 24) and tuple(out.meta["val"].stride()) == k.outputs[0][2]


def test_a_fallback_seed_is_not_integrated_it_is_what_the_model_runs(tmp_path):
    """qwen_moe's dispatch sort: node zero is `torch.sort(..., out=outputs)`, Inductor's own
    fallback call. There is no Triton kernel to inline, and nothing to gain: refused, saying so."""
    from kforge_tui.regions.build import task_of
    from kforge_tui.search import inductor_seed

    task = task_of(lambda x: torch.sort(x.reshape(-1)), (torch.randint(0, 128, (4096, 8)),), backend="triton")
    k = _kernel(tmp_path, inductor_seed.generate(task, "cpu").render(), task, "cpu")
    with pytest.raises(TritonLoadError, match="PyTorch's own call only"):
        _traced(k, task)
