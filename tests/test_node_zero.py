"""Every search starts from Inductor's own kernel (node zero), in the languages the run searches,
and a search out of ideas hands its budget on (issue 27). The engine is real (workload step,
store, loop); the evaluator and the proposer are scripted, so routing and budgets are exact."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kforge_tui.engine import Engine, OptimizeSettings
from kforge_tui.errors import UsageError
from kforge_tui.search.languages import language_of, route, search_plan
from kforge_tui.store import RunStore
from scripted_engine import ScriptedEvaluator, ScriptedProposer

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = str(ROOT / "tests" / "fixtures" / "engine" / "softmax_model.py")
pytestmark = pytest.mark.timeout(300)

TWO = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1), torch.nn.functional.gelu(x) * 3


def get_inputs():
    return [torch.randn(32, 512)]
'''


def test_search_plan():
    assert search_plan("cuda", None) == ("cuda", ["triton", "cuda"])  # the default on a GPU
    assert search_plan("cuda", "auto") == ("cuda", ["triton", "cuda"])
    assert search_plan("cuda", "cuda") == ("cuda", ["cuda"])
    assert search_plan("cpu", None) == ("cpu", ["cpu"])
    assert search_plan("cpu", "auto") == ("cpu", ["cpu"])
    assert search_plan("cpu", "triton") == ("triton", ["triton"])  # the interpreter: CI
    with pytest.raises(UsageError, match="needs --device cuda"):
        search_plan("cpu", "cuda")


def test_a_candidates_language_is_read_off_its_source():
    py = "import triton\n\ndef kforge_launch(inputs, outputs):\n    return 0\n"
    cu = '#include "kforge_region.h"\n__global__ void k() {}\n'
    cpp = '#include "kforge_region.h"\nextern "C" int kforge_launch(const void* const* i, void* const* o) { return 0; }\n'
    assert language_of(py, "cuda") == "triton" and language_of(cu, "cuda") == "cuda"
    assert language_of(cpp, "cpu") == "cpu" and language_of(cu, "triton") == "cuda"
    assert language_of(None, "cuda") == "cuda"

    class T:
        backend = "cuda"

        def with_backend(self, b):
            t = T()
            t.backend = b
            return t

    assert route(T(), py, ["triton", "cuda"]).backend == "triton"
    assert route(T(), py, ["cuda"]).backend == "cuda"  # not a language of this run: as the task


class _Recording(ScriptedEvaluator):
    def __init__(self):
        super().__init__(0.01)
        self.seen: list[tuple[str, str]] = []

    async def baseline(self, task_json, run_dir, with_compile=False):
        self.seen.append(("baseline", task_json["backend"]))
        return await super().baseline(task_json, run_dir, with_compile)

    async def evaluate(self, task_json, run_dir, source, on_stage=None):
        self.seen.append((source.split("\n", 1)[0][:60], task_json["backend"]))
        return await super().evaluate(task_json, run_dir, source, on_stage)


def test_node_zero_is_inductors_kernel_and_goes_to_the_triton_workers(tmp_path):
    ev = _Recording()
    run = tmp_path / "run"
    st = OptimizeSettings(model=SOFTMAX, device="cpu", backend="triton", top=1, budget=2,
                          parallel=1, run_dir=str(run), end_to_end=False)
    asyncio.run(Engine(st, evaluator=ev, proposer=ScriptedProposer()).run())
    with RunStore.open(run, readonly=True) as s:
        (t,) = s.tasks()
        nodes = s.nodes(t["task_id"])
    root, first = nodes[0], nodes[1]
    assert root["lang"] == "pytorch"
    assert (first["action"], first["proposer"], first["parent_id"]) == ("seed:inductor", "inductor", root["id"])
    assert first["lang"] == "triton" and first["params"]["family"] == "inductor"
    assert "def kforge_launch(inputs, outputs)" in first["source"]
    assert ev.seen[0] == ("baseline", "triton")
    assert ev.seen[1][1] == "triton" and "Inductor" in ev.seen[1][0]
    assert t["evaluated"] == 2 and t["best_lang"] in ("triton", "cpu")
    # the region table's seed column: node zero's own time, on the candidates' clock
    assert first["status"] == "ok" and t["seed_node"] == first["id"] and t["seed_us"] == first["time_us"] > 0
    from kforge_tui.summary import show_json

    (shown,) = show_json(str(run))["tasks"]
    assert (shown["seed_us"], shown["seed_node"], shown["best_lang"]) == (t["seed_us"], first["id"], t["best_lang"])


class _OneIdeaFor(ScriptedProposer):
    """Nothing to propose for regions whose op contains `stuck`; plenty for the others."""

    def __init__(self, stuck: str):
        super().__init__()
        self.stuck = stuck

    def can_expand(self, ctx) -> bool:
        return self.stuck not in ctx.task["op"]


def test_a_search_out_of_ideas_passes_its_budget_on(tmp_path):
    model = tmp_path / "two.py"
    model.write_text(TWO)
    run = tmp_path / "run"
    st = OptimizeSettings(model=str(model), device="cpu", top=2, budget=4, parallel=1,
                          run_dir=str(run), end_to_end=False)
    seen: list = []
    asyncio.run(Engine(st, seen.append, evaluator=ScriptedEvaluator(0.01),
                       proposer=_OneIdeaFor("softmax")).run())
    with RunStore.open(run, readonly=True) as s:
        rows = {t["op"]: t for t in s.tasks()}
    stuck = next(t for op, t in rows.items() if "softmax" in op)
    other = next(t for op, t in rows.items() if "softmax" not in op)
    assert stuck["evaluated"] == 0 and stuck["budget"] == 0
    assert other["budget"] == 8 and other["evaluated"] == 8
    assert any("passed on to" in getattr(e, "message", "") for e in seen)
