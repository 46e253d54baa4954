"""GPU checks of the shape-robust family variants (issue 14) against `patterns.reference`.

Run on the GPU machine: `pytest -m gpu tests/test_families_gpu.py` (~1-2 minutes on an H200,
most of it nvcc). Every case renders a family point for one task, compiles it (all cases in a
few translation units, in parallel), calls its `kforge_launch_<i>` through ctypes on random
inputs (softmax rows partly masked with -inf), output poisoned with NaN first, and compares with
the reference under the per-dtype tolerance. Cases marked "run at" call the kernel rendered for
one shape with other sizes at run time: the launchers' runtime checks must take it to a correct
path (the generic fallback) whatever the sizes.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families_util import NVCC, TD, TOL, batch_cuda, compile_one, make  # noqa: E402

from kforge_tui.regions import patterns  # noqa: E402
from kforge_tui.search.families import get_family  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NVCC is None, reason="nvcc not installed")]


def _t(op, shape, dtype, **kw):
    return make(op, shape, dtype, "cuda", **kw)


SM32 = _t("softmax", (16, 262144), "float32")
LN32 = _t("layer_norm", (16, 1_048_576), "float32")
GN512 = _t("group_norm", (1, 512, 128, 128), "float32", groups=32)
POOL = _t("adaptive_avg_pool2d", (1, 16, 1024, 1024), "float32", output_size=[1, 1])

# (render task, family, parameter overrides of its default, run task or None = the render task)
CASES = [
    # few long rows over the whole GPU (cooperative grid, chunks kept in shared memory)
    (SM32, "coop_row", {}, None),
    (SM32, "coop_row", {"keep": 0}, None),
    (SM32, "coop_row", {"keep": 160, "threads": 1024, "unroll": 4}, None),
    (_t("log_softmax", (3, 100000), "bfloat16"), "coop_row", {}, None),
    (_t("softmax", (1, 10_000_000), "float32"), "coop_row", {}, None),
    (_t("softmax", (5, 65537), "float16"), "coop_row", {"vec": 1}, None),
    (_t("softmax", (4, 65536), "bfloat16", out_dtype="float32"), "coop_row", {}, None),
    (LN32, "coop_row", {}, None),
    (_t("rms_norm", (4, 300000), "bfloat16", variant="gemma"), "coop_row", {}, None),
    (_t("rms_norm", (2, 524288), "float16", variant="llama"), "coop_row", {"keep": 224, "threads": 1024}, None),
    (_t("layer_norm", (3, 50001), "float16"), "coop_row", {"vec": 1}, None),
    (GN512, "coop_row", {}, None),
    (GN512, "coop_row", {"keep": 224, "threads": 1024}, None),
    (_t("group_norm", (2, 30, 33, 33), "float16", groups=6), "coop_row", {}, None),
    # clusters with chunks kept on chip (many long rows run in waves of clusters)
    (_t("softmax", (256, 65536), "float32"), "cluster_row", {"keep": 64, "cluster": 4}, None),
    (_t("log_softmax", (2, 40000), "bfloat16"), "cluster_row", {}, None),
    (_t("layer_norm", (64, 131072), "bfloat16"), "cluster_row", {"keep": 64}, None),
    (_t("rms_norm", (1000, 8192), "float32"), "cluster_row", {}, None),
    # many short rows: rows per lane group
    (_t("softmax", (100000, 16), "float32"), "warp_row", {"rows": 4}, None),
    (_t("log_softmax", (1000, 48), "bfloat16"), "warp_row", {"rows": 2}, None),
    # pools: large windows (block / cluster per channel, unaligned channels), tiny windows, wide windows
    (POOL, "chan_block", {}, None),
    (POOL, "chan_block", {"cluster": 1, "unroll": 1}, None),
    (_t("adaptive_avg_pool2d", (2, 64, 67, 71), "bfloat16", output_size=[1, 1]), "chan_block", {}, None),
    (_t("adaptive_avg_pool2d", (2, 64, 67, 71), "bfloat16", output_size=[1, 1]), "chan_block", {"cluster": 4}, None),
    (_t("adaptive_avg_pool2d", (15625, 64, 2, 2), "bfloat16", output_size=[1, 1]), "global_tile", {}, None),
    (_t("adaptive_avg_pool2d", (2, 8, 256, 250), "float32", output_size=[3, 2]), "window", {"lanes": 32}, None),
    # elementwise: tiny (tail in the same launch), odd, persistent grid
    (_t("gelu", (1,), "bfloat16", approximate="tanh"), "vec_grid", {}, None),
    (_t("silu", (17,), "float16"), "vec_grid", {}, None),
    (_t("relu", (1001,), "bfloat16"), "vec_grid", {}, None),
    (_t("silu", (4096, 4097), "float32"), "vec_grid", {"grid": "persist"}, None),
    (_t("silu_mul", (100000, 16), "bfloat16"), "flat_vec", {}, None),
    (_t("silu_mul", (7, 1001), "float32"), "flat_vec", {}, None),
    (_t("silu_mul", (3, 8), "float16"), "flat_vec", {"unroll": 4}, None),
    # rendered for one shape, run at others: runtime checks take the launcher to a correct path
    (SM32, "coop_row", {}, _t("softmax", (4000, 2048), "float32")),
    (SM32, "coop_row", {}, _t("softmax", (1, 16), "float32")),
    (LN32, "coop_row", {}, _t("layer_norm", (3000, 4096), "float32")),
    (_t("softmax", (8, 262144), "float32"), "split_row", {}, _t("softmax", (70000, 1024), "float32")),
    (_t("softmax", (100000, 16), "float32"), "warp_row", {"rows": 2}, _t("softmax", (9, 3000), "float32")),
    (GN512, "two_phase", {}, _t("group_norm", (70000, 1, 4, 4), "float32", groups=1)),
    (POOL, "chan_block", {}, _t("adaptive_avg_pool2d", (1, 1, 3, 3), "float32", output_size=[1, 1])),
    (_t("relu", (1001,), "bfloat16"), "vec_grid", {}, _t("relu", (3,), "bfloat16")),
    (_t("softmax", (1000, 48), "float32"), "warp_row", {}, _t("softmax", (3, 37, 5), "float32", dim=1)),
    (SM32, "coop_row", {}, _t("softmax", (3, 37, 5), "float32", dim=1)),
    (_t("adaptive_avg_pool2d", (2, 64, 7, 7), "float32", output_size=[1, 1]), "global_tile", {},
     _t("adaptive_avg_pool2d", (2, 3, 10, 9), "float32", output_size=[3, 4])),
    (_t("adaptive_avg_pool2d", (2, 64, 7, 7), "float32", output_size=[1, 1]), "global_tile", {},
     _t("adaptive_avg_pool2d", (1, 4, 128, 128), "float32", output_size=[1, 1])),
]


def _inputs(task, torch, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out, whole = {}, None
    for m in task.inputs:
        if not m.present:
            out[m.name] = None
        elif task.op == "silu_mul":
            if whole is None:
                whole = (torch.randn(m.shape[0], 2 * m.shape[1], device="cuda", generator=g) * 3).to(TD[m.dtype])
            out[m.name] = whole[:, : m.shape[1]] if m.name == "a" else whole[:, m.shape[1]:]
        elif len(m.shape) == 1 and m.name in ("weight", "bias"):
            out[m.name] = (torch.randn(m.shape, device="cuda", generator=g) * 0.2
                           + (1.0 if m.name == "weight" else 0.0)).to(TD[m.dtype])
        else:
            x = torch.randn(m.shape, device="cuda", generator=g) * (4.0 if task.op.endswith("softmax") else 1.0) + 0.3
            if task.op.endswith("softmax") and x.shape[-1] > 2:
                x[..., 1::7] = float("-inf")  # masked entries, as attention masks write them
            out[m.name] = x.to(TD[m.dtype])
    return out


def _check(out, ref) -> str | None:
    import torch

    rtol, atol = TOL[str(ref.dtype).replace("torch.", "")]
    e, g = ref.float(), out.float()
    scale = float(e[torch.isfinite(e)].abs().max()) if torch.isfinite(e).any() else 1.0
    ok = (g == e) | ((g - e).abs() <= atol * scale + rtol * e.abs()) | (g.isnan() & e.isnan())
    n = int((~ok).sum())
    return None if n == 0 else f"{n}/{e.numel()} wrong, max abs {float((g - e).abs().nan_to_num(1e30).max()):.3g}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{case index: (ctypes function, run task)}; all cases compiled up front, several to a TU."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    work = tmp_path_factory.mktemp("fam_gpu")
    srcs = []
    for task, name, over, _ in CASES:
        fam = get_family(name, "cuda", task.op)
        p = {**fam.default(task), **over}
        assert fam.valid(task, p), (name, p, task.task_id)
        srcs.append(fam.render(task, p))
    per = 6
    groups = [list(range(i, min(i + per, len(srcs)))) for i in range(0, len(srcs), per)]

    def one(gi):
        idx = groups[gi]
        rc, log, so = compile_one(batch_cuda([srcs[i] for i in idx]), "cuda", work, f"g{gi}")
        assert rc == 0, log
        return gi, so

    with ThreadPoolExecutor(os.cpu_count() or 4) as ex:
        sos = dict(ex.map(one, range(len(groups))))
    out = {}
    for gi, idx in enumerate(groups):
        lib = ctypes.CDLL(str(sos[gi]))
        for j, i in enumerate(idx):
            out[i] = (getattr(lib, f"{patterns.ENTRY}_{j}"), CASES[i][3] or CASES[i][0])
    return out


@pytest.mark.parametrize("i", range(len(CASES)),
                         ids=[f"{c[1]}-{(c[3] or c[0]).task_id}" + ("-runat" if c[3] else "") for c in CASES])
def test_variant_matches_reference(built, i):
    import torch

    fn, task = built[i]
    sig = patterns.signature(task, "cuda")
    fn.restype = ctypes.c_int
    fn.argtypes = sig.argtypes()
    for seed in (0, 1):
        inp = _inputs(task, torch, seed)
        before = {k: v.clone() for k, v in inp.items() if v is not None}
        ref = patterns.reference(task, inp)
        y = torch.full(task.output.shape, float("nan"), dtype=TD[task.output.dtype], device="cuda")
        rc = fn(*sig.call_args(inp, y, patterns.scalar_args(task), torch.cuda.current_stream().cuda_stream))
        torch.cuda.synchronize()
        assert rc == 0, f"launch returned {rc}"
        err = _check(y, ref)
        assert err is None, err
        assert all(torch.equal(inp[k], v) for k, v in before.items()), "an input was written"
