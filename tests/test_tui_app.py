"""Pilot tests of the TUI: every key action and pane, driven by a scripted event stream.

The engine side is a recording EngineControl (a test double of the UI boundary); node details
come from the scripted rows. Follow mode against a real store is in test_tui_follow.py.
"""
from __future__ import annotations

import asyncio

import pytest
from rich.syntax import Syntax
from textual.widgets import Static, TextArea

from kforge_tui import events as ev
from kforge_tui.tui.app import KforgeApp
from kforge_tui.tui.demo import T0, scripted_run
from kforge_tui.tui.details import DictDetails
from kforge_tui.tui.screens.dialogs import ConfirmScreen, PromptScreen
from kforge_tui.tui.screens.editor import EditorScreen
from kforge_tui.tui.screens.help import HelpScreen
from kforge_tui.tui.widgets.tree import SearchTree

SIZE = (100, 30)


class RecordingControl:
    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        if name in ("pause", "resume", "add_budget", "stop_task", "submit_source", "repair", "request_stop"):
            return lambda *a: self.calls.append((name, *a))
        raise AttributeError(name)


def make_app(n=12, control=None, **kw):
    events, rows = scripted_run(n, **kw)
    app = KforgeApp(control=control, run_dir=None, details=DictDetails(rows), clock=lambda: T0 + 100)
    return app, events, rows


async def settle(pilot, app):
    """Wait until queued events are drawn (the flush timer ran and nothing is pending)."""
    for _ in range(100):
        await pilot.pause(0.02)
        if not app._queue and not app._open_pending:
            await pilot.pause(0.02)
            return
    raise AssertionError("events were not drawn")


def source_text(app) -> str:
    body = app.screen_stack[0].query_one("#source-body", Static)
    r = body.content if hasattr(body, "content") else body.renderable
    return r.code if isinstance(r, Syntax) else str(r)


def first_task(app):
    return next(iter(app.model.tasks))


async def test_panes_fill_from_events():
    app, events, rows = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        table = app.query_one("#profile")
        assert table.row_count == 3
        tid = first_task(app)
        assert app.task_id == tid
        tree = app.query_one(SearchTree)
        assert len(tree._tn) == len(app.model.tasks[tid].node_ids) == 12
        status = str(app.query_one("#status").content)
        assert "NVIDIA H200" in status and "built-in" in status and "in flight 6" in status
        assert "2,000 tok" in status and "$0.0123" in status
        best = app.model.tasks[tid].best_speedup
        assert f"best {best:.2f}x" in str(app.query_one("#plot-label").content)
        assert "★" in str(tree._tn[app.model.tasks[tid].best_node].label)


async def test_tree_updates_incrementally():
    app, events, rows = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tree = app.query_one(SearchTree)
        tid = first_task(app)
        before = dict(tree._tn)
        app.sink(ev.NodeAdded(task_id=tid, node_id=999, parent_id=1, action="hand", proposer="user"))
        app.sink(ev.NodeStage(task_id=tid, node_id=999, stage="compile"))
        await settle(pilot, app)
        assert all(tree._tn[k] is v for k, v in before.items())  # same TreeNodes: no rebuild
        assert "compile" in str(tree._tn[999].label)
        app.sink(ev.NodeFinished(task_id=tid, node_id=999, status="compile_error", message="x", time_us=None,
                                 speedup=None, reward=-1))
        await settle(pilot, app)
        assert "✘" in str(tree._tn[999].label) and "compile_error" in str(tree._tn[999].label)


async def test_walk_tree_opens_node_and_diff_toggle():
    app, events, rows = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("2", "down", "down")
        await settle(pilot, app)
        nid = app.node_id
        assert nid == app.query_one(SearchTree).current_node_id and nid != 1
        assert source_text(app) == rows[nid]["source"]
        await pilot.press("d")
        assert app.diff and source_text(app).startswith("---")  # unified diff against the parent
        await pilot.press("d")
        assert source_text(app) == rows[nid]["source"]


async def test_pick_task_with_keys_and_table():
    app, events, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        ids = list(app.model.tasks)
        await pilot.press("right_square_bracket")
        assert app.task_id == ids[1]
        assert app.query_one(SearchTree).task_id == ids[1]
        await pilot.press("1", "down")
        assert app.task_id == ids[2]
        await pilot.press("left_square_bracket")
        assert app.task_id == ids[1]


async def test_jump_best_next_failure_and_logs():
    app, events, rows = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tid = first_task(app)
        await pilot.press("g")
        assert app.node_id == app.model.tasks[tid].best_node
        assert app.query_one(SearchTree).current_node_id == app.node_id
        timing = str(app.query_one("#log-timing-body", Static).content)
        assert "median" in timing and "floor" in timing
        await pilot.press("f")
        first_fail = app.node_id
        assert app.model.nodes[first_fail].failed
        compile_log = str(app.query_one("#log-compile-body", Static).content)
        assert rows[first_fail]["message"] in compile_log
        await pilot.press("f")
        assert app.node_id != first_fail and app.model.nodes[app.node_id].failed
        # the failing line is highlighted in the source view
        body = app.query_one("#source-body", Static)
        syn = body.content if hasattr(body, "content") else body.renderable
        assert isinstance(syn, Syntax) and syn.highlight_lines == {7}


async def test_mismatch_tab_shows_report():
    app, events, rows = make_app(16)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        vid = next(i for i, r in rows.items() if r.get("status") == "verify_error" and r["task_id"] == app.task_id)
        app.query_one(SearchTree).select_node_id(vid)
        await settle(pilot, app)
        text = str(app.query_one("#log-mismatch-body", Static).content)
        assert "random[1]" in text and "max abs err 0.5" in text and "[3, 17]" in text
        assert app.query_one("#logs").active == "log-mismatch"


async def test_filter_and_collapse():
    app, events, _ = make_app(16)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tree = app.query_one(SearchTree)
        await pilot.press("slash")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press(*"verify", "enter")
        shown = [app.model.nodes[i] for i in tree._tn]
        assert any(n.status == "verify_error" for n in shown)
        assert all(n.status in ("verify_error", "ok") for n in shown)  # matches plus their ancestors
        assert len(shown) < 16
        await pilot.press("slash", *["backspace"] * 12, "enter")  # empty filter restores
        assert len(tree._tn) == 16
        await pilot.press("c")
        assert not any(c.is_expanded for c in tree.root.children)
        await pilot.press("c")
        assert all(c.is_expanded for c in tree.root.children)


async def test_edit_and_submit_hand_written():
    ctl = RecordingControl()
    app, events, rows = make_app(control=ctl)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("2", "down", "down")
        await settle(pilot, app)
        nid = app.node_id
        await pilot.press("e")
        assert isinstance(app.screen, EditorScreen)
        area = app.screen.query_one(TextArea)
        assert area.text == rows[nid]["source"]
        area.insert("// tuned by hand\n", (0, 0))
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, EditorScreen)
        assert ctl.calls == [("submit_source", app.task_id, nid, "// tuned by hand\n" + rows[nid]["source"])]
        # escape cancels without a call
        await pilot.press("e", "escape")
        assert len(ctl.calls) == 1


async def test_repair_only_failed_nodes():
    ctl = RecordingControl()
    app, events, _ = make_app(control=ctl)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("g", "r")
        assert ctl.calls == []  # the best node did not fail
        await pilot.press("f", "r")
        assert ctl.calls == [("repair", app.task_id, app.node_id)]


async def test_pause_budget_stop():
    ctl = RecordingControl()
    app, events, _ = make_app(control=ctl)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tid = app.task_id
        await pilot.press("p", "p", "P")
        assert ctl.calls == [("pause", None), ("resume", None), ("pause", tid)]
        app.sink(ev.TaskStatus(task_id=tid, status="paused"))
        await settle(pilot, app)
        await pilot.press("P")
        assert ctl.calls[-1] == ("resume", tid)
        await pilot.press("b")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press("enter")
        assert ctl.calls[-1] == ("add_budget", tid, 16)
        await pilot.press("b", *["backspace"] * 12, *"-3", "enter")
        assert ctl.calls[-1] == ("add_budget", tid, 16)  # rejected with a notification
        assert any("positive whole number" in n.message for n in app._notifications)
        await pilot.press("s")
        assert ctl.calls[-1] == ("stop_task", tid)


async def test_actions_without_engine_say_so():
    app, events, _ = make_app(control=None)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("p")
        assert any("No engine attached" in n.message for n in app._notifications)


async def test_export_error_is_a_notification(tmp_path):
    app, events, _ = make_app()
    app.run_dir = str(tmp_path / "no_such_run")
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("x")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause(0.1)
        assert any(n.message.startswith("export failed") for n in app._notifications)


async def test_help_palette_and_themes():
    app, events, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+p")
        await pilot.press(*"Diff")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.diff
        assert app.theme == "kforge-dark"
        await pilot.press("t")
        assert app.theme == "kforge-light"
        await pilot.press("ctrl+p", *"Theme: kforge-ansi")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.theme == "kforge-ansi" and app.current_theme.ansi


def test_unknown_theme_is_a_usage_error():
    from kforge_tui.errors import UsageError

    with pytest.raises(UsageError, match="unknown theme 'nope'"):
        KforgeApp(control=None, run_dir=None, theme="nope")
    assert KforgeApp(control=None, run_dir=None, theme="light").theme == "kforge-light"


async def test_live_mode_quit_confirms_and_stops_engine():
    ctl = RecordingControl()
    events, rows = scripted_run(8)
    release = asyncio.Event()

    async def runner(sink):
        for e in events:
            sink(e)
        await release.wait()

    app = KforgeApp(control=ctl, run_dir=None, details=DictDetails(rows), engine_runner=runner)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        assert len(app.query_one(SearchTree)._tn) == 8
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert app.is_running and ctl.calls == []
        await pilot.press("q", "y")
        await pilot.pause()
        assert ctl.calls == [("request_stop",)]
    assert app.return_code == 0


async def test_quit_without_confirm_when_finished():
    app, events, _ = make_app(finish=True)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_engine_error_is_shown_not_a_crash():
    async def runner(sink):
        sink(ev.RunStarted(run_dir="", model="m.py", device="cpu", device_name="cpu", proposer="built-in"))
        raise RuntimeError("nvcc exploded\nsecond line")

    app = KforgeApp(control=None, run_dir=None, engine_runner=runner)
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await settle(pilot, app)
        assert any(n.message == "engine stopped: nvcc exploded" for n in app._notifications)
        assert app.is_running
        await pilot.press("q")  # the run is over: no confirmation
        await pilot.pause()
    assert app.return_code == 0
