"""Print one table from `kforge show --json` / `kforge apply --json` files (GPU round 5 steps).

    python3 bench/e2e_table.py regions  RUN_DIR...   # per task: eager, torch.compile, best, floor
    python3 bench/e2e_table.py models   APPLY.json...   # per model: eager, torch.compile, kforge

Ratios are of figures measured side by side in one run (the sandbox's interleaved timing for
regions, e2e.py's alternated forwards for models); absolute times are for orientation only.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _f(x, fmt="{:.1f}"):
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def regions(run_dirs: list[str]) -> None:
    print(f"{'run':24} {'region':26} {'shape':22} {'eager':>9} {'compile':>9} {'best':>9} "
          f"{'floor':>8} {'/eager':>7} {'/compile':>8}")
    for rd in run_dirs:
        out = subprocess.run([sys.executable, "-m", "kforge_tui", "show", rd, "--json"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{Path(rd).name:24} show failed: {out.stderr.strip()[:100]}")
            continue
        for t in json.loads(out.stdout)["tasks"]:
            e, c, b = t.get("baseline_us"), t.get("compiled_us"), t.get("best_us")
            print(f"{Path(rd).name[:24]:24} {t['op'][:26]:26} {'x'.join(map(str, t['shape']))[:22]:22} "
                  f"{_f(e):>9} {_f(c):>9} {_f(b):>9} {_f(t.get('floor_us')):>8} "
                  f"{_f(e / b if e and b else None, '{:.2f}x'):>7} "
                  f"{_f(c / b if c and b else None, '{:.2f}x'):>8}")


def models(files: list[str]) -> None:
    print(f"{'model':22} {'mode':8} {'eager ms':>9} {'compile ms':>10} {'kforge ms':>9} "
          f"{'vs eager':>8} {'vs compile':>10} {'within tol':>10} kernels")
    for f in files:
        try:
            r = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            print(f"{Path(f).stem:22} unreadable: {e}")
            continue
        print(f"{Path(f).stem[:22]:22} {r.get('mode', '-'):8} {_f(r.get('eager_ms'), '{:.3f}'):>9} "
              f"{_f(r.get('compile_ms'), '{:.3f}'):>10} {_f(r.get('patched_ms'), '{:.3f}'):>9} "
              f"{_f(r.get('speedup'), '{:.2f}x'):>8} {_f(r.get('speedup_vs_compile'), '{:.2f}x'):>10} "
              f"{str(r.get('within_tolerance')):>10} {sum((r.get('kernels_used') or {}).values())}")


if __name__ == "__main__":
    kind, args = sys.argv[1], sys.argv[2:]
    {"regions": regions, "models": models}[kind](args)
