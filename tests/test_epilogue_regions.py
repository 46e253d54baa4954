"""GEMM and convolution regions with their epilogues (partition rule 2, issue 27), and the
epilogue-fused GEMM kernels generated for them (search/codegen/compute/epilogue.py).

The epilogue rule is the GPU partition (`epilogues_for`); KFORGE_EPILOGUES=1 asks for it here on
the cpu, where the fused cpu GEMM is built with g++ and judged against the region's reference."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

import llm_regions as L
from kforge_tui.regions.build import tasks_of
from kforge_tui.sandbox import static
from kforge_tui.search.designs import designs_for

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


@pytest.fixture(autouse=True)
def gpu_partition(monkeypatch):
    monkeypatch.setenv("KFORGE_EPILOGUES", "1")


def _one(fn, args, kind="compute"):
    ts = [t for t in tasks_of(fn, args) if t.kind == kind]
    assert len(ts) == 1, [t.op for t in tasks_of(fn, args)]
    return ts[0]


def test_linear_bias_gelu_residual_is_one_region():
    w, b = torch.randn(32, 64), torch.randn(32)
    ts = tasks_of(lambda x, r: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) + r,
                  (torch.randn(2, 8, 64), torch.randn(2, 8, 32)))
    assert [t.op for t in ts] == ["linear+gelu+add"] and ts[0].kind == "compute"


def test_conv_folded_batch_norm_relu_is_one_region():
    bn = torch.nn.BatchNorm2d(8).eval()
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    ts = tasks_of(lambda x: torch.relu(bn(conv(x))), (torch.randn(2, 3, 8, 8),))
    assert [t.op for t in ts] == ["conv+batch_norm+relu"]


def test_the_epilogue_ends_at_a_transpose_and_a_norm_keeps_its_prologue():
    w1, w2 = torch.randn(64, 64), torch.randn(64, 64)

    def f(x, res, g):
        q = torch.nn.functional.linear(x, w1).view(2, 8, 4, 16).transpose(1, 2)  # heads: not epilogue
        h = torch.nn.functional.linear(x, w2) + res  # the residual stream: epilogue
        n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * g  # the norm keeps pow(2)
        return q * 2, n, h

    ops = sorted(t.op for t in tasks_of(f, (torch.randn(2, 8, 64), torch.randn(2, 8, 64), torch.randn(64))))
    assert "linear+add" in ops and "mul" in ops, ops  # the transposed heads: a region of their own
    assert any(o.startswith("pow") for o in ops), ops  # the RMSNorm region starts at its pow(2)


def test_no_epilogue_on_the_cpu_partition(monkeypatch):
    monkeypatch.delenv("KFORGE_EPILOGUES")
    w = torch.randn(32, 64)
    ops = [t.op for t in tasks_of(lambda x: torch.relu(torch.nn.functional.linear(x, w)), (torch.randn(8, 64),))]
    assert sorted(ops) == ["linear", "relu"], ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_cpu_gemm_verifies(dtype, tmp_path):
    w, b = torch.randn(32, 64).to(dtype), torch.randn(32).to(dtype)

    def f(x, r):
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))
        return h + r, h  # two outputs: the residual sum and the activation

    t = _one(f, (torch.randn(2, 8, 64, dtype=dtype), torch.randn(2, 8, 32, dtype=dtype)))
    ds = designs_for(t)
    assert [d.name for d in ds] == ["gen_gemm_omp"]
    src = ds[0].render(t, ds[0].default(t))
    rep = static.check_source(src, t.signature("cpu"))
    assert rep.ok, rep.text()
    assert L.run_cpu(t, src, tmp_path) is None


def test_fused_cuda_gemms_compile(tmp_path):
    if not shutil.which(NVCC) and not __import__("os").path.exists(NVCC):
        pytest.skip("no nvcc")
    w, b = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)
    t = _one(lambda x: torch.relu(torch.nn.functional.linear(x, w, b)) / 2.0,
             (torch.randn(16, 64, dtype=torch.bfloat16),)).with_backend("cuda")
    ds = designs_for(t)
    assert {"gen_gemm_simt", "gen_gemm_wmma"} <= {d.name for d in ds}
    for d in ds:
        if not d.name.startswith("gen_gemm"):
            continue
        src = d.render(t, d.default(t))
        assert static.check_source(src, t.signature("cuda")).ok
        (tmp_path / "kforge_region.h").write_text(t.header("cuda"))
        (tmp_path / "k.cu").write_text(src)
        r = subprocess.run([NVCC, "-O1", "-arch=sm_90", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                            "k.cu", "-o", "k.so"], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]


def test_kernelbench_gemm_bias_gelu_fixture_is_one_region():
    import importlib.util
    from pathlib import Path

    p = Path(__file__).parent / "fixtures" / "kernelbench_l2" / "gemm_bias_gelu.py"
    spec = importlib.util.spec_from_file_location("gbg", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.Model(*mod.get_init_inputs()).eval()
    ts = tasks_of(m, tuple(mod.get_inputs()))
    assert [t.op for t in ts] == ["linear+gelu"]
    assert [d.name for d in designs_for(ts[0])] == ["gen_gemm_omp"]


def test_epilogue_region_seed_is_the_library_gemm_and_inductors_epilogue(tmp_path, monkeypatch):
    """Node zero of a GEMM+epilogue region: cuBLAS (torch.mm/addmm) into scratch, then
    Inductor's own Triton kernel for the epilogue, as torch.compile runs it."""
    pytest.importorskip("triton")
    from kforge_tui.search.node_zero import node_zero

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    w, b = torch.randn(24, 32), torch.randn(24)
    t = _one(lambda x, r: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) * 0.5 + r,
             (torch.randn(16, 32), torch.randn(16, 24)))
    source, params, why = node_zero(t)
    assert source is not None, why
    assert ("torch.mm(" in source or "torch.addmm(" in source) and "@triton.jit" in source
    assert L.run_triton(t.with_backend("triton"), source, tmp_path) is None


@pytest.mark.slow
def test_kernelbench_gemm_bias_gelu_gets_a_verified_fused_kernel(tmp_path):
    """The real CLI, sandbox workers and run store on the cpu (the GPU partition asked for with
    KFORGE_EPILOGUES=1): the built-in proposer's fused GEMM+bias+GELU verifies."""
    import json
    import os
    import sqlite3
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(root), KFORGE_EPILOGUES="1")
    p = subprocess.run([sys.executable, "-m", "kforge_tui", "optimize",
                        "tests/fixtures/kernelbench_l2/gemm_bias_gelu.py", "--device", "cpu", "--top", "1",
                        "--budget", "3", "--parallel", "1", "--headless", "--no-apply", "--run-dir", str(run)],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    s = subprocess.run([sys.executable, "-m", "kforge_tui", "show", str(run), "--json"], cwd=root, env=env,
                       capture_output=True, text=True, timeout=120)
    (task,) = json.loads(s.stdout)["tasks"]
    assert task["op"] == "linear+gelu" and task["verified"], p.stderr[-3000:]
    db = sqlite3.connect(run / "run.db")
    rows = db.execute("select action, source from nodes where status = 'ok' and action like 'family:gen_gemm_omp%'"
                      ).fetchall()
    assert rows and all("kf_epi" in src and "erff(" in src for _, src in rows)  # the GELU in the GEMM's store


def test_on_a_gpu_a_gemm_takes_its_epilogue_and_a_convolution_does_not(monkeypatch):
    """ResNet-50 on the H200 (2026-12-04): its top regions were conv+batch_norm+relu chains that
    no design writes (no conv epilogue design; no seed from Inductor's kept cuDNN result), both
    searched with 0 candidates. By default on a GPU only GEMMs fold their epilogue."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kforge_tui.regions.partition import epilogues_for

    monkeypatch.delenv("KFORGE_EPILOGUES")
    g = fx.Graph()
    nodes = {}
    with FakeTensorMode():
        for name, target in (("mm", torch.ops.aten.mm.default), ("conv", torch.ops.aten.convolution.default)):
            n = g.call_function(target, ())
            n.meta["val"] = torch.empty(4, 4, device="cuda")
            nodes[name] = n
        on_cpu = g.call_function(torch.ops.aten.mm.default, ())
        on_cpu.meta["val"] = torch.empty(4, 4)
    assert epilogues_for(nodes["mm"]) and not epilogues_for(nodes["conv"]) and not epilogues_for(on_cpu)
    monkeypatch.setenv("KFORGE_EPILOGUES", "1")  # asked for: both fold (the partition tests above)
    assert epilogues_for(nodes["conv"])


def test_a_conv_region_with_its_epilogue_is_not_claimed_by_a_triton_search():
    """Selection passes over what no design can write: a Triton search serves a region through
    Inductor's seed, which a convolution (its cuDNN result kept by Inductor) rules out."""
    from kforge_tui.search.proposers.builtin import BuiltinProposer
    from kforge_tui.search.seed_rewrite import unseedable

    bn = torch.nn.BatchNorm2d(8).eval()
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    (fused,) = tasks_of(lambda x: torch.relu(bn(conv(x))), (torch.randn(2, 3, 8, 8),))
    fused = fused.with_backend("cuda")
    assert "convolution" in (unseedable(fused) or "")
    assert not BuiltinProposer().serves(fused, ["triton", "cuda"])
    (bare,) = tasks_of(lambda x: conv(x), (torch.randn(2, 3, 8, 8),))
    assert BuiltinProposer().serves(bare.with_backend("cuda"), ["triton", "cuda"])  # the conv designs
    (chain,) = [t for t in tasks_of(lambda x: torch.relu(bn(x)) * 2, (torch.randn(2, 8, 8, 8),))]
    assert unseedable(chain.with_backend("cuda")) is None


def test_a_grouped_mm_region_is_not_claimed_by_a_triton_search():
    """Inductor keeps `extern_kernels._grouped_mm`'s result (qwen_moe's expert GEMMs, H100): no
    seed can be written, no design fits, so selection gives the slot to the next region instead
    of a search that ends with 0 candidates."""
    from kforge_tui.search.proposers.builtin import BuiltinProposer
    from kforge_tui.search.seed_rewrite import unseedable

    x, w = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(4, 32, 16, dtype=torch.bfloat16)
    offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
    (t,) = tasks_of(lambda x, w, offs: torch.nn.functional.grouped_mm(x, w, offs=offs), (x, w, offs))
    t = t.with_backend("cuda")
    assert "grouped GEMM" in (unseedable(t) or "")
    assert not BuiltinProposer().serves(t, ["triton", "cuda"])
