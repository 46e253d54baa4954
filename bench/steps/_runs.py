"""What the searching steps share: `kforge optimize` a model, then read the run (`kforge show
--json`: per region) or apply it (`kforge apply --json`: end to end), through the CLI a user
runs. Folded from bench/e2e_table.py. Ratios are of figures measured side by side in one run
(the sandbox's interleaved timing for regions, integrate/e2e.py's alternated forwards for
models); absolute times are for orientation only.
"""
from __future__ import annotations

import json

REGION_COLUMNS = ["run", "region", "shape", "dtype", "evaluated", "eager_us", "compile_us", "best_us", "floor_us",
                  "x_eager", "x_compile", "best/floor", "verified"]
MODEL_COLUMNS = ["model", "inductor_mode", "mode", "eager_ms", "compile_ms", "kforge_ms", "vs_eager", "vs_compile",
                 "within_tol", "kernels"]


def optimize(ctx, name: str, model: str, *extra: str, top: int, budget: int) -> int:
    """`kforge optimize` headless into <dir>/runs/<name> (no end-to-end check: `apply` does it)."""
    if ctx.args.ops:
        extra += ("--ops", ctx.args.ops)
    r = ctx.kforge("optimize", model, "--device", ctx.device, "--headless", "--top", str(top), "--budget",
                   str(budget), "--no-apply", "--run-dir", str(ctx.dir / "runs" / name), *extra,
                   log=f"{name}.optimize.log")
    return r.returncode


def show(ctx, name: str) -> list[dict]:
    """One row per task of a run: eager, torch.compile, best and floor, and their ratios."""
    r = ctx.kforge("show", str(ctx.dir / "runs" / name), "--json", log=f"{name}.show.log", capture=True)
    if r.returncode != 0:
        return [{"run": name, "region": "show failed (see its log)"}]
    rows = []
    for t in json.loads(r.stdout)["tasks"]:
        e, c, b, f = t.get("baseline_us"), t.get("compiled_us"), t.get("best_us"), t.get("floor_us")
        rows.append({"run": name, "region": t["op"], "shape": t["shape"], "dtype": t["dtype"],
                     "evaluated": f"{t.get('evaluated')}/{t.get('budget')}", "eager_us": e, "compile_us": c,
                     "best_us": b, "floor_us": f, "x_eager": _ratio(e, b), "x_compile": _ratio(c, b),
                     "best/floor": _ratio(b, f), "verified": t.get("verified")})
    return rows


def apply(ctx, name: str, model: str, inductor_mode: str | None = None) -> dict:
    """One row: `kforge apply --json` of a run on its model (eager, torch.compile, kforge)."""
    mode_args = ("--inductor-mode", inductor_mode) if inductor_mode else ()
    tag = f"{name}.{inductor_mode or 'default'}"
    r = ctx.kforge("apply", str(ctx.dir / "runs" / name), model, "--device", ctx.device, "--json", *mode_args,
                   log=f"{tag}.apply.log", capture=True)
    row = {"model": name, "inductor_mode": inductor_mode or "default"}
    try:
        a = json.loads(r.stdout)
    except ValueError:
        return dict(row, mode=f"apply failed, rc {r.returncode} (see {tag}.apply.log)")
    (ctx.dir / f"{tag}.apply.json").write_text(json.dumps(a, indent=1))
    return dict(row, mode=a.get("mode"), eager_ms=a.get("eager_ms"), compile_ms=a.get("compile_ms"),
                kforge_ms=a.get("patched_ms"), vs_eager=a.get("speedup"), vs_compile=a.get("speedup_vs_compile"),
                within_tol=a.get("within_tolerance"), kernels=sum((a.get("kernels_used") or {}).values()))


def _ratio(a, b):
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a and b else None
