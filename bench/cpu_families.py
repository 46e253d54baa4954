"""The built-in cpu kernel families at their default points vs eager PyTorch, on this machine.

    python bench/cpu_families.py [--repeats 5] [--dtype float32] [--only softmax,silu] [--all-points]
                                 [--json OUT]      (`python -m bench kernels --device cpu` runs it)

Self-contained (the sandbox worker is being rewritten): each point is rendered, compiled with
g++ `-O3 -march=native -fopenmp`, loaded with ctypes in this process (OMP_WAIT_POLICY=PASSIVE and
torch's thread count, as the sandbox gives candidates), checked against `patterns.reference`
(per-dtype tolerance) and wall-clock timed against eager, alternating kernel and eager call by
call. A 2-core VM is noisy: each case is timed `--repeats` times; the table shows the median of
the per-repeat medians with their spread (min..max), and the median per-repeat speedup.
Speed targets live here, not in the tests.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads the OpenMP runtime

import torch  # noqa: E402

from kforge_tui.regions import patterns  # noqa: E402
from kforge_tui.search.families import families_for  # noqa: E402
from shape_sweep import make_task as _meta_task  # noqa: E402

TD = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOL = {"float32": (1e-4, 1e-5), "float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 8e-3)}

# (label, op, shape, params): the sample models' shapes the cpu families were measured at.
CASES = [
    ("softmax", "softmax", (256, 4096), {"dim": -1}),
    ("log_softmax", "log_softmax", (256, 4096), {"dim": -1}),
    ("silu", "silu", (64, 4096), {}),
    ("gelu", "gelu", (64, 4096), {"approximate": "none"}),
    ("gelu_tanh", "gelu", (64, 4096), {"approximate": "tanh"}),
    ("silu_mul", "silu_mul", (64, 4096), {}),
    ("relu", "relu", (64, 4096), {}),
    ("avgpool", "adaptive_avg_pool2d", (8, 2048, 7, 7), {"output_size": [1, 1]}),
    ("layer_norm", "layer_norm", (256, 768), {}),
    ("group_norm", "group_norm", (1, 128, 32, 32), {"groups": 32}),
]


def make_task(op: str, shape, dtype: str, params: dict):
    """The cpu pattern task at `shape` (silu_mul: a, b the halves of one [rows, 2*cols] tensor)."""
    return _meta_task(op, shape, dtype, "cpu", **dict(params))


def inputs_for(task, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    out, whole = {}, None
    for m in task.inputs:
        if not m.present:
            out[m.name] = None
        elif task.op == "silu_mul":
            if whole is None:
                whole = (torch.randn(m.shape[0], 2 * m.shape[1], generator=g) * 3).to(TD[m.dtype])
            out[m.name] = whole[:, : m.shape[1]] if m.name == "a" else whole[:, m.shape[1]:]
        else:
            out[m.name] = (torch.randn(m.shape, generator=g) * 2 + 0.3).to(TD[m.dtype])
    return out


def build(src: str, work: Path, name: str) -> tuple[str | None, str]:
    cpp, so = work / f"{name}.cpp", work / f"{name}.so"
    cpp.write_text(src)
    r = subprocess.run(["g++", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", str(cpp),
                        "-o", str(so)], capture_output=True, text=True)
    return (str(so) if r.returncode == 0 else None), r.stderr[-800:]


def check(out, ref) -> str | None:
    rtol, atol = TOL[str(ref.dtype).replace("torch.", "")]
    e, g = ref.float(), out.float()
    bad = ~((g == e) | ((g - e).abs() <= atol * float(e.abs().max()) + rtol * e.abs()))
    return None if not bool(bad.any()) else f"{int(bad.sum())}/{e.numel()} wrong"


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.0f}..{max(xs):.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=30, help="kernel and eager calls per repeat (alternating)")
    ap.add_argument("--dtype", choices=tuple(TD), default="float32")
    ap.add_argument("--only", default="", help="comma-separated case labels")
    ap.add_argument("--all-points", action="store_true",
                    help="also every one-parameter change from the default (the search's first moves)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dtype {args.dtype}, "
          f"{args.repeats} repeats x {args.calls} calls; times in us (median of per-repeat medians, min..max)")
    points = []  # (label, shape, task, family, params)
    for label, op, shape, params in CASES:
        if only and label not in only:
            continue
        task = make_task(op, shape, args.dtype, params)
        for fam in families_for(task):
            pts = [fam.default(task)]
            if args.all_points:
                for k, vals in fam.space.items():
                    pts += [{**pts[0], k: v} for v in vals if v != pts[0][k]]
            points += [(label, list(shape), task, fam, p) for p in pts if fam.valid(task, p)]
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, shape, task, fam, p) in enumerate(points):
            so, log = build(fam.render(task, p), Path(tmp), f"k{i}")
            if so is None:
                print(f"FAILED {label} {fam.name} {p}: compile: {log}")
                failed += 1
                continue
            fn = getattr(ctypes.CDLL(so), patterns.ENTRY)
            fn.restype = ctypes.c_int
            sig = patterns.signature(task)
            fn.argtypes = sig.argtypes()
            inp = inputs_for(task)
            ref = patterns.reference(task, inp)
            y = torch.empty_like(ref)
            args_ = sig.call_args(inp, y, patterns.scalar_args(task))
            rc = fn(*args_)
            err = f"rc={rc}" if rc else check(y, ref)
            if err:
                print(f"FAILED {label} {fam.name} {p}: {err}")
                failed += 1
                continue
            ours, eager, sp = [], [], []
            for _ in range(args.repeats):
                tk, te = [], []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    fn(*args_)
                    t1 = time.perf_counter()
                    patterns.reference(task, inp)
                    t2 = time.perf_counter()
                    tk.append((t1 - t0) * 1e6)
                    te.append((t2 - t1) * 1e6)
                ours.append(statistics.median(tk))
                eager.append(statistics.median(te))
                sp.append(eager[-1] / ours[-1])
            rows.append((label, shape, fam.name, " ".join(f"{k}={v}" for k, v in p.items()), ours, eager, sp))
            print(f"  {label} {fam.name} {p}: {statistics.median(ours):.1f} us vs eager {statistics.median(eager):.1f}",
                  flush=True)
    print()
    print("| case | shape | family | point | kernel us | eager us | speedup (min..max) |")
    print("|---|---|---|---|---|---|---|")
    for label, shape, fam, pt, ours, eager, sp in rows:
        print(f"| {label} | {shape} | {fam} | {pt} | {statistics.median(ours):.1f} ({_spread(ours)}) | "
              f"{statistics.median(eager):.1f} ({_spread(eager)}) | {statistics.median(sp):.2f}x "
              f"({min(sp):.2f}..{max(sp):.2f}) |")
    if args.json:
        keys = ("case", "shape", "family", "point", "kernel_us", "eager_us", "speedup")
        Path(args.json).write_text(json.dumps({"failed": failed, "rows": [
            dict(zip(keys, (label, shape, fam, pt, ours, eager, sp))) for label, shape, fam, pt, ours, eager, sp in rows]}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
