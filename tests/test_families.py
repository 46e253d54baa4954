"""Kernel families: every family renders, passes the static check (on the source the sandbox
sees: the render adapted to the region entry point) and compiles with the real compilers; cpu
families are run against the pattern reference (`regions.patterns`) in a child process.

The default run compiles one representative task per (family, op) and runs every cpu family on
every dtype; the full family x op x dtype matrix (and a few non-default parameter points) is
`slow`. CUDA sources are compiled several to a translation unit (tests/families_util.py).
Extreme shapes (1 row, 10^6 rows, 16 rows of 4*10^6, odd sizes) are tests/test_families_shapes.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families_util import (DTYPES, GXX, NVCC, TD, compile_cuda_batches, compile_one,  # noqa: E402
                           failures, make, run_cpu_many, static_problems)

from kforge_tui.regions import patterns  # noqa: E402
from kforge_tui.search.families import Family, all_families, families_for  # noqa: E402


def cases(backend: str, dtype: str) -> list:
    """Tasks that exercise every family of every op (tails, non-multiples of vec, inner > 1)."""
    out = [
        make("softmax", (64, 1000), dtype, backend, dim=-1),
        make("softmax", (3, 20000), dtype, backend, dim=-1),
        make("softmax", (3, 37, 5), dtype, backend, dim=1),
        make("log_softmax", (33, 517), dtype, backend, dim=-1),
        make("layer_norm", (16, 768), dtype, backend),
        make("layer_norm", (7, 1001), dtype, backend, no_bias=True),
        make("rms_norm", (16, 512), dtype, backend, variant="llama"),
        make("rms_norm", (9, 640), dtype, backend, variant="gemma"),
        make("rms_norm", (5, 96), dtype, backend, variant="functional", no_weight=True),
        make("group_norm", (2, 64, 8, 8), dtype, backend, groups=8),
        make("group_norm", (1, 12, 10, 10), dtype, backend, groups=3),
        make("adaptive_avg_pool2d", (2, 64, 7, 7), dtype, backend, output_size=[1, 1]),
        make("adaptive_avg_pool2d", (2, 3, 10, 9), dtype, backend, output_size=[3, 4]),
        make("gelu", (4, 1025), dtype, backend, approximate="none"),
        make("gelu", (3001,), dtype, backend, approximate="tanh"),
        make("silu", (4, 1025), dtype, backend),
        make("relu", (2, 999), dtype, backend),
        make("silu_mul", (6, 130), dtype, backend),
    ]
    if dtype == "bfloat16":
        out.append(make("softmax", (16, 300), dtype, backend, out_dtype="float32", dim=-1))
    return out


def points(task) -> list[tuple[Family, dict]]:
    return [(f, f.default(task)) for f in families_for(task)]


def static_ok(src: str, task) -> str | None:
    return static_problems(task, src)


def compile_many(jobs, workdir: Path, threads: int | None = None):
    """jobs: [(label, task, family, params)] -> failure strings (empty = all good). The static
    check runs on every source; cuda sources compile in batches, cpu sources one by one."""
    fails, cuda = [], []
    for label, task, fam, params in jobs:
        src = fam.render(task, params)
        err = static_ok(src, task)
        if err:
            fails.append(f"{label}: static check: {err}")
        elif task.backend == "cuda":
            cuda.append((label, src))
        else:
            rc, log, _ = compile_one(src, "cpu", workdir, f"c{len(fails)}_{abs(hash(label))}")
            if rc:
                fails.append(f"{label}: compile failed:\n{log}")
    return fails + compile_cuda_batches(cuda, workdir, threads=threads)


# ---------------------------------------------------------------- registry / coverage


def test_every_op_and_backend_has_a_family():
    for backend in ("cuda", "cpu"):
        for dtype in DTYPES:
            for task in cases(backend, dtype):
                fams = families_for(task)
                assert fams, f"no family for {task.task_id} on {backend}"
                for f in fams:
                    p = f.default(task)
                    assert f.valid(task, p), (f.name, p)
                    assert f.name in {g.name for g in all_families()}


def test_invalid_params_are_refused():
    task = make("softmax", (64, 1000), "float32", "cuda", dim=-1)
    fam = next(f for f in families_for(task) if f.name == "block_row")
    p = fam.default(task)
    assert not fam.valid(task, {**p, "threads": 96})  # not in the space
    assert not fam.valid(task, {**p, "vec": 16})  # 16 does not divide 1000
    assert not fam.valid(task, {k: v for k, v in p.items() if k != "vec"})
    with pytest.raises(ValueError):
        fam.render(task, {**p, "vec": 16})


def test_rendered_source_has_the_exact_entry_point_and_no_forbidden_words():
    for backend in ("cuda", "cpu"):
        for task in cases(backend, "bfloat16"):
            for fam, p in points(task):
                src = fam.render(task, p)
                sig = patterns.signature(task)
                assert src.startswith(sig.prelude())
                assert src.count(sig.declaration() + " {") == 1
                for bad in ("static ", "cudaMalloc(", "torch/", "cudaStreamCreate", "std::thread"):
                    assert bad not in src, (fam.name, bad)


# ---------------------------------------------------------------- static check + compile


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_cuda_families_compile_representative(tmp_path):
    """Every cuda family once, at its default, dtypes rotating (nvcc takes ~8 s a file on 2 cores)."""
    by_key: dict = {}
    for dtype in DTYPES:
        for task in cases("cuda", dtype):
            for fam, p in points(task):
                by_key.setdefault((fam.name, fam.ops), {}).setdefault(dtype, (task, fam, p))
    jobs = []
    for k, (key, per_dtype) in enumerate(sorted(by_key.items())):
        task, fam, p = list(per_dtype.values())[k % len(per_dtype)]
        jobs.append((f"{fam.name}/{task.task_id}", task, fam, p))
    assert len(jobs) >= 10
    fails = compile_many(jobs, tmp_path)
    assert not fails, "\n\n".join(fails)


@pytest.mark.skipif(GXX is None, reason="g++ not installed")
def test_cpu_families_static_check_all_dtypes():
    for dtype in DTYPES:
        for task in cases("cpu", dtype):
            for fam, p in points(task):
                assert static_ok(fam.render(task, p), task) is None


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_cuda_families_compile_full_matrix(tmp_path):
    """Every cuda family x op (x gelu variant) x dtype once (distinct kernels, not every shape)."""
    jobs, seen = [], set()
    for dtype in DTYPES:
        for task in cases("cuda", dtype):
            for fam, p in points(task):
                key = (fam.name, fam.ops, task.op, task.params.get("approximate"), dtype, task.output.dtype,
                       patterns.scalar_args(task).get("inner", 1) > 1)
                if key not in seen:
                    seen.add(key)
                    jobs.append((f"{fam.name}/{task.task_id}", task, fam, p))
    fails = compile_many(jobs, tmp_path, threads=os.cpu_count() or 2)
    assert not fails, "\n\n".join(fails)


# ---------------------------------------------------------------- cpu correctness (child process)


def run_cpu(task, src: str, workdir: Path, name: str, trials: int = 2) -> list[dict]:
    return run_cpu_many([(name, task, src)], workdir, trials)[name]


def _check_cpu_dtype(dtype: str, tmp_path: Path, extra_points: bool = False):
    jobs = []
    for task in cases("cpu", dtype):
        for fam, p in points(task):
            jobs.append((f"{fam.name} {p} on {task.task_id}", task, fam.render(task, p)))
            if extra_points:
                for k, vals in fam.space.items():
                    for v in vals:
                        q = {**p, k: v}
                        if q != p and fam.valid(task, q):
                            jobs.append((f"{fam.name} {q} on {task.task_id}", task, fam.render(task, q)))
                            break
    res = run_cpu_many(jobs, tmp_path)
    assert len(res) == len(jobs)
    fails = failures(res)
    assert not fails, "\n".join(fails)


@pytest.mark.skipif(GXX is None, reason="g++ not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16",
                                   pytest.param("float16", marks=pytest.mark.slow)])
def test_cpu_families_match_reference(dtype, tmp_path):
    _check_cpu_dtype(dtype, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(GXX is None, reason="g++ not installed")
def test_cpu_families_match_reference_other_points(tmp_path):
    _check_cpu_dtype("float32", tmp_path, extra_points=True)


@pytest.mark.skipif(GXX is None, reason="g++ not installed")
def test_cpu_harness_catches_a_wrong_kernel(tmp_path):
    """The correctness check above can fail: a softmax that forgets to normalise is caught."""
    task = make("softmax", (8, 100), "float32", "cpu", dim=-1)
    fam = families_for(task)[0]
    src = fam.render(task, fam.default(task)).replace("yf[j] * inv", "yf[j]")
    res = run_cpu(task, src, tmp_path, "wrong", trials=1)
    assert res[0]["bad"] > 0


@pytest.mark.skipif(GXX is None, reason="g++ not installed")
def test_cpu_half_conversions_are_exact(tmp_path):
    """The uint16_t <-> float conversions agree with torch on every f16 / bf16 bit pattern."""
    from kforge_tui.search.families._common import cpu_head

    task = make("relu", (65536,), "float16", "cpu")
    out = []
    for dtype in ("float16", "bfloat16"):
        t = make("relu", (65536,), dtype, "cpu")
        src = cpu_head(t) + textwrap.dedent('''
            extern "C" void kf_roundtrip(const uint16_t* in, float* f, uint16_t* back, const float* src, uint16_t* rounded, int64_t n) {
              for (int64_t i = 0; i < n; ++i) { f[i] = kf_in(in[i]); back[i] = kf_round(f[i]); rounded[i] = kf_round(src[i]); }
            }
        ''')
        rc, log, so = compile_one(src, "cpu", tmp_path, f"conv_{dtype}")
        assert rc == 0, log
        out.append((dtype, so))
    del task
    import ctypes

    for dtype, so in out:
        lib = ctypes.CDLL(str(so))
        bits = torch.arange(65536, dtype=torch.int32).to(torch.int16).contiguous()
        f = torch.empty(65536, dtype=torch.float32)
        back = torch.empty(65536, dtype=torch.int16)
        src = torch.randn(65536) * torch.logspace(-9, 6, 65536)
        src[:4] = torch.tensor([65519.0, 65520.0, 1e-8, -3e-7])
        rounded = torch.empty(65536, dtype=torch.int16)
        lib.kf_roundtrip(ctypes.c_void_p(bits.data_ptr()), ctypes.c_void_p(f.data_ptr()),
                         ctypes.c_void_p(back.data_ptr()), ctypes.c_void_p(src.data_ptr()),
                         ctypes.c_void_p(rounded.data_ptr()), ctypes.c_int64(65536))
        expect = bits.view(TD[dtype]).float()
        same = (f == expect) | (torch.isnan(f) & torch.isnan(expect))
        assert bool(same.all()), dtype
        finite = ~torch.isnan(expect)
        assert torch.equal(back[finite], bits[finite]), dtype
        assert torch.equal(rounded, src.to(TD[dtype]).view(torch.int16)), dtype


# ---------------------------------------------------------------- every option of every cuda family


def _one_step_points(task, fam):
    """The default and every valid one-parameter change of it (what the proposer's set: moves reach)."""
    d = fam.default(task)
    out = [d]
    for k, values in fam.space.items():
        for v in values:
            q = {**d, k: v}
            if q != d and fam.valid(task, q):
                out.append(q)
    return out


def test_every_cuda_option_renders_and_passes_the_static_check():
    """Each value of each parameter, one step from the default, on the bf16 cases: the search may
    propose any of them, so each must be a kernel the sandbox accepts."""
    n = 0
    for task in cases("cuda", "bfloat16"):
        for fam in families_for(task):
            for p in _one_step_points(task, fam):
                src = fam.render(task, p)
                assert static_ok(src, task) is None, (fam.name, p)
                assert "static " not in src, (fam.name, p)
                n += 1
    assert n > 200


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_round3_options_compile(tmp_path):
    """The options added in round 3 (bench/NOTES.md) compile with nvcc for sm_90: a cluster chunk
    kept in shared memory, the persistent pipelined row kernel, a register cap, exact two-round
    statistics, affine preloading and the streaming / L2-prefetch load hints."""
    gn = make("group_norm", (1, 64, 64, 64), "bfloat16", "cuda", groups=8)
    ln = make("layer_norm", (16, 768), "bfloat16", "cuda")
    rms = make("rms_norm", (16, 512), "float16", "cuda", variant="gemma")
    sm = make("silu_mul", (6, 130), "bfloat16", "cuda")
    want = [(gn, "cluster_group", {"cluster": 2, "keep": 32}), (ln, "block_row", {"pipe": 1, "minb": 4}),
            (ln, "block_row", {"stats": "two", "wpre": 1}), (rms, "warp_row", {"pipe": 1}),
            (sm, "rows_vec", {"hint": "l2pf"}), (sm, "rows_vec", {"hint": "stream"})]
    jobs = []
    for task, name, over in want:
        fam = next(f for f in families_for(task) if f.name == name)
        p = {**fam.default(task), **over}
        assert fam.valid(task, p), (name, p)
        jobs.append((f"{name} {over}", task, fam, p))
    fails = compile_many(jobs, tmp_path)
    assert not fails, "\n\n".join(fails)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_output_packs_are_stored_as_one_vector_access(tmp_path):
    """Each kernel that loads 16-byte packs also stores whole packs: nvcc 13 split a struct-copied
    pack of bf16 / f32 into 2- or 4-byte stores in these families (bench/NOTES.md round 4: silu*b
    ran at 144 instead of 90 us under ncu, group_norm 12 % slower), which kf_store now prevents.
    Checked in the PTX of each entry point that has vector loads (the scalar fallback kernels
    have none)."""
    import re

    sm = make("silu_mul", (64, 4096), "bfloat16", "cuda")
    gn32 = make("group_norm", (1, 64, 64, 64), "float32", "cuda", groups=8)
    gn16 = make("group_norm", (1, 64, 64, 64), "bfloat16", "cuda", groups=8)
    sx = make("softmax", (4, 65536), "float32", "cuda", dim=-1)
    ln = make("layer_norm", (64, 4096), "bfloat16", "cuda")
    long_ln = make("layer_norm", (16, 1_048_576), "bfloat16", "cuda")
    sm_short = make("silu_mul", (100_000, 16), "bfloat16", "cuda")
    want = [(sm, "rows_vec"), (gn32, "cluster_group"), (gn16, "cluster_group"), (sx, "block_row"),
            (ln, "block_row"), (sx, "coop_row"), (long_ln, "coop_row"), (sm_short, "flat_vec")]

    def ptx(k):
        task, name = want[k]
        fams = [f for f in families_for(task) if f.name == name]
        assert fams, (name, task.op, [f.name for f in families_for(task)])
        fam = fams[0]
        cu = tmp_path / f"s{k}.cu"
        cu.write_text(fam.render(task, fam.default(task)))
        r = subprocess.run([NVCC, "-arch=sm_90", "-O3", "-ptx", str(cu), "-o", str(cu) + ".ptx"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return name, Path(str(cu) + ".ptx").read_text()

    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(ptx, range(len(want))))
    checked = 0
    for name, text in got:
        for entry in re.split(r"\n(?=\.visible \.entry)", text)[1:]:
            if not re.search(r"ld\.global[.\w]*\.v[24]", entry):
                continue
            stores = re.findall(r"st\.global[.\w]*", entry)
            vector = [st for st in stores if re.search(r"\.v[24]\b", st)]
            scalar = [st for st in stores if st not in vector]
            assert vector and not scalar, (name, entry.split("(")[0], len(vector), len(scalar))
            checked += 1
    assert checked >= len(want)


def test_registry_is_complete_when_first_loaded_from_many_threads():
    """Threads that ask for families at the same first moment all see the whole registry (it was
    marked loaded before its modules were imported, so a second thread could see it half-filled)."""
    code = textwrap.dedent("""
        import threading
        from kforge_tui.search import families
        counts, gate = [], threading.Barrier(8)
        def ask():
            gate.wait()
            counts.append(len(families.all_families()))
        ts = [threading.Thread(target=ask) for _ in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        print(sorted(counts))
    """)
    full = len(all_families())
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert json.loads(out) == [full] * 8, out


def test_cpu_kernels_go_parallel_only_on_enough_work():
    """Every OpenMP team a family or a row/pointwise/pool generator opens on the cpu backend has
    an `if` clause against csrc.OMP_MIN_WORK: a tiny region runs on one thread (a team woken
    for a few hundred elements, next to PyTorch's own spinning pool, cost milliseconds).
    Compute generators (gemm, conv, attention) size their teams by FLOPs and are left out."""
    import re

    from kforge_tui.regions.build import tasks_of
    from kforge_tui.search.csrc import OMP_MIN_WORK
    from kforge_tui.search.designs import designs_for

    bare = []
    for task in cases("cpu", "float32"):
        for fam, p in points(task):
            bare += [f"{fam.name}/{task.op}: {ln.strip()}" for ln in fam.render(task, p).splitlines()
                     if "omp parallel" in ln and "if(" not in ln]
    snippets = [(lambda x: torch.softmax(x, -1) * 2, (torch.randn(4, 64),)),
                (lambda x: torch.relu(x) + 1, (torch.randn(4, 64),)),
                (lambda x: torch.cumsum(x, -1), (torch.randn(4, 64),)),
                (lambda x: torch.nn.functional.avg_pool2d(x, 2), (torch.randn(1, 2, 8, 8),))]
    for fn, args in snippets:
        for t in tasks_of(fn, args, "cpu"):
            for d in designs_for(t):
                if d.name.startswith(("gen_gemm", "gen_conv", "gen_flash")):
                    continue
                bare += [f"{d.name}: {ln.strip()}" for ln in d.render(t, d.default(t)).splitlines()
                         if "omp parallel" in ln and not re.search(r"if\(.*(kf_omp_min_work|%d)" % OMP_MIN_WORK, ln)]
    assert not bare, "\n".join(bare)
