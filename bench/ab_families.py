"""A/B timing of kernel-family changes: sources rendered by an older checkout next to the current ones.

    # on the CPU machine, in a checkout of the old version (round 4 used commit fe23645):
    git worktree add /tmp/old fe23645 && cp bench/ab_families.py /tmp/old/bench/
    python /tmp/old/bench/ab_families.py render ab_a    # renders with /tmp/old's families
    # on the GPU machine, in the current version:
    python bench/ab_families.py time ab_a [--only 'layer_norm|rms_norm']

A change to a family's shared code (stores, reductions, the norm epilogue) moves every kernel a
little, and the GPU is shared and noisy between calls, so the old and the new source of each point
are compiled, checked against PyTorch and timed in the same process, alternating A and B over
several rounds (CUDA events, L2 flushed before each call, median per round), and the table gives
B / A with the spread of the per-round ratios. POINTS are (case, family, parameter overrides of the
family's default); the old checkout renders them with its own defaults.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

POINTS = [
    ("layer_norm [8192,4096] bf16", "block_row", {}),
    ("layer_norm [8192,4096] bf16", "block_row", {"minb": 5}),
    ("layer_norm [8192,4096] bf16", "block_row", {"threads": 128}),
    ("layer_norm [8192,4096] bf16", "block_row", {"threads": 128, "cache": "none"}),
    ("rms_norm [8192,4096] bf16", "block_row", {}),
    ("rms_norm [8192,4096] bf16", "block_row", {"minb": 5}),
    # the default is math=fast since round 4; fe23645 has no `math` option and renders IEEE
    ("silu*mul [8192,2x8192] bf16", "rows_vec", {}),
    ("silu*mul [8192,2x8192] bf16", "rows_vec", {"unroll": 1}),
    ("group_norm [1,512,128,128] g32 f32", "cluster_group", {"cluster": 8, "threads": 512, "keep": 32}),
    ("group_norm [1,512,128,128] g32 f32", "two_phase", {"threads": 256}),
    ("group_norm [1,512,128,128] g32 bf16", "cluster_group", {"cluster": 8, "threads": 512, "keep": 32}),
    ("group_norm [1,256,512,512] g32 bf16", "cluster_group", {"cluster": 16, "threads": 1024, "keep": 64}),
    ("softmax [1,8,2048,2048] bf16", "block_row", {}),
    ("softmax [8,262144] f32", "cluster_row", {}),
    ("softmax [4096,256] f32", "warp_row", {}),
    ("pool [32,2048,7,7] f32", "global_tile", {}),
]


def _case(name):
    from check_families_gpu import CASES

    return dict(CASES)[name]()


def _family(task, name):
    """The family called `name` that serves the task (block_row is a norm and a softmax family)."""
    from kforge_tui.search.families import families_for

    return next(f for f in families_for(task) if f.name == name and f.backend == "cuda")


def render(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for i, (case, fam_name, over) in enumerate(POINTS):
        task = _case(case)
        fam = _family(task, fam_name)
        # an option this checkout does not have is left at its (only) behaviour
        p = {k: v for k, v in {**fam.default(task), **over}.items() if k in fam.space}
        if not fam.valid(task, p):
            print(f"skip (invalid here): {case} {fam_name} {p}")
            continue
        (out / f"a{i}.cu").write_text(fam.render(task, p))
        manifest.append({"case": case, "family": fam_name, "over": over, "params": p, "file": f"a{i}.cu"})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"rendered {len(manifest)} points into {out}")
    return 0


def time_ab(adir: Path, rounds: int, reps: int, only: str = "") -> int:
    import torch
    from check_families_gpu import checked_call, compile_one, inputs_for, time_fn

    from kforge_tui.regions import patterns

    work = Path(tempfile.mkdtemp(prefix="kforge_ab_"))
    flush = torch.empty(2**26, dtype=torch.float32, device="cuda")
    manifest = json.loads((adir / "manifest.json").read_text())
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  rounds {rounds} x {reps} calls", flush=True)
    rows = []
    for m in manifest:
        if only and not any(o in m["case"] for o in only.split("|")):
            continue
        task = _case(m["case"])
        fam = _family(task, m["family"])
        over = dict(m["over"])
        pb = {**fam.default(task), **over}
        srcs = {"A": (adir / m["file"]).read_text(), "B": fam.render(task, pb)}
        inp = inputs_for(task, torch.Generator(device="cuda").manual_seed(len(rows)))
        ref = patterns.reference(task, inp)
        calls = {}
        for k, src in srcs.items():
            so, log = compile_one(src, work, f"{k}{m['file'][:-3]}")
            if so is None:
                print(f"  {m['case']} {m['family']} {k}: COMPILE FAIL {log[:160]}", flush=True)
                continue
            call, err = checked_call(task, so, inp, ref)
            if err:
                print(f"  {m['case']} {m['family']} {k}: WRONG {err}", flush=True)
                continue
            calls[k] = call
        if len(calls) < 2:
            continue
        ta, tb = [], []
        for _ in range(rounds):
            ta.append(time_fn(calls["A"], reps, flush))
            tb.append(time_fn(calls["B"], reps, flush))
        ratios = [b / a for a, b in zip(ta, tb)]
        label = " ".join(f"{k}={v}" for k, v in over.items()) or "default"
        rows.append((m["case"], m["family"], label, statistics.median(ta), statistics.median(tb), ratios))
        print(f"  {m['case']} {m['family']} {label}: A {statistics.median(ta):.1f} us  B {statistics.median(tb):.1f} us",
              flush=True)
    print(f"\n{'case':38s} {'family':14s} {'point':24s} {'A us':>8s} {'B us':>8s} {'B/A':>6s} {'spread':>13s}")
    for case, fam, label, a, b, r in rows:
        print(f"{case:38s} {fam:14s} {label:24s} {a:8.1f} {b:8.1f} {statistics.median(r):6.3f} "
              f"{min(r):6.3f}-{max(r):.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="render POINTS with this checkout into DIR (the A side)")
    r.add_argument("dir", type=Path)
    t = sub.add_parser("time", help="time DIR's A sources against this checkout's (GPU)")
    t.add_argument("dir", type=Path)
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--reps", type=int, default=20)
    t.add_argument("--only", default="", help="cases whose name contains one of these ('|'-separated)")
    a = ap.parse_args()
    return render(a.dir) if a.cmd == "render" else time_ab(a.dir, a.rounds, a.reps, a.only)


if __name__ == "__main__":
    sys.exit(main())
