"""Operator profile: grouping, friendly names, the rms_norm pattern row, shares and the table."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kforge_tui.workload import catalogue
from kforge_tui.workload.loader import load_model
from kforge_tui.workload.profile import format_profile, friendly_name, profile_model

FIX = Path(__file__).parent / "fixtures" / "models"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_profile():
    return profile_model(load_model(str(FIX / "tiny.py")), warmup=1, iters=2)


def rows_of(profile, op):
    return [r for r in profile.rows if r.op == op]


def test_rows_grouped_by_op_shape_dtype_with_per_forward_calls(tiny_profile):
    p = tiny_profile
    assert p.iters == 2 and p.device == "cpu" and p.total_us > 0
    sm = {tuple(map(tuple, r.shapes)): r for r in rows_of(p, "softmax")}
    # torch.softmax and F.softmax on [2,6,6] (twice per forward), Tensor.softmax on [2,64,6] once
    assert sm[((2, 6, 6),)].calls == 2 and sm[((2, 64, 6),)].calls == 1
    assert all(r.aten == "aten::softmax" and r.target and r.dtype == "float32" for r in sm.values())
    gn = rows_of(p, "group_norm")
    assert len(gn) == 1 and gn[0].shapes[0] == [2, 32, 8, 8] and gn[0].calls == 1
    assert rows_of(p, "adaptive_avg_pool2d")[0].shapes == [[2, 32, 8, 8]]
    assert {r.aten for r in rows_of(p, "relu")} == {"aten::relu", "aten::relu_"}
    for op in ("layer_norm", "gelu", "silu", "log_softmax", "conv2d", "linear"):
        assert rows_of(p, op), op
    assert not rows_of(p, "addmm") and not rows_of(p, "_softmax")  # nested ops are not rows


def test_hf_style_rms_norm_modules_are_one_pattern_row(tiny_profile):
    p = tiny_profile
    pattern = [r for r in rows_of(p, "rms_norm") if r.aten == "rms_norm pattern"]
    assert len(pattern) == 1
    r = pattern[0]
    assert r.calls == 2 and r.shapes == [[2, 6, 64], [64]] and r.target and r.dtype == "float32"
    # the pattern's parts do not leak out as top-level rows
    assert not rows_of(p, "rsqrt") and not rows_of(p, "pow")
    fused = [r for r in rows_of(p, "rms_norm") if r.aten == "aten::rms_norm"]  # F.rms_norm
    assert len(fused) == 1 and fused[0].calls == 1


def test_shares_and_times_are_consistent(tiny_profile):
    p = tiny_profile
    assert p.rows == sorted(p.rows, key=lambda r: r.total_us, reverse=True)
    for r in p.rows:
        assert r.total_us >= 0 and abs(r.mean_us * r.calls - r.total_us) < 1e-6 * max(1, r.total_us)
        assert abs(r.share - r.total_us / p.total_us) < 1e-9
        assert r.target == (r.op in catalogue.TARGET_OPS)
    assert sum(r.share for r in p.rows) <= 1.0 + 1e-6  # top-level ops do not double count


def test_one_dominant_op_has_most_of_the_forward():
    """Per-forward normalisation: a model that is one big softmax spends most of its time there."""
    import torch

    from kforge_tui.workload.loader import LoadedModel

    class OneSoftmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1)

    lm = LoadedModel(OneSoftmax().eval(), (torch.randn(512, 4096),), "inline", "cpu")
    p = profile_model(lm, warmup=1, iters=4)
    (row,) = rows_of(p, "softmax")
    assert row.calls == 1 and row.shapes == [[512, 4096]] and row.aten == "aten::softmax"
    assert 0.5 < row.share <= 1.0
    assert row.total_us <= p.total_us


def test_json_and_table(tiny_profile):
    data = json.loads(json.dumps(tiny_profile.to_json()))
    assert data["device"] == "cpu" and len(data["rows"]) == len(tiny_profile.rows)
    assert set(data["rows"][0]) == {"op", "aten", "shapes", "dtype", "calls", "total_us", "mean_us",
                                    "share", "target"}
    text = format_profile(tiny_profile, top=5)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["op", "aten", "shapes"]
    body = lines[2:7]
    assert len(body) == 5 and all(("*" in ln.split()[0]) == (ln.split()[0] == "*") for ln in body)
    assert "top 5 of" in text
    full = format_profile(tiny_profile)
    assert all(r.op in full for r in tiny_profile.rows)
    assert any(ln.startswith("*") and "group_norm" in ln for ln in full.splitlines())


def test_friendly_names():
    assert friendly_name("aten::_softmax") == "softmax"
    assert friendly_name("aten::relu_") == "relu"
    assert friendly_name("aten::native_group_norm") == "group_norm"
    assert friendly_name("aten::addmm") == "matmul"


def test_forward_error_during_profile_is_usage_error():
    from kforge_tui.errors import UsageError

    with pytest.raises(UsageError, match="forward raised"):
        profile_model(load_model(str(FIX / "forward_raises.py")))


# ------------------------------------------------------------------ sample models (slow)

def _profile_sample(name: str):
    t0 = time.perf_counter()
    lm = load_model(str(ROOT / "sample_models" / f"{name}.py"))
    p = profile_model(lm, warmup=1, iters=1)
    print(f"\n{name}: build+profile {time.perf_counter() - t0:.1f}s\n{format_profile(p, top=5)}")
    return lm, p


@pytest.mark.slow
@pytest.mark.models
def test_resnet50_shows_adaptive_avg_pool2d():
    _, p = _profile_sample("resnet50")
    pool = rows_of(p, "adaptive_avg_pool2d")
    assert pool and pool[0].shapes[0] == [2, 2048, 7, 7] and pool[0].target
    assert rows_of(p, "conv2d") and rows_of(p, "relu")


@pytest.mark.slow
@pytest.mark.models
def test_sd35_vae_shows_group_norm():
    _, p = _profile_sample("sd35_vae")
    gn = rows_of(p, "group_norm")
    assert gn and all(r.target for r in gn)
    assert {r.shapes[0][1] for r in gn} >= {512, 256, 128}  # the decoder's widths, 32 groups each


@pytest.mark.gpu
def test_cuda_profile_uses_device_time():
    p = profile_model(load_model(str(FIX / "tiny.py"), device="cuda"), warmup=2, iters=3)
    assert p.device == "cuda" and p.total_us > 0
    gn = rows_of(p, "group_norm")
    assert gn and gn[0].total_us > 0  # kernel time launched under aten::group_norm
    assert [r for r in rows_of(p, "rms_norm") if r.aten == "rms_norm pattern"][0].total_us > 0
    assert sum(r.share for r in p.rows) <= 1.0 + 1e-6


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("name, op", [("resnet50", "adaptive_avg_pool2d"), ("sd35_vae", "group_norm"),
                                      ("gemma", "softmax"), ("qwen_moe", "softmax")])
def test_samples_at_gpu_size(name, op, monkeypatch):
    monkeypatch.setenv("KFORGE_SAMPLE_SIZE", "gpu")
    lm = load_model(str(ROOT / "sample_models" / f"{name}.py"), device="cuda")
    p = profile_model(lm, warmup=2, iters=3)
    print(f"\n{name} (gpu size)\n{format_profile(p, top=5)}")
    assert rows_of(p, op)
