"""Generated CUDA kernels (kforge_tui/search/codegen) run on a GPU against the region's PyTorch
reference: every snippet of test_codegen.CASES, the default point of each design and the points
that exercise what a cpu run cannot (row caches in registers / shared memory, split rows over
several CTAs with stream-ordered scratch, column layouts, grid-stride grids), plus the scalar
fallback taken when a pointer is not aligned for vector packs.

    pytest -m gpu tests/test_codegen_gpu.py
    python tests/test_codegen_gpu.py --bench      # timings vs eager and torch.compile
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import test_codegen as TC  # noqa: E402

pytestmark = pytest.mark.gpu
HAVE_GPU = torch.cuda.is_available() and TC.NVCC is not None


def gpu_points(d, t) -> list[dict]:
    out = TC._cuda_points(d, t)
    for q in TC.points(d, t, 2):
        if q not in out:
            out.append(q)
    return out


def compile_cuda(task, src: str, root: Path) -> Path:
    h = hashlib.sha1((src + task.header("cuda")).encode()).hexdigest()[:16]
    d = root / h
    so = d / "k.so"
    if so.exists():
        return so
    d.mkdir(parents=True, exist_ok=True)
    (d / "kforge_region.h").write_text(task.header("cuda"))
    (d / "k.cu").write_text(src)
    r = subprocess.run([TC.NVCC, "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-std=c++17",
                        "k.cu", "-o", "k.so"], cwd=d, capture_output=True, text=True)
    if r.returncode:
        raise AssertionError(f"nvcc failed in {d}:\n{r.stderr[:3000]}")
    return so


class Kernel:
    def __init__(self, task, so: Path):
        self.task = task
        self.lib = ctypes.CDLL(str(so))
        self.fn = self.lib.kforge_launch
        self.fn.restype = ctypes.c_int
        self.sig = task.signature("cuda")
        self.fn.argtypes = self.sig.argtypes()

    def __call__(self, inputs, outs) -> int:
        args = self.sig.call_args(inputs, outs, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        return self.fn(*args)


def shifted(x: torch.Tensor) -> torch.Tensor:
    """The same values and strides, one element past an aligned address (packs must fall back)."""
    span = 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride())) if x.numel() else 1
    buf = torch.empty(span + 1, dtype=x.dtype, device=x.device)
    y = buf.as_strided(x.shape, x.stride(), 1)
    y.copy_(x)
    return y


_JOBS = None


def _jobs(root: Path):
    """(case, task, design, params, .so) for every case, built in parallel once per session."""
    global _JOBS
    if _JOBS is None:
        items = []
        for case in sorted(TC.CASES):
            for t in TC.case_tasks(case, "cuda"):
                for d in TC.designs_of(t):
                    for p in gpu_points(d, t):
                        items.append((case, t, d, p, d.render(t, p)))
        with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
            sos = list(ex.map(lambda j: compile_cuda(j[1], j[4], root), items))
        _JOBS = [(c, t, d, p, so) for (c, t, d, p, _), so in zip(items, sos)]
    return _JOBS


def _check(kern: Kernel, t, gen, shift: bool = False) -> str:
    ins = [TC.make_input(m, gen, "cuda") for m in t.inputs]
    if shift:
        ins = [shifted(x) for x in ins]
    before = [x.clone() for x in ins]
    refs = t.reference(ins)
    outs = [TC.poisoned(m, "cuda") for m in t.outputs]
    if shift:
        outs = [shifted(o) for o in outs]
    rc = kern(ins, outs)
    torch.cuda.synchronize()
    if rc != 0:
        return f"kforge_launch returned {rc}"
    why = TC.compare(outs, refs)
    if why:
        return why
    for a, b in zip(ins, before):
        if not torch.equal(a.nan_to_num() if a.is_floating_point() else a,
                           b.nan_to_num() if b.is_floating_point() else b):
            return "an input was modified"
    return ""


@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and nvcc")
@pytest.mark.parametrize("case", sorted(TC.CASES))
def test_cuda_kernels_match_reference(case, tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "codegen_cuda"
    jobs = [j for j in _jobs(root) if j[0] == case]
    assert jobs, f"{case}: no cuda design"
    gen = TC.CASES[case][2]
    torch.manual_seed(0)
    failures = []
    for _, t, d, p, so in jobs:
        kern = Kernel(t, so)
        for shift in (False, True):
            why = _check(kern, t, gen, shift)
            if why:
                failures.append(f"{t.op} {d.name} {p}{' (misaligned)' if shift else ''}: {why} ({so.parent})")
                break
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ timing

def _bench_cases():
    import torch.nn.functional as F

    bf = torch.bfloat16

    def rms(x, w):
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def silu_mul(x):
        a, b = x.chunk(2, -1)
        return F.silu(a) * b

    bn = torch.nn.BatchNorm2d(256).eval().cuda()
    return {
        "softmax [4096,256] f32": (lambda x: torch.softmax(x, -1), (torch.randn(4096, 256),)),
        "softmax [8,262144] f32": (lambda x: torch.softmax(x, -1), (torch.randn(8, 262144),)),
        "softmax [16384,2048] bf16": (lambda x: torch.softmax(x, -1), (torch.randn(16384, 2048, dtype=bf),)),
        "layer_norm [8192,4096] bf16": (lambda x, w, b: F.layer_norm(x, (4096,), w, b),
                                        (torch.randn(8192, 4096, dtype=bf), torch.randn(4096, dtype=bf),
                                         torch.randn(4096, dtype=bf))),
        "rms_norm [8192,4096] bf16": (rms, (torch.randn(8192, 4096, dtype=bf), torch.randn(4096, dtype=bf))),
        "rms hand [4096,4096] f32": (TC._rms_hand, (torch.randn(4096, 4096),)),
        "group_norm [1,512,128,128] f32": (lambda x, w, b: F.group_norm(x, 32, w, b),
                                           (torch.randn(1, 512, 128, 128), torch.randn(512), torch.randn(512))),
        "silu*b [8192,2x8192] bf16": (silu_mul, (torch.randn(8192, 16384, dtype=bf),)),
        "newgelu [8192,8192] f32": (TC.CASES["newgelu_f32"][0], (torch.randn(8192, 8192),)),
        "bn+relu [32,256,56,56] f32": (lambda x: torch.relu(bn(x)), (torch.randn(32, 256, 56, 56),)),
        "mean dim0 [65536,256] f32": (lambda x: x.mean(0), (torch.randn(65536, 256),)),
        "mse [4096,4096] f32": (lambda a, b: F.mse_loss(a, b), (torch.randn(4096, 4096), torch.randn(4096, 4096))),
        "mean hw [32,2048,7,7] f32": (lambda x: x.mean((2, 3)), (torch.randn(32, 2048, 7, 7),)),
    }


def _time(fn, n=50) -> float:
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=max(20, n)) * 1000.0)
    except Exception:  # noqa: BLE001
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) * 1000.0)
        return sorted(ts)[len(ts) // 2]


def bench(sweep: int = 4, only: str = "") -> None:
    root = Path(tempfile.mkdtemp(prefix="kf_bench_"))
    torch.manual_seed(0)
    for name, (fn, args) in _bench_cases().items():
        if only and not any(o and o in name for o in only.split(",")):
            continue
        args = tuple(a.cuda() for a in args)
        tasks = [t for t in TC.tasks_of(fn, args, "cuda") if t.kind in ("pointwise", "reduction")]
        t = max(tasks, key=lambda t: t.main_input.numel)
        ins = [TC.make_input(m, None, "cuda") for m in t.inputs]
        from kforge_tui.regions.graph import to_graph_module

        gm = to_graph_module(t.graph, "cuda")
        eager = _time(lambda: gm(*ins))
        comp = torch.compile(gm)
        comp(*ins)
        compiled = _time(lambda: comp(*ins))
        nbytes = sum(m.nbytes for m in t.inputs) + sum(m.nbytes for m in t.outputs)
        floor = nbytes / 4.25e12 * 1e6
        best = []
        for d in TC.designs_of(t):
            pts = gpu_points(d, t)
            for q in TC.points(d, t, sweep):
                if q not in pts:
                    pts.append(q)
            srcs = [d.render(t, p) for p in pts]
            with ThreadPoolExecutor(16) as ex:
                sos = list(ex.map(lambda s: compile_cuda(t, s, root), srcs))
            for p, so in zip(pts, sos):
                k = Kernel(t, so)
                outs = [TC.poisoned(m, "cuda") for m in t.outputs]
                if k(ins, outs) != 0:
                    continue
                torch.cuda.synchronize()
                why = TC.compare(outs, t.reference(ins))
                us = _time(lambda: k(ins, outs))
                best.append((us, d.name, p, why))
        best.sort(key=lambda b: b[0])
        print(f"\n== {name}  region {t.op}  floor {floor:.1f} us  eager {eager:.1f} us  compile {compiled:.1f} us")
        for us, dn, p, why in best[:4]:
            print(f"   {us:8.1f} us  {dn} {p} {'OK' if not why else 'WRONG: ' + why}")
        d0 = [b for b in best if b[2] == next(d for d in TC.designs_of(t) if d.name == b[1]).default(t)]
        for us, dn, p, why in d0:
            print(f"   default {dn}: {us:.1f} us {'OK' if not why else 'WRONG: ' + why}")


if __name__ == "__main__":
    if "--bench" in sys.argv:
        bench(only=sys.argv[sys.argv.index("--bench") + 1] if len(sys.argv) > sys.argv.index("--bench") + 1 else "")
    else:
        sys.exit(pytest.main([__file__, "-m", "gpu", "-q"]))
