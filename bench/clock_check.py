"""Step `clock-check`: do the end-to-end clocks agree with triton's do_bench on the same forwards?

One model, three forwards compiled in this order: torch.compile, the kforge backend with no
kernel (what `apply` gives when nothing is kept), and torch.compile again (to see whether the
order of compilation matters). Each is timed by do_bench three times, alternated, and by the
throughput clock (integrate/measure.py) with short and long blocks. A kforge backend with no
kernel must read as torch.compile does on every clock.

    python -m bench clock-check sample_models/resnet50.py
"""
from __future__ import annotations

import argparse
import statistics
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench clock-check", description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="sample_models/resnet50.py")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    import torch

    from kforge_tui.integrate import decide, measure
    from kforge_tui.workload.loader import load_model

    loaded = load_model(a.model, a.device)
    model, inputs = loaded.model, loaded.example_inputs
    call = (lambda f: f(**inputs)) if isinstance(inputs, dict) else (lambda f: f(*inputs))
    with decide._recompile_room(), torch.inference_mode():
        fns = {"compile": torch.compile(model, dynamic=False)}
        call(fns["compile"])
        fns["kforge0"], _ = decide.kforge_fn(model, [], "cuda" if a.device == "cuda" else "cpu", "compile", None)
        call(fns["kforge0"])
        fns["compile2"] = torch.compile(model, dynamic=False)
        call(fns["compile2"])
        db = {k: [] for k in fns}
        for _ in range(3):
            for name, fn in fns.items():
                db[name].append(measure.do_bench({name: fn}, inputs, a.device)[name])
        short = measure.throughput(fns, inputs, a.device, rounds=12, block=8)
        long = measure.throughput(fns, inputs, a.device, rounds=4, block=64)
        lat = measure.latency(fns, inputs, a.device)
    print(f"clock-check {a.model} on {a.device}: ms per forward (median)")
    print(f"{'forward':10} {'do_bench (3 runs)':>26} {'thr block 8':>12} {'thr block 64':>13} {'latency':>9}")
    for name in fns:
        runs = " ".join(f"{x:.3f}" for x in db[name])
        print(f"{name:10} {runs:>26} {short.median(name):>12.3f} {long.median(name):>13.3f} {lat.median(name):>9.3f}")
    base = statistics.median(db["compile"])
    print("kforge0 / compile: do_bench %.3f, thr8 %.3f, thr64 %.3f, latency %.3f" % (
        statistics.median(db["kforge0"]) / base, short.median("kforge0") / short.median("compile"),
        long.median("kforge0") / long.median("compile"), lat.median("kforge0") / lat.median("compile")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
