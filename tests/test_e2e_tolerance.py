"""The end-to-end verdict for deep models: judged against a float64 run of the original model."""
from __future__ import annotations

import torch
import torch.nn as nn

from kforge_tui.integrate.accuracy import F64_FACTOR, float64_judgement


def _deep_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [nn.Linear(64, 64), nn.GroupNorm(8, 64), nn.SiLU()]
    return nn.Sequential(*layers).eval()


def test_patched_output_as_close_to_float64_as_eager_is_accepted():
    model, x = _deep_model(), torch.randn(16, 64)
    with torch.inference_mode():
        eager = model(x)
        exact = model.double()(x.double())
    model.float()
    got = exact.float()  # a "patched" model whose rounding differs from eager but is no worse
    r = float64_judgement(model, (x,), [("out", eager)], [("out", got)])
    assert r["verdict"] == "as accurate", r
    assert r["eager_err"] > 0 and r["patched_err"] <= r["eager_err"]


def test_patched_output_further_from_float64_than_eager_is_refused():
    model, x = _deep_model(), torch.randn(16, 64)
    with torch.inference_mode():
        eager = model(x)
        exact = model.double()(x.double())
    model.float()
    err = (eager.double() - exact).abs().max()
    got = eager + float(3 * F64_FACTOR * err)  # off by more than the factor allows
    r = float64_judgement(model, (x,), [("out", eager)], [("out", got)])
    assert r["verdict"] == "less accurate than eager", r


def test_a_model_that_cannot_run_in_float64_leaves_the_strict_verdict():
    class Float32Only(nn.Module):
        def forward(self, x):
            assert x.dtype == torch.float32, "float32 only"
            return x * 2

    x = torch.randn(4)
    r = float64_judgement(Float32Only(), (x,), [("out", x * 2)], [("out", x * 2)])
    assert r["verdict"].startswith("float64 run failed"), r


def test_half_precision_models_are_judged_against_float32():
    model, x = _deep_model(), torch.randn(16, 64)
    model = model.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    with torch.inference_mode():
        eager = model(xb)
        exact32 = model.float()(xb.float())
    model.to(torch.bfloat16)
    r = float64_judgement(model, (xb,), [("out", eager)], [("out", exact32.to(torch.bfloat16))])
    assert r["verdict"] == "as accurate", r
