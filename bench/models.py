"""Step `models`: eager vs torch.compile vs kforge on whole models, default and reduce-overhead.

For each MODEL spec: `kforge optimize MODEL --headless` (its end-of-run check decides, on the
compiled model in default mode, which kernels ship), then `kforge apply RUN_DIR MODEL` once per
Inductor mode asked (`--modes default,reduce-overhead`), each comparing like with like: kforge in
a mode against torch.compile in the same mode. One table: per model and mode, eager,
torch.compile and kforge on the decision clock (throughput: back-to-back forwards, CUDA events)
and on triton's do_bench of the same forwards, kforge / compile on both, kernels kept of those
tried, and the wall time of the optimize run. JSON of every run goes to --out.

    python -m bench models sample_models/resnet50.py sample_models/gemma.py --budget 20
    python -m bench models --apply-only RUN_DIR=MODEL ...      # re-measure finished runs
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _kforge(args: list[str], timeout: float) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "kforge_tui", *args], capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        return 124, e.stdout or "", (e.stderr or "") + f"\ntimed out after {timeout:.0f} s", time.perf_counter() - t0


def _json_tail(text: str) -> dict | None:
    """The last JSON object printed (the CLI prints progress before its --json result)."""
    i = text.rfind("\n{")
    for start in ([i + 1] if i >= 0 else []) + [0]:
        try:
            return json.loads(text[start:])
        except ValueError:
            continue
    return None


def _row(model: str, mode: str, rep: dict | None, wall: float | None, rc: int, err: str) -> dict:
    if not rep:
        return {"model": model, "mode": mode, "error": (err.strip().splitlines() or [f"exit {rc}"])[-1][:160]}
    db = rep.get("do_bench_ms") or {}
    dec = rep.get("decision") or {}
    return {"model": model, "mode": mode, "eager_ms": rep.get("eager_ms"), "compile_ms": rep.get("compile_ms"),
            "kforge_ms": rep.get("patched_ms"), "vs_compile": rep.get("speedup_vs_compile"),
            "spread": max(v for v in (rep.get("compile_spread"), rep.get("patched_spread")) if v is not None)
            if rep.get("patched_spread") is not None else None,
            "db_compile_ms": db.get("compile"), "db_kforge_ms": db.get("kforge"),
            "db_vs_compile": (db["compile"] / db["kforge"]) if db.get("compile") and db.get("kforge") else None,
            "kept": len(dec.get("kept") or []), "tried": sum(1 for t in dec.get("trials") or [] if t.get("gain") is not None),
            "candidates": len(dec.get("trials") or []), "within_tolerance": rep.get("within_tolerance"),
            "op_impl": rep.get("op_impl"), "optimize_s": wall, "clock": rep.get("clock")}


def _f(x, fmt="{:.3f}"):
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def print_table(rows: list[dict]) -> None:
    print(f"{'model':26} {'mode':15} {'eager':>8} {'compile':>8} {'kforge':>8} {'vs comp':>8} "
          f"{'spread':>6} {'db vs comp':>10} {'kept':>6} {'optimize':>9}")
    for r in rows:
        if r.get("error"):
            print(f"{r['model'][:26]:26} {r['mode']:15} failed: {r['error']}")
            continue
        print(f"{r['model'][:26]:26} {r['mode']:15} {_f(r['eager_ms']):>8} {_f(r['compile_ms']):>8} "
              f"{_f(r['kforge_ms']):>8} {_f(r['vs_compile'], '{:.2f}x'):>8} {_f(r['spread'], '{:.0%}'):>6} "
              f"{_f(r['db_vs_compile'], '{:.2f}x'):>10} {r['kept']}/{r['tried']:<4} "
              f"{_f(r['optimize_s'], '{:.0f} s'):>9}")


def run(models: list[str], *, out: Path, budget: int | None, top: int | None, modes: list[str],
        device: str | None, apply_only: dict[str, str] | None = None, timeout: float = 1800.0) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    todo = list(apply_only.items()) if apply_only else [(None, m) for m in models]
    for run_dir, model in todo:
        name = Path(model.split(":")[0]).stem
        wall, res = None, {}
        if run_dir is None:
            run_dir = str(out / f"run_{name}")
            args = ["optimize", model, "--headless", "--json", "--run-dir", run_dir]
            args += ["--budget", str(budget)] if budget else []
            args += ["--top", str(top)] if top else []
            args += ["--device", device] if device else []
            rc, so, se, wall = _kforge(args, timeout)
            (out / f"optimize_{name}.log").write_text(se[-200_000:])
            res = _json_tail(so) or {}
            (out / f"optimize_{name}.json").write_text(json.dumps(res, indent=1, default=str))
            print(f"{name}: optimize exit {rc} in {wall:.0f} s", file=sys.stderr)
        for mode in modes:
            done = (res.get("end_to_end") or {}) if wall is not None else {}
            if mode == "default" and done.get("inductor_mode") == "default" and done.get("eager_ms"):
                # optimize's own end-of-run check measured this mode: the same code as apply's
                rows.append(_row(name, mode, done, wall, 0, ""))
                print_table(rows[-1:])
                continue
            args = ["apply", run_dir, model, "--json"] + (["--device", device] if device else [])
            if mode != "default":
                args += ["--inductor-mode", mode]
            rc, so, se, _ = _kforge(args, timeout)
            rep = _json_tail(so)
            (out / f"apply_{name}_{mode}.json").write_text(json.dumps(rep, indent=1, default=str))
            rows.append(_row(name, mode, rep, wall, rc, se))
            print_table(rows[-1:])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench models", description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="MODEL specs (default: the four samples)")
    ap.add_argument("--budget", type=int, default=None, help="optimize --budget (default: kforge's)")
    ap.add_argument("--top", type=int, default=None, help="optimize --top (default: kforge's)")
    ap.add_argument("--modes", default="default,reduce-overhead", help="Inductor modes, comma-separated")
    ap.add_argument("--device", default=None)
    ap.add_argument("--apply-only", nargs="*", default=None, metavar="RUN_DIR=MODEL")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per kforge command")
    ap.add_argument("--out", default="bench_out/models")
    a = ap.parse_args(argv)
    models = a.models or [f"sample_models/{m}.py" for m in ("resnet50", "gemma", "qwen_moe", "sd35_vae")]
    apply_only = dict(x.split("=", 1) for x in a.apply_only) if a.apply_only else None
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    rows = run(models, out=Path(a.out), budget=a.budget, top=a.top,
               modes=[m.strip() for m in a.modes.split(",") if m.strip()], device=a.device,
               apply_only=apply_only, timeout=a.timeout)
    import platform

    summary = {"step": "models", "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(),
               "rows": rows}
    Path(a.out, "models.json").write_text(json.dumps(summary, indent=1, default=str))
    print()
    print(f"models ({summary['date']}; ratios from forwards alternated in one process; db = triton do_bench)")
    print_table(rows)
    return 0 if all(not r.get("error") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
