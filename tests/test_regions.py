"""The region contract: graph capture, the partitioner's rules, the task data, the ABI header,
pattern matching and family adaptation. Everything runs the real torch.compile front end."""
from __future__ import annotations

import ctypes
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kforge_tui.regions import abi, patterns
from kforge_tui.regions.build import task_of, tasks_of
from kforge_tui.regions.graph import graph_key, ops_of, python_code, to_graph_module
from kforge_tui.regions.task import Task


def kinds(tasks):
    return sorted((t.kind, t.op) for t in tasks)


# ------------------------------------------------------------------ partition rules

def test_softmax_is_one_reduction_region_with_both_reductions():
    t = task_of(lambda x: torch.softmax(x, -1), (torch.randn(8, 64),))
    assert t.kind == "reduction"
    ops = ops_of(t.graph)
    assert "amax" in ops and "sum" in ops and "exp" in ops and "div" in ops


def test_chain_on_the_same_rows_fuses_into_one_region():
    def f(x, w, b):
        return torch.softmax(F.layer_norm(F.gelu(x), (64,), w, b), -1) * 2

    t = task_of(f, (torch.randn(4, 64), torch.randn(64), torch.randn(64)))
    ops = ops_of(t.graph)
    assert {"erf", "var_mean", "amax", "sum"} <= set(ops)
    assert len(t.inputs) == 3 and len(t.outputs) == 1


@pytest.mark.parametrize("name,fn,args", [
    ("rmsnorm_by_hand", lambda x: x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6),
     (torch.randn(16, 128),)),
    ("mingpt_newgelu", lambda x: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0)))),
     (torch.randn(16, 128),)),
])
def test_hand_written_ops_are_one_region(name, fn, args):
    t = task_of(fn, args)
    assert t.outputs[0].shape == (16, 128)


def test_batchnorm_relu_is_one_pointwise_region():
    bn = nn.BatchNorm2d(8).eval()
    bn.running_var.uniform_(0.5, 2.0)
    m = nn.Sequential(bn, nn.ReLU()).eval()
    t = task_of(m, (torch.randn(2, 8, 5, 5),))
    assert t.kind == "pointwise"
    ops = ops_of(t.graph)
    assert "relu" in ops and ("sqrt" in ops or "rsqrt" in ops)


def test_compute_ops_are_their_own_regions_with_their_views():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 4 * 4, 10)).eval()
    tasks = tasks_of(m, (torch.randn(2, 3, 4, 4),))
    ks = kinds(tasks)
    assert ("compute", "conv") in ks and ("compute", "linear") in ks
    lin = next(t for t in tasks if t.op == "linear")
    assert "permute" in ops_of(lin.graph)  # the weight's transpose belongs to the linear region
    assert any(m.shape == (10, 128) for m in lin.inputs)  # the raw weight is the input


def test_epilogue_never_spans_more_than_the_reduced_rows():
    # y is unrelated to the reduction and bigger than its input: x.mean() * y is two kernels
    def f(x, y):
        return x.mean() * y

    tasks = tasks_of(f, (torch.randn(16), torch.randn(64, 64)))
    assert len(tasks) == 2


def test_regions_form_a_dag_no_fusion_creates_a_cycle():
    # relu(x) feeds a matmul whose reduction meets relu(x) again: fusing the two chains
    # around the matmul would need the matmul's output before its input exists
    def f(x, w):
        y = torch.relu(x)
        z = y @ w
        return y + z.sum(-1, keepdim=True)

    from kforge_tui.regions import partition as P
    from kforge_tui.regions import trace

    seen = []

    def hook(gm, ex, inf, kw):
        part = P.partition(gm)
        seen.append(part)
        where = {n: i for i, r in enumerate(part.regions) for n in r.nodes}
        for i, r in enumerate(part.regions):
            for inp in r.inputs:
                assert where.get(inp, -1) < i, f"region {i} reads {inp.name} from a later region"
        return trace.eager_runner(gm)

    torch.compile(f, backend=trace.make_backend(hook))(torch.randn(8, 8), torch.randn(8, 8))
    assert seen and len(seen[0].regions) >= 3


def test_unsupported_regions_are_listed_with_a_reason():
    from kforge_tui.regions import partition as P
    from kforge_tui.regions import trace

    found = []

    def hook(gm, ex, inf, kw):
        found.extend(P.partition(gm).regions)
        return trace.eager_runner(gm)

    torch.compile(lambda x: x + torch.rand_like(x), backend=trace.make_backend(hook))(torch.randn(4))
    reasons = [r.unsupported for r in found if r.unsupported]
    assert any("random" in r for r in reasons)


# ------------------------------------------------------------------ task data and ABI

def test_task_round_trips_through_json_with_a_stable_key():
    t = task_of(lambda x: torch.softmax(x, -1), (torch.randn(8, 64),))
    t2 = Task.from_json(t.to_json())
    assert t2 == t and t2.key == t.key and t2.task_id == t.task_id
    other = task_of(lambda x: torch.softmax(x, -1), (torch.randn(8, 32),))
    assert other.key != t.key  # shapes are part of the identity


def test_same_code_different_names_same_graph_key():
    a = task_of(lambda x: torch.relu(x) * 3.0, (torch.randn(4, 4),))
    b = task_of(lambda y: torch.relu(y) * 3.0, (torch.randn(4, 4),))
    c = task_of(lambda y: torch.relu(y) * 2.0, (torch.randn(4, 4),))
    assert graph_key(a.graph) == graph_key(b.graph) != graph_key(c.graph)


def test_reference_is_the_regions_own_graph():
    t = task_of(lambda x, w: F.rms_norm(x, (32,), w, 1e-6), (torch.randn(4, 32), torch.randn(32)))
    x, w = torch.randn(4, 32), torch.randn(32)
    inputs = [x if m.shape == (4, 32) else w for m in t.inputs]
    torch.testing.assert_close(t.reference(inputs)[0], F.rms_norm(x, (32,), w, 1e-6))
    code = python_code(t.graph)
    assert "def forward" in code and "torch.ops.aten" in code


def test_header_declares_every_input_and_output_with_strides():
    t = task_of(lambda x: torch.relu(x.t()) + 1, (torch.randn(6, 4),))
    h = t.header("cuda")
    assert 'extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream);' in h
    assert "#define KF_IN0_SIZE_0 6LL" in h and "#define KF_IN0_STRIDE_1 1LL" in h
    assert "#define KF_NUM_OUTPUTS 1" in h
    assert "typedef __nv_bfloat16" not in h and "typedef float kf_in0_t;" in h
    assert "uint16_t" in abi.header((t.inputs[0].__class__("x", (2,), "bfloat16"),), t.outputs, "cpu")


def test_graph_module_rebuilds_and_runs_on_another_device_arg():
    t = task_of(lambda x: x + torch.ones_like(x), (torch.randn(3),))
    gm = to_graph_module(t.graph, "cpu")
    out = gm(torch.zeros(3))
    torch.testing.assert_close(out[0], torch.ones(3))


# ------------------------------------------------------------------ patterns

@pytest.mark.parametrize("fn,args,op,params", [
    (lambda x: torch.softmax(x, -1), (torch.randn(8, 64),), "softmax", {"dim": 1}),
    (lambda x: torch.log_softmax(x, 1), (torch.randn(8, 64),), "log_softmax", {"dim": 1}),
    (lambda x: x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6), (torch.randn(8, 64),),
     "rms_norm", {"eps": 1e-6}),
    (lambda x: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0)))),
     (torch.randn(8, 64),), "gelu", {"approximate": "tanh"}),
    (lambda x, w, b: F.group_norm(x, 4, w, b), (torch.randn(2, 16, 4, 4), torch.randn(16), torch.randn(16)),
     "group_norm", {"groups": 4}),
    (lambda x: F.silu(x[..., :32]) * x[..., 32:], (torch.randn(4, 64),), "silu_mul", {}),
])
def test_patterns_are_recognised_whatever_the_spelling(fn, args, op, params):
    t = task_of(fn, args)
    b = patterns.match(t)
    assert b is not None and b.op_task.op == op
    for k, v in params.items():
        assert b.op_task.params[k] == v


def test_a_region_that_only_looks_like_a_pattern_is_not_bound():
    t = task_of(lambda x: torch.softmax(x * 0.5, -1) + 1.0, (torch.randn(8, 64),))
    b = patterns.match(t)
    assert b is None or b.op_task.op != "softmax"


def _compile_cpu(src: str, header: str, tmp_path) -> ctypes.CDLL:
    (tmp_path / "kforge_region.h").write_text(header)
    (tmp_path / "k.cpp").write_text(src)
    subprocess.run(["g++", "-O2", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-o",
                    str(tmp_path / "k.so"), str(tmp_path / "k.cpp")], check=True, capture_output=True)
    return ctypes.CDLL(str(tmp_path / "k.so"))


@pytest.mark.parametrize("fn,args", [
    (lambda x, w: F.layer_norm(x, (64,), w), (torch.randn(8, 64), torch.randn(64))),
    (lambda x: F.silu(x[..., :32]) * x[..., 32:], (torch.randn(4, 64),)),
    (lambda x: x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6), (torch.randn(8, 64),)),
    # a Linear's [B*L, N] output viewed as [B, L, N] first: bound at the view's shape
    (lambda x: torch.softmax(x.view(2, 8, 64), -1), (torch.randn(16, 64),)),
])
def test_a_family_kernel_serves_a_region_through_its_binding(tmp_path, fn, args):
    from dataclasses import replace

    from kforge_tui.search.designs import designs_for

    t = task_of(fn, args)
    b = patterns.match(t)
    t = replace(t, pattern=b.op_task.op, params={"binding": b.to_json()})
    ds = [d for d in designs_for(t) if d.__class__.__name__ == "FamilyDesign"]
    assert ds, "no family design offered for a bound region"
    d = ds[0]
    lib = _compile_cpu(d.render(t, d.default(t)), t.header(), tmp_path)
    fnc = lib.kforge_launch
    fnc.restype, fnc.argtypes = ctypes.c_int, t.signature().argtypes()
    ins = [torch.randn(m.shape) for m in t.inputs]
    outs = [torch.full(m.shape, float("nan")) for m in t.outputs]
    assert fnc(*t.signature().call_args(ins, outs)) == 0
    torch.testing.assert_close(outs[0], t.reference(ins)[0], rtol=1e-4, atol=1e-5)


class _ViewThenGelu(torch.nn.Module):
    def forward(self, x):
        h = x.view(8, 64)
        return torch.nn.functional.gelu(h) * 2.0


def test_a_region_names_its_first_real_op_line_not_a_leading_view():
    """GPT-2's attention, GELU and LayerNorm all pointed at one `x.view(size_out)` line."""
    from kforge_tui.regions.build import tasks_of

    (t,) = [t for t in tasks_of(_ViewThenGelu(), (torch.randn(2, 4, 64),)) if "gelu" in t.op]
    assert "gelu(h)" in t.source and "view" not in t.source, t.source


class _Calls(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fn,args,op,native", [
    (lambda x, w, b: F.layer_norm(x, (96,), w, b), (torch.randn(2, 49, 96), torch.randn(96), torch.randn(96)),
     "layer_norm", "layer_norm"),
    (lambda x: torch.softmax(x, -1), (torch.randn(8, 64),), "softmax", "softmax"),
    (lambda x: F.silu(x[..., :32]) * x[..., 32:], (torch.randn(4, 64),), "silu_mul", "silu"),
    (lambda x: torch.softmax(x.view(2, 784, 96), -1), (torch.randn(1568, 96),), "softmax", "softmax"),
])
def test_eager_is_the_op_the_model_calls_where_a_pattern_binds_the_region(fn, args, op, native):
    """The region's graph is Inductor's decomposition (layer_norm as var_mean, sub, rsqrt, ...),
    which eager PyTorch never runs: "vs eager" must time the op itself."""
    from dataclasses import replace

    t = task_of(fn, args)
    b = patterns.match(t)
    t = replace(t, pattern=b.op_task.op, params={"binding": b.to_json()})
    ins = [torch.randn(m.shape) for m in t.inputs]
    expected = t.reference(ins)
    got = patterns.native_eager(t, ins, expected)
    assert got is not None and got[1] == f"{op} as PyTorch runs it"
    with _Calls() as calls:
        out = got[0](*ins)
    assert native in calls.names and "var_mean" not in calls.names and "amax" not in calls.names
    torch.testing.assert_close(out, expected[0], rtol=1e-4, atol=1e-5)


def test_eager_stays_the_regions_graph_where_the_op_does_not_reproduce_it():
    from dataclasses import replace

    t = task_of(lambda x: torch.softmax(x, -1), (torch.randn(8, 64),))
    b = patterns.match(t)
    ins = [torch.randn(8, 64)]
    assert patterns.native_eager(t, ins, t.reference(ins)) is None  # no binding: the graph
    t = replace(t, pattern="softmax", params={"binding": b.to_json()})
    wrong = [t.reference(ins)[0] + 1e-2]  # an output the op does not give: it is not this region
    assert patterns.native_eager(t, ins, wrong) is None


def test_a_pattern_is_matched_in_bounded_memory_whatever_the_regions_size(monkeypatch):
    """The numeric check compares in chunks (whole, a 6 GiB softmax ran out of an H100's memory
    and went unbound): chunks of a few elements decide as one comparison does."""
    monkeypatch.setattr(patterns, "CLOSE_CHUNK", 7)
    t = task_of(lambda x: torch.softmax(x, -1), (torch.randn(8, 64),))
    b = patterns.match(t)
    assert b is not None and b.op_task.op == "softmax"
    x = torch.randn(100)
    assert patterns.reproduces(x, x.clone(), patterns.CLOSE_CHUNK)
    y = x.clone()
    y[93] += 1.0  # in the last chunk
    assert not patterns.reproduces(x, y, patterns.CLOSE_CHUNK)
    z = x.clone()
    z[50] = float("nan")
    assert not patterns.reproduces(x, z, patterns.CLOSE_CHUNK)
    assert patterns.reproduces(z, z.clone(), patterns.CLOSE_CHUNK)


@pytest.mark.parametrize("fn,op", [
    (lambda x: F.gelu(x), "gelu"),
    (lambda x: F.gelu(x, approximate="tanh"), "gelu"),
    (lambda x: torch.softmax(x, -1), "softmax"),
    (lambda x: torch.log_softmax(x, -1), "log_softmax"),
    (lambda x: F.silu(x), "silu"),
    (lambda x: torch.relu(x), "relu"),
])
def test_a_region_too_big_to_check_numerically_is_bound_by_what_its_ops_spell(monkeypatch, fn, op):
    """Over CHECK_BYTES_CPU the numeric check is skipped: the binding must still be the op the
    graph computes (it was the first candidate of all, relu, for a GELU)."""
    monkeypatch.setattr(patterns, "CHECK_BYTES_CPU", 0)
    t = task_of(fn, (torch.randn(8, 64),))
    b = patterns.match(t)
    assert b is not None and b.op_task.op == op
    if op == "gelu":
        assert b.op_task.params["approximate"] == ("tanh" if "tanh" in str(t.graph) else "none")
    assert patterns.match(task_of(lambda x: torch.sin(x), (torch.randn(8, 64),))) is None


class _HandGelu(torch.nn.Module):  # as transformers' NewGELUActivation writes it
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def test_eager_of_a_hand_written_op_is_the_ops_the_model_runs():
    """A GELU the model spells out binds the gelu pattern (its families serve it), but eager
    PyTorch runs its mul, pow and tanh one by one: that is its eager figure, not F.gelu's."""
    from dataclasses import replace

    m = _HandGelu()
    t = task_of(m, (torch.randn(8, 64),))
    b = patterns.match(t)
    assert b is not None and b.op_task.op == "gelu" and "gelu" not in t.called.split()
    t = replace(t, pattern="gelu", params={"binding": b.to_json()})
    ins = [torch.randn(8, 64)]
    assert patterns.native_eager(t, ins, t.reference(ins)) is None
    called = task_of(torch.nn.GELU(approximate="tanh"), (torch.randn(8, 64),))
    assert "gelu" in called.called.split()
