"""clock-check: do the end-to-end clocks agree with triton's do_bench on the same forwards?

One model, three forwards compiled in this order: torch.compile, the kforge backend with no
kernel (the backend every model with a kept kernel runs through; with none kept `apply` gives
torch.compile itself) and torch.compile again (whether the order of
compilation matters). The decision's own measurement (decide.py: two forwards alone, paired
rounds, compare_blocks) is run on pairs of these, which must never keep one over the other. Each is timed by do_bench three times, alternated, and by the end-to-end
clocks of integrate/measure.py: throughput (short and long blocks) and latency. The kforge
backend with no kernel must read as torch.compile does on every clock, and each clock's
kforge / compile ratio must agree with do_bench's within 5 % (issue 26).

    python -m bench clock-check --model sample_models/resnet50.py
    python -m bench clock-check --model sample_models/sd35_vae.py --kernels 12

With `--kernels N` (GPU) the torch profiler also records three forwards of torch.compile and of
kforge0, and the N device kernels whose time per forward differs most between the two are
rows of their own (what an empty kforge backend changes in the compiled code, if anything).
"""
from __future__ import annotations

import statistics

from bench.report import Table

HELP = "the end-to-end clocks against triton's do_bench, on torch.compile and an empty kforge backend"


def add_arguments(g) -> None:
    g.add_argument("--model", default="sample_models/resnet50.py", help="MODEL spec to time")
    g.add_argument("--kernels", type=int, default=0,
                   help="clock-check: also list the N device kernels whose time differs most (profiler)")


def kernel_times(fn, call, forwards: int = 3) -> dict[str, float]:
    """Device microseconds per forward of each kernel name, from the torch profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call(fn)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            call(fn)
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        us = e.self_device_time_total  # a kernel's own; a CPU op that launched it would count it again
        if us:
            out[e.key] = out.get(e.key, 0.0) + us / forwards
    return out


def kernel_rows(a: dict, b: dict, n: int) -> list[dict]:
    """The n kernels whose per-forward time differs most between a (compile) and b (kforge0)."""
    names = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0.0) - a.get(k, 0.0)))[:n]
    return [{"forward": f"kernel {k[:90]}", "compile_us": round(a.get(k, 0.0), 1),
             "kforge0_us": round(b.get(k, 0.0), 1)} for k in names]


def run(ctx) -> Table:
    import torch

    from kforge_tui.integrate import decide, measure
    from kforge_tui.workload.loader import load_model

    loaded = load_model(ctx.args.model, ctx.device)
    model, inputs = loaded.model, loaded.example_inputs
    call = (lambda f: f(**inputs)) if isinstance(inputs, dict) else (lambda f: f(*inputs))
    backend = "cuda" if ctx.device == "cuda" else "cpu"
    with decide._recompile_room(), torch.inference_mode():
        fns = {"compile": torch.compile(model, dynamic=False)}
        call(fns["compile"])
        fns["kforge0"], _ = decide.kforge_fn(model, [], backend, "compile", None)
        call(fns["kforge0"])
        fns["compile2"] = torch.compile(model, dynamic=False)
        call(fns["compile2"])
        db = {k: [] for k in fns}
        if ctx.device == "cuda":
            for _ in range(3):
                for name, fn in fns.items():
                    db[name].append(measure.do_bench({name: fn}, inputs, ctx.device)[name])
        # the decision's own measurement (decide.py): two forwards alone, paired rounds, its
        # verdict; both orders. The same graph must never read as a gain here.
        pairs = []
        for cur, trial in (("compile", "kforge0"), ("kforge0", "compile"), ("compile", "compile2")):
            ps = measure.throughput({"current": fns[cur], "trial": fns[trial]}, inputs, ctx.device)
            v = measure.compare_blocks(ps, "current", "trial")
            pairs.append({"forward": f"decision pair: {cur} then {trial}", "thr8_ms": ps.median("trial"),
                          "latency_ms": None, "do_bench_ms": None,
                          "do_bench_runs": f"current/trial {v.ratio:.3f}, {'KEPT' if v.faster else 'dropped'}: {v.why}"})
        short = measure.throughput(fns, inputs, ctx.device, rounds=12, block=8)
        long = measure.throughput(fns, inputs, ctx.device, rounds=4, block=64)
        lat = measure.latency(fns, inputs, ctx.device)
        kernels = []
        if ctx.args.kernels and ctx.device == "cuda":
            ka, kb = kernel_times(fns["compile"], call), kernel_times(fns["kforge0"], call)
            kernels = [{"forward": "all kernels (profiler)", "compile_us": round(sum(ka.values()), 1),
                        "kforge0_us": round(sum(kb.values()), 1)}] + kernel_rows(ka, kb, ctx.args.kernels)
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    rows = [{"forward": n, "do_bench_ms": med(db[n]), "do_bench_runs": [round(x, 4) for x in db[n]],
             "thr8_ms": short.median(n), "thr64_ms": long.median(n), "latency_ms": lat.median(n)} for n in fns]
    ratio = lambda col: (rows[1][col] / rows[0][col]) if rows[0][col] and rows[1][col] else None  # noqa: E731
    ratios = {c: ratio(c) for c in ("do_bench_ms", "thr8_ms", "thr64_ms", "latency_ms")}
    rows.append({"forward": "kforge0/compile", **{c: round(v, 3) if v else None for c, v in ratios.items()}})
    rows += pairs + kernels
    agree = ratios["do_bench_ms"] is None or abs(ratios["thr8_ms"] / ratios["do_bench_ms"] - 1) <= 0.05
    cols = ["forward", "do_bench_ms", "thr8_ms", "thr64_ms", "latency_ms", "do_bench_runs"]
    return Table(cols + (["compile_us", "kforge0_us"] if kernels else []), rows,
                 [f"{ctx.args.model} on {ctx.device}: ms per forward, medians",
                  "throughput (the decision clock) " + ("agrees with" if agree else "DISAGREES with")
                  + " do_bench on kforge0/compile within 5 %",
                  "decision pairs: the same graph twice must be dropped in either order"
                  + ("" if not any("KEPT" in r["do_bench_runs"] for r in pairs) else " (one was KEPT: the "
                     "decision's measurement can read a gain where there is none)")], {},
                 agree and not any("KEPT" in r["do_bench_runs"] for r in pairs))
