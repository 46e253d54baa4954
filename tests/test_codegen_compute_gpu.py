"""Generated compute kernels on a GPU (run on a machine with one: pytest -m gpu).

Regions are traced on CUDA tensors, so they hold the CUDA ops (flash / efficient attention,
cuDNN-free convolution, ...). Every design's default point and a few others are compiled with
nvcc -arch=sm_90, called through the task's ABI on the current stream with outputs poisoned
with NaN, and compared with the region's reference at the verifier's tolerances. The sizes are
chosen to leave partial tiles everywhere. A short timing table (ours vs the eager reference)
is printed for information; nothing is asserted about speed.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

try:
    import test_codegen_compute as base
except ImportError:  # pragma: no cover - imported by path when tests/ is not on sys.path
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "test_codegen_compute", Path(__file__).with_name("test_codegen_compute.py"))
    base = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(base)

ARCH = "sm_90"


def _flags():
    return ["-O3", f"-arch={ARCH}", "-shared", "-Xcompiler", "-fPIC", "-std=c++17"]


def build(task, src: str, workdir: Path) -> Path:
    import hashlib

    d = workdir / hashlib.sha1((task.header("cuda") + src).encode()).hexdigest()[:16]
    d.mkdir(parents=True, exist_ok=True)
    (d / "kforge_region.h").write_text(task.header("cuda"))
    (d / "k.cu").write_text(src)
    r = subprocess.run(["nvcc", *_flags(), "-o", str(d / "k.so"), str(d / "k.cu")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "k.so"


def cuda_inputs(task, seed=0, lo=0, hi=4, ties=False):
    return [x.cuda() if x is not None else None
            for x in _strided_cuda(base.random_inputs(task, seed, lo, hi, ties), task)]


def _strided_cuda(xs, task):
    out = []
    for x, m in zip(xs, task.inputs):
        if x is None:
            out.append(None)
            continue
        t = torch.empty_strided(m.shape, m.strides, dtype=x.dtype, device="cpu")
        t.copy_(x)
        out.append(t)
    return out


def call(lib, task, inputs):
    outs = base.poisoned_outputs(task, device="cuda")
    fn = lib.kforge_launch
    sig = task.signature("cuda")
    fn.argtypes = sig.argtypes()
    fn.restype = ctypes.c_int
    args = sig.call_args(inputs, outs, torch.cuda.current_stream().cuda_stream)
    rc = fn(*args)
    torch.cuda.synchronize()
    return rc, outs, (fn, args)


def timed(f, n=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3  # us


def _qkv(B, H, L, S, E, dt, Hk=None, Ev=None):
    Hk = Hk or H
    Ev = Ev or E
    return (torch.randn(B, H, L, E, dtype=dt, device="cuda"), torch.randn(B, Hk, S, E, dtype=dt, device="cuda"),
            torch.randn(B, Hk, S, Ev, dtype=dt, device="cuda"))


def _cases():
    cu = dict(device="cuda")
    x = torch.randn(4, 16, 37, 41, **cu)
    return [
        ("linear_f32", nn.Linear(200, 130).cuda(), (torch.randn(300, 200, **cu),), {}),
        ("linear_bf16", nn.Linear(256, 200).cuda().bfloat16(), (torch.randn(300, 256, **cu).bfloat16(),), {}),
        ("linear_f16_big", nn.Linear(1024, 1024).cuda().half(), (torch.randn(2048, 1024, **cu).half(),), {}),
        ("linear_f32_big", nn.Linear(1024, 1024).cuda(), (torch.randn(2048, 1024, **cu),), {}),
        ("bmm_f16_transposed", lambda a, b: torch.bmm(a.transpose(1, 2), b.transpose(1, 2)),
         (torch.randn(3, 96, 70, **cu).half(), torch.randn(3, 90, 96, **cu).half()), {}),
        ("bmm_bf16_odd_k", lambda a, b: torch.bmm(a, b),
         (torch.randn(2, 65, 100, **cu).bfloat16(), torch.randn(2, 100, 77, **cu).bfloat16()), {}),
        ("addmm_f32", lambda c, a, b: torch.addmm(c, a, b, alpha=0.5, beta=2),
         (torch.randn(1, 70, **cu), torch.randn(90, 33, **cu), torch.randn(33, 70, **cu)), {}),
        ("sdpa_f16", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), _qkv(2, 4, 200, 200, 64, torch.float16), {}),
        ("sdpa_bf16_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         _qkv(2, 4, 130, 130, 128, torch.bfloat16), {}),
        ("sdpa_bf16_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
         _qkv(2, 2, 77, 91, 64, torch.bfloat16) + (torch.randn(77, 91, **cu).bfloat16(),), {}),
        ("sdpa_f32", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2),
         _qkv(2, 3, 50, 50, 32, torch.float32), {}),
        ("sdpa_f16_big", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         _qkv(4, 16, 1024, 1024, 128, torch.float16), {}),
        ("conv_f32_s2", nn.Conv2d(16, 32, 3, stride=2, padding=1).cuda(), (x,), {}),
        ("conv_bf16", nn.Conv2d(16, 48, 3, padding=1).cuda().bfloat16(), (x.bfloat16(),), {}),
        ("conv_dw_f16_cl", nn.Conv2d(16, 16, 5, padding=2, groups=16).cuda().half(),
         (x.half().to(memory_format=torch.channels_last),), {}),
        ("conv1d_f32", nn.Conv1d(8, 12, 5, padding=2, dilation=2).cuda(), (torch.randn(3, 8, 50, **cu),), {}),
        ("conv_transpose2d_f32", nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1).cuda(), (x,), {}),
        ("conv_transpose2d_bf16", nn.ConvTranspose2d(16, 32, 3, stride=2, padding=1, output_padding=1).cuda()
         .bfloat16(), (x.bfloat16(),), {}),
        ("sdpa_f16_gqa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
         _qkv(2, 8, 100, 120, 64, torch.float16, Hk=2), {}),
        ("cumsum", lambda x: torch.cumsum(x, 1), (torch.randn(64, 1000, **cu),), {}),
        ("cumsum_rev", lambda x: torch.cumsum(x.flip(0), 0).flip(0), (torch.randn(300, 40, **cu),), {}),
        ("cumprod_excl_cat", lambda x: torch.cumprod(torch.cat((torch.ones_like(x[:, :1]), x), dim=1)[:, :-1], dim=1),
         (torch.rand(16, 100, **cu) + 0.5,), {}),
        ("max_pool_offsets", lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), (x,), {"ties": True}),
        ("max_pool_indices_bf16", lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (x.bfloat16(),),
         {"ties": True, "hi": 9}),
        ("avg_pool", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), (x,), {}),
        ("adaptive_avg", lambda x: F.adaptive_avg_pool2d(x, (5, 7)), (x,), {}),
        ("embedding", nn.Embedding(1000, 64).cuda(), (torch.randint(0, 1000, (4, 33), **cu),), {"hi": 1000}),
        ("index", lambda x, i: x[i], (torch.randn(50, 24, **cu), torch.randint(-50, 50, (7, 3), **cu)),
         {"lo": -50, "hi": 50}),
    ]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    return tmp_path_factory.mktemp("codegen_gpu")


@pytest.mark.parametrize("case", _cases() if torch.cuda.is_available() else [], ids=lambda c: c[0])
def test_gpu_designs_verify(case, workdir):
    name, fn, args, opts = case
    tasks = base.tasks_for(fn, args, "cuda")
    assert tasks, name
    rows = []
    for task in tasks:
        designs = base.designs_of(task)
        assert designs, f"{name}: no design for {task.op} ({task.aten})"
        lo, hi = opts.get("lo", 0), opts.get("hi", 4)
        if task.op.endswith("indices") and any(m.dtype == "int8" for m in task.inputs):
            lo, hi = 0, 9
        inputs = cuda_inputs(task, seed=1, lo=lo, hi=hi, ties=opts.get("ties", False))
        ref = task.reference(inputs)
        from kforge_tui.regions.graph import to_graph_module

        gm = to_graph_module(task.graph, "cuda")
        jobs = []
        for d in designs:
            for p in [d.default(task)] + base.other_points(d, task, n=2):
                jobs.append((d, p, d.render(task, p)))
        with ThreadPoolExecutor(max_workers=8) as ex:
            libs = list(ex.map(lambda j: build(task, j[2], workdir), jobs))
        failures = []
        for (d, p, _src), so in zip(jobs, libs):
            lib = ctypes.CDLL(str(so))
            rc, outs, (f, a) = call(lib, task, inputs)
            if rc != 0:
                failures.append(f"{d.name} {p}: rc {rc}")
                continue
            for j, (r, o, m) in enumerate(zip(ref, outs, task.outputs)):
                msg = base.mismatch(r, o, m.dtype)
                if msg:
                    failures.append(f"{d.name} {p} output {j}: {msg}")
            if p == d.default(task):
                us = timed(lambda: f(*a))
                ref_us = timed(lambda: gm(*inputs))
                rows.append(f"{name:24s} {d.name:16s} {us:9.1f} us   eager {ref_us:9.1f} us")
        assert not failures, "\n".join(failures)
    print("\n" + "\n".join(rows))
