"""The cpu reduction kernels (codegen/rows, gen_cols and gen_rows) stay accurate on rows of equal
values, judged as the sandbox judges its edge cases (`judge_f64` against the float64 run, with
PyTorch's own error and its one-ulp sensitivity as allowance).

A float accumulator run along the whole reduced axis rounds at every add: gen_cols summed a
group_norm group of 1024 in one float chain, and on a diffusers VAE group_norm+silu region the
variance's rounding, divided by sqrt(var + eps), failed the "rows of equal values" edge case
(3.3e3 ulps) on about one draw in three. Each group constant is the sharpest form: the variance
is 0, so any error in the mean comes out multiplied by 1/sqrt(eps).
"""
from __future__ import annotations

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F

from kforge_tui.regions.build import tasks_of
from kforge_tui.sandbox.inputs import edge_into
from kforge_tui.sandbox.judge import MANTISSA, judge_f64
from kforge_tui.sandbox.references import reference64
from kforge_tui.search.codegen import rows

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

DRAWS = 24  # per kind of input
MAGNITUDES = (1e3, 1.0, 1e-3)


def _reduction(fn, args):
    [t] = [t for t in tasks_of(fn, args, "cpu") if t.kind == "reduction"]
    return t


def _group_norm_silu(shape, groups):
    """The VAE's region: channels-last float32 (as diffusers' AutoencoderKL captured it), eps 1e-6."""
    x = torch.randn(shape).to(memory_format=torch.channels_last)
    return _reduction(lambda x, w, b: F.silu(F.group_norm(x, groups, w, b, eps=1e-6)),
                      (x, torch.randn(shape[1]), torch.randn(shape[1])))


def _points(task) -> list[tuple[object, dict]]:
    """gen_cols at its default and at every valid splits=1 point; gen_rows at its default."""
    out = [(rows.CPU_COLS, rows.CPU_COLS.default(task))]
    for block in rows.CPU_COLS_SPACE["block"]:
        for math in rows.CPU_COLS_SPACE["math"]:
            p = {"block": block, "splits": 1, "math": math}
            if p not in [q for _, q in out] and rows.CPU_COLS.valid(task, p):
                out.append((rows.CPU_COLS, p))
    return out + [(rows.CPU_ROWS, rows.CPU_ROWS.default(task))]


def _launcher(task, design, p, tmp_path):
    """The design's render built as the sandbox builds it, called through the generic ABI."""
    from kforge_tui.sandbox.compile import compile_candidate_sync

    r = compile_candidate_sync(design.render(task, p), "cpu", "native", tmp_path / "cc",
                               header=task.header("cpu"))
    assert r.ok, r.log[-2000:]
    fn = ctypes.CDLL(r.lib_path).kforge_launch
    fn.restype = ctypes.c_int
    sig = task.signature("cpu")
    fn.argtypes = sig.argtypes()

    def launch(ins):
        outs = [torch.empty_strided(m.shape, m.strides, dtype=getattr(torch, m.dtype)).fill_(float("nan"))
                for m in task.outputs]
        assert fn(*sig.call_args(ins, outs)) == 0
        return outs
    return launch


def _perturbed(task, ins, gen):
    """PyTorch's outputs with every float input element moved by one ulp, a random sign each
    (the sandbox's `_perturbed_reference`)."""
    moved = []
    for t, m in zip(ins, task.inputs):
        eps = 2.0 ** -MANTISSA[m.dtype]
        f = torch.empty(t.shape, dtype=torch.float32).bernoulli_(0.5, generator=gen).mul_(2 * eps).add_(1 - eps)
        moved.append((t.float() * f).to(t.dtype))
    return task.reference(moved)


def _fresh(task):
    return [torch.empty_strided(m.shape, m.strides, dtype=getattr(torch, m.dtype)) for m in task.inputs]


def _groups_constant(task, groups, mag, gen):
    """x constant over each group (a random value of about `mag`, either sign), w and b ~ N(0, 1)."""
    ins = _fresh(task)
    x = ins[0]
    n, c = x.shape[:2]
    v = (torch.rand(n, c, generator=gen, dtype=torch.float64) + 0.5) * mag
    v = torch.where(torch.rand(n, c, generator=gen) < 0.5, -v, v)
    v = v.view(n, groups, -1)[:, :, :1].expand(n, groups, c // groups).reshape(n, c)  # a group's channels alike
    x.copy_(v[:, :, None, None].expand(x.shape).to(x.dtype))
    for t in ins[1:]:
        t.copy_(torch.randn(t.shape, generator=gen))
    return ins


def _judge(task, points, draws) -> dict:
    """{(design, params, kind, output): failures} over `draws` [(kind, inputs)] for every point."""
    ref64 = reference64(task, "cpu")
    fails = {}
    gen = torch.Generator().manual_seed(0)
    for kind, ins in draws:
        r64, r32, pert = ref64(ins), task.reference(ins), _perturbed(task, ins, gen)
        for name, p, launch in points:
            for j, (got, m) in enumerate(zip(launch(ins), task.outputs)):
                if judge_f64(r64[j].reshape(m.shape), r32[j].reshape(m.shape), got, m.dtype, kind,
                             pert[j].reshape(m.shape)) is not None:
                    key = (name, str(p), kind, f"out{j}")
                    fails[key] = fails.get(key, 0) + 1
    return fails


@pytest.mark.parametrize("shape,groups", [((1, 32, 32, 32), 32), ((1, 64, 16, 16), 16)])
def test_group_norm_silu_equal_rows(shape, groups, tmp_path):
    """The sandbox's own "rows of equal values" edge case and groups that are constant, at
    magnitudes 1e3, 1 and 1e-3: every point passes every draw."""
    task = _group_norm_silu(shape, groups)
    pts = _points(task)
    assert len([d for d, _ in pts if d is rows.CPU_COLS]) >= 2
    points = [(d.name, p, _launcher(task, d, p, tmp_path)) for d, p in pts]
    gen = torch.Generator().manual_seed(1)
    draws = []
    for _ in range(DRAWS):
        ins = _fresh(task)
        edge_into("equal_rows", task, ins, [None] * len(ins), gen)
        draws.append(("equal_rows", ins))
    for mag in MAGNITUDES:
        draws += [(f"groups constant ~{mag:g}", _groups_constant(task, groups, mag, gen)) for _ in range(DRAWS)]
    fails = _judge(task, points, draws)
    assert not fails, f"failed draws (of {DRAWS} each): {fails}"


# column reductions (gen_cols' home: the reduced dim is the outer one), every float dtype
COLUMN_CASES = {
    "var_mean": lambda x: torch.var_mean(x, 0),
    "sum": lambda x: x.sum(0),
    "mean": lambda x: x.mean(0),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_column_reductions_of_equal_values(case, dtype, tmp_path):
    """Columns of 4096 equal values (random ~1 and ~1e3, and the edge case's halves): the sum is
    N times the value, the variance 0, within the judge's ulps at every dtype."""
    dt = getattr(torch, dtype)
    task = _reduction(COLUMN_CASES[case], (torch.randn(4096, 64, dtype=dt),))
    pts = [(d, p) for d, p in _points(task) if d is rows.CPU_COLS][:3]
    points = [(d.name, p, _launcher(task, d, p, tmp_path)) for d, p in pts]
    gen = torch.Generator().manual_seed(2)
    draws = []
    for mag in (1.0, 1e3):
        for _ in range(8):
            v = (torch.rand(64, generator=gen, dtype=torch.float64) + 0.5) * mag
            draws.append((f"columns constant ~{mag:g}", [v.to(dt).expand(4096, 64).contiguous()]))
    for _ in range(8):
        v = torch.randint(-8, 9, (64,), generator=gen).to(torch.float64) / 2
        draws.append(("columns of halves", [v.to(dt).expand(4096, 64).contiguous()]))
    fails = _judge(task, points, draws)
    assert not fails, f"failed draws (of {len(draws) // 3} each): {fails}"
