"""Real-tensor capture: files on disk, exact reproduction, unchanged outputs, disk bounds."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kforge_tui.errors import UsageError
from kforge_tui.task import Task, capture_dir, load_calls
from kforge_tui.workload import catalogue
from kforge_tui.workload.capture import capture
from kforge_tui.workload.loader import load_model
from kforge_tui.workload.profile import profile_model

FIX = Path(__file__).parent / "fixtures" / "models"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny():
    lm = load_model(str(FIX / "tiny.py"))
    return lm, profile_model(lm, warmup=1, iters=1)


def assert_reproduces(run_dir, tasks):
    """Reload every saved call and rerun the catalogue reference: outputs must be bit-equal."""
    for t in tasks:
        calls = load_calls(run_dir, t.task_id)
        assert calls, t.task_id
        for c in calls:
            assert set(c["inputs"]) == {m.name for m in t.inputs}
            assert c["params"] == t.params
            ref = catalogue.reference(t, c["inputs"])
            assert ref.dtype == c["output"].dtype and ref.shape == c["output"].shape
            assert torch.equal(ref, c["output"]), t.task_id
            for name, st in c["stats"].items():
                x = c["inputs"][name].float()
                assert st["min"] == pytest.approx(float(x.min())) and st["max"] == pytest.approx(float(x.max()))


def test_capture_writes_reloadable_calls_that_reproduce_exactly(tiny, tmp_path):
    lm, prof = tiny
    tasks = capture(lm, tmp_path, prof, top_n=None)
    by_op = {}
    for t in tasks:
        by_op.setdefault(t.op, []).append(t)
    assert set(by_op) >= {"softmax", "log_softmax", "layer_norm", "group_norm", "adaptive_avg_pool2d",
                          "rms_norm", "relu", "gelu", "silu_mul"}
    assert_reproduces(tmp_path, tasks)
    # canonical inputs and params per op
    gn = by_op["group_norm"][0]
    assert [m.name for m in gn.inputs] == ["x", "weight", "bias"] and gn.params == {"groups": 8, "eps": 1e-5}
    assert by_op["adaptive_avg_pool2d"][0].params == {"output_size": [1, 1]}
    assert by_op["gelu"][0].params == {"approximate": "tanh"}
    variants = {t.params["variant"] for t in by_op["rms_norm"]}
    assert variants == {"llama", "gemma", "functional"}  # detected by exact reproduction
    sm = {t.shape: t for t in by_op["softmax"]}
    assert sm[(2, 6, 6)].calls == 2 and sm[(2, 6, 6)].params == {"dim": 2}
    assert (2, 64, 6) not in sm  # Tensor.softmax on a transposed view: not contiguous, no task
    relu = by_op["relu"][0]  # nn.ReLU(inplace=True) and torch.relu on the same shape
    assert relu.calls == 2 and len(load_calls(tmp_path, relu.task_id)) == 2
    first = load_calls(tmp_path, relu.task_id)[0]
    assert (first["inputs"]["x"] < 0).any()  # saved before the in-place relu overwrote it
    sw = by_op["silu_mul"][0]  # gate/up halves of one tensor: row stride 128, unit column stride
    assert sw.input("a").stride[-1] == 1 and sw.input("a").stride[-2] == 128
    # profile facts filled in and tasks ordered by share
    assert all(t.share >= 0 and t.aten for t in tasks)
    assert sm[(2, 6, 6)].aten == "aten::softmax" and sm[(2, 6, 6)].share > 0
    assert [t.share for t in tasks] == sorted((t.share for t in tasks), reverse=True)
    # tasks survive a JSON round trip (the store keeps them so)
    assert all(Task.from_json(t.to_json()) == t for t in tasks)


def test_capture_leaves_outputs_unchanged(tiny, tmp_path):
    lm, prof = tiny
    before = lm.run().clone()
    capture(lm, tmp_path, prof, top_n=None)
    after = lm.run()
    assert torch.equal(before, after)
    # and the forward under capture itself returns the same values
    from kforge_tui.workload.capture import _CaptureMode, _Recorder, _RmsNormHooks

    rec = _Recorder(max_calls=3, max_bytes=2**30)
    with _RmsNormHooks(lm.model, rec), _CaptureMode(rec):
        during = lm.run()
    assert torch.equal(before, during)
    assert not lm.model._forward_hooks and not lm.model.rms._forward_hooks  # hooks removed


def test_top_n_ops_filter_and_unknown_op(tiny, tmp_path):
    lm, prof = tiny
    top2 = capture(lm, tmp_path / "a", prof, top_n=2)
    assert len(top2) == 2
    only = capture(lm, tmp_path / "b", prof, top_n=None, ops=["group_norm", "gelu"])
    assert sorted(t.op for t in only) == ["gelu", "group_norm"]
    saved_dirs = {p.name for p in (tmp_path / "b" / "captures").iterdir()}
    assert saved_dirs == {t.task_id for t in only}  # nothing written for tasks not kept
    with pytest.raises(UsageError, match="unknown op 'flash_attn'; known ops: softmax"):
        capture(lm, tmp_path / "c", prof, ops=["flash_attn"])


def test_max_calls_and_max_bytes_per_op(tiny, tmp_path):
    lm, prof = tiny
    capture(lm, tmp_path / "one", prof, top_n=None, max_calls=3)
    tasks = capture(lm, tmp_path / "one", prof, top_n=None, max_calls=1)  # again, same run dir
    assert all(len(load_calls(tmp_path / "one", t.task_id)) == 1 for t in tasks)  # stale files gone
    # softmax [2,6,6] is called twice; a budget for one call's worth keeps only one file
    cap = 12 * 1024
    tasks = capture(lm, tmp_path / "small", prof, top_n=None, max_bytes_per_op=cap)
    sizes = {t.task_id: sum(f.stat().st_size for f in capture_dir(tmp_path / "small", t.task_id).glob("*"))
             for t in tasks}
    assert all(s <= cap for s in sizes.values()), sizes
    sm = next(t for t in tasks if t.op == "softmax" and t.shape == (2, 6, 6))
    assert len(load_calls(tmp_path / "small", sm.task_id)) == 1
    big = next(t for t in tasks if t.op == "group_norm")  # 2*32*8*8 floats in + out > 12 KiB
    assert load_calls(tmp_path / "small", big.task_id) == []


def test_output_dtype_is_part_of_the_task(tmp_path):
    """softmax(x) and softmax(x, dtype=float32) on the same bf16 x are two different kernels."""
    from kforge_tui.workload.loader import LoadedModel

    class TwoSoftmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1).float() + torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32)

    lm = LoadedModel(TwoSoftmax(), (torch.randn(4, 32, dtype=torch.bfloat16),), "inline", "cpu")
    tasks = capture(lm, tmp_path, profile_model(lm, warmup=0, iters=1), top_n=None)
    assert sorted(t.output.dtype for t in tasks) == ["bfloat16", "float32"]
    assert all(t.dtype == "bfloat16" and t.calls == 1 for t in tasks)
    assert_reproduces(tmp_path, tasks)


def test_backend_is_recorded(tiny, tmp_path):
    lm, prof = tiny
    tasks = capture(lm, tmp_path, prof, top_n=1, backend="cuda")
    assert tasks[0].backend == "cuda"
    assert catalogue.signature(tasks[0]).declaration().startswith('extern "C" int kforge_launch(')


# ------------------------------------------------------------------ LLM-style sample models (slow)

@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("name, variant", [("gemma", "gemma"), ("qwen_moe", "llama")])
def test_decoder_samples_profile_and_capture(name, variant, tmp_path):
    from kforge_tui.workload.profile import format_profile

    t0 = time.perf_counter()
    lm = load_model(str(ROOT / "sample_models" / f"{name}.py"))
    prof = profile_model(lm, warmup=1, iters=1)
    print(f"\n{name}: build+profile {time.perf_counter() - t0:.1f}s\n{format_profile(prof, top=5)}")
    ops = {r.op for r in prof.rows}
    assert {"softmax", "rms_norm"} <= ops
    before = lm.run().clone() if name == "gemma" else lm.run().logits.clone()
    tasks = capture(lm, tmp_path, prof, top_n=None, max_calls=2)
    after = lm.run() if name == "gemma" else lm.run().logits
    assert torch.equal(before, after)
    soft = {t.shape for t in tasks if t.op == "softmax"}
    if name == "gemma":
        assert (2, 262144) in soft  # sampling softmax over the whole vocabulary
        assert (2, 4, 32, 32) in soft  # eager attention, 4 heads
    else:
        assert (32, 128) in soft  # router: 32 tokens x 128 experts
    norms = [t for t in tasks if t.op == "rms_norm"]
    assert norms and {t.params["variant"] for t in norms} == {variant}
    assert_reproduces(tmp_path, [t for t in tasks if t.op in ("softmax", "rms_norm")])


@pytest.mark.gpu
def test_capture_on_cuda_reproduces_exactly(tmp_path):
    lm = load_model(str(FIX / "tiny.py"), device="cuda")
    prof = profile_model(lm, warmup=1, iters=2)
    assert prof.device == "cuda" and prof.total_us > 0
    before = lm.run().clone()
    tasks = capture(lm, tmp_path, prof, top_n=None, backend="cuda")
    assert torch.equal(before, lm.run())
    assert tasks and all(t.backend == "cuda" for t in tasks)
    # saved on CPU; the reference is rerun on the GPU where the output was produced
    for t in tasks:
        for c in load_calls(tmp_path, t.task_id):
            inputs = {k: (v.cuda() if v is not None else None) for k, v in c["inputs"].items()}
            ref = catalogue.reference(t, inputs).cpu()
            assert torch.allclose(ref, c["output"], rtol=1e-5, atol=1e-6), t.task_id
