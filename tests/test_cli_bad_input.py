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
    # a name kforge knows nowhere: refused before the model loads
    "unknown_op": (["optimize", M + "tiny.py", "--ops", "softmax,flash_attn", "--headless"],
                   "--ops: flash_attn names no op, pattern or kind kforge knows"),
    # a real op this model does not have: refused after the capture, before the profile, with
    # names a person can type (a label cut with … is offered as its parts)
    "absent_op": (["optimize", M + "tiny.py", "--ops", "max_pool2d", "--headless", "--device", "cpu"],
                  "--ops: no region matches max_pool2d; this model has:"),
    "run_dir_under_file": (["optimize", M + "tiny.py", "--headless", "--run-dir", M + "tiny.py/run"],
                           "tiny.py is a file, not a directory"),
    "run_dir_in_proc": (["optimize", M + "tiny.py", "--headless", "--run-dir", "/proc/kforge-run"],
                        "--run-dir /proc/kforge-run: cannot create it in /proc"),
    "api_base_refused": (["optimize", M + "tiny.py", "--headless", "--llm", "openai/m", "--api-base",
                          "http://127.0.0.1:9/v1"], "--api-base http://127.0.0.1:9/v1 is unreachable"),
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
    if case in ("unknown_op", "run_dir_under_file", "run_dir_in_proc", "api_base_refused"):
        assert "[load]" not in p.stderr and "[capture]" not in p.stderr  # refused before any work
    if case == "absent_op":
        assert "[capture]" in p.stderr and "[profile]" not in p.stderr
        names = errors[0].split("this model has: ")[1].split(", ")
        assert "softmax" in names and not any("…" in n for n in names), names


def test_unreachable_api_base_fails_in_under_3_s():
    """It took 24.6 s to report a refusal that took 0.0 s (litellm's import came first)."""
    import time

    t0 = time.monotonic()
    p = kforge(["optimize", M + "tiny.py", "--headless", "--llm", "openai/m", "--api-base", "http://127.0.0.1:9/v1"])
    took = time.monotonic() - t0
    assert p.returncode == 2 and "unreachable" in p.stderr, p.stderr
    assert took < 3.0, f"{took:.1f} s"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_read_only_run_dir_is_one_line_and_exit_2(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    p = kforge(["optimize", M + "tiny.py", "--headless", "--run-dir", str(ro / "run")])
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(f"kforge: error: --run-dir {ro / 'run'}: cannot create it")


def test_debug_shows_the_traceback(results):
    p = results["debug"]
    assert p.returncode == 2 and "Traceback" in p.stderr and "weights not found" in p.stderr


def test_profile_of_linears_and_an_add_lists_every_region(results):
    """No named op anywhere: every aten op is still a region (the old catalogue had nothing)."""
    p = results["no_targets"]
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["rows"] and all(r["target"] for r in data["rows"])
    assert {r["op"] for r in data["rows"]} >= {"linear", "add"}
    assert "USDT" not in p.stderr


def test_tui_without_a_terminal_exits_2_at_once(tmp_path):
    """It used to hang: Textual waited for a terminal that nohup, a pipe or CI never gives."""
    from kforge_tui.tui.demo import write_store

    write_store(tmp_path / "run", 3)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "kforge_tui", "tui", str(tmp_path / "run")], capture_output=True,
                       text=True, timeout=60, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"kforge: error: kforge tui needs a terminal (stdin and stdout are not a TTY); "
        f"`kforge show {tmp_path / 'run'}` prints the run instead"]


def test_a_mistyped_model_leaves_no_run_dir_to_block_the_next_try(tmp_path):
    run = tmp_path / "run"
    p = kforge(["optimize", M + "tiny_typo.py", "--device", "cpu", "--headless", "--run-dir", str(run)])
    assert p.returncode == 2 and "model file not found" in p.stderr, p.stderr
    assert not run.exists()


def test_runs_lists_runs_made_with_run_dir_anywhere(tmp_path):
    """`kforge runs` looked only under run_root and ./kforge_runs."""
    from kforge_tui.tui.demo import write_store

    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(tmp_path / "data"))
    elsewhere = tmp_path / "somewhere" / "my-run"
    write_store(elsewhere, 3)
    code = f"from kforge_tui.store import register_run; register_run({str(elsewhere)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
    p = subprocess.run([sys.executable, "-m", "kforge_tui", "runs", "--json"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert [r["run_dir"] for r in json.loads(p.stdout)["runs"]] == [str(elsewhere.resolve())]
    (tmp_path / "somewhere").rename(tmp_path / "moved")  # a vanished run drops out of the list
    p = subprocess.run([sys.executable, "-m", "kforge_tui", "runs", "--json"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=env)
    assert json.loads(p.stdout)["runs"] == []
