"""level2: KernelBench level-2 style problems (tests/fixtures/kernelbench_l2: a GEMM or conv with
its epilogue), each searched and applied end to end like a model: eager vs torch.compile vs kforge,
in each Inductor mode of --modes (the models step's option: default,reduce-overhead).

    python -m bench level2                        # every fixture, KernelBench sizes on a GPU
    python -m bench level2 --problems gemm_relu_div,conv_bn_relu
    python -m bench level2 --small --device cpu   # two problems, CPU sizes, budget 2
"""
from __future__ import annotations

from bench.report import ROOT, Table
from bench.steps import _runs

HELP = "KernelBench level-2 problems searched and applied end to end: eager vs torch.compile vs kforge"
FIXTURES = ROOT / "tests" / "fixtures" / "kernelbench_l2"
SMALL = ("gemm_relu_div", "conv_clamp_tanh")


def add_arguments(g) -> None:
    g.add_argument("--problems", default="", help="comma-separated problem names (default: all; --small: "
                                                  + ",".join(SMALL) + ")")


def run(ctx) -> Table:
    names = (ctx.args.problems.split(",") if ctx.args.problems else list(SMALL) if ctx.small
             else sorted(p.stem for p in FIXTURES.glob("*.py")))
    top, budget = ctx.top(6, 1), ctx.budget(20, 2)
    rows, regions = [], []
    for n in names:
        path = f"tests/fixtures/kernelbench_l2/{n}.py"
        _runs.optimize(ctx, n, path, "--compile-baseline", top=top, budget=budget)
        regions += _runs.show(ctx, n)
        rows += _runs.apply_modes(ctx, n, path)
    ok = all(r.get("kforge_ms") for r in rows)
    return Table(_runs.MODEL_COLUMNS, rows, [f"search: top {top} regions, budget {budget} per region",
                                             _runs.never_slower(rows)],
                 {"regions": regions, "region_columns": _runs.REGION_COLUMNS}, ok)
