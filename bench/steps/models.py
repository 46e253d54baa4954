"""models: each sample model searched (`kforge optimize`, built-in proposer), then applied end to
end (`kforge apply --json`): eager vs torch.compile vs kforge, per Inductor mode.

    python -m bench models                                   # the four sample models, GPU size
    python -m bench models --models gemma --modes default,reduce-overhead
    python -m bench models --small --device cpu              # tests/fixtures/models/tiny.py

The starting point of issue 26's end-to-end table (the lead extends it): the search's per-region
figures go into the JSON (`regions`), the table is one row per model and mode.
"""
from __future__ import annotations

from bench.report import Table
from bench.steps import _runs

HELP = "eager vs torch.compile vs kforge end to end on the sample models (optimize, then apply)"
MODELS = ("gemma", "qwen_moe", "resnet50", "sd35_vae")
SMALL = {"tiny": "tests/fixtures/models/tiny.py"}


def add_arguments(g) -> None:
    g.add_argument("--models", default="", help=f"comma-separated sample models (default {','.join(MODELS)}; "
                                                "--small: tests/fixtures/models/tiny.py)")
    g.add_argument("--modes", default="default", help="Inductor modes to apply in (default, reduce-overhead, ...)")


def run(ctx) -> Table:
    if ctx.args.models:
        models = {m: f"sample_models/{m}.py" for m in ctx.args.models.split(",")}
    else:
        models = SMALL if ctx.small else {m: f"sample_models/{m}.py" for m in MODELS}
    top, budget = ctx.top(6, 2), ctx.budget(20, 2)
    rows, regions = [], []
    for name, path in models.items():
        _runs.optimize(ctx, name, path, "--compile-baseline", top=top, budget=budget)
        regions += _runs.show(ctx, name)
        for mode in ctx.args.modes.split(","):
            rows.append(_runs.apply(ctx, name, path, None if mode == "default" else mode))
    ok = all(r.get("kforge_ms") for r in rows)
    return Table(_runs.MODEL_COLUMNS, rows, [f"search: top {top} regions, budget {budget} per region; "
                                             "vs_* are ratios of forwards alternated in one process"],
                 {"regions": regions, "region_columns": _runs.REGION_COLUMNS}, ok)
