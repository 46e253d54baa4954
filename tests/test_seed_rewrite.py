"""Inductor's wrapper shapes the seed rewrite handles (search/seed_rewrite.py), each run under
Triton's interpreter and judged against the region's reference (tests/llm_regions.py harness).
"""
from __future__ import annotations

import pytest
import torch

import llm_regions as L
from kforge_tui.regions.build import task_of
from kforge_tui.sandbox import triton_check
from kforge_tui.search import inductor_seed

pytest.importorskip("triton")


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _seed_ok(task, tmp_path):
    seed = inductor_seed.generate(task, "cpu")
    src = seed.render()
    assert triton_check.check_source(src).ok, triton_check.check_source(src).text()
    assert L.run_triton(task, src, tmp_path) is None, src
    return seed, src


def test_scan_keeps_its_combine_function(tmp_path):
    task = task_of(lambda x: torch.cumsum(x, -1), (torch.randn(4, 16),), backend="triton")
    seed, src = _seed_ok(task, tmp_path)
    assert "associative_scan" in src and "kf_triton_helper_fn_add0_" in src


def test_cat_halves_are_written_at_their_offsets(tmp_path):
    task = task_of(lambda a, b: torch.cat((a, b.transpose(1, 2)), -1),
                   (torch.randn(2, 6, 4), torch.randn(2, 4, 6)), backend="triton")
    seed, src = _seed_ok(task, tmp_path)
    assert "_KFOFF" in src and len(seed.kernels) == 2


def test_outputs_sharing_one_buffer_get_their_own_copies(tmp_path):
    """A normed value and its rotate-half slice are one buffer in Inductor's wrapper."""
    w = torch.randn(16)

    def f(x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        h = h.transpose(1, 2)
        return h, h[..., :8], -h[..., 8:]

    task = task_of(f, (torch.randn(2, 8, 3, 16),), backend="triton")
    assert len(task.outputs) == 3
    seed, src = _seed_ok(task, tmp_path)
    assert any(k.generated for k in seed.kernels.values())
    assert not seed.main.generated  # the search tunes Inductor's kernel, not a copy


def test_linear_with_bias_is_the_library_call(tmp_path):
    w, b = torch.randn(12, 8), torch.randn(12)
    task = task_of(lambda x: torch.nn.functional.linear(x, w, b), (torch.randn(16, 8),),
                   backend="triton")
    seed, src = _seed_ok(task, tmp_path)
    assert seed.libraries and ("torch.addmm(" in src or "torch.mm(" in src)


def test_a_library_call_into_an_output_of_another_shape_writes_through_a_view(tmp_path, monkeypatch):
    """linear + gelu on a 3-d input: Inductor's mm writes a [B*S, N] buffer that the region
    returns as [B, S, N]. The seed's `mm(out=outputs[0])` resized the output tensor (its memory
    verified; traced into gemma's graph, the region returned [4096, 6912] where [8, 512, 6912]
    was read, H100 2026-12-06): the call writes through a view of the output at mm's shape."""
    monkeypatch.setenv("KFORGE_EPILOGUES", "1")
    w = torch.randn(24, 8)
    task = task_of(lambda x: torch.nn.functional.gelu(torch.nn.functional.linear(x, w), approximate="tanh"),
                   (torch.randn(2, 4, 8),), backend="triton")
    assert [tuple(m.shape) for m in task.outputs] == [(2, 4, 24)]
    seed, src = _seed_ok(task, tmp_path)
    assert seed.libraries and "out=outputs[0].as_strided((8, 24), (24, 1))" in src
