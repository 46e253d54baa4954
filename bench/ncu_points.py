"""Run a few family points once each, for Nsight Compute (run on the GPU machine).

    ncu --kernel-name regex:'kf_' --metrics ... python bench/ncu_points.py

Each point is rendered by its family, compiled, checked against PyTorch once and launched twice
(ncu flushes caches before each profiled launch by default, so DRAM bytes are cold-cache bytes).
The points are the ones bench/NOTES.md round 3 asks about: why group_norm [1,512,128,128] f32
stays near 2x its floor and why layer_norm runs slower than rms_norm with the same design.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from check_families_gpu import TD, check, compile_one, inputs_for, kernel_call, make  # noqa: E402

from kforge_tui.search.families import get_family  # noqa: E402
from kforge_tui.workload import catalogue  # noqa: E402

POINTS = [
    ("GN512 f32", lambda: make("group_norm", (1, 512, 128, 128), "float32", groups=32), "cluster_group",
     dict(cluster=8, threads=512, unroll=2, keep=32)),
    ("GN512 f32", lambda: make("group_norm", (1, 512, 128, 128), "float32", groups=32), "cluster_group",
     dict(cluster=8, threads=1024, unroll=2, keep=0)),
    ("GN512 f32", lambda: make("group_norm", (1, 512, 128, 128), "float32", groups=32), "two_phase",
     dict(threads=256, splits=32, reverse=1)),
    ("layer_norm", lambda: make("layer_norm", (8192, 4096), "bfloat16"), "block_row", {}),
    ("layer_norm", lambda: make("layer_norm", (8192, 4096), "bfloat16"), "block_row", dict(minb=6)),
    ("rms_norm", lambda: make("rms_norm", (8192, 4096), "bfloat16", variant="llama"), "block_row", {}),
]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kforge_ncu_"))
    for i, (name, mk, fam_name, over) in enumerate(POINTS):
        task = mk()
        fam = get_family(fam_name, "cuda")
        p = {**fam.default(task), **over}
        so, log = compile_one(fam.render(task, p), work, f"n{i}")
        if so is None:
            print(f"{name} {fam_name} {p}: compile failed {log[:200]}")
            continue
        inp = inputs_for(task, torch.Generator(device="cuda").manual_seed(i))
        ref = catalogue.reference(task, inp)
        y = torch.full(task.output.shape, float("nan"), dtype=TD[task.output.dtype], device="cuda")
        call = kernel_call(task, so, inp, y)
        for _ in range(2):
            rc = call()
        torch.cuda.synchronize()
        print(f"[{i}] {name} {fam_name} {p}: rc={rc} {check(task, y, ref) or 'ok'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
