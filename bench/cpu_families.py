"""The built-in cpu kernel families at their default points vs eager PyTorch, on this machine.

    python bench/cpu_families.py [--repeats 5] [--dtype float32] [--only softmax,silu] [--all-points]

Every candidate goes through the product's own sandbox (EvaluatorPool: static check, g++
`-O3 -march=native -fopenmp`, load in a worker process, verify against PyTorch, wall-clock
timing). The worker sets OMP_WAIT_POLICY=PASSIVE and gives candidates torch's thread count, and
each EvalResult carries the eager time measured in the same worker run, so kernel and eager are
timed side by side under the same conditions. A 2-core VM is noisy: each case is evaluated
`--repeats` times, each repeat in a fresh worker that re-times eager next to the kernels (the
compile is cached, the timing is not); the table shows the median of the per-repeat medians with
their spread (min..max), and the median per-repeat speedup.
Speed targets live here, not in the tests.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kforge_tui.sandbox.pool import EvaluatorPool  # noqa: E402
from kforge_tui.search.families import families_for  # noqa: E402
from kforge_tui.workload import catalogue  # noqa: E402

TD = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

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
    """A cpu Task built from live tensors, as capture builds it."""
    dt, params = TD[dtype], dict(params)
    if op == "silu_mul":
        rows, cols = shape
        whole = torch.randn(rows, 2 * cols, dtype=dt)
        a, b = whole[:, :cols], whole[:, cols:]
        return catalogue.make_task(op, {"a": a, "b": b}, params, torch.empty(rows, cols, dtype=dt), "cpu")
    inputs = {"x": torch.randn(shape, dtype=dt)}
    out_shape = shape
    if op == "layer_norm":
        params.update(normalized_shape=[shape[-1]], eps=1e-5)
        inputs.update(weight=torch.randn(shape[-1], dtype=dt), bias=torch.randn(shape[-1], dtype=dt))
    elif op == "group_norm":
        params.setdefault("eps", 1e-5)
        inputs.update(weight=torch.randn(shape[1], dtype=dt), bias=torch.randn(shape[1], dtype=dt))
    elif op == "adaptive_avg_pool2d":
        out_shape = tuple(shape[:-2]) + tuple(params["output_size"])
    return catalogue.make_task(op, inputs, params, torch.empty(out_shape, dtype=dt), "cpu")


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.0f}..{max(xs):.0f}"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", choices=tuple(TD), default="float32")
    ap.add_argument("--only", default="", help="comma-separated case labels")
    ap.add_argument("--all-points", action="store_true",
                    help="also every one-parameter change from the default (the search's first moves)")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dtype {args.dtype}, "
          f"{args.repeats} repeats; times in us (median of per-repeat medians, min..max)")
    # Points to time, in table order: (label, shape, task, family, params).
    points = []
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
    res: dict[int, tuple[list, list, list]] = {i: ([], [], []) for i in range(len(points))}
    failed = set()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            # A fresh worker each repeat: the worker times eager once per task, so a new one
            # re-times it right next to the kernels (the compile cache is kept).
            pool = EvaluatorPool("cpu", cache_dir=Path(tmp) / "cache")
            try:
                prepared = set()
                for i, (label, shape, task, fam, p) in enumerate(points):
                    if i in failed:
                        continue
                    tj = task.to_json()
                    if task.task_id not in prepared:
                        await pool.baseline(tj, tmp)
                        prepared.add(task.task_id)
                    r = await pool.evaluate(tj, tmp, fam.render(task, p))
                    if not r.ok:
                        print(f"FAILED {label} {fam.name} {p}: {r.status}: {r.message}")
                        failed.add(i)
                        continue
                    for lst, v in zip(res[i], (r.timing.median_us, r.baseline.median_us, r.speedup)):
                        lst.append(v)
            finally:
                await pool.close()
            print(f"repeat {rep + 1}/{args.repeats} done", flush=True)
    rows = [(label, shape, fam.name, " ".join(f"{k}={v}" for k, v in p.items()), *res[i])
            for i, (label, shape, task, fam, p) in enumerate(points) if i not in failed and res[i][0]]
    print()
    print("| case | shape | family | point | kernel us | eager us | speedup (min..max) |")
    print("|---|---|---|---|---|---|---|")
    for label, shape, fam, pt, ours, eager, sp in rows:
        print(f"| {label} | {shape} | {fam} | {pt} | {statistics.median(ours):.1f} ({_spread(ours)}) | "
              f"{statistics.median(eager):.1f} ({_spread(eager)}) | {statistics.median(sp):.2f}x "
              f"({min(sp):.2f}..{max(sp):.2f}) |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
