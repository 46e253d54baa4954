"""`kforge tui RUN_DIR` on a run nobody runs any more: an edit or more budget is not refused, and
nothing typed is lost. The TUI saves the edit under the run, posts the command in the store,
resumes the run itself (it becomes the owner) and the engine carries the command out.

Real store, real engine loop on the TUI's engine thread, real workload step; evaluation and
proposals are scripted (tests/scripted_engine.py) so the outcome is exact.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from textual.widgets import TextArea

from kforge_tui.engine import Engine, OptimizeSettings
from kforge_tui.store import RunStore, owner_pid
from kforge_tui.tui.app import KforgeApp
from kforge_tui.tui.screens.dialogs import PromptScreen
from kforge_tui.tui.screens.editor import EditorScreen
from scripted_engine import ScriptedEvaluator, ScriptedProposer

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "tests" / "fixtures" / "engine" / "softmax_model.py")
SIZE = (100, 30)
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    s = OptimizeSettings(model=MODEL, device="cpu", top=1, parallel=1, budget=2, run_dir=str(run), end_to_end=False)
    asyncio.run(Engine(s, evaluator=ScriptedEvaluator(), proposer=ScriptedProposer()).run())
    return run


def scripted(settings, sink):
    return Engine(settings, sink, evaluator=ScriptedEvaluator(), proposer=ScriptedProposer())


async def until(pilot, cond, what: str, timeout: float = 60.0):
    for _ in range(int(timeout / 0.1)):
        if cond():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def store_nodes(run):
    with RunStore.open(run, readonly=True) as s:
        return s.nodes()


async def quit_owned(pilot, app):
    """Our own engine serves after the search: q ends the run (no end-to-end: the run has it off)."""
    await pilot.press("q")
    await until(pilot, lambda: not app.is_running, "the app to exit", 30)


async def test_edit_on_a_finished_run_is_saved_then_evaluated_by_this_tui(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    assert owner_pid(run) is None
    app = KforgeApp(run_dir=str(run), follow=True, make_engine=scripted)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.node_id is not None and app.model.finished, "the finished run")
        parent = app.node_id  # opened on its best node
        await pilot.press("e")
        assert isinstance(app.screen, EditorScreen)
        app.screen.query_one(TextArea).text = "// written by hand\n"
        await pilot.press("ctrl+s")
        hand = lambda: [n for n in store_nodes(run) if n["hand_written"]]  # noqa: E731
        await until(pilot, lambda: hand() and hand()[0]["status"] == "ok", "the hand-written kernel evaluated")
        (node,) = hand()
        # the run opened on its winner, a side-by-side re-timing: the edit is a child of the
        # candidate it re-timed (the node the search tree holds)
        opened = next(n for n in store_nodes(run) if n["id"] == parent)
        want = opened["parent_id"] if opened["action"].startswith("confirm:") else parent
        assert node["parent_id"] == want and node["source"] == "// written by hand\n"
        (saved,) = (run / "edits").iterdir()
        assert saved.read_text() == "// written by hand\n"
        assert app.host is not None and app.host.running and not app.follow  # this TUI owns the run now
        assert owner_pid(run) is not None
        await until(pilot, lambda: node["id"] in app.model.nodes and not app.model.nodes[node["id"]].in_flight,
                    "the node in the tree")
        assert any(str(saved) in n.message for n in app._notifications)
        await quit_owned(pilot, app)
    assert owner_pid(run) is None
    with RunStore.open(run, readonly=True) as s:
        assert s.run_info()["status"] == "finished" and s.untaken_commands() == []


async def test_budget_on_a_finished_run_resumes_the_search_here(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    app = KforgeApp(run_dir=str(run), follow=True, make_engine=scripted)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.task_id is not None and app.model.finished, "the finished run")
        await pilot.press("b")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press(*["backspace"] * 4, "3", "enter")
        done = lambda: len([n for n in store_nodes(run) if n["parent_id"] is not None  # noqa: E731
                            and not n["action"].startswith("confirm:")]) == 5
        await until(pilot, done, "three more candidates")
        await until(pilot, lambda: app.model.phase == "done", "the end of the new search")
        t = app.model.tasks[app.task_id]
        assert t.budget == 5 and t.evaluated == 5
        await quit_owned(pilot, app)


async def test_pause_on_a_finished_run_explains_instead_of_failing(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    app = KforgeApp(run_dir=str(run), follow=True, make_engine=scripted)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.task_id is not None and app.model.finished, "the finished run")
        await pilot.press("p", "s")
        await pilot.pause(0.3)
        messages = [n.message for n in app._notifications]
        assert any("nothing to pause" in m for m in messages) and any("already" in m for m in messages)
        assert app.host is None  # nothing to do: nobody resumed the run
