"""kforge doctor: real version queries of this machine's python, torch, compilers and settings."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from kforge_tui.doctor import Check, format_checks, run_checks

ROOT = Path(__file__).resolve().parent.parent


def by_name(checks):
    return {c.name: c for c in checks}


def test_checks_cover_the_toolchain():
    checks = by_name(run_checks())
    assert {"python", "torch", "gpu", "nvcc", "c++ compiler", "tree-sitter", "textual", "llm"} <= set(checks)
    assert checks["python"].ok and sys.executable in checks["python"].detail
    assert torch.__version__ in checks["torch"].detail
    assert checks["gpu"].ok == torch.cuda.is_available()
    if not checks["gpu"].ok:
        assert checks["gpu"].fix and "cpu backend" in checks["gpu"].detail
    gxx = shutil.which("g++")
    if gxx:
        assert checks["c++ compiler"].ok and "g++" in checks["c++ compiler"].detail
    assert checks["llm"].ok and "built-in proposer" in checks["llm"].detail


def test_nvcc_version_comes_from_running_it(tmp_path, monkeypatch):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    "echo 'Cuda compilation tools, release 99.1, V99.1.7'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KFORGE_NVCC", str(fake))
    c = by_name(run_checks())["nvcc"]
    assert c.ok and "release 99.1" in c.detail and str(fake) in c.detail


def test_configured_llm_is_named():
    c = by_name(run_checks(llm="openai/qwen2.5-coder", api_base="http://127.0.0.1:8000/v1"))["llm"]
    assert c.ok and "openai/qwen2.5-coder" in c.detail and "127.0.0.1:8000" in c.detail


def test_format_marks_missing_with_fix():
    text = format_checks([Check("nvcc", False, "not found", "install the CUDA toolkit"),
                          Check("python", True, "3.11")])
    lines = text.splitlines()
    assert lines[0].startswith("missing") and "nvcc" in lines[0]
    assert "fix: install the CUDA toolkit" in lines[1]
    assert any(ln.startswith("OK") and "python" in ln for ln in lines)
    assert "backend" in lines[-1]


def test_cli_doctor_json():
    env = dict(os.environ, PYTHONPATH=str(ROOT), LITELLM_LOCAL_MODEL_COST_MAP="True")
    p = subprocess.run([sys.executable, "-m", "kforge_tui", "doctor", "--json"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert {d["name"] for d in data} >= {"python", "torch", "nvcc"}
    assert all(set(d) == {"name", "ok", "detail", "fix"} for d in data)
