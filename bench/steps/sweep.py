"""sweep: the kernel families across shapes (bench/shape_sweep.py): at each (op, dtype, rows, n)
point a small built-in search (the proposer's own priors, no engine), each candidate checked and
timed next to eager, torch.compile and the floor; the share of points beating torch.compile and
within 1.25x of the floor.

    python -m bench sweep                               # --quick: ~36 points, < 6 min on an H200
    python -m bench sweep --sweep-args "--ops softmax --dtypes float32 --budget 6"
    python -m bench sweep --device cpu                  # no GPU: the points and their candidates only

The script stays runnable on its own; this step runs it and reads the JSON it writes.
"""
from __future__ import annotations

import json
import shlex
import sys

from bench.report import Table

HELP = "the families across shapes (bench/shape_sweep.py): best vs eager, torch.compile, floor per point"


def add_arguments(g) -> None:
    g.add_argument("--sweep-args", default="", help="sweep: options for bench/shape_sweep.py (default --quick)")


def run(ctx) -> Table:
    args = shlex.split(ctx.args.sweep_args) or ["--quick"]
    if ctx.device != "cuda":
        return _listing(ctx, args)
    r = ctx.sh([sys.executable, "bench/shape_sweep.py", *args, "--out", str(ctx.dir)], "shape_sweep.log")
    files = sorted(ctx.dir.glob("sweep-*.json"))
    data = json.loads(files[-1].read_text()) if files else {"points": []}
    rows, beat, n_comp, near, n_floor = [], 0, 0, 0, 0
    for p in data["points"]:
        b, comp, fl = p.get("best"), p.get("compile_us"), p.get("floor_us")
        row = {"point": f"{p['op']} {p['dtype']} {p['rows']}x{p['n']}", "eager_us": p.get("eager_us"),
               "compile_us": comp, "floor_us": fl}
        if b:
            row.update({"best": f"{b['family']} " + ",".join(f"{k}={v}" for k, v in b["params"].items()),
                        "best_us": b["us"], "x_compile": comp / b["us"] if comp else None,
                        "best/floor": b["us"] / fl if fl else None})
            n_comp += comp is not None
            beat += comp is not None and b["us"] < comp
            if fl and fl >= 10:
                n_floor += 1
                near += b["us"] <= 1.25 * fl
        else:
            row["best"] = p.get("error") or "no verified kernel"
        rows.append(row)
    notes = [f"beats torch.compile at {beat}/{n_comp} points; within 1.25x of the floor at {near}/{n_floor} "
             f"points whose floor is >= 10 us; copy {data.get('copy_gbs', 0):.0f} GB/s",
             "command: bench/shape_sweep.py " + shlex.join(args)]
    return Table(["point", "best", "best_us", "eager_us", "compile_us", "floor_us", "x_compile", "best/floor"], rows,
                 notes, {"sweep": data}, r.returncode == 0 and bool(rows))


def _listing(ctx, args: list[str]) -> Table:
    """Without a GPU: the points the same options give and each one's candidates (`--list`)."""
    r = ctx.sh([sys.executable, "bench/shape_sweep.py", *args, "--list"], "shape_sweep_list.log")
    rows = []
    for line in (ctx.dir / "shape_sweep_list.log").read_text().splitlines():
        head, sep, cands = line.partition(": ")
        if sep and "[" in head:
            point, _, shape = head.partition(" [")
            rows.append({"point": point, "shape": "[" + shape, "candidates": len(cands.split("; ")),
                         "first": cands.split("; ")[0]})
    return Table(["point", "shape", "candidates", "first"], rows,
                 ["no GPU: the points and their candidates only (`bench/shape_sweep.py --list`); nothing timed"],
                 {}, r.returncode == 0 and bool(rows))


