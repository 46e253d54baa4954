"""What the searching steps share: `kforge optimize` a model, then read the run (`kforge show
--json`: per region) or apply it (`kforge apply --json`: end to end), through the CLI a user
runs. Folded from bench/e2e_table.py. Ratios are of figures measured side by side in one run
(the sandbox's interleaved timing for regions, integrate/e2e.py's alternated forwards for
models); absolute times are for orientation only.
"""
from __future__ import annotations

import json
import sys

REGION_COLUMNS = ["run", "region", "shape", "dtype", "evaluated", "eager_us", "compile_us", "seed_us", "best_us",
                  "floor_us", "x_eager", "x_compile", "seed/compile", "best/floor", "best_lang", "verified"]
MODEL_COLUMNS = ["model", "inductor_mode", "mode", "eager_ms", "compile_ms", "kforge_ms", "vs_eager", "vs_compile",
                 "spread", "db_vs_compile", "clock/db", "kept", "within_tol"]


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
        sd = t.get("seed_us")  # node zero, Inductor's own kernel on the sandbox's clock
        rows.append({"run": name, "region": t["op"], "shape": t["shape"], "dtype": t["dtype"],
                     "evaluated": f"{t.get('evaluated')}/{t.get('budget')}", "eager_us": e, "compile_us": c,
                     "seed_us": sd, "best_us": b, "floor_us": f, "x_eager": _ratio(e, b), "x_compile": _ratio(c, b),
                     "seed/compile": _ratio(sd, c), "best/floor": _ratio(b, f), "best_lang": t.get("best_lang"),
                     "verified": t.get("verified"), "failures": t.get("failures") or []})
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
    db = a.get("do_bench_ms") or {}
    trials = (a.get("decision") or {}).get("trials") or []
    spreads = [v for v in (a.get("compile_spread"), a.get("patched_spread")) if v is not None]
    # kforge / torch.compile on the decision clock (throughput) and on triton's do_bench of the
    # same forwards; kept = kernels the whole-model check kept / candidates it compiled in
    row = dict(row, mode=a.get("mode"), eager_ms=a.get("eager_ms"), compile_ms=a.get("compile_ms"),
                kforge_ms=a.get("patched_ms"), vs_eager=a.get("speedup"), vs_compile=a.get("speedup_vs_compile"),
                spread=round(max(spreads), 3) if spreads else None, db_vs_compile=_ratio(db.get("compile"), db.get("kforge")),
                **{"clock/db": _agreement(a.get("clock_agreement"))},  # speedup on one over the other
                kept=f"{sum(1 for t in trials if t.get('kept'))}/{sum(1 for t in trials if t.get('gain') is not None)}",
                within_tol=a.get("within_tolerance"), same_forward=a.get("same_forward"))
    # each row as it is measured: a step cut short by a time limit still shows what it finished
    print(f"    {tag}: " + ", ".join(f"{k} {row.get(k)}" for k in MODEL_COLUMNS[3:] if row.get(k) is not None),
          file=sys.stderr, flush=True)
    return row


def apply_modes(ctx, name: str, model: str) -> list[dict]:
    """One `apply` row per Inductor mode of --modes, each against torch.compile in that mode."""
    return [apply(ctx, name, model, None if mode == "default" else mode) for mode in ctx.args.modes.split(",")]


SAME_MODEL_NOISE = 0.02  # two torch.compile builds of one model read 2 % apart (sd35_vae, H200, 2026-12-04)


def never_slower(rows: list[dict]) -> str:
    """Issue 26's verdict over apply rows: kforge is slower than torch.compile only when both
    clocks (the decision's and do_bench) say so beyond the noise of the same model compiled twice.
    A row that kept no kernel ran torch.compile's own forward on both sides (`same_forward`): it
    cannot be slower, and how far its two readings lie apart is this machine's noise, said so."""
    timed = [r for r in rows if r.get("vs_compile")]
    slow = 1 - SAME_MODEL_NOISE
    same = [r for r in timed if r.get("same_forward")]
    slower = [f"{r['model']} ({r['inductor_mode']}: {r['vs_compile']:.3f}"
              + (f", do_bench {r['db_vs_compile']:.3f}" if r.get("db_vs_compile") else ", no do_bench") + ")"
              for r in timed if not r.get("same_forward") and r["vs_compile"] < slow
              and (r.get("db_vs_compile") or 0) < slow]
    noise = [abs(x - 1.0) for r in same for x in (r["vs_compile"], r.get("db_vs_compile")) if x]
    return (f"never slower than torch.compile (beyond {SAME_MODEL_NOISE:.0%} on every clock timed): "
            f"{len(timed) - len(slower)} of {len(timed)} rows" + (f"; slower: {', '.join(slower)}" if slower else "")
            + (f"; {len(same)} of them kept no kernel, so kforge's forward was torch.compile's own "
               f"(its two readings {max(noise):.1%} apart at most: the noise)" if same and noise else ""))


def _agreement(agree: dict | None) -> str | None:
    """The end-to-end check's speedup over its do_bench speedup, and whether they agree within
    measure.AGREE_WITHIN (the worst single forward's ratio where no speedup was measured)."""
    if not agree:
        return None
    off = agree.get("off") or max(agree["ratios"].values(), key=lambda r: abs(r - 1.0))
    return f"{off:.3f} {'ok' if agree['agrees'] else 'OFF'}"


def _ratio(a, b):
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a and b else None
