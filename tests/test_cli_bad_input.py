"""Bad input through the real CLI (a subprocess): exit 2, one error line, no traceback.

Progress lines (`kforge: loading ...`) may precede the error; exactly one line is the error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "models"


def kforge(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LITELLM_LOCAL_MODEL_COST_MAP="True")
    return subprocess.run([sys.executable, "-m", "kforge_tui", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def assert_usage_error(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("kforge: error:")]
    assert len(errors) == 1, p.stderr
    assert needle in errors[0], p.stderr
    assert not [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("kforge:")], \
        p.stderr  # nothing else: no stray C++ or Python noise


@pytest.mark.parametrize("model, needle", [
    ("tests/fixtures/models/missing_model.py", "model file not found"),
    ("tests/fixtures/models/syntax_error.py", "syntax_error.py:4: syntax error"),
    ("tests/fixtures/models/raises_in_build.py", "build() raised RuntimeError: weights not found"),
    ("tests/fixtures/models/wrong_return.py", "must return (model, example_inputs)"),
    ("tests/fixtures/models/forward_raises.py", "forward raised RuntimeError"),
])
def test_profile_bad_model(model, needle):
    assert_usage_error(kforge("profile", model), needle)


def test_debug_shows_the_traceback():
    p = kforge("profile", "tests/fixtures/models/raises_in_build.py", "--debug")
    assert p.returncode == 2 and "Traceback" in p.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without GPU")
def test_profile_cuda_without_gpu():
    assert_usage_error(kforge("profile", "tests/fixtures/models/tiny.py", "--device", "cuda"),
                       "no CUDA GPU is visible")


def test_optimize_unknown_op():
    p = kforge("optimize", "tests/fixtures/models/tiny.py", "--ops", "softmax,flash_attn",
               "--headless")
    assert_usage_error(p, "unknown op 'flash_attn'; known ops: softmax")


def test_profile_model_without_target_ops_still_prints():
    p = kforge("profile", "tests/fixtures/models/no_target_ops.py", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["rows"] and not any(r["target"] for r in data["rows"])
    assert any("no kernel-target ops" in n for n in data["notes"])
    assert "USDT" not in p.stderr  # profiler start/stop chatter is hidden
