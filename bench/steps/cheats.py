"""cheats: the cheat corpus (tests/cheats, issue 17) end to end through the real evaluation pool
with the production timing loop: every cheat must be rejected with its expected status and a
message naming its reason, every honest kernel (tests/cheats/honest) must pass and be timed.

    python -m bench cheats                     # this device's corpus (.cu on cuda, .cpp on cpu)
    python -m bench cheats --small             # four cheats and two honest kernels
    python -m bench cheats --cheats-only fork,omp

The corpus and what each file expects are read by tests/test_cheats.py's own helpers, so the
step and the tests cannot disagree about a file. One row per file; `verdict` is caught / passed
for the expected outcome, MISSED / FAILED otherwise.
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from bench.report import ROOT, Table

HELP = "the cheat corpus end to end through the sandbox: every cheat rejected, every honest kernel passes"


def add_arguments(g) -> None:
    g.add_argument("--cheats-only", default="", help="cheats: files whose name contains one of these (comma-separated)")


def run(ctx) -> Table:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_cheats as T  # the corpus reader: expectation(), cheat_task(), honest_task()

    suffix = ".cu" if ctx.device == "cuda" else ".cpp"
    cheats = [p for p in sorted(T.CHEATS.glob(f"*{suffix}"))]
    honest = [p for p in sorted(T.HONEST.glob(f"*{suffix}"))]
    only = [s for s in ctx.args.cheats_only.split(",") if s]
    if only:
        cheats = [p for p in cheats if any(o in p.stem for o in only)]
        honest = [p for p in honest if any(o in p.stem for o in only)]
    if ctx.small:
        cheats, honest = cheats[:4], honest[:2]
    rows = asyncio.run(_evaluate(ctx, T, cheats, honest))
    bad = [r for r in rows if r["verdict"] in ("MISSED", "FAILED")]
    notes = [f"{sum(r['verdict'] == 'caught' for r in rows)}/{len(cheats)} cheats caught, "
             f"{sum(r['verdict'] == 'passed' for r in rows)}/{len(honest)} honest kernels passed "
             f"({ctx.device}, production timing loop)"]
    return Table(["file", "kind", "expected", "status", "verdict", "us", "message"], rows, notes, {}, not bad)


async def _evaluate(ctx, T, cheats: list[Path], honest: list[Path]) -> list[dict]:
    from kforge_tui.sandbox.pool import EvaluatorPool

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pool = EvaluatorPool(ctx.device, cache_dir=Path(tmp) / "cache", eval_timeout_s=60)
        await pool.start()
        try:
            for p in cheats:
                statuses, reasons = T.expectation(p)
                r = await pool.evaluate(T.cheat_task(p).to_json(), tmp, p.read_text())
                caught = r.status in statuses and T._named(r.message or "", reasons)
                rows.append({"file": p.name, "kind": "cheat", "expected": "/".join(statuses), "status": r.status,
                             "verdict": "caught" if caught else "MISSED", "message": (r.message or "")[:90]})
                print(f"  {p.name}: {r.status} {'' if caught else 'MISSED'}", file=sys.stderr, flush=True)
            for p in honest:
                r = await pool.evaluate(T.honest_task(p.stem, ctx.device).to_json(), tmp, p.read_text())
                rows.append({"file": f"honest/{p.name}", "kind": "honest", "expected": "ok", "status": r.status,
                             "verdict": "passed" if r.status == "ok" else "FAILED",
                             "us": r.timing.median_us if r.timing else None, "message": (r.message or "")[:90]})
                print(f"  honest/{p.name}: {r.status}", file=sys.stderr, flush=True)
        finally:
            await pool.close()
    return rows
