"""The TUI on the REAL engine: cpu backend, built-in proposer, real compiles and worker processes.

The app is built by `live_app`, the same path `kforge optimize` (no --headless) takes, so the engine
runs on the app's loop and feeds it events. What the widgets show is checked against the run
store the engine wrote, so a pane that stays empty, lags or shows the wrong node fails here.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from rich.syntax import Syntax
from textual.widgets import Static, TextArea

from kforge_tui.engine import OptimizeSettings
from kforge_tui.store import RunStore
from kforge_tui.summary import fmt_us
from kforge_tui.tui.app import live_app
from kforge_tui.tui.screens.editor import EditorScreen
from kforge_tui.tui.widgets.tree import SearchTree

pytestmark = pytest.mark.timeout(240)

FIX = Path(__file__).parent / "fixtures" / "engine"
GOOD_CPP = (FIX / "softmax_cpu.cpp").read_text()
SIZE = (100, 30)


def settings(tmp_path, budget: int) -> OptimizeSettings:
    return OptimizeSettings(model=str(FIX / "softmax_model.py"), device="cpu", budget=budget,
                            run_dir=str(tmp_path / "run"), end_to_end=False)


async def wait_until(pilot, app, cond, what: str, timeout: float = 150.0) -> None:
    """Poll the live app (the engine is streaming, so Pilot never sees the app idle)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        await pilot.pause(0.1)
        if cond():
            await pilot.pause(0.2)  # one more batch window so the widgets drew what the model holds
            return
    raise AssertionError(f"timed out waiting for {what}; phase={app.model.phase!r} "
                         f"tasks={[(t.status, t.evaluated) for t in app.model.tasks.values()]} "
                         f"log={[e.message for e in list(app.model.logs)[-5:]]}")


def search_over(app) -> bool:
    m = app.model
    return bool(m.tasks) and not m.in_flight and all(t.status in ("done", "failed") for t in m.tasks.values())


def cell(table, row_key: str, col: str) -> str:
    return str(table.get_cell(row_key, col))


def source_text(app) -> str:
    body = app.screen_stack[0].query_one("#source-body", Static)
    r = body.content if hasattr(body, "content") else body.renderable
    return r.code if isinstance(r, Syntax) else str(r)


def static_text(app, selector: str) -> str:
    w = app.screen_stack[0].query_one(selector, Static)
    return str(w.content if hasattr(w, "content") else w.renderable)


async def quit_after_search(pilot, app) -> None:
    """After the search, q ends the run (these runs have the end-to-end check off, so nothing to
    offer) and the app exits once the engine's thread is done."""
    await pilot.press("q")
    end = time.monotonic() + 60
    while app.is_running and time.monotonic() < end:
        await asyncio.sleep(0.05)
    assert not app.is_running, "q did not end the run"


async def test_real_engine_fills_table_tree_and_best(tmp_path):
    s = settings(tmp_path, budget=5)
    app = live_app(s)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, app, lambda: search_over(app), "the search to finish")
        with RunStore.open(s.run_dir, readonly=True) as store:
            tasks = store.tasks()
            rows = {r["id"]: r for r in store.nodes()}
        assert len(tasks) == 1
        t = tasks[0]
        tid = t["task_id"]
        assert t["op"] == "softmax" and t["status"] in ("done", "failed")

        # profile table: one row per task, with the store's numbers
        table = app.query_one("#profile")
        assert table.row_count == 1 and app.task_id == tid
        assert cell(table, tid, "op") == "softmax" and cell(table, tid, "shape") == "64x4096"
        assert cell(table, tid, "status") == t["status"]
        finished = [r for r in rows.values() if r["action"] != "root" and r["status"] != "pending"
                    and not r["action"].startswith("confirm:")]  # re-timings are not candidates
        assert cell(table, tid, "evals") == f"{len(finished)}/5"
        assert len(finished) >= 5  # the budget was spent on real evaluations

        # the tree: every candidate node, with the action it ended up with and its final status
        tree = app.query_one(SearchTree)
        cands = {i for i, r in rows.items() if r["action"] != "root"}
        assert cands <= set(tree._tn)
        for nid in cands:
            label = str(tree._tn[nid].label)
            r = rows[nid]
            assert f"#{nid} {r['action']}" in label, (label, r["action"])  # not stuck at "proposing"
            assert ("✔" in label) == (r["status"] == "ok"), label
            if r["status"] != "ok":
                assert r["status"] in label

        # the best speedup, if anything verified: table, plot label, star in the tree; the live
        # view's reference and winner are the store's (one rule: summary.TaskFigures)
        assert cell(table, tid, "eager") == fmt_us(t["baseline_us"], compact=True)
        assert app.model.tasks[tid].best_node == t["best_node"]
        if t["best_node"] is not None:
            best = t["speedup"]
            assert best == t["baseline_us"] / t["best_us"]
            assert cell(table, tid, "x") == f"{best:.2f}x"
            assert cell(table, tid, "best") == fmt_us(t["best_us"], compact=True)
            assert f"best {best:.2f}x" in static_text(app, "#plot-label")
            assert "★" in str(tree._tn[t["best_node"]].label)
            await pilot.press("2", "g")
            await wait_until(pilot, app, lambda: app.node_id == t["best_node"], "jump to best", 10)
            assert source_text(app) == rows[t["best_node"]]["source"]
            assert f"speedup   {best:.2f}x vs eager" in static_text(app, "#log-timing-body")
        else:
            assert cell(table, tid, "x") == "-"
        status = static_text(app, "#status")
        assert "[cpu]" in status and "built-in" in status and "in flight 0" in status
        assert status.splitlines()[1].split()[0] == "done"  # the end of the search is shown
        assert app.host._loop is not asyncio.get_running_loop()  # the engine has its own thread and loop

        await quit_after_search(pilot, app)
    assert app.return_code == 0
    with RunStore.open(s.run_dir, readonly=True) as store:
        assert store.run_info()["status"] == "finished"


async def test_edit_submit_evaluates_hand_written_child(tmp_path):
    """e opens the editor on a node; ctrl+s submits: the engine evaluates it after the budget is spent."""
    s = settings(tmp_path, budget=2)
    app = live_app(s)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, app, lambda: search_over(app), "the search to finish")
        tree = app.query_one(SearchTree)
        await pilot.press("2")
        with_source = [n for n in app.model.tasks[app.task_id].node_ids if app.model.nodes[n].action != "root"]
        assert tree.select_node_id(with_source[0])
        await pilot.press("o")
        await wait_until(pilot, app, lambda: app.node_id == with_source[0], "the node to open", 10)
        await pilot.press("e")
        await wait_until(pilot, app, lambda: isinstance(app.screen, EditorScreen), "the editor", 10)
        app.screen.query_one(TextArea).text = GOOD_CPP
        await pilot.press("ctrl+s")
        hand = lambda: [n for n in app.model.nodes.values() if n.action == "hand"]  # noqa: E731
        await wait_until(pilot, app, lambda: hand() and not hand()[0].in_flight, "the hand-written node", 45)
        n = hand()[0]
        assert n.parent_id == with_source[0] and n.status == "ok", (n.status, n.message)
        assert n.speedup is not None and f"{n.speedup:.2f}x" in str(tree._tn[n.node_id].label)
        with RunStore.open(s.run_dir, readonly=True) as store:
            row = store.node(n.node_id)
        assert row["hand_written"] and row["source"] == GOOD_CPP and row["status"] == "ok"
        await quit_after_search(pilot, app)
