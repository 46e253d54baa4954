"""Run a few family points once each, for Nsight Compute (run on the GPU machine).

    ncu --kernel-name regex:'kf_' --metrics ... python bench/ncu_points.py [round3|round4]

Each point is rendered by its family, compiled, checked against PyTorch once and launched twice
(ncu flushes caches before each profiled launch by default, so DRAM bytes are cold-cache bytes).
The point sets are the ones bench/NOTES.md rounds 3 and 4 ask about (POINT_SETS).
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
from kforge_tui.regions import patterns  # noqa: E402

GN512 = lambda: make("group_norm", (1, 512, 128, 128), "float32", groups=32)  # noqa: E731
LN = lambda: make("layer_norm", (8192, 4096), "bfloat16")  # noqa: E731
RMS = lambda: make("rms_norm", (8192, 4096), "bfloat16", variant="llama")  # noqa: E731
SILU = lambda: make("silu_mul", (8192, 8192), "bfloat16")  # noqa: E731
POINT_SETS = {
    # round 3: why GN [1,512,128,128] f32 stays near 2x its floor; layer_norm vs rms_norm
    "round3": [("GN512 f32", GN512, "cluster_group", dict(cluster=8, threads=512, unroll=2, keep=32)),
               ("GN512 f32", GN512, "cluster_group", dict(cluster=8, threads=1024, unroll=2, keep=0)),
               ("GN512 f32", GN512, "two_phase", dict(threads=256, splits=32, reverse=1)),
               ("layer_norm", LN, "block_row", {}),
               ("layer_norm", LN, "block_row", dict(minb=6)),
               ("rms_norm", RMS, "block_row", {})],
    # round 4: issue rate and instruction counts of layer_norm next to rms_norm, silu*b with IEEE
    # vs fast math (call 1 also had layer_norm 512 threads / wpre and the removed cluster_ring)
    "round4": [("layer_norm", LN, "block_row", {}),
               ("rms_norm", RMS, "block_row", {}),
               ("GN512 f32", GN512, "cluster_group", dict(cluster=8, threads=512, unroll=2, keep=32)),
               ("silu*b", SILU, "rows_vec", dict(math="ieee")),
               ("silu*b", SILU, "rows_vec", dict(math="fast")),
               ("silu*b", SILU, "rows_vec", dict(math="fast", unroll=1))],
    # round 4, last call: Liger's Triton kernels next to the layer/rms norm points the search found
    "round4b": [("layer_norm", LN, "liger", {}),
                ("layer_norm", LN, "block_row", dict(minb=5)),
                ("layer_norm", LN, "block_row", dict(threads=128, cache="none")),
                ("rms_norm", RMS, "liger", {}),
                ("rms_norm", RMS, "block_row", {})],
}


def main() -> int:
    points = POINT_SETS[sys.argv[1] if len(sys.argv) > 1 else "round3"]
    work = Path(tempfile.mkdtemp(prefix="kforge_ncu_"))
    for i, (name, mk, fam_name, over) in enumerate(points):
        task = mk()
        if fam_name == "liger":  # the rival's kernel, launched the same way
            from kernel_quality import liger_callable

            inp = inputs_for(task, torch.Generator(device="cuda").manual_seed(i))
            fn = liger_callable(task)
            for _ in range(2):
                out = fn(inp)
            torch.cuda.synchronize()
            print(f"[{i}] {name} liger: {check(task, out, patterns.reference(task, inp)) or 'ok'}", flush=True)
            continue
        fam = get_family(fam_name, "cuda")
        p = {**fam.default(task), **over}
        so, log = compile_one(fam.render(task, p), work, f"n{i}")
        if so is None:
            print(f"{name} {fam_name} {p}: compile failed {log[:200]}")
            continue
        inp = inputs_for(task, torch.Generator(device="cuda").manual_seed(i))
        ref = patterns.reference(task, inp)
        y = torch.full(task.output.shape, float("nan"), dtype=TD[task.output.dtype], device="cuda")
        call = kernel_call(task, so, inp, y)
        for _ in range(2):
            rc = call()
        torch.cuda.synchronize()
        print(f"[{i}] {name} {fam_name} {p}: rc={rc} {check(task, y, ref) or 'ok'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
