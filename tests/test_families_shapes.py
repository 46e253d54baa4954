"""Families that hold across shapes (issue 14), on the CPU: every family renders, passes the static
check and compiles (nvcc compile-only, several kernels a translation unit; g++ for the cpu
families) at extreme shapes - one row, 10^6 rows of 16, 16 rows of 4*10^6, odd sizes - every
family's default is valid at every point of the shape sweep's grid (bench/shape_sweep.py), the
cpu families match `patterns.reference` at small versions of the extreme shapes, and the
built-in proposer's priors pick by shape. GPU runs of the new variants: test_families_gpu.py.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families_util import (GXX, NVCC, compile_cuda_batches, compile_one, failures, make,  # noqa: E402
                           make_rows, run_cpu_many, static_problems)

from kforge_tui.regions import patterns  # noqa: E402
from kforge_tui.search.families import families_for  # noqa: E402

ROW_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "adaptive_avg_pool2d",
           "silu_mul")
FLAT_OPS = ("gelu", "silu", "relu")
# (rows, n): one row (short and long), many short rows, few very long rows, odd sizes
EXTREME = ((1, 16), (1, 10_000_000), (1_000_000, 16), (16, 4_000_000), (7, 1001), (1_000_000, 17))
EXTREME_NUMEL = (1, 16, 1001, 16_000_000, 64_000_000)


def extreme_tasks(backend: str = "cuda") -> list:
    out = []
    for i, op in enumerate(ROW_OPS):
        for j, (r, n) in enumerate(EXTREME):
            dt = ("float32", "bfloat16", "float16")[(i + j) % 3]
            out.append(make_rows(op, r, n, dt, backend))
    for i, op in enumerate(FLAT_OPS):
        for j, m in enumerate(EXTREME_NUMEL):
            out.append(make(op, (m,), ("bfloat16", "float32", "float16")[(i + j) % 3], backend))
    # layouts the coordinates above do not reach
    out += [make("softmax", (3, 37, 5), "float32", backend, dim=1),
            make("group_norm", (3, 15, 7, 9), "bfloat16", backend, groups=5),
            make("adaptive_avg_pool2d", (2, 3, 1000, 999), "float16", backend, output_size=[3, 4]),
            make("adaptive_avg_pool2d", (1, 1, 1, 1), "float32", backend, output_size=[1, 1]),
            make("gelu", (5, 1001), "bfloat16", backend, approximate="tanh"),
            make("rms_norm", (3, 4096), "bfloat16", backend, variant="gemma"),
            make("softmax", (16, 4_000_000), "bfloat16", backend, out_dtype="float32")]
    return out


def test_every_op_has_a_family_at_every_extreme_shape():
    for backend in ("cuda", "cpu"):
        for t in extreme_tasks(backend):
            fams = families_for(t)
            assert fams, f"no {backend} family for {t.task_id}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.timeout(300)
def test_cuda_families_compile_at_extreme_shapes(tmp_path):
    """Each cuda family's default at each extreme shape: rendered, statically checked as the
    sandbox would see it, and compiled for sm_90 (identical sources once; 20 a translation unit,
    device code only: test_families.py links whole libraries of every family)."""
    jobs, seen, bad = [], set(), []
    for t in extreme_tasks("cuda"):
        for f in families_for(t):
            src = f.render(t, f.default(t))
            err = static_problems(t, src)
            if err:
                bad.append(f"{f.name} on {t.task_id}: {err}")
            if src not in seen:
                seen.add(src)
                jobs.append((f"{f.name} {f.default(t)} on {t.task_id}", src))
    assert not bad, "\n".join(bad)
    assert len(jobs) >= 60
    t0 = time.time()
    fails = compile_cuda_batches(jobs, tmp_path, per_batch=20, device_only=True)
    assert not fails, "\n\n".join(fails)
    print(f"{len(jobs)} distinct kernels compiled in {time.time() - t0:.0f}s")


def test_defaults_are_valid_across_the_sweep_grid():
    """Every point of bench/shape_sweep.py's full grid (all ops, dtypes, rows 1..10^6, n 16..10^7
    up to 4 GiB): some cuda and some cpu family serves it, and every serving family's default is
    a valid point of its space that renders."""
    import shape_sweep as sw

    pts = sw.grid_points()
    assert len(pts) > 500
    n = 0
    for op, dt, r, cols in pts:
        for backend in ("cuda", "cpu"):
            t = sw.point_task(op, r, cols, dt, backend)
            fams = families_for(t)
            assert fams, (backend, op, dt, r, cols)
            for f in fams:
                p = f.default(t)
                assert f.valid(t, p), (f.name, p, t.task_id)
                if backend == "cuda":
                    assert f.render(t, p).count(patterns.signature(t).declaration() + " {") == 1
                n += 1
    assert n > 2000


def test_sweep_quick_preset_covers_every_op_and_both_ends():
    import shape_sweep as sw

    assert 30 <= len(sw.QUICK) <= 40
    assert {op for op, *_ in sw.QUICK} == set(sw.OPS)
    assert {dt for _, dt, *_ in sw.QUICK} == {"float32", "bfloat16", "float16"}
    assert any(r >= 1_000_000 for _, _, r, _ in sw.QUICK) and any(n >= 4_000_000 and r <= 16 for _, _, r, n in sw.QUICK)
    for op, dt, r, n in sw.QUICK:
        assert sw.input_bytes(sw.point_task(op, r, n, dt)) <= sw.MAX_GIB * 2**30
    dev = {"sms": 132, "compute_capability": "9.0", "l2_bytes": 50 * 2**20}
    for op, dt, r, n in sw.QUICK:  # the short search has a budget's worth of distinct points
        t = sw.point_task(op, r, n, dt)
        cs = sw.candidates(t, 4, dev)
        assert 1 <= len(cs) <= 4
        assert len({(f.name, str(sorted(p.items()))) for f, p, _ in cs}) == len(cs)


# ---------------------------------------------------------------- cpu families vs the reference


# small versions of the extreme shapes: the same structure (one row, many short rows, few long
# rows, odd sizes), sized for a 2-core CPU
SMALL = ((1, 16), (1, 100_003), (20_000, 16), (4, 250_000), (7, 1001), (3001, 17))


@pytest.mark.skipif(GXX is None, reason="g++ not installed")
def test_cpu_families_at_extreme_shapes(tmp_path):
    """Every cpu family's default at every extreme shape passes the static check and compiles;
    at the small versions of those shapes each one matches the reference (1 trial each; every
    distinct source is compiled once)."""
    jobs = []
    for i, op in enumerate(ROW_OPS):
        for j, (r, n) in enumerate(SMALL):
            dt = ("float32", "bfloat16", "float16")[(i + j) % 3]
            t = make_rows(op, r, n, dt, "cpu")
            for f in families_for(t):
                jobs.append((f"{f.name} {f.default(t)} on {t.task_id}", t, f.render(t, f.default(t))))
    for i, op in enumerate(FLAT_OPS):
        for m in (1, 17, 100_003):
            t = make(op, (m,), ("bfloat16", "float32", "float16")[i], "cpu")
            for f in families_for(t):
                jobs.append((f"{f.name} on {t.task_id}", t, f.render(t, f.default(t))))
    t = make("group_norm", (3, 15, 7, 9), "float32", "cpu", groups=5)
    jobs += [(f"{f.name} on {t.task_id}", t, f.render(t, f.default(t))) for f in families_for(t)]
    ran = {src for _, _, src in jobs}
    extra, bad = {}, []
    for t in extreme_tasks("cpu"):
        for f in families_for(t):
            src = f.render(t, f.default(t))
            err = static_problems(t, src)
            if err:
                bad.append(f"{f.name} on {t.task_id}: {err}")
            if src not in ran:
                extra.setdefault(src, f"{f.name} on {t.task_id}")
    assert not bad, "\n".join(bad)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        built = list(ex.map(lambda ij: (ij[1][1], compile_one(ij[1][0], "cpu", tmp_path, f"x{ij[0]}", shared=False)),
                            enumerate(extra.items())))
    fails = [f"{label}: {log}" for label, (rc, log, _) in built if rc]
    res = run_cpu_many(jobs, tmp_path, trials=1)
    assert len(res) == len({label for label, _, _ in jobs})
    fails += failures(res)
    assert not fails, "\n".join(fails)


# ---------------------------------------------------------------- priors by shape


def _ranked(op, rows, n, dtype="float32", sms=132):
    import shape_sweep as sw

    from kforge_tui.search.proposers.builtin import BuiltinProposer

    t = sw.point_task(op, rows, n, dtype)
    ctx = SimpleNamespace(device={"sms": sms, "l2_bytes": 50 * 2**20})
    bp = BuiltinProposer()
    pri = {f.name: bp._family_prior(t, sw._Fam(f, op), ctx) for f in families_for(t)}
    return sorted(pri, key=lambda k: -pri[k]), pri


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_priors_choose_by_rows_and_row_length(op):
    assert _ranked(op, 16, 4_194_304)[0][0] == "coop_row"  # few long rows: the whole GPU
    assert _ranked(op, 1, 10_000_000)[0][0] == "coop_row"
    assert _ranked(op, 1_000_000, 16)[0][0] == "warp_row"  # many short rows
    assert _ranked(op, 8192, 4096, "bfloat16")[0][0] == "block_row"
    assert _ranked(op, 2048, 262_144)[0][0] == "cluster_row"  # many long rows: chunks kept on chip
    # the same shape on a GPU with 4x the SMs is "few rows" for longer
    assert _ranked(op, 256, 65536, sms=132)[0][0] != "coop_row"
    assert _ranked(op, 256, 65536, sms=528)[0][0] == "coop_row"


def test_priors_for_groups_pools_and_gates():
    assert _ranked("group_norm", 32768, 64)[0][0] == "warp_row"  # many small groups
    top = _ranked("group_norm", 32, 262_144)[0][:3]  # few large groups that fit in L2
    assert set(top) == {"cluster_group", "coop_row", "two_phase"}
    assert _ranked("adaptive_avg_pool2d", 16, 1_048_576)[0][0] == "chan_block"  # large windows
    # tiny windows: whole 16-byte packs per channel (4x4 bf16) straight from global memory,
    # else (7x7 f32, unaligned channels) tiles through shared memory
    assert _ranked("adaptive_avg_pool2d", 1_000_000, 16, "bfloat16")[0][0] == "global_warp"
    assert _ranked("adaptive_avg_pool2d", 65536, 49, "float32")[0][0] == "global_tile"
    assert _ranked("silu_mul", 1_000_000, 16, "bfloat16")[0][0] == "flat_vec"  # short gated rows
    assert _ranked("silu_mul", 8192, 8192, "bfloat16")[0][0] == "rows_vec"
