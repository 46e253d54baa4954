"""Profile by region: every region timed eager (and compiled for the heaviest), ranked by its
time in the forward, with the model source line; unsupported regions listed with a reason."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kforge_tui.workload.capture import trace_model
from kforge_tui.workload.loader import load_model
from kforge_tui.workload.profile import format_profile, profile_regions

FIX = Path(__file__).parent / "fixtures" / "models"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_profile():
    lm = load_model(str(FIX / "tiny.py"))
    traced = trace_model(lm, "cpu", max_calls=1)
    return traced, profile_regions(lm, traced, compile_top=2, budget_s=0.05)


def test_every_task_has_a_row_ranked_by_headroom(tiny_profile):
    traced, p = tiny_profile
    keys = {r.task_key for r in p.rows if r.target}
    assert keys == {r.task.key for r in traced.records.values()}
    rooms = [r.headroom_us for r in p.rows if r.target]
    assert rooms == sorted(rooms, reverse=True)
    for r in p.rows:
        if r.target:
            assert r.floor_us is not None and r.headroom_us >= 0
            if r.compiled_us:
                assert r.headroom_us == pytest.approx(max(0.0, r.compiled_us - r.floor_us) * r.calls) \
                    or r.headroom_note  # at its floor, or a vendor GEMM
    # a share is over the forward, or over the regions' sum when they add up to more than it
    # (each timed alone carries its own call overhead; a busy machine): never above 100 %
    denom = max(p.total_us, sum(r.total_us for r in p.rows))
    for r in p.rows:
        assert r.total_us == pytest.approx(r.mean_us * r.calls)
        assert r.share == pytest.approx(r.total_us / denom)


def test_heaviest_regions_are_also_timed_compiled(tiny_profile):
    """The two heaviest by eager time that are not bare GEMMs (those are the vendor's)."""
    _, p = tiny_profile
    targets = sorted((r for r in p.rows if r.target and "vendor" not in r.headroom_note),
                     key=lambda r: -r.total_us)
    assert all(r.compiled_us and r.compiled_us > 0 for r in targets[:2])
    assert all(r.compiled_us is None for r in targets[2:])
    assert all(r.compiled_us is None for r in p.rows if "vendor" in r.headroom_note)


def test_rows_carry_the_model_source_line(tiny_profile):
    _, p = tiny_profile
    srcs = [r.source for r in p.rows if r.target]
    assert all(s.startswith("tiny.py:") for s in srcs), srcs


def test_json_and_table(tiny_profile):
    _, p = tiny_profile
    d = json.loads(json.dumps(p.to_json()))
    assert d["rows"] and {"op", "kind", "source", "compiled_us", "share", "target"} <= set(d["rows"][0])
    text = format_profile(p, top=3)
    assert "region" in text and "compiled µs" in text and "top 3 of" in text
    assert "headroom µs" in text and "floor µs" in text
    assert {"floor_us", "headroom_us", "headroom_note", "compile_error"} <= set(d["rows"][0])


def test_forward_error_is_a_usage_error():
    from kforge_tui.errors import UsageError

    with pytest.raises(UsageError, match="raised"):
        trace_model(load_model(str(FIX / "forward_raises.py")), "cpu")


def test_cli_profile_selects_regions_and_rejects_unknown_names():
    run = lambda *a: subprocess.run([sys.executable, "-m", "kforge_tui", "profile",  # noqa: E731
                                     str(FIX / "tiny.py"), "--device", "cpu", "--compile-top", "0",
                                     *a], capture_output=True, text=True, timeout=300)
    ok = run("--ops", "group_norm,linear", "--json")
    assert ok.returncode == 0, ok.stderr
    ops = {r["op"] for r in json.loads(ok.stdout)["rows"]}
    assert "linear" in ops and any("group_norm" in o.split("+") for o in ops)
    assert all(o == "linear" or "group_norm" in o.split("+") for o in ops)
    bad = run("--ops", "no_such_region")
    assert bad.returncode == 2 and "no region matches no_such_region" in bad.stderr
    assert "group_norm" in bad.stderr  # the message lists what the model has


# ------------------------------------------------------------------ sample models (slow)

@pytest.mark.slow
@pytest.mark.models
def test_resnet50_profile_lists_conv_batch_norm_relu_and_add_regions():
    lm = load_model(str(ROOT / "sample_models" / "resnet50.py"))
    traced = trace_model(lm, "cpu", max_calls=1)
    p = profile_regions(lm, traced, compile_top=0, budget_s=0.02)
    print("\n" + format_profile(p, top=12))
    labels = {r.op for r in p.rows if r.target}
    assert "conv" in labels and "max_pool2d" in labels and "linear" in labels
    assert "batch_norm+relu" in labels and "batch_norm+add+relu" in labels
    assert all(0 < r.share for r in p.rows if r.target)


@pytest.mark.gpu
def test_cuda_profile_uses_device_time():
    lm = load_model(str(FIX / "tiny.py"), device="cuda")
    traced = trace_model(lm, "cuda")
    p = profile_regions(lm, traced, compile_top=1)
    assert p.device.startswith("cuda") and p.total_us > 0
    assert all(r.total_us > 0 for r in p.rows if r.target)


def test_a_busy_cpu_is_said_in_the_profile(monkeypatch):
    """On a CPU already running other work the profile's wall-clock times come in scheduler
    ticks; the profile says so (and a quiet machine, or a GPU, gets no such note)."""
    import os

    from kforge_tui.workload import profile as P

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (7.3, 5.0, 4.0))
    note = P.busy_note("cpu")
    assert note and "load 7.3 on 2 CPUs" in note and "noisy" in note
    assert P.busy_note("cuda:0") is None
    lm = load_model(str(FIX / "tiny.py"))
    traced = trace_model(lm, "cpu", max_calls=1)
    assert note in profile_regions(lm, traced, compile_top=0, budget_s=0.02).notes
    monkeypatch.setattr(os, "getloadavg", lambda: (2.9, 2.0, 2.0))  # under 1.5 per CPU
    assert P.busy_note("cpu") is None
    monkeypatch.setattr(os, "getloadavg", lambda: (_ for _ in ()).throw(OSError("none here")))
    assert P.busy_note("cpu") is None
