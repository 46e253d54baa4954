"""kernels: the kernel families at fixed points, no search: each family's default point and a few
one-parameter neighbours on the reference cases (DESIGN.md's shapes on a GPU, the sample models'
on a CPU), checked against PyTorch and timed next to eager (and on a GPU torch.compile, Liger and
the floor). What the search starts from; `regions` is what it finds.

    python -m bench kernels                       # cuda: bench/check_families_gpu.py
    python -m bench kernels --kernels-only softmax --points 6
    python -m bench kernels --device cpu          # bench/cpu_families.py (g++ -O3 -fopenmp)
    python -m bench kernels --device cpu --small  # two cases, one repeat

Both scripts stay runnable on their own; this step runs them and reads their --json rows.
"""
from __future__ import annotations

import json
import math
import statistics
import sys

from bench.report import Table

HELP = "every kernel family at its default and neighbouring points vs eager, torch.compile, Liger, floor"


def add_arguments(g) -> None:
    g.add_argument("--kernels-only", default="", help="kernels: cases whose name contains one of these "
                                                      "(comma- or |-separated)")
    g.add_argument("--points", type=int, default=3, help="kernels (cuda): points per family (default 3)")
    g.add_argument("--reps", type=int, default=30, help="kernels (cuda): timed calls per point (default 30)")
    g.add_argument("--repeats", type=int, default=5, help="kernels (cpu): repeats per point (default 5)")
    g.add_argument("--no-compile", action="store_true", help="kernels (cuda): skip torch.compile")


def run(ctx) -> Table:
    out = ctx.dir / "rows.json"
    a = ctx.args
    if ctx.device == "cuda":
        argv = ["bench/check_families_gpu.py", "--points", str(a.points), "--reps", str(a.reps), "--json", str(out)]
        argv += ["--no-compile"] * a.no_compile + (["--only", a.kernels_only] if a.kernels_only else [])
        r = ctx.sh([sys.executable, *argv], "check_families_gpu.log")
        data = json.loads(out.read_text()) if out.exists() else {"rows": []}
        rows = [_gpu_row(x) for x in data["rows"]]
        notes = [f"copy bandwidth {data.get('copy_gbs', 0):.0f} GB/s (the floor's); "
                 f"geomean over eager {_geomean([x['x_eager'] for x in rows]):.2f}x", "command: " + " ".join(argv)]
        return Table(["case", "floor_us", "eager_us", "compile_us", "liger_us", "best_us", "best/floor", "x_eager",
                      "x_compile", "x_liger", "best_point"], rows, notes, {"copy_gbs": data.get("copy_gbs")},
                     r.returncode == 0 and all(x.get("best_us") for x in rows))
    only = a.kernels_only or ("softmax,gelu_tanh" if ctx.small else "")
    argv = ["bench/cpu_families.py", "--repeats", str(1 if ctx.small else a.repeats), "--json", str(out)]
    argv += ["--calls", "5"] * ctx.small + (["--only", only] if only else [])
    r = ctx.sh([sys.executable, *argv], "cpu_families.log")
    data = json.loads(out.read_text()) if out.exists() else {"rows": [], "failed": "no output"}
    rows = [{"case": x["case"], "shape": x["shape"], "family": x["family"], "point": x["point"],
             "kernel_us": statistics.median(x["kernel_us"]), "eager_us": statistics.median(x["eager_us"]),
             "speedup": statistics.median(x["speedup"]),
             "min..max": f"{min(x['speedup']):.2f}..{max(x['speedup']):.2f}"} for x in data["rows"]]
    notes = [f"median of per-repeat medians (kernel and eager alternated call by call); failed points: "
             f"{data['failed']}", "command: " + " ".join(argv)]
    return Table(["case", "shape", "family", "point", "kernel_us", "eager_us", "speedup", "min..max"], rows, notes,
                 {}, r.returncode == 0 and bool(rows))


def _gpu_row(x: dict) -> dict:
    b = x.get("best_us")
    ratio = lambda o: o / b if b and o and o == o else None  # noqa: E731 (NaN: not timed)
    return dict(x, **{"best/floor": b / x["floor_us"] if b else None}, x_eager=ratio(x.get("eager_us")),
                x_compile=ratio(x.get("compile_us")), x_liger=ratio(x.get("liger_us")))


def _geomean(xs) -> float:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else 0.0


