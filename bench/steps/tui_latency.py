"""tui-latency: key press to screen updated in the real app (headless, Textual's test driver at
100x30) with a 2,000-node tree and 8 evaluations streaming stage events (bench/tui_latency.py).

    python -m bench tui-latency                  # 200 presses
    python -m bench tui-latency --presses 60

Target (issue 5): median <= 50 ms, worst <= 200 ms. No GPU involved.
"""
from __future__ import annotations

import asyncio
import contextlib
import sys

from bench.report import ROOT, Table

HELP = "key press -> screen updated in the TUI with a 2,000-node tree streaming (bench/tui_latency.py)"


def add_arguments(g) -> None:
    g.add_argument("--presses", type=int, default=200, help="tui-latency: key presses (default 200; --small 20)")


def run(ctx) -> Table:
    sys.path.insert(0, str(ROOT / "bench"))
    import tui_latency

    presses = 20 if ctx.small and ctx.args.presses == 200 else ctx.args.presses
    with contextlib.redirect_stdout(sys.stderr):  # its own summary line is progress here
        res = asyncio.run(tui_latency.main(presses))
    met = res["median_ms"] <= 50 and res["worst_ms"] <= 200  # a miss is a figure, not a failed run
    return Table(["presses", "tree_nodes", "nodes", "median_ms", "worst_ms"], [res],
                 ["target: median <= 50 ms, worst <= 200 ms: " + ("met" if met else "missed")])
