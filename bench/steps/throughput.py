"""throughput: candidates per minute and source-to-result latency of the evaluation pipeline
(static check, compile and binary check, fresh runner process, verify, time), as the search
submits them: bench/eval_throughput.py run as it is (the script stays callable on its own) and
its summary line read into the table.

    python -m bench throughput                              # 20 softmax candidates, this device
    python -m bench throughput --runs 3                     # three runs (a loaded host is noisy)
    python -m bench throughput --throughput-args "--warm-compile"   # any of the script's options
    python -m bench throughput --triton                     # also bench/triton_throughput.py (GPU)

Issue 17's bar on an H200: >= 300 candidates/min, median latency <= 2 s.
"""
from __future__ import annotations

import json
import re
import shlex
import sys

from bench.report import ROOT, Table

HELP = "candidates/min and latency through the sandbox (bench/eval_throughput.py; --triton: Triton seeds)"
COLUMNS = ["run", "backend", "shape", "n", "ok", "cand/min", "latency med s", "compile med s", "verify med s",
           "time med s"]


def add_arguments(g) -> None:
    g.add_argument("--runs", type=int, default=1, help="throughput: runs of the script (default 1)")
    g.add_argument("--throughput-args", default="", help="extra options for bench/eval_throughput.py")
    g.add_argument("--triton", action="store_true", help="also run bench/triton_throughput.py (GPU)")


def summary(text: str) -> dict:
    """The script's last table line, `| key value | ... |`, as {key: value}."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|") and "| backend " in f"{ln} "]
    if not lines:
        return {}
    out = {}
    for cell in lines[-1].strip("| \n").split(" | "):
        toks = cell.split()
        if len(toks) == 1:  # the run's label (`local`, `ray 2 nodes`): a cell with no value
            out.setdefault("run", toks[0])
            continue
        i = next((k for k, t in enumerate(toks) if k and re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?", t)),
                 len(toks) - 1)
        key, val = " ".join(toks[:i]), toks[i:]
        if len(val) == 2 and val[1] == "s":  # "11.50 s": seconds, as a number
            key, val = f"{key} s", val[:1]
        val = " ".join(val)
        out[key] = (int(val) if val.lstrip("+-").isdigit() else float(val) if re.fullmatch(r"[-+]?[\d.]+", val)
                    else val)
    return out


def run(ctx) -> Table:
    small = ["--n", "6", "--shape", "64,256"] if ctx.small else []
    extra = shlex.split(ctx.args.throughput_args)
    rows, ok = [], True
    for k in range(ctx.args.runs):
        log = f"eval_throughput.{k}.log"
        r = ctx.sh([sys.executable, str(ROOT / "bench" / "eval_throughput.py"), "--backend", ctx.device, *small,
                    *extra], log)
        row = {"run": k, **summary((ctx.dir / log).read_text())}
        ok &= r.returncode == 0 and bool(row.get("cand/min"))
        rows.append(row)
    extra_json = {}
    if ctx.args.triton:
        ctx.need_gpu("Triton candidates run on the GPU (the CPU tests use the interpreter)")
        out = ctx.dir / "triton.json"
        r = ctx.sh([sys.executable, str(ROOT / "bench" / "triton_throughput.py"), "--json", str(out)]
                   + (["--candidates", "6"] if ctx.small else []), "triton_throughput.log")
        ok &= r.returncode == 0
        extra_json["triton"] = json.loads(out.read_text()) if out.exists() else None
    notes = [f"bench/eval_throughput.py --backend {ctx.device} {shlex.join(small + extra)}".rstrip(),
             "target (issue 17, H200): >= 300 candidates/min, median latency <= 2 s"]
    return Table(COLUMNS, rows, notes, extra_json, ok)
