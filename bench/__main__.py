"""python -m bench STEP [STEP ...] [options]: kforge-tui's benchmarks, one named step at a time.

Arguments after `--` go to the one step named (a step that wraps a script passes them on).
Each step prints one table (Markdown, the form bench/RESULTS.md quotes) headed by the machine,
date, commit and command, and writes the same as JSON to --out. Steps run in the order given;
`all` runs every step this machine can (GPU-only steps are skipped, with a note, on a CPU).
Exit status: 0 every table ok, 1 a step measured a failure, 2 bad usage or a step that cannot
run here.

On a GPU machine without internet, wheels carried in a folder are installed first and the steps
run with them: `python -m bench --install-wheels .whl STEP...` (into a temporary target on
PYTHONPATH; with no STEP it prints the `export PYTHONPATH=...` line for your shell).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # `python bench/__main__.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from bench.steps import STEPS, Context, load  # noqa: E402

WHEEL_TARGET = Path(tempfile.gettempdir()) / "kforge_bench_site"


def parser() -> argparse.ArgumentParser:
    mods = {name: load(name) for name in STEPS}
    width = max(map(len, STEPS))
    listing = "\n".join(f"  {n:<{width}}  {mods[n].HELP}" for n in STEPS)
    ap = argparse.ArgumentParser(
        prog="python -m bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 1)[1].split("\n\nOn a GPU")[0] + "\n\nsteps:\n" + listing,
        epilog="Each step's module (bench/steps/<step>.py) says what it runs and how to read it; "
               "bench/RESULTS.md holds the latest figure of each step with the command that made it.")
    ap.add_argument("steps", nargs="*", metavar="STEP", help="steps to run (or 'all')")
    ap.add_argument("--out", type=Path, default=Path("runs") / "bench",
                    help="where the JSON (and each step's runs and logs) go (default: runs/bench)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda when a GPU is visible, else cpu")
    ap.add_argument("--small", action="store_true",
                    help="CPU-sized shapes and tiny budgets: a dry run of the step's whole path")
    ap.add_argument("--budget", type=int, default=None, help="candidates per searched region (steps that search)")
    ap.add_argument("--top", type=int, default=None, help="regions searched per model (steps that search)")
    ap.add_argument("--ops", default=None, help="only these regions (kforge optimize --ops; steps that search)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per command a step runs")
    ap.add_argument("--install-wheels", type=Path, metavar="DIR",
                    help="pip-install DIR/*.whl (no index, no deps) and run the steps with them")
    for name in STEPS:
        if hasattr(mods[name], "add_arguments"):
            mods[name].add_arguments(ap.add_argument_group(f"{name} options"))
    return ap


def install_wheels(folder: Path, steps: list[str]) -> int:
    """Install an offline machine's wheels into WHEEL_TARGET, then re-run this command with it
    first on PYTHONPATH (or print the export line when there is nothing to run)."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        print(f"bench: no wheels in {folder}", file=sys.stderr)
        return 2
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(WHEEL_TARGET), *map(str, wheels)])
    if r.returncode:
        return 1
    path = os.pathsep.join(p for p in (str(WHEEL_TARGET), os.environ.get("PYTHONPATH", "")) if p)
    if not steps:
        print(f"export PYTHONPATH={path}")
        return 0
    argv = _without_install(sys.argv[1:])
    os.execve(sys.executable, [sys.executable, "-m", "bench", *argv], dict(os.environ, PYTHONPATH=path))
    return 0  # not reached


def _without_install(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip or a.startswith("--install-wheels="):
            skip = False
        elif a == "--install-wheels":
            skip = True
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:len(argv) - len(rest) - 1] if "--" in argv else argv)
    if args.install_wheels:
        return install_wheels(args.install_wheels, args.steps)
    if not args.steps:
        ap.print_help()
        return 2
    unknown = [s for s in args.steps if s not in STEPS and s != "all"]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; the steps are: {', '.join(STEPS)}")
    if rest and len(args.steps) != 1:
        ap.error("arguments after -- go to one step: name exactly one")
    args.out = args.out.resolve()  # the steps' commands run from the repository root
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    names = list(STEPS) if args.steps == ["all"] else args.steps
    status = 0
    for name in names:
        step = load(name)
        ctx = Context(args=args, out=args.out, dir=args.out / name, device=device, small=args.small, rest=rest)
        print(f"bench: {name} on {device}{' (small)' if args.small else ''}", file=sys.stderr, flush=True)
        try:
            table = step.run(ctx)
        except report.StepError as e:
            print(f"bench {name}: {e}", file=sys.stderr)
            if args.steps == ["all"] and e.code == 2:
                continue  # `all` skips what this machine cannot run
            status = max(status, e.code)
            continue
        rec = report.record(name, table, report.command_line(argv))
        print(report.render(name, table, rec), flush=True)
        print(f"bench: wrote {report.write(args.out, name, rec)}", file=sys.stderr)
        if not table.ok:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
