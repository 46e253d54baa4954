"""Models kforge had never seen (tests/fixtures/unseen/): what trying them found, kept fixed.

Each test loads a fixture through the real MODEL-spec loader and checks one class of graph or
model end to end on the CPU: what the capture lists, what the profile says, what the graph
rewrite puts into the compiled model and that its outputs equal eager's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kforge_tui.integrate import runtime as rt
from kforge_tui.regions import graph as G
from kforge_tui.regions import partition as P
from kforge_tui.regions.build import tasks_of
from kforge_tui.workload.capture import trace_model
from kforge_tui.workload.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
U = "tests/fixtures/unseen/"


def _load(name: str):
    return load_model(str(ROOT / U / f"{name}.py"), "cpu")


def _kforge(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LITELLM_LOCAL_MODEL_COST_MAP="True")
    return subprocess.run([sys.executable, "-m", "kforge_tui", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def _call(model, inputs):
    with torch.inference_mode():
        return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flat(v)]
    return []


# ------------------------------------------------------------------ the graph rewrite

class _GraphKernel(rt.Kernel):
    """A stand-in for a compiled kernel: the region's own graph, counted when it runs (it has
    no library, so the runtime keeps its calls in Python)."""

    def __init__(self, task):
        self.task_id, self.key, self.graph, self.cuda = task.task_id, task.key, task.graph, False
        self.site_key = task.site_key
        self.inputs = [(tuple(m.shape), getattr(torch, m.dtype), tuple(m.strides)) for m in task.inputs]
        self.outputs = [(tuple(m.shape), getattr(torch, m.dtype), tuple(m.strides))
                        for m in task.outputs]


class _GraphRuntime(rt.Runtime):
    """Runs each region's graph; records calls whose input strides differ from the task's (a
    real kernel would have fallen back to PyTorch on those)."""

    def run(self, key, tensors):
        k = self.kernels[key]
        self._py_counts[k.task_id] += 1
        got = [tuple(t.stride()) for t in tensors]
        if got != [st for _, _, st in k.inputs]:
            self.fallback_counts[f"{k.task_id}: {got} != {k.inputs}"] = 1
        return [t.clone() for t in G.run(k.graph, list(tensors))]


def _apply_graph_kernels(name: str, mode: str):
    loaded = _load(name)
    model, inputs = loaded.model, loaded.example_inputs
    ref = _flat(_call(model, inputs))
    tasks = tasks_of(model, inputs)
    runtime = _GraphRuntime([_GraphKernel(t) for t in tasks])
    torch._dynamo.reset()
    rt.install(model, runtime, "cpu", mode=mode)
    try:
        got = _flat(_call(model, inputs))
    finally:
        rt.uninstall(model)
    assert len(got) == len(ref)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    return tasks, runtime


def test_inductor_hands_kernels_the_strides_they_were_verified_on():
    """channels_last convs inside torch.compile: Inductor treated the inserted op as free of
    layout constraints and passed the second conv a contiguous buffer, so its kernel fell back
    on every call. The op now requires exact strides (the verified ones)."""
    tasks, runtime = _apply_graph_kernels("channels_last", "compile")
    assert runtime.fallbacks == {}
    convs = [t.task_id for t in tasks if t.op == "conv"]
    assert len(convs) == 2 and all(runtime.counts[c] == 1 for c in convs)
    assert all(n == 1 for n in runtime.replaced.values()), runtime.replaced


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_adjacent_regions_with_winners_are_all_replaced(mode):
    """dict_outputs: a linear feeding a fused relu+softmax+sum+max chain. Both regions have a
    kernel; replacing the first used to rewire the second's input before its key was read, so
    only the first went in (the second was silently left out)."""
    tasks, runtime = _apply_graph_kernels("dict_outputs", mode)
    assert sorted(t.op for t in tasks) == ["linear", "relu+softmax+sum+…"]
    assert all(n == 1 for n in runtime.replaced.values()), runtime.replaced
    assert all(n == 1 for n in runtime.counts.values()), runtime.counts
    assert runtime.fallbacks == {}


# ------------------------------------------------------------------ the end-to-end comparison

def test_stateful_model_that_mutates_its_input_is_compared_from_the_same_state():
    """input_mutation: x.sub_(running mean) and a buffer updated in place. Each compared
    forward used to see the input and buffer the previous one left: 76/128 elements differed
    between two runs of the same eager model, and a float64 run of the mutated state then
    'accepted' it (so a wrong kernel would have passed as well)."""
    from kforge_tui.integrate import accuracy

    loaded = _load("input_mutation")
    model, inputs = loaded.model, loaded.example_inputs
    x0, mean0 = inputs[0].clone(), model.mean.clone()
    state = accuracy.State(model)
    a = accuracy.forward(model, inputs, state)
    b = accuracy.forward(model, inputs, state)
    assert torch.equal(a[0][1], b[0][1])
    assert torch.equal(inputs[0], x0)  # the example input is left as it was
    state.restore()
    assert torch.equal(model.mean, mean0)
    # without the state put back, the same model gives another answer: what was compared
    c = accuracy.forward(model, inputs)
    d = accuracy.forward(model, inputs)
    assert not torch.allclose(c[0][1], d[0][1])
    assert accuracy.compare(a, b)["within_tolerance"]


def test_dataclass_outputs_are_compared_and_nothing_to_compare_is_not_a_pass():
    from kforge_tui.integrate import accuracy

    loaded = _load("dataclass_out")
    out = accuracy.forward(loaded.model, loaded.example_inputs)
    assert [n for n, _ in out] == ["out.logits", "out.hidden"]
    bad = [(n, t + 1.0) for n, t in out]
    assert not accuracy.compare(out, bad)["within_tolerance"]
    none = accuracy.compare([], [])
    assert not none["within_tolerance"] and "no tensor kforge can compare" in none["notes"][0]


def test_fresh_inputs_keep_strides_and_reach_into_containers():
    """Fresh inputs were contiguous (a kernel verified on a transposed input never ran on them:
    the compiled graph was another one) and tensors inside dicts and lists were not renewed."""
    from kforge_tui.integrate import accuracy

    loaded = _load("noncontig")
    a, b, c = loaded.example_inputs
    fa, fb, fc = accuracy.fresh_like(loaded.example_inputs, seed=1)
    assert (fa.stride(), fb.stride(), fc.stride()) == (a.stride(), b.stride(), c.stride())
    assert not torch.equal(fa, a) and torch.equal(fc, fc[:1, :1].expand(4, 8, 6))
    loaded = _load("container_inputs")
    (batch, extras), = [accuracy.fresh_like(loaded.example_inputs, seed=2)]
    assert set(batch) == {"x", "mask"} and isinstance(extras, list) and len(extras) == 2
    assert not torch.equal(batch["x"], loaded.example_inputs[0]["x"])
    assert not torch.equal(extras[1], loaded.example_inputs[1][1])


# ------------------------------------------------------------------ what the partition lists

def _partition_of(name):
    loaded = _load(name)
    parts = []

    def hook(gm, example_inputs, is_inference, kwargs):
        parts.append(P.partition(gm))
        from kforge_tui.regions import trace

        return trace.eager_runner(gm)

    from kforge_tui.regions import trace

    torch._dynamo.reset()
    compiled = torch.compile(loaded.model, backend=trace.make_backend(hook), dynamic=False)
    _call(compiled, loaded.example_inputs)
    return loaded, parts


def test_zero_sized_region_is_skipped_not_a_pattern():
    """`empty * 3 + 1` on a [0, 8] tensor: every pattern "reproduces" an empty output, so it
    used to be named `relu` and searched; now it is listed as skipped."""
    loaded, parts = _partition_of("zero_size")
    skipped = [s for p in parts for s in p.skipped]
    assert ("mul+add", "zero elements: nothing to compute") in skipped
    traced = trace_model(loaded, "cpu", max_calls=1)
    for t in traced.tasks():
        assert all(m.numel > 0 for m in t.outputs), (t.op, t.outputs)
    assert sorted(t.op for t in traced.tasks()) == ["linear", "relu+mul", "sum"]


def test_input_free_constant_chains_are_not_targets():
    """F.interpolate's index arithmetic (iota, mul, convert) depends on no input: it used to be
    two `interpolate` regions that the search ranked first on a noisy profile."""
    loaded, parts = _partition_of("channels_last")
    skipped = [s for p in parts for s in p.skipped]
    assert skipped.count(("interpolate (its part that depends on no input)", "the same values every call")) == 2
    traced = trace_model(loaded, "cpu", max_calls=1)
    assert all(t.inputs for t in traced.tasks())
    assert {"conv", "_unsafe_index", "batch_norm+silu", "mean"} <= {t.op for t in traced.tasks()}
    # channels_last strides are kept: the first conv's input is NHWC
    conv = next(t for t in traced.tasks() if t.op == "conv" and t.inputs[0].shape[1] == 3)
    assert conv.inputs[0].strides == (192, 1, 24, 3)


def test_expanded_input_is_unsupported_with_its_reason():
    """A model input made with expand (stride 0) could not take test values in the sandbox:
    the whole run stopped at its baseline. It is now an unsupported region, with the reason."""
    loaded = _load("noncontig")
    traced = trace_model(loaded, "cpu", max_calls=1)
    reasons = [u.reason for u in traced.unsupported]
    assert len(reasons) == 1 and "overlaps itself in memory (an expanded tensor)" in reasons[0]
    assert "[4, 8, 6] with strides [0, 0, 1]" in reasons[0]
    # the other region (on a transposed input) is still a target, with its real strides
    (t,) = traced.tasks()
    assert t.op == "sub+abs" and t.inputs[0].strides == (48, 1, 6)
    assert P._overlaps(torch.empty(3, 1).expand(3, 4))
    assert not P._overlaps(torch.empty(4, 6).t()) and not P._overlaps(torch.empty(2, 8)[:, ::2])


# ------------------------------------------------------------------ graph breaks

def test_graph_breaks_are_reported_in_one_line_each():
    loaded = _load("graph_break")
    traced = trace_model(loaded, "cpu", max_calls=1)
    assert traced.graphs == 3
    text = "\n".join(traced.breaks)
    assert "Data-dependent branching" in text and "graph_break.py:14" in text
    assert "Tensor.item()" in text
    assert all("\n" not in b for b in traced.breaks)


@pytest.mark.parametrize("name, why", [("rnn_unfold", "Dynamo does not support RNN, GRU, or LSTM"),
                                       ("scripted_sub", "torch.jit.script/freeze modules unsupported")])
def test_a_model_dynamo_does_not_capture_says_why(name, why):
    """nn.GRU/nn.LSTM or a TorchScript submodule make dynamo give up on the whole forward: no
    graph, and the profile used to say only 'no region kforge can write a kernel for'."""
    from kforge_tui.workload.profile import profile_regions

    loaded = _load(name)
    traced = trace_model(loaded, "cpu", max_calls=1)
    assert traced.graphs == 0
    prof = profile_regions(loaded, traced, compile_top=0, budget_s=0.01)
    assert any(n.startswith("torch.compile captured no graph") and why in n
               for n in prof.notes), prof.notes


def test_a_forward_without_tensor_ops_says_so():
    from kforge_tui.workload.profile import profile_regions

    loaded = _load("no_tensor_ops")
    traced = trace_model(loaded, "cpu", max_calls=1)
    prof = profile_regions(loaded, traced, compile_top=0, budget_s=0.01)
    assert prof.rows == []
    assert "torch.compile captured no graph: the forward does no tensor operation" in prof.notes


def test_profile_shares_never_exceed_the_forward(monkeypatch):
    """Regions timed alone on a busy machine can add up to more than the forward timed whole:
    one row said 5661.8 %."""
    from kforge_tui.workload import profile as prof_mod

    def fake_timer(self, fn, budget_s=0.2, max_iters=50):
        return 10.0 if max_iters == 20 else 40.0  # the forward, then each region

    monkeypatch.setattr(prof_mod._Timer, "__call__", fake_timer)
    loaded = _load("scalar_args")
    traced = trace_model(loaded, "cpu", max_calls=1)
    prof = prof_mod.profile_regions(loaded, traced, compile_top=0)
    assert prof.rows and all(0 < r.share <= 1.0 for r in prof.rows)
    assert sum(r.share for r in prof.rows) == pytest.approx(1.0)


# ------------------------------------------------------------------ the command line

def test_json_output_stays_json_when_the_model_prints():
    """A model that prints in its forward used to put its lines into `--json` output."""
    p = _kforge("profile", U + "graph_break.py", "--device", "cpu", "--compile-top", "0", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert {r["op"] for r in data["rows"]} >= {"linear", "sigmoid+mul"}
    assert any(n.startswith("graph break: Data-dependent branching") for n in data["notes"])
    assert "scale 0.891" in p.stderr  # the model's own print is not lost, it goes to stderr
    assert "Graph break from `Tensor.item()`" not in p.stderr  # dynamo's dozen-line warning
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("name, needle", [
    ("syntax_error", "syntax_error.py:3: syntax error: invalid syntax"),
    ("forward_raises", "the model's forward raised ValueError: expected 7 features, got 5"),
])
def test_bad_models_exit_2_with_one_line(name, needle):
    p = _kforge("profile", U + f"{name}.py", "--device", "cpu")
    assert p.returncode == 2
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("kforge: error:")]
    assert len(errors) == 1 and needle in errors[0], p.stderr
    assert "Traceback" not in p.stderr


def test_a_linear_without_bias_is_labelled_linear():
    """nn.Linear(bias=False) lowers to mm: it was listed as `matmul`, unlike its biased twin."""
    loaded = _load("container_inputs")
    tasks = tasks_of(loaded.model, loaded.example_inputs)
    assert sorted(t.op for t in tasks) == ["linear", "mul+add+log_softmax"]
    assert tasks_of(lambda a, b: a @ b, (torch.randn(3, 4), torch.randn(4, 5)))[0].op == "matmul"


def test_fresh_integer_inputs_are_values_the_model_accepts():
    """Targets with ignore_index=-100 were redrawn anywhere in [-100, 9]: cross_entropy raised
    'Target -43 is out of bounds' and the whole end-to-end check was skipped."""
    from kforge_tui.integrate import accuracy

    loaded = _load("fft_loss")
    x, target = loaded.example_inputs
    fx, ft = accuracy.fresh_like(loaded.example_inputs, seed=3)
    assert set(ft.tolist()) <= set(target.tolist()) and not torch.equal(fx, x)
    for seed in range(1, 6):  # the model's own forward takes every draw
        _call(loaded.model, accuracy.fresh_like(loaded.example_inputs, seed=seed))
