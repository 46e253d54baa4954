"""throughput: candidates per minute and source-to-result latency of the evaluation pipeline
(static check, compile and binary check, fresh runner process, verify, time), as the search
submits them: bench/eval_throughput.py run as it is (the script stays callable on its own), its
summary line read into the table and its per-stage figures (median, p90, mean s) into the JSON.

    python -m bench throughput                              # 20 softmax candidates, this device
    python -m bench throughput --runs 3                     # three runs (a loaded host is noisy)
    python -m bench throughput --backends cuda,triton       # each kernel language in turn
    python -m bench throughput --throughput-args "--n 60 --in-flight 8"   # any of the script's options
    python -m bench throughput --triton                     # also bench/triton_throughput.py (GPU)

Issue 20's bar on one H200: cuda >= 200 candidates/min with a median latency <= 2 s (per-candidate
isolation, every timed call checked), triton >= 120/min.
"""
from __future__ import annotations

import json
import re
import shlex
import sys

from bench.report import ROOT, Table

HELP = "candidates/min, latency and the time of each stage through the sandbox (bench/eval_throughput.py)"
COLUMNS = ["run", "backend", "shape", "n", "ok", "cand/min", "latency med s", "compile med s", "verify med s",
           "time med s", "worker mean s"]
TARGETS = {"cuda": (200, 2.0), "triton": (120, None)}  # issue 20, one H200: per minute, median latency


def add_arguments(g) -> None:
    g.add_argument("--runs", type=int, default=1, help="throughput: runs of the script per backend (default 1)")
    g.add_argument("--backends", default=None,
                   help="throughput: kernel languages, comma-separated (cpu, cuda, triton; default: the device's)")
    g.add_argument("--throughput-args", default="", help="extra options for bench/eval_throughput.py")
    g.add_argument("--triton", action="store_true", help="also run bench/triton_throughput.py (GPU)")


def summary(text: str) -> dict:
    """The script's last table line, `| key value | ... |`, as {key: value}."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|") and "| backend " in f"{ln} "]
    if not lines:
        return {}
    out = {}
    cells = lines[-1].strip("| \n").split(" | ")
    if cells and not cells[0].startswith("backend "):  # the run's label (`local pool`, `ray, 2 nodes`)
        out["run"] = cells.pop(0)
    for cell in cells:
        toks = cell.split()
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
    extra = shlex.split(ctx.args.throughput_args) + list(ctx.rest or [])
    backends = [b.strip() for b in (ctx.args.backends or ctx.device).split(",") if b.strip()]
    rows, ok, stages = [], True, {}
    for backend in backends:
        for k in range(ctx.args.runs):
            log, js = f"eval_throughput.{backend}.{k}.log", ctx.dir / f"eval_throughput.{backend}.{k}.json"
            r = ctx.sh([sys.executable, str(ROOT / "bench" / "eval_throughput.py"), "--backend", backend, *small,
                        *extra, "--json", str(js)], log)
            row = {"run": k, **summary((ctx.dir / log).read_text())}
            row.setdefault("worker mean s", row.pop("worker mean", None))
            ok &= r.returncode == 0 and bool(row.get("cand/min"))
            rows.append(row)
            if js.exists():
                stages[f"{backend}.{k}"] = json.loads(js.read_text())
    extra_json = {"runs": stages}
    if ctx.args.triton:
        ctx.need_gpu("Triton candidates run on the GPU (the CPU tests use the interpreter)")
        out = ctx.dir / "triton.json"
        r = ctx.sh([sys.executable, str(ROOT / "bench" / "triton_throughput.py"), "--json", str(out)]
                   + (["--candidates", "6"] if ctx.small else []), "triton_throughput.log")
        ok &= r.returncode == 0
        extra_json["triton"] = json.loads(out.read_text()) if out.exists() else None
    notes = [f"bench/eval_throughput.py --backend {','.join(backends)} {shlex.join(small + extra)}".rstrip()]
    for run_name, fig in stages.items():
        st = fig.get("stages", {})
        notes.append(f"{run_name}: stage means (s) " + ", ".join(f"{k} {v['mean']:.3f}" for k, v in st.items()))
    for b in backends:
        if b in TARGETS:
            per_min, lat = TARGETS[b]
            notes.append(f"target (issue 20, one H200, {b}): >= {per_min} candidates/min"
                         + (f", median latency <= {lat:g} s" if lat else ""))
    return Table(COLUMNS, rows, notes, extra_json, ok)
