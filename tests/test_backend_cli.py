"""`--backend`: the kernel language a run searches, through the real CLI and sandbox.

On this CPU machine Triton candidates run under Triton's interpreter; the LLM is the scripted
OpenAI-compatible server on 127.0.0.1 answering one Triton softmax."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_llm_server import Reply, fake_llm  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
HONEST = (ROOT / "tests" / "cheats" / "triton" / "_honest_softmax.py").read_text()
MODEL = ROOT / "tests" / "fixtures" / "kernelbench_l2" / "bmm_scale_softmax.py"


def kforge(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "kforge_tui", *map(str, args)], capture_output=True,
                          text=True, cwd=str(ROOT), timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))


def test_backend_needs_a_gpu_for_cuda_and_is_validated(tmp_path):
    p = kforge("optimize", MODEL, "--device", "cpu", "--backend", "cuda", "--headless",
               "--run-dir", tmp_path / "r")
    assert p.returncode == 2 and "--backend cuda needs --device cuda" in p.stderr
    assert not (tmp_path / "r").exists()  # a refused run leaves nothing behind


@pytest.mark.slow
@pytest.mark.timeout(1500)  # over its run's own 20-minute limit: Inductor's seed interprets at ~10 s a call
def test_triton_backend_searches_with_the_llm_under_the_interpreter(fake_llm, tmp_path):
    import re

    # a row softmax over the region's last dim; the region also scales, so the kernel must too
    scale = re.compile(r"x = tl.load\(([^\n]*)\)\.to\(tl.float32\)")
    src = scale.sub(lambda m: f"x = tl.load({m.group(1)}).to(tl.float32) * 0.25", HONEST)
    src = src.replace("# expect: ok | an honest row softmax (the template the cheats below start from)\n", "")
    src = src.replace("rows, cols = x.shape", "cols = x.shape[-1]\n    rows = x.numel() // cols")
    fake_llm.default = Reply(content=f"```python\n{src}```")
    run = tmp_path / "run"
    p = kforge("optimize", MODEL, "--device", "cpu", "--backend", "triton", "--ops", "softmax",
               "--top", "1", "--budget", "2", "--parallel", "1", "--headless", "--no-apply",
               "--llm", "openai/fake", "--api-base", fake_llm.url, "--run-dir", run,
               env={"OPENAI_API_KEY": "sk-test"}, timeout=1200)  # node zero: seconds a call interpreted
    assert p.returncode == 0, p.stderr[-3000:]
    assert "```python" not in fake_llm.prompts()[0] or "def kforge_launch(inputs, outputs)" in fake_llm.prompts()[0]
    assert "# kforge region ABI" in fake_llm.prompts()[0]  # the Python ABI, not a C header
    from kforge_tui.store import RunStore

    data = json.loads(kforge("show", run, "--json").stdout)
    (task,) = data["tasks"]
    assert task["verified"], p.stdout[-2000:]
    store = RunStore.open(run, readonly=True)
    try:
        (row,) = store.tasks()
        assert row["task"]["backend"] == "triton"
    finally:
        store.close()
