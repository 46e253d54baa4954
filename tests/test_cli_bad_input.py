"""Bad input through the real CLI (subprocesses): exit 2, one error line, no traceback.

Progress lines (`kforge: loading ...`) may precede the error; exactly one line is the error.
The invocations are independent, so they start together (a module fixture) and each test
checks its own result: this keeps the file fast on a 2-core machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
M = "tests/fixtures/models/"

CASES = {
    "missing": (["profile", M + "missing_model.py"], "model file not found"),
    "syntax": (["profile", M + "syntax_error.py"], "syntax_error.py:4: syntax error"),
    "raises": (["profile", M + "raises_in_build.py"], "build() raised RuntimeError: weights not found"),
    "wrong_return": (["profile", M + "wrong_return.py"], "must return (model, example_inputs)"),
    "forward_raises": (["profile", M + "forward_raises.py"], "forward raised RuntimeError"),
    "not_kernelbench": (["profile", M + "not_kernelbench.py"], "is not a KernelBench file"),
    "unknown_op": (["optimize", M + "tiny.py", "--ops", "softmax,flash_attn", "--headless"],
                   "unknown op 'flash_attn'; known ops: softmax"),
    "cuda_without_gpu": (["profile", M + "tiny.py", "--device", "cuda"], "no CUDA GPU is visible"),
}
OTHER = {
    "debug": ["profile", M + "raises_in_build.py", "--debug"],
    "no_targets": ["profile", M + "no_target_ops.py", "--json"],
}


def kforge(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LITELLM_LOCAL_MODEL_COST_MAP="True")
    return subprocess.run([sys.executable, "-m", "kforge_tui", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def results():
    todo = {k: v[0] for k, v in CASES.items()} | OTHER
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {k: pool.submit(kforge, args) for k, args in todo.items()}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(results, case):
    if case == "cuda_without_gpu" and torch.cuda.is_available():
        pytest.skip("needs a machine without GPU")
    p, needle = results[case], CASES[case][1]
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("kforge: error:")]
    assert len(errors) == 1, p.stderr
    assert needle in errors[0], p.stderr
    stray = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("kforge:")]
    assert not stray, p.stderr  # no C++ or Python noise besides kforge's own lines
    assert p.stdout == ""


def test_debug_shows_the_traceback(results):
    p = results["debug"]
    assert p.returncode == 2 and "Traceback" in p.stderr and "weights not found" in p.stderr


def test_profile_model_without_target_ops_still_prints(results):
    p = results["no_targets"]
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["rows"] and not any(r["target"] for r in data["rows"])
    assert {r["op"] for r in data["rows"]} >= {"linear", "add"}
    assert any("no kernel-target ops" in n for n in data["notes"])
    assert "USDT" not in p.stderr  # the profiler's start/stop chatter is hidden
