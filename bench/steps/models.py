"""models: each sample model searched (`kforge optimize`, built-in proposer), then applied end to
end (`kforge apply --json`): eager vs torch.compile vs kforge, per Inductor mode.

    python -m bench models                                   # the four sample models, GPU size
    python -m bench models --models gemma --modes default,reduce-overhead
    python -m bench models --small --device cpu              # tests/fixtures/models/tiny.py

Issue 26's end-to-end table: per model and Inductor mode, eager, torch.compile and kforge on the
decision clock (throughput: back-to-back forwards, CUDA events), kforge / torch.compile on it and
on triton's do_bench of the same forwards, and how many candidates the whole-model check kept.
`apply` decides in a process of its own (the search's worker processes would make the timings
noisy). The search's per-region figures go into the JSON (`regions`).
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
    g.add_argument("--modes", default="default,reduce-overhead",
                   help="Inductor modes to apply in, each against torch.compile in the same mode "
                        "(models and level2)")


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
        rows += _runs.apply_modes(ctx, name, path)
    ok = all(r.get("kforge_ms") for r in rows)
    return Table(_runs.MODEL_COLUMNS, rows, [f"search: top {top} regions, budget {budget} per region; "
                                             "vs_* are ratios of forwards alternated in one process",
                                             _runs.never_slower(rows)],
                 {"regions": regions, "region_columns": _runs.REGION_COLUMNS}, ok)
