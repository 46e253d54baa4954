"""gen_flash_triton (search/codegen/compute/attention_triton.py): the Triton flash attention design
for sdpa regions at any head dim, checked, loaded and judged under Triton's interpreter
(TRITON_INTERPRET=1) against the region's own reference: masks, causal, GQA, transposed layouts,
a head dim split over the grid, the log-sum-exp output, fully masked rows.

bfloat16 is judged on a GPU only: the interpreter's `tl.dot` multiplies bfloat16 tiles as their
raw bits (Triton 3.9: a 16x16 product off by 2e10), float16 it computes exactly."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import llm_regions as L
from test_codegen_compute import CASES, _qkv, tasks_for

from kforge_tui.sandbox import triton_check, triton_loader
from kforge_tui.search.codegen import compute as C
from kforge_tui.search.codegen.compute import attention_triton as AT
from kforge_tui.search.designs import designs_for


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _judge(task, params, tmp_path, name="k"):
    (d,) = AT.designs(task)
    src = d.render(task, params)
    rep = triton_check.check_source(src, task.signature())
    assert rep.ok, rep.text()
    with triton_loader.libdevice_as_installed():
        return L.run_triton(task, src, tmp_path / name)


def _points(d, task, n):
    """The default and `n` other valid points, spread over the space (not only its corner)."""
    pts = [d.default(task)]
    for combo in itertools.product(*d.space.values()):
        p = dict(zip(d.space, combo))
        if p not in pts and d.valid(task, p) and hash(tuple(combo)) % 7 == 0:
            pts.append(p)
        if len(pts) > n:
            break
    return pts


ATTN = [c for c in CASES if c[3] == "attention" and c[0] != "sdpa_bf16_causal"]
ATTN.append(("sdpa_f16_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             _qkv(2, 2, 40, 40, 32, torch.float16), "attention", {}))


@pytest.mark.parametrize("case", ATTN, ids=[c[0] for c in ATTN])
def test_the_design_verifies_on_every_sdpa_form(case, tmp_path):
    name, fn, args, _, _ = case
    (task,) = tasks_for(fn, args, "triton")
    (d,) = AT.designs(task)
    for i, p in enumerate(_points(d, task, 1)):
        assert _judge(task, p, tmp_path, f"p{i}") is None, (name, p)


@pytest.mark.parametrize("E,Ev", [(512, 512), (1024, 1024), (40, 40)])
def test_head_dims_past_the_fused_kernels_get_a_verified_design(E, Ev, tmp_path):
    """SD3.5 VAE's head dim 512 and KernelBench 97's 1024 in float32, where the CUDA designs have
    no point that fits shared memory (1024) and PyTorch has no tensor-core kernel; the output's
    head dim split over the grid (BLOCK_DV < Ev) and an uneven last slice (40 = 32 + 8) included."""
    q = torch.randn(1, 2, 20, E)
    k, v = torch.randn(1, 2, 24, E), torch.randn(1, 2, 24, Ev)
    (task,) = tasks_for(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v), "triton")
    (d,) = AT.designs(task)
    if E >= 512:
        assert d.default(task)["BLOCK_D"] < E  # the scores are summed over slices of the head dim
    split = {**d.default(task), "BLOCK_DV": 32, "BLOCK_M": 16, "num_stages": 1}
    assert d.valid(task, split)
    assert _judge(task, d.default(task), tmp_path, "default") is None
    assert _judge(task, split, tmp_path, "split") is None
    cuda = [x.name for x in designs_for(task.with_backend("cuda"))]
    if E == 1024:
        assert "gen_flash_simt" not in cuda  # the gap this design fills


def test_fully_masked_rows_and_the_log_sum_exp(tmp_path):
    """A row whose mask is all -inf gets 0 as the cpu op gives it; an exposed log-sum-exp is
    written (natural log) by the head-dim slice that owns column 0 only."""
    from kforge_tui.regions.meta import TensorMeta

    q, k, v = _qkv(2, 2, 9, 11, 8)
    task = tasks_for(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v),
                     "triton")[0]
    g = dict(task.graph)
    nodes = list(g["nodes"])
    main = next(n for n in nodes if "scaled_dot_product" in n["target"])
    nodes.append({"name": "lse", "target": "getitem", "args": [{"ref": main["name"]}, 1], "kwargs": {}})
    g = {"inputs": g["inputs"], "nodes": nodes, "outputs": g["outputs"] + [{"ref": "lse"}]}
    task2 = replace(task, graph=g, outputs=task.outputs + (TensorMeta("out1", (2, 2, 9), "float32", (18, 1, 2)),))
    (d,) = AT.designs(task2)
    assert "lse_ptr" in d.render(task2, d.default(task2))
    assert _judge(task2, {**d.default(task2), "BLOCK_DV": 16}, tmp_path, "lse") is None

    mask = torch.randn(6, 7)
    mask[2] = float("-inf")
    task3 = tasks_for(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                      _qkv(1, 2, 6, 7, 8) + (mask,), "triton")[0]
    (d3,) = AT.designs(task3)
    src = d3.render(task3, d3.default(task3))
    outs = [L._Out(m) for m in task3.outputs]
    ins = L.inputs_for(task3, 1)
    mask_i = next(i for i, m in enumerate(task3.inputs) if tuple(m.shape) == (6, 7))
    ins[mask_i] = mask
    with triton_loader.libdevice_as_installed():
        e = triton_loader.worker_entry(src, tmp_path / "masked", ins, [o.t for o in outs], sync=lambda: None)
        assert e.status == "ok", e.message
        for o in outs:
            o.poison(True)
        e.launch(ins, [o.t for o in outs])
    ref = task3.reference([x.clone() for x in ins])[0]
    assert torch.allclose(outs[0].t, ref.reshape(outs[0].t.shape), atol=1e-5, rtol=1e-4)
    assert bool((outs[0].t[:, :, 2] == 0).all())  # the row with no key: 0, not NaN or poison


def test_validity_rules_and_where_the_design_is_offered():
    q, k, v = _qkv(1, 2, 20, 24, 64)
    (task,) = tasks_for(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v), "triton")
    (d,) = AT.designs(task)
    p = d.default(task)
    assert d.valid(task, p)
    assert not d.valid(task, {**p, "BLOCK_D": 128})  # wider than the head dim: masked lanes only
    assert not d.valid(task, {**p, "BLOCK_M": 128, "BLOCK_DV": 64, "BLOCK_N": 128, "num_warps": 2})  # registers
    assert [x.name for x in C.generate(task)] == ["gen_flash_triton"]
    assert "gen_flash_triton" in [x.name for x in designs_for(task)]
    assert AT.designs(task.with_backend("cuda")) == []  # a Triton design for Triton tasks
    h = tasks_for(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), _qkv(1, 2, 20, 24, 64, torch.float16),
                  "triton")[0]
    (dh,) = AT.designs(h)
    assert not dh.valid(h, {**dh.default(h), "precision": "ieee"})  # one point of that axis in 16-bit
    assert "input_precision" not in dh.render(h, dh.default(h))
    assert "input_precision='tf32x3'" in d.render(task, p)


def test_a_16_bit_head_of_128_or_less_takes_the_tutorial_point_with_q_loaded_once(tmp_path):
    """On an H100 (2026-12-07) the design was 3x slower than cuDNN at bf16 head dim 128: Q was
    loaded again for every key block, and the register rule, counting K and V tiles that live
    in shared memory, refused Triton's own tutorial point. A 16-bit head of 128 or less now
    defaults to it (128 x 64, the head in one slice, Q loaded before the key loop)."""
    q, k, v = _qkv(1, 2, 80, 96, 64, torch.float16)
    (task,) = tasks_for(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v), "triton")
    (d,) = AT.designs(task)
    p = d.default(task)
    assert (p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_D"], p["num_warps"], p["num_stages"]) == (128, 64, 64, 8, 3)
    src = d.render(task, p)
    loop = src.index("for j0 in range")
    assert src.index("qt = tl.load(") < loop and "for d0 in" not in src  # once, before the key loop
    assert "d_ok" not in src  # the head dim is a whole number of slices: no mask on it
    assert _judge(task, p, tmp_path, "tutorial") is None
    assert _judge(task, {**p, "BLOCK_M": 64, "BLOCK_N": 32}, tmp_path, "smaller") is None
