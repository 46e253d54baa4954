"""Generated kernels (kforge_tui/search/codegen): every pointwise chain and reduction region of
a sweep of small PyTorch snippets gets designs; their cpu renders compile with g++, run through
the generic ABI on real tensors (outputs poisoned with NaN, allocated with their exact strides)
and match the region's PyTorch reference; cuda renders compile with nvcc (run on a GPU by
test_codegen_gpu.py).

The helper here is deliberately local (g++ + ctypes in this process): it does not depend on the
sandbox worker/pool.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import random
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kforge_tui.regions.build import tasks_of

GXX = shutil.which("g++")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-4}
BF, HF = torch.bfloat16, torch.float16


# ------------------------------------------------------------------------------ cases

def _bn_relu():
    bn = torch.nn.BatchNorm2d(8).eval()
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 2.0)
        bn.running_mean.normal_()
        bn.weight.normal_()
        bn.bias.normal_()
    return lambda x: torch.relu(bn(x)), (torch.randn(2, 8, 7, 7),)


def _silu_mul(dt):
    def f(x):
        a, b = x.chunk(2, -1)
        return F.silu(a) * b
    return f, (torch.randn(7, 2000, dtype=dt),)


def _split_heads(x, c):
    """q/k/v heads split from one projection (GQA: q wider), a RoPE-style half of k: one region
    whose outputs lie on three iteration spaces."""
    q, k, v = x.split([64, 32, 32], -1)
    q = q.view(2, 16, 4, 16).transpose(1, 2)
    k = k.view(2, 16, 2, 16).transpose(1, 2)
    return q * c, -k[..., 8:], v.view(2, 16, 2, 16).transpose(1, 2) * 2


def _rms_hand(x):
    return x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6)


def _rms_hf(x, w):
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + 1e-6)
    return w * h.to(x.dtype)


def _gelu_ln_softmax(x, w, b):
    return torch.softmax(F.layer_norm(F.gelu(x), (x.shape[-1],), w, b), -1)


def _int_ops(i, j):
    return (i * 3 + j) // 2 % 5 - torch.bitwise_and(i, 6) + torch.where(i > j, i, j).abs()


def _bool_ops(a, b):
    return ((a > 0) & (b < 0.5)) | ~(a == b) ^ torch.logical_not(a < -1)


def _nan_ops(x):
    return torch.nan_to_num(x) + x.isnan().float() + x.isinf().float() + torch.relu(x) + torch.maximum(x, -x)


def _ce(x, t):
    return F.cross_entropy(x, t)


def _ties(shape):
    return lambda m: torch.randint(-3, 3, m.shape).to(getattr(torch, m.dtype))


def _pos(m):
    return torch.rand(m.shape, dtype=torch.float64).add(0.5).to(getattr(torch, m.dtype))


def _with_nan(m):
    x = torch.randn(m.shape, dtype=torch.float64)
    x.view(-1)[::7] = float("nan")
    x.view(-1)[3::11] = float("inf")
    x.view(-1)[5::13] = -float("inf")
    return x.to(getattr(torch, m.dtype))


# id -> (callable, example args, input generator or None)
CASES = {
    # ------------------------------------------------------------ pointwise
    "newgelu_f32": (lambda x: 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0)))),
                    (torch.randn(7, 1000),), None),
    "gelu_erf_bf16": (lambda x: F.gelu(x), (torch.randn(3, 4097, dtype=BF),), None),
    "gelu_tanh_f16": (lambda x: F.gelu(x, approximate="tanh"), (torch.randn(5, 1000, dtype=HF),), None),
    "silu_mul_bf16": (*_silu_mul(BF), None),
    "silu_mul_f32": (*_silu_mul(torch.float32), None),
    "bn_relu": (*_bn_relu(), None),
    "residual_bias": (lambda x, r, b: torch.relu(x + b) + r, (torch.randn(16, 1000), torch.randn(16, 1000),
                                                              torch.randn(1000)), None),
    "where_mask": (lambda x, m: torch.where(m, x, 0.0).masked_fill(~m & (x > 1), float("-inf")),
                   (torch.randn(7, 33), torch.rand(7, 33) > 0.5), None),
    "clamp_round": (lambda x: x.clamp(-1, 1).floor() + torch.remainder(x, 3) + torch.fmod(x, 2) + x.sign()
                    + torch.div(x, 3, rounding_mode="floor") + torch.div(x, 0.7, rounding_mode="trunc")
                    + x.round() + x.ceil() + x.trunc(), (torch.randn(9, 100) * 5,), None),
    "activations_f16": (lambda x: F.hardtanh(x) + F.leaky_relu(x) + F.elu(x) + F.softplus(x) + F.hardswish(x)
                        + F.mish(x) + F.relu6(x) + F.hardsigmoid(x) + torch.sigmoid(x) + F.silu(x),
                        (torch.randn(4, 1000, dtype=HF),), None),
    "pow_exp_log": (lambda a, b: a ** b + 2 ** b + a.pow(0.5) + b.exp2() + b.expm1() + a.log1p() + a.rsqrt()
                    + a.log() + a.log2() + torch.reciprocal(a) + a.pow(-2),
                    (torch.rand(7, 33) + 0.5, torch.randn(7, 33)), _pos),
    "trig_f64": (lambda x: torch.sin(x) * torch.cos(x) + torch.tanh(x) + torch.erf(x) + torch.erfc(x)
                 + torch.atan(x) + torch.sigmoid(x), (torch.randn(7, 7, dtype=torch.float64),), None),
    "transposed_in": (lambda a, b: a * b + a.exp(), (torch.randn(33, 17).t(), torch.randn(17, 33)), None),
    "strided_slice": (lambda x: x * 2 + 1, (torch.randn(8, 64)[:, ::2],), None),
    "broadcast_outer": (lambda x, y: x * y - x, (torch.randn(17, 1), torch.randn(1, 33)), None),
    "two_outputs": (lambda x, w: ((x * w), (x * w).relu().sum(-1)), (torch.randn(6, 40), torch.randn(40)), None),
    "cast_chain": (lambda x: (x.half() * 3).float() + x.to(torch.bfloat16).float(), (torch.randn(5, 77),), None),
    "int_ops": (_int_ops, (torch.randint(-9, 9, (7, 33)), torch.randint(-9, 9, (7, 33), dtype=torch.int32)), None),
    "bool_ops": (_bool_ops, (torch.randn(7, 33), torch.randn(7, 33)), None),
    "nan_inf": (_nan_ops, (torch.randn(5, 50),), _with_nan),
    "bn_relu_channels_last": (lambda x, s, b: torch.relu(x * s[:, None, None] + b[:, None, None]),
                              (torch.randn(2, 8, 7, 7).to(memory_format=torch.channels_last), torch.randn(8),
                               torch.randn(8)), None),
    "bcast_outputs": (lambda x, w: (x * w.exp(), w.exp()), (torch.randn(6, 40), torch.randn(40)), None),
    "size_one": (lambda x, y: x * y + 1, (torch.randn(1), torch.randn(1, 1)), None),
    "split_heads": (_split_heads, (torch.randn(2, 16, 128), torch.randn(16, 16)), None),
    "split_heads_bf16": (_split_heads, (torch.randn(2, 16, 128, dtype=BF), torch.randn(16, 16, dtype=BF)), None),
    # ------------------------------------------------------------ reductions
    "softmax_f32": (lambda x: torch.softmax(x, -1), (torch.randn(7, 1000),), None),
    "softmax_dim0": (lambda x: torch.softmax(x, 0), (torch.randn(33, 40),), None),
    "log_softmax_bf16": (lambda x: torch.log_softmax(x, -1), (torch.randn(4, 4097, dtype=BF),), None),
    "layer_norm_f32": (lambda x, w, b: F.layer_norm(x, (1000,), w, b),
                       (torch.randn(7, 1000), torch.randn(1000), torch.randn(1000)), None),
    "layer_norm_bf16": (lambda x, w, b: F.layer_norm(x, (512,), w, b),
                        (torch.randn(6, 512, dtype=BF), torch.randn(512, dtype=BF), torch.randn(512, dtype=BF)),
                        None),
    "rms_hand": (_rms_hand, (torch.randn(3, 4097),), None),
    "rms_hf_bf16": (_rms_hf, (torch.randn(5, 1024, dtype=BF), torch.randn(1024, dtype=BF)), None),
    "group_norm": (lambda x, w, b: F.group_norm(x, 4, w, b), (torch.randn(2, 8, 7, 7), torch.randn(8),
                                                                torch.randn(8)), None),
    "batch_norm_train": (lambda x: F.batch_norm(x, None, None, training=True), (torch.randn(4, 3, 7, 7),), None),
    "mean_dim0": (lambda x: x.mean(0), (torch.randn(1000, 7),), None),
    "mean_hw_channels_last": (lambda x: x.mean((2, 3)), (torch.randn(2, 8, 7, 7).to(memory_format=torch.channels_last),),
                              None),
    "mean_hw": (lambda x: x.mean((2, 3)), (torch.randn(2, 8, 7, 7),), None),
    "sum_transposed": (lambda x: x.sum(0), (torch.randn(40, 33).t(),), None),
    "mse": (lambda a, b: F.mse_loss(a, b), (torch.randn(40, 33), torch.randn(40, 33)), None),
    "l1_huber": (lambda a, b: F.l1_loss(a, b) + F.smooth_l1_loss(a, b),
                 (torch.randn(64, 33), torch.randn(64, 33)), None),
    "kl_div": (lambda a, b: F.kl_div(a, b, reduction="batchmean"), (torch.randn(8, 33), torch.rand(8, 33)), None),
    "cross_entropy": (_ce, (torch.randn(8, 33), torch.randint(0, 33, (8,))), None),
    "argmax_ties": (lambda x: (x.argmax(1), x.argmin(0)), (torch.randn(7, 33),), _ties(None)),
    "max_dim_ties": (lambda x: x.max(1), (torch.randn(7, 33),), _ties(None)),
    "amax_nan": (lambda x: x.amax(-1) + x.amin(-1), (torch.randn(7, 33),), _with_nan),
    "var_std": (lambda x: (x.var(1), x.std(1, correction=0)), (torch.randn(7, 100) + 3,), None),
    "var_mean": (lambda x: torch.var_mean(x, -1, keepdim=True), (torch.randn(7, 100),), None),
    "prod_any_all": (lambda x: (x.prod(1), (x > 1).any(1), (x > -2).all(1)), (torch.rand(7, 9) + 0.5,), None),
    "logsumexp": (lambda x: x.logsumexp(1), (torch.randn(7, 1000),), None),
    "gelu_ln_softmax": (_gelu_ln_softmax, (torch.randn(6, 256), torch.randn(256), torch.randn(256)), None),
    "sum_dtype_bool": (lambda x: ((x > 0).sum(-1), x.sum(-1, dtype=torch.float64)), (torch.randn(7, 33),), None),
    "full_reduce_f16": (lambda x: x.sum() + x.amax(), (torch.randn(33, 70, dtype=HF),), None),
}


def make_input(m, gen, device="cpu"):
    """A fresh input with the meta's exact strides (on `device`; `.cuda()` would make a
    non-dense tensor contiguous)."""
    dt = getattr(torch, m.dtype)
    if gen is not None:
        x = gen(m)
    elif m.dtype in ("float32", "float16", "bfloat16", "float64"):
        x = torch.randn(m.shape, dtype=dt)
    elif m.dtype == "bool":
        x = torch.rand(m.shape) > 0.5
    else:
        x = torch.randint(-9, 9, m.shape, dtype=dt)
    if x.dtype != dt:
        x = x.to(dt)
    out = torch.empty_strided(m.shape, m.strides, dtype=dt, device=device)
    out.copy_(x)
    return out


def poisoned(m, device="cpu"):
    t = torch.empty_strided(m.shape, m.strides, dtype=getattr(torch, m.dtype), device=device)
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-77)
    return t


def compare(outs, refs) -> str:
    """'' when every output matches its reference (tolerance relative to max|ref|, NaN where
    the reference has NaN, infinities equal, integers exact), else what differs."""
    for k, (o, r) in enumerate(zip(outs, refs)):
        o, r = o.cpu(), r.cpu()
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"out{k}: {o.shape} {o.dtype} != {r.shape} {r.dtype}"
        if not r.is_floating_point():
            bad = int((o != r).sum())
            if bad:
                return f"out{k}: {bad} integer elements differ"
            continue
        rd, od = r.double(), o.double()
        if not torch.equal(rd.isnan(), od.isnan()):
            return f"out{k}: NaN pattern differs ({int(rd.isnan().sum())} vs {int(od.isnan().sum())})"
        fin = rd.isfinite()
        if not torch.equal(rd[~fin & ~rd.isnan()], od[~fin & ~rd.isnan()]):
            return f"out{k}: infinities differ"
        if not bool(od[fin].isfinite().all()):
            return f"out{k}: non-finite where the reference is finite"
        scale = float(rd[fin].abs().max()) if bool(fin.any()) else 1.0
        err = float((rd[fin] - od[fin]).abs().max()) if bool(fin.any()) else 0.0
        if err > TOL[r.dtype] * max(scale, 1e-30):
            return f"out{k}: max error {err:.3g} > {TOL[r.dtype]} x {scale:.3g}"
    return ""


def designs_of(task) -> list:
    from kforge_tui.search.codegen import pointwise, rows

    return pointwise.generate(task) + rows.generate(task)


def points(design, task, extra: int = 2) -> list[dict]:
    """The default point and up to `extra` valid neighbours (one parameter changed each)."""
    p0 = design.default(task)
    out = [p0]
    order = list(design.space.items())
    rnd = random.Random(task.task_id + design.name)
    rnd.shuffle(order)
    for k, vals in order:
        if len(out) > extra:
            break
        for v in vals:
            q = {**p0, k: v}
            if v != p0[k] and design.valid(task, q) and q not in out:
                out.append(q)
                break
    return out


def compile_cpu(task, src: str, root: Path) -> Path:
    h = hashlib.sha1((src + task.header("cpu")).encode()).hexdigest()[:16]
    d = root / h
    so = d / "k.so"
    if so.exists():
        return so
    d.mkdir(parents=True, exist_ok=True)
    (d / "kforge_region.h").write_text(task.header("cpu"))
    (d / "k.cpp").write_text(src)
    r = subprocess.run([GXX, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                        "k.cpp", "-o", "k.so"], cwd=d, capture_output=True, text=True)
    if r.returncode:
        raise AssertionError(f"g++ failed in {d}:\n{r.stderr[:3000]}")
    return so


def run_cpu(task, so: Path, inputs: list) -> list:
    lib = ctypes.CDLL(str(so))
    fn = lib.kforge_launch
    fn.restype = ctypes.c_int
    sig = task.signature("cpu")
    fn.argtypes = sig.argtypes()
    outs = [poisoned(m) for m in task.outputs]
    args = sig.call_args(inputs, outs)
    rc = fn(*args)
    assert rc == 0, f"kforge_launch returned {rc}"
    return outs


_TASKS: dict = {}


def case_tasks(case: str, backend: str = "cpu") -> list:
    key = (case, backend)
    if key not in _TASKS:
        fn, args, _ = CASES[case]
        _TASKS[key] = [t for t in tasks_of(fn, args, backend) if t.kind in ("pointwise", "reduction")]
    return _TASKS[key]


# ------------------------------------------------------------------------------ tests

def test_at_least_25_snippets():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_fused_region_gets_a_design(case):
    tasks = case_tasks(case)
    assert tasks, f"{case}: no pointwise/reduction region"
    from kforge_tui.search.codegen.ir import region_of
    from kforge_tui.search.codegen.sym import Unsupported

    for t in tasks:
        if not designs_of(t):
            try:
                region_of(t)
                why = "region analysed; no layout expressed it"
            except Unsupported as e:
                why = str(e)
            pytest.fail(f"{case}: region {t.op} ({t.kind}) has no generated design: {why}")


@pytest.mark.skipif(GXX is None, reason="needs g++")
@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_kernels_match_reference(case, tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "codegen_cpu"
    gen = CASES[case][2]
    jobs = []
    for t in case_tasks(case):
        for d in designs_of(t):
            for p in points(d, t):
                jobs.append((t, d, p, d.render(t, p)))
    assert jobs
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        sos = list(ex.map(lambda j: compile_cpu(j[0], j[3], root), jobs))
    torch.manual_seed(0)
    failures = []
    for (t, d, p, src), so in zip(jobs, sos):
        for trial in range(2):
            ins = [make_input(m, gen) for m in t.inputs]
            before = [x.clone() for x in ins]
            refs = t.reference(ins)
            outs = run_cpu(t, so, ins)
            why = compare(outs, refs)
            if not why and not all(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                   and torch.equal(a.nan_to_num(), b.nan_to_num())) for a, b in zip(ins, before)):
                why = "an input was modified"
            if why:
                failures.append(f"{t.op} {d.name} {p}: {why} ({so.parent})")
                break
    assert not failures, "\n".join(failures)


def test_unsupported_regions_get_no_design():
    """A region with an op the generator cannot express (cumsum is not pointwise) offers nothing
    and does not raise."""
    from kforge_tui.regions.build import tasks_of as tof

    tasks = tof(lambda x: torch.cumsum(x, 1) * 2, (torch.randn(4, 8),))
    for t in tasks:
        if t.kind == "compute":
            assert designs_of(t) == []


def test_designs_registered_with_search():
    from kforge_tui.search.designs import designs_for

    t = case_tasks("softmax_f32")[0]
    names = {d.name for d in designs_for(t)}
    assert "gen_rows" in names
    t = case_tasks("newgelu_f32")[0]
    assert "gen_pointwise" in {d.name for d in designs_for(t)}


def test_design_protocol():
    for case in ("softmax_f32", "mean_dim0", "bn_relu"):
        for backend in ("cpu", "cuda"):
            for t in case_tasks(case, backend):
                for d in designs_of(t):
                    assert d.backend == backend
                    p = d.default(t)
                    assert d.valid(t, p), (case, d.name, p)
                    assert set(p) == set(d.space)
                    rows, n = d.extent(t)
                    assert rows >= 1 and n >= 1
                    src = d.render(t, p)
                    assert src.startswith('#include "kforge_region.h"')
                    assert "kforge_launch" in src
                    bad = {**p, next(iter(d.space)): object()}
                    assert not d.valid(t, bad)


def test_static_check_accepts_renders():
    """What the sandbox's static check would say of a few renders on each backend."""
    try:
        from kforge_tui.regions.abi import declaration
        from kforge_tui.sandbox import static
    except Exception as e:  # noqa: BLE001  (the sandbox is being rewritten)
        pytest.skip(f"static check not importable: {e}")

    class Sig:
        def __init__(self, backend):
            self.backend = backend
            self.params = [type("P", (), {"name": n})() for n in ("inputs", "outputs", "stream")]

        def declaration(self):
            return declaration(self.backend)

    for case in ("softmax_f32", "mean_dim0", "group_norm", "max_dim_ties", "newgelu_f32", "mse"):
        for backend in ("cpu", "cuda"):
            for t in case_tasks(case, backend):
                for d in designs_of(t):
                    for p in points(d, t, 3):
                        try:
                            rep = static.check_source(d.render(t, p), Sig(backend))
                        except (AttributeError, TypeError) as e:
                            pytest.skip(f"static check API changed: {e}")
                        assert rep.ok, f"{case} {backend} {d.name} {p}:\n{rep.text()}"


# ------------------------------------------------------------------------------ cuda compile

CUDA_CASES = ("softmax_f32", "layer_norm_bf16", "group_norm", "mean_dim0", "mse", "max_dim_ties", "bn_relu",
              "silu_mul_bf16", "newgelu_f32", "var_mean", "gelu_ln_softmax", "int_ops")


def _cuda_points(d, t) -> list:
    """Default point plus the features a cpu run cannot exercise: caches, splits, fallbacks."""
    p0 = d.default(t)
    out = [p0]
    for k, v in (("cache", "regs"), ("cache", "smem"), ("splits", 4), ("vec", 1), ("grid", "stride"),
                 ("unroll", 4), ("ty", 4)):
        if k in d.space:
            q = {**p0, k: v}
            if q != p0 and d.valid(t, q) and q not in out:
                out.append(q)
        if len(out) >= 3:
            break
    return out


def batch_cuda_source(sources: list[str]) -> str:
    """Several candidates as one translation unit: each in its own namespace, entry renamed."""
    parts = ["#include <cuda_runtime.h>", "#include <cuda_fp16.h>", "#include <cuda_bf16.h>",
             "#include <stdint.h>", "#include <stddef.h>"]
    for k, src in enumerate(sources):
        body = src.replace('#include "kforge_region.h"', "")
        body = body.replace('extern "C" int kforge_launch(', f"int kforge_launch_{k}(")
        parts.append(f"namespace kfb{k} {{\n{body}\n}}  // namespace kfb{k}")
    return "\n".join(parts) + "\n"


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_cuda_renders_compile(tmp_path):
    sources = []
    for case in CUDA_CASES:
        for t in case_tasks(case, "cuda"):
            for d in designs_of(t):
                for p in _cuda_points(d, t):
                    sources.append(d.render(t, p))
    assert len(sources) >= 20
    # a few translation units compiled in parallel
    n_tu = min(4, len(sources))
    groups = [sources[k::n_tu] for k in range(n_tu)]

    def build(k):
        f = tmp_path / f"batch{k}.cu"
        f.write_text(batch_cuda_source(groups[k]))
        r = subprocess.run([NVCC, "-O3", "-arch=sm_90", "-std=c++17", "-Xcompiler", "-fPIC", "-c", str(f),
                            "-o", str(tmp_path / f"batch{k}.o")], capture_output=True, text=True)
        return k, r.returncode, r.stderr

    with ThreadPoolExecutor(n_tu) as ex:
        res = list(ex.map(build, range(n_tu)))
    errs = [f"batch{k}: {err[:4000]}" for k, rc, err in res if rc]
    assert not errs, "\n".join(errs)
    warn = [f"batch{k}: {m}" for k, rc, err in res for m in re.findall(r"warning #\d+-D: [^\n]*", err)]
    assert not warn, "\n".join(warn[:20])


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("case", ["layer_norm_bf16", "softmax_f32", "cast_chain"])
def test_one_cuda_render_compiles_alone(tmp_path, case):
    """The plain candidate form (header beside it, nvcc -shared), as the sandbox builds it. The
    header brings cuda_fp16.h / cuda_bf16.h only for tensors of that type: an f32 region compiles
    without them, and one that casts through f16 and bf16 inside (cast_chain) gets them from its
    render."""
    t = case_tasks(case, "cuda")[0]
    d = designs_of(t)[0]
    header, src = t.header("cuda"), d.render(t, d.default(t))
    sixteen = {dt for m in (*t.inputs, *t.outputs) for dt in [m.dtype]} & {"float16", "bfloat16"}
    assert ("#include <cuda_bf16.h>" in header) == ("bfloat16" in sixteen)
    assert ("#include <cuda_fp16.h>" in header) == ("float16" in sixteen)
    if case == "cast_chain":
        assert "#include <cuda_fp16.h>" in src and "#include <cuda_bf16.h>" in src
    (tmp_path / "kforge_region.h").write_text(header)
    (tmp_path / "k.cu").write_text(src)
    r = subprocess.run([NVCC, "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "k.cu",
                        "-o", "k.so"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:4000]


def _hand_task(graph, inputs, outputs, kind="pointwise", backend="cpu"):
    from kforge_tui.regions.meta import TensorMeta, contiguous_stride
    from kforge_tui.regions.task import Task

    ins = tuple(TensorMeta(f"in{k}", s, d, contiguous_stride(s)) for k, (s, d) in enumerate(inputs))
    outs = tuple(TensorMeta(f"out{k}", s, d, contiguous_stride(s)) for k, (s, d) in enumerate(outputs))
    return Task(op="hand", kind=kind, graph=graph, inputs=ins, outputs=outs, backend=backend)


@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_output_smaller_than_the_iteration_space(tmp_path):
    """An output broadcast against the iteration space is written once per element (by the
    threads whose broadcast coordinates are 0)."""
    graph = {"inputs": ["x", "w"],
             "nodes": [{"name": "e", "target": "aten.exp.default", "args": [{"ref": "w"}], "kwargs": {}},
                       {"name": "y", "target": "aten.mul.Tensor", "args": [{"ref": "x"}, {"ref": "e"}],
                        "kwargs": {}}],
             "outputs": [{"ref": "y"}, {"ref": "e"}]}
    t = _hand_task(graph, [((6, 40), "float32"), ((40,), "float32")], [((6, 40), "float32"), ((40,), "float32")])
    ds = designs_of(t)
    assert [d.name for d in ds] == ["gen_pointwise"]
    for p in points(ds[0], t, 2):
        so = compile_cpu(t, ds[0].render(t, p), tmp_path)
        ins = [make_input(m, None) for m in t.inputs]
        assert compare(run_cpu(t, so, ins), t.reference(ins)) == ""
    tc = _hand_task(graph, [((6, 40), "float32"), ((40,), "float32")], [((6, 40), "float32"), ((40,), "float32")],
                    backend="cuda")
    assert "if (" in designs_of(tc)[0].render(tc, designs_of(tc)[0].default(tc))


def test_epilogue_on_another_row_is_refused():
    """x + x.sum(1, keepdim=True).t(): element (i, j) needs row j's sum; no design, no error."""
    tasks = [t for t in tasks_of(lambda x: x + x.sum(1, keepdim=True).t(), (torch.randn(8, 8),))
             if t.kind == "reduction"]
    assert tasks
    from kforge_tui.search.codegen import rows

    for t in tasks:
        if len(t.graph["nodes"]) > 1:
            assert rows.generate(t) == []
