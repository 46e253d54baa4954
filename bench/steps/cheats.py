"""cheats: the cheat corpus (tests/cheats, issue 17) end to end through the real evaluation pool
with the production timing loop: every cheat must be rejected with its expected status and a
message naming its reason, every honest kernel (tests/cheats/honest) must pass and be timed.

    python -m bench cheats                     # this device's corpus (.cu on cuda, .cpp on cpu), and
                                               # the Triton one (tests/cheats/triton; the cpu: interpreter)
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
    import test_triton_pool as TT  # the Triton corpus: cheat_files(), rejected_for(), softmax_task()

    tcheats = TT.cheat_files()
    if only:
        tcheats = [p for p in tcheats if any(o in p.stem for o in only)]
    if ctx.small:
        cheats, honest, tcheats = cheats[:4], honest[:2], tcheats[:2]
    rows = asyncio.run(_evaluate(ctx, T, cheats, honest))
    rows += asyncio.run(_evaluate_triton(ctx, TT, tcheats))
    bad = [r for r in rows if r["verdict"] in ("MISSED", "FAILED")]
    n_cheats = len(cheats) + len(tcheats)
    notes = [f"{sum(r['verdict'] == 'caught' for r in rows)}/{n_cheats} cheats caught "
             f"({len(tcheats)} Triton), "
             f"{sum(r['verdict'] == 'passed' for r in rows)}/{len(honest) + 1} honest kernels passed "
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


async def _evaluate_triton(ctx, TT, cheats: list[Path]) -> list[dict]:
    """The Triton corpus through a triton pool on this device (the GPU, or the interpreter on the
    cpu at the tests' small shape), each judged by its first line's `# expect: kind:what |`, then
    the honest softmax of the same corpus."""
    import re

    from kforge_tui.regions.build import task_of
    from kforge_tui.sandbox.pool import EvaluatorPool
    import torch

    rows_cols = (4096, 64) if ctx.device == "cuda" else (8, 64)  # the corpus's BLOCK is 64
    task = task_of(lambda x: torch.softmax(x, -1), (torch.randn(*rows_cols),), backend="triton")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pool = EvaluatorPool("triton", cache_dir=Path(tmp) / "cache", eval_timeout_s=60, device=ctx.device)
        await pool.start()
        try:
            for p in cheats:
                m = re.match(r"#\s*expect:\s*(static|runtime):(\S+)\s*\|", p.read_text().splitlines()[0])
                kind, what = m.groups() if m else ("?", "?")
                r = await pool.evaluate(task.to_json(), tmp, p.read_text())
                if kind == "static":
                    caught = r.status == "static_error" and f"[{what}]" in (r.log or "")
                else:
                    caught = TT.rejected_for(what, r)
                rows.append({"file": f"triton/{p.name}", "kind": "cheat", "expected": f"{kind}:{what}",
                             "status": r.status, "verdict": "caught" if caught else "MISSED",
                             "message": (r.message or "")[:90]})
                print(f"  triton/{p.name}: {r.status} {'' if caught else 'MISSED'}", file=sys.stderr, flush=True)
            honest = TT.CHEATS / "_honest_softmax.py"
            r = await pool.evaluate(task.to_json(), tmp, honest.read_text())
            rows.append({"file": "triton/_honest_softmax.py", "kind": "honest", "expected": "ok", "status": r.status,
                         "verdict": "passed" if r.status == "ok" else "FAILED",
                         "us": r.timing.median_us if r.timing else None, "message": (r.message or "")[:90]})
        finally:
            await pool.close()
    return rows
