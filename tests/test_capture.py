"""Region capture: the graph torch.compile sees, real tensors per region, exact reproduction,
unchanged model outputs, one task per distinct region, disk bounds, nothing dropped silently."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kforge_tui.regions.graph import ops_of
from kforge_tui.regions.task import load_calls
from kforge_tui.workload.capture import save_captures, trace_model
from kforge_tui.workload.loader import LoadedModel, load_model

FIX = Path(__file__).parent / "fixtures" / "models"
ROOT = Path(__file__).resolve().parent.parent


def loaded(model, *inputs, device="cpu") -> LoadedModel:
    return LoadedModel(model=model.eval(), example_inputs=tuple(inputs), spec="test", device=device)


@pytest.fixture(scope="module")
def tiny():
    lm = load_model(str(FIX / "tiny.py"))
    return lm, trace_model(lm, "cpu", max_calls=3)


def assert_reproduces(run_dir, tasks):
    """Reload every saved call and rerun the region's own graph: outputs must be bit-equal."""
    for t in tasks:
        calls = load_calls(run_dir, t.task_id)
        assert calls, t.task_id
        for c in calls:
            assert len(c["inputs"]) == len(t.inputs) and len(c["outputs"]) == len(t.outputs)
            for x, m in zip(c["inputs"], t.inputs):
                assert tuple(x.shape) == m.shape and x.stride() == m.strides  # real strides kept
            got = t.reference(c["inputs"])
            for g, o in zip(got, c["outputs"]):
                assert g.dtype == o.dtype and g.shape == o.shape and torch.equal(g, o), t.task_id
            for x, st in zip(c["inputs"], c["stats"]):
                if st and x.is_floating_point():
                    assert st["min"] == pytest.approx(float(x.float().min()))


def test_every_region_reproduces_its_captured_calls_exactly(tiny, tmp_path):
    lm, traced = tiny
    assert not traced.ref_mismatch
    tasks = traced.tasks()
    assert len(tasks) >= 8
    notes = save_captures(tmp_path, tasks, traced)
    assert set(notes) == {t.task_id for t in tasks}
    assert_reproduces(tmp_path, tasks)


def test_non_contiguous_inputs_become_tasks_with_their_strides(tiny):
    _, traced = tiny
    strided = [t for t in traced.tasks() if any(m.present and not m.contiguous for m in t.inputs)]
    assert strided, "the transposed softmax and the chunked halves are tasks, not skips"


def test_capture_leaves_model_outputs_unchanged(tiny):
    lm, _ = tiny
    before = lm.run().clone()
    trace_model(lm, "cpu")
    assert torch.equal(before, lm.run())


def test_identical_regions_are_one_task_with_all_their_calls():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.LayerNorm(32), nn.LayerNorm(32)
            self.l = nn.Linear(32, 32)

        def forward(self, x):
            return self.b(self.l(self.a(x)))

    traced = trace_model(loaded(Two(), torch.randn(4, 32)))
    norms = [r for r in traced.records.values() if r.task.op == "layer_norm"]
    assert len(norms) == 1 and norms[0].calls == 2 and len(norms[0].saved) == 2
    # each call's own input is kept (the second norm sees the linear's output)
    assert not torch.equal(norms[0].saved[0][0][0], norms[0].saved[1][0][0])


def test_max_calls_and_bytes_per_task_summarise_the_rest(tmp_path):
    layers = []
    for _ in range(5):  # a linear between norms keeps them apart (same rows would fuse)
        layers += [nn.LayerNorm(64), nn.Linear(64, 64)]
    m = nn.Sequential(*layers)
    traced = trace_model(loaded(m, torch.randn(16, 64)), max_calls=2)
    rec = next(r for r in traced.records.values() if r.task.op == "layer_norm")
    assert rec.calls == 5 and len(rec.saved) == 2
    small = trace_model(loaded(m, torch.randn(16, 64)), max_calls=3, max_bytes_per_task=9000)
    rec = next(r for r in small.records.values() if r.task.op == "layer_norm")
    assert len(rec.saved) == 1 and len(rec.summarised) == 2  # 16*64*4*2 + weights fits once
    assert all(len(s["sha1"][0]) == 40 for s in rec.summarised)
    notes = save_captures(tmp_path, [rec.task], small)
    assert "statistics" in notes[rec.task.task_id]
    assert json.loads((tmp_path / "captures" / rec.task.task_id / "summarised.json").read_text())


def test_output_dtype_and_backend_are_part_of_the_task():
    class M(nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1, dtype=torch.float32), torch.softmax(x, -1)

    traced = trace_model(loaded(M(), torch.randn(4, 16).bfloat16()), "cuda")
    outs = sorted(t.outputs[0].dtype for t in traced.tasks())
    assert outs == ["bfloat16", "float32"]
    assert all(t.backend == "cuda" for t in traced.tasks())


def test_unsupported_regions_are_listed_not_dropped():
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x) + torch.rand_like(x)

    traced = trace_model(loaded(M(), torch.randn(8)))
    assert any("random" in u.reason for u in traced.unsupported)


def test_graph_breaks_give_several_graphs_and_all_their_regions():
    class M(nn.Module):
        def forward(self, x):
            y = torch.softmax(x, -1)
            print("", end="")  # a graph break
            return torch.relu(y) * 2

    traced = trace_model(loaded(M(), torch.randn(4, 8)))
    assert traced.graphs == 2
    ops = {o for t in traced.tasks() for o in ops_of(t.graph)}
    assert {"amax", "relu"} <= ops


def test_patterns_name_the_regions_they_fit(tiny):
    _, traced = tiny
    names = {t.op for t in traced.tasks()}
    assert {"group_norm", "log_softmax"} & names
    bound = [t for t in traced.tasks() if t.pattern]
    assert bound and all("binding" in t.params for t in bound)


# ------------------------------------------------------------------ sample models (slow)

@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("name", ["gemma", "qwen_moe"])
def test_decoder_samples_capture_and_reproduce(name, tmp_path):
    t0 = time.perf_counter()
    lm = load_model(str(ROOT / "sample_models" / f"{name}.py"))
    traced = trace_model(lm, "cpu", max_calls=2)
    print(f"\n{name}: {len(traced.records)} tasks in {time.perf_counter() - t0:.1f}s")
    assert not traced.ref_mismatch
    tasks = traced.tasks()
    assert any(t.kind == "reduction" for t in tasks) and any(t.kind == "compute" for t in tasks)
    save_captures(tmp_path, tasks, traced)
    assert_reproduces(tmp_path, [t for t in tasks if t.kind != "compute"][:6])


@pytest.mark.gpu
def test_capture_on_cuda_reproduces_exactly(tmp_path):
    lm = load_model(str(FIX / "tiny.py"), device="cuda")
    before = lm.run().clone()
    traced = trace_model(lm, "cuda")
    assert torch.equal(before, lm.run())
    assert not traced.ref_mismatch
    tasks = traced.tasks()
    assert tasks and all(t.backend == "cuda" for t in tasks)
    save_captures(tmp_path, tasks, traced)
    for t in tasks:  # saved on the CPU; the reference reruns on the GPU that produced them
        for c in load_calls(tmp_path, t.task_id):
            got = t.reference([x.cuda() if x is not None else None for x in c["inputs"]])
            for g, o in zip(got, c["outputs"]):
                assert torch.allclose(g.cpu(), o, rtol=1e-5, atol=1e-6), t.task_id
