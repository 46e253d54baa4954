"""regions: the built-in search on single-op regions at the sample models' real shapes, then
each best kernel against eager, torch.compile, Liger-Kernel and the floor (issue 7's verdict).

    python -m bench regions                          # bench/cases.py:zoo, 11 cases, one run (GPU)
    python -m bench regions --cases zoo_a            # half the zoo (also zoo_b)
    python -m bench regions --cases kernelbench      # tests/fixtures/kernelbench, a run each
    python -m bench regions --device cpu             # bench/cases.py:small (CPU sizes), budget 50
    python -m bench regions --small                  # the same at budget 2: a dry run

Every case is searched by `kforge optimize` (profile, capture, MCTS, sandbox, store: the
product's path). On a GPU each run's best kernels are then re-evaluated by bench/kernel_quality.py
(verification, timing next to eager in one worker, Liger timed alongside) and judged against
the stricter of the in-harness rival figure and DESIGN.md's (bench/reference_h200.json on an
H200); elsewhere the table is the run's own figures (`kforge show --json`).
"""
from __future__ import annotations

import json
import sys

from bench.report import ROOT, Table
from bench.steps import _runs

HELP = "the search on single regions (bench/cases.py): best kernel vs eager, torch.compile, Liger, floor"
QUALITY_COLUMNS = ["region", "shape", "dtype", "evaluated", "floor_us", "best_us", "spread", "x_eager",
                   "compile_rival_us", "liger_rival_us", "best/floor", "beats_all"]


def add_arguments(g) -> None:
    g.add_argument("--cases", default="", help="regions: zoo, zoo_a, zoo_b (bench/cases.py), kernelbench, "
                                               "small (default: zoo on a GPU, small on a CPU or with --small)")
    g.add_argument("--no-quality", action="store_true",
                   help="regions (cuda): the run's own figures, no re-evaluation by bench/kernel_quality.py")


def run(ctx) -> Table:
    cases = ctx.args.cases or ("zoo" if ctx.device == "cuda" and not ctx.small else "small")
    budget = ctx.budget(50, 2)
    if cases == "kernelbench":
        runs = {p.stem: f"tests/fixtures/kernelbench/{p.stem}.py"
                for p in sorted((ROOT / "tests" / "fixtures" / "kernelbench").glob("*.py"))}
        top = 1
    else:
        sys.path.insert(0, str(ROOT / "bench"))
        import cases as C  # bench/cases.py: the zoo's case list

        runs = {cases: f"bench/cases.py:{cases}"}
        top = {"zoo": len(C.CASES), "zoo_a": len(C.ZOO_A), "zoo_b": len(C.CASES) - len(C.ZOO_A)}.get(cases, 5)
    baseline = "--no-compile-baseline" if ctx.device == "cuda" and not ctx.args.no_quality else "--compile-baseline"
    rows, ok = [], True
    for name, model in runs.items():
        ok &= _runs.optimize(ctx, name, model, baseline, top=ctx.args.top or top, budget=budget) == 0
        rows += _runs.show(ctx, name)
    notes = [f"budget {budget} per region"]
    if ctx.device != "cuda" or ctx.args.no_quality:
        return Table(_runs.REGION_COLUMNS, rows, notes, {}, ok and all(r.get("best_us") for r in rows))
    # torch.compile is timed by kernel_quality.py in its own worker (the search's one GPU worker
    # is not held up by it), with Liger and the reference figures
    out = ctx.dir / "quality.json"
    r = ctx.sh([sys.executable, "bench/kernel_quality.py", *(str(ctx.dir / "runs" / n) for n in runs),
                "--json", str(out)], "kernel_quality.log")
    q = json.loads(out.read_text()) if out.exists() else []
    qrows = [_quality_row(x) for x in q]
    verdict = [ln for ln in (ctx.dir / "kernel_quality.log").read_text().splitlines() if ln.startswith("geomean")]
    return Table(QUALITY_COLUMNS, qrows, notes + verdict + ["rival = the stricter of the in-harness figure and "
                                                            "DESIGN.md's (reference) one"],
                 {"search_rows": rows, "quality": q}, ok and r.returncode == 0 and all(x["best_us"] for x in qrows))


def _quality_row(x: dict) -> dict:
    best = x.get("best_us")
    rivals = [v for v in (x.get("eager_us"), x.get("compile_rival_us"), x.get("liger_rival_us")) if v]
    eager = x.get("eager_side_by_side_us") or x.get("eager_us")
    return {"region": x["op"], "shape": x["shape"], "dtype": x["dtype"],
            "evaluated": f"{x.get('evaluated')}/{x.get('budget')}", "floor_us": x.get("floor_us"), "best_us": best,
            "spread": x.get("spread"), "x_eager": eager / best if best and eager else None,
            "compile_rival_us": x.get("compile_rival_us"), "liger_rival_us": x.get("liger_rival_us"),
            "best/floor": best / x["floor_us"] if best and x.get("floor_us") else None,
            "beats_all": bool(best) and all(best < v for v in rivals)}
