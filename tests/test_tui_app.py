"""Pilot tests of the TUI: every key action and pane, driven by a scripted event stream.

The engine side is a recording EngineControl (a test double of the UI boundary) or a scripted
engine run on the app's engine thread; node details come from the scripted rows. Follow mode
against a real store is in test_tui_follow.py, the real engine in test_tui_engine.py.
"""
from __future__ import annotations

import asyncio
import threading

import pytest
from rich.syntax import Syntax
from textual.widgets import Static, TextArea

from kforge_tui import events as ev
from kforge_tui.errors import UsageError
from kforge_tui.tui.app import KforgeApp
from kforge_tui.tui.demo import T0, scripted_run
from kforge_tui.tui.details import DictDetails
from kforge_tui.tui.messages import SteerResult
from kforge_tui.tui.screens.dialogs import ChoiceScreen, ConfirmScreen, PromptScreen
from kforge_tui.tui.screens.editor import EditorScreen
from kforge_tui.tui.screens.help import HelpScreen
from kforge_tui.tui.widgets.logs import LogTabs
from kforge_tui.tui.widgets.source import SourceView
from kforge_tui.tui.widgets.tree import SearchTree

SIZE = (100, 30)
COMMANDS = ("pause", "resume", "add_budget", "stop_task", "submit_source", "repair", "request_stop")


class RecordingControl:
    def __init__(self, fail: str | None = None):
        self.calls: list[tuple] = []
        self.fail = fail

    def __getattr__(self, name):
        if name in COMMANDS:
            def call(*a):
                if self.fail:
                    raise RuntimeError(self.fail)
                self.calls.append((name, *a))
            return call
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


async def until(pilot, cond, what: str, timeout: float = 10.0):
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def sent(pilot, ctl, n: int):
    """Commands go out on the steering thread: wait until `n` reached the control."""
    await until(pilot, lambda: len(ctl.calls) >= n, f"{n} command(s)")
    await pilot.pause(0.05)


def source_text(app) -> str:
    body = app.screen_stack[0].query_one("#source-body", Static)
    r = body.content if hasattr(body, "content") else body.renderable
    return r.code if isinstance(r, Syntax) else str(r)


def header(app) -> str:
    return str(app.screen_stack[0].query_one("#status").content)


def first_task(app):
    return next(iter(app.model.tasks))


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


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
        status = header(app)
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
        await pilot.press("2", "home", "down", "down")
        await settle(pilot, app)
        nid = app.node_id
        assert nid == app.query_one(SearchTree).current_node_id and nid != 1
        assert source_text(app) == rows[nid]["source"]
        await pilot.press("d")
        assert app.diff and source_text(app).startswith("---")  # unified diff against the parent
        await pilot.press("d")
        assert source_text(app) == rows[nid]["source"]


async def test_finished_run_opens_on_its_best_node():
    """Issue 15: a finished run used to open with no node selected and an empty source pane."""
    app, events, rows = make_app(finish=True)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        best = app.model.tasks[first_task(app)].best_node
        assert best is not None and app.node_id == best
        assert app.query_one(SearchTree).current_node_id == best
        assert source_text(app) == rows[best]["source"]
        await pilot.press("right_square_bracket")  # another op opens on its own best node too
        await settle(pilot, app)
        assert app.node_id == app.model.tasks[app.task_id].best_node


async def test_enter_opens_a_node_and_keeps_its_children_shown():
    """The hint says 'arrows, enter': enter used to fold the node away instead."""
    app, events, rows = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tree = app.query_one(SearchTree)
        await pilot.press("2", "home", "down")  # node #2: it has children
        await settle(pilot, app)
        node = tree.cursor_node
        assert node.data == 2 and node.children and node.is_expanded
        await pilot.press("3")
        await pilot.press("2", "enter")
        await settle(pilot, app)
        assert app.node_id == 2 and tree.cursor_node.is_expanded
        await pilot.press("space")  # space is the fold key
        assert not tree.cursor_node.is_expanded


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


async def test_node_without_source_shows_its_own_error():
    """A proposal error (429 after retries, a prose answer) used to show the root's text under
    the previous node's title."""
    app, events, rows = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tid = first_task(app)
        rows[500] = {"id": 500, "task_id": tid, "parent_id": 1, "action": "llm:improve", "source": None,
                     "status": "proposal_error", "message": "HTTP 429 rate limited (after 4 attempts)",
                     "result": None, "prompt": "p", "response": "I would use shared memory here.",
                     "proposer": "openai/x"}
        app.sink(ev.NodeAdded(task_id=tid, node_id=500, parent_id=1, action="llm:improve", proposer="openai/x"))
        app.sink(ev.NodeFinished(task_id=tid, node_id=500, status="proposal_error", message=rows[500]["message"],
                                 time_us=None, speedup=None, reward=-2.0))
        await settle(pilot, app)
        await pilot.press("g")  # a node with source first: its title must not stay
        await settle(pilot, app)
        app.query_one(SearchTree).select_node_id(500)
        await settle(pilot, app)
        text = source_text(app)
        assert "proposal_error" in text and "HTTP 429" in text and "I would use shared memory" in text
        assert "root" not in text
        assert app.query_one(SourceView).border_subtitle == "#500 no source"
        app.query_one(SearchTree).select_node_id(1)
        await settle(pilot, app)
        assert "PyTorch reference" in source_text(app)


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


async def test_key_4_focuses_the_logs_and_l_switches_tabs():
    """Issue 15: `4` (and the palette's 'Focus logs') did nothing; log tabs had no keys."""
    app, events, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        logs = app.query_one(LogTabs)
        await pilot.press("4")
        assert app.focused is not None and logs in app.focused.ancestors_with_self
        first = logs.active
        await pilot.press("l")
        assert logs.active != first
        await pilot.press("L")
        assert logs.active == first
        await pilot.press("2")
        assert logs not in app.focused.ancestors_with_self
        await pilot.press("ctrl+p", *"Focus logs")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert logs in app.focused.ancestors_with_self
        await pilot.press("ctrl+p", *"Logs: Run log")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert logs.active == "log-run"


async def test_logs_pane_grows_with_the_terminal():
    """It stayed 6-8 lines even at 200x60."""
    for size, least in (((100, 30), 7), ((200, 60), 18)):
        app, events, _ = make_app()
        async with app.run_test(size=size) as pilot:
            app.feed(events)
            await settle(pilot, app)
            assert app.query_one(LogTabs).region.height >= least, size


async def test_zoom_gives_the_focused_pane_the_screen_at_80x24():
    app, events, rows = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.feed(events)
        await settle(pilot, app)
        src = app.query_one(SourceView)
        small = src.region.height
        await pilot.press("3", "z")
        await pilot.pause(0.1)
        assert src.region.height >= 22 and src.region.width == 80 and small < 12
        assert not app.query_one("#profile").display and not app.query_one(SearchTree).display
        await pilot.press("z")
        await pilot.pause(0.1)
        assert src.region.height == small and app.query_one("#profile").display
        await pilot.press("2", "z")  # whichever pane has the focus
        await pilot.pause(0.1)
        assert app.query_one(SearchTree).region.width == 80 and not app.query_one("#detail").display


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
        await pilot.press("2", "home", "down", "down")
        await settle(pilot, app)
        nid = app.node_id
        await pilot.press("e")
        assert isinstance(app.screen, EditorScreen)
        area = app.screen.query_one(TextArea)
        assert area.text == rows[nid]["source"]
        area.insert("// tuned by hand\n", (0, 0))
        await pilot.press("ctrl+s")
        await sent(pilot, ctl, 1)
        assert not isinstance(app.screen, EditorScreen)
        assert ctl.calls == [("submit_source", app.task_id, nid, "// tuned by hand\n" + rows[nid]["source"])]
        # escape cancels without a call
        await pilot.press("e", "escape")
        await pilot.pause(0.2)
        assert len(ctl.calls) == 1


async def test_editing_a_re_timing_edits_the_kernel_it_re_timed():
    """The best is often a `confirm:#N` re-timing of kernel N; the engine files an edit of it under
    N (the tree node), so the editor's title and the submitted command name N, not the re-timing."""
    ctl = RecordingControl()
    app, events, rows = make_app(control=ctl)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        kernel = next(i for i, r in rows.items() if r.get("status") == "ok" and r["action"] != "root")
        tid = rows[kernel]["task_id"]
        retime = max(rows) + 1
        rows[retime] = dict(rows[kernel], id=retime, parent_id=kernel, action=f"confirm:#{kernel}")
        app.feed([ev.NodeAdded(task_id=tid, node_id=retime, parent_id=kernel, action=f"confirm:#{kernel}",
                               proposer="kforge", ts=T0 + 50)])
        await settle(pilot, app)
        app.task_id = tid
        app.open_node(retime)
        await pilot.press("e")
        assert isinstance(app.screen, EditorScreen)
        assert f"editing #{kernel} " in app.screen.title_text
        app.screen.query_one(TextArea).insert("// by hand\n", (0, 0))
        await pilot.press("ctrl+s")
        await sent(pilot, ctl, 1)
        assert ctl.calls == [("submit_source", tid, kernel, "// by hand\n" + rows[kernel]["source"])]


async def test_edit_saves_the_kernel_under_the_run_dir_first(tmp_path):
    """Nothing typed is lost: the edit is on disk (owner-only) before it is sent anywhere."""
    ctl = RecordingControl(fail="the owner went away")
    app, events, rows = make_app(control=ctl)
    app.run_dir = str(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("g", "e")
        app.screen.query_one(TextArea).text = "// mine\n"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: any(m.startswith("could not submit") for m in notes(app)), "the failure")
        (saved,) = (tmp_path / "edits").iterdir()
        assert saved.read_text() == "// mine\n" and saved.suffix == ".cu"
        assert oct(saved.stat().st_mode & 0o777) == "0o600" and oct(saved.parent.stat().st_mode & 0o777) == "0o700"
        assert any(str(saved) in m for m in notes(app) if m.startswith("could not submit"))  # says where


async def test_editor_opens_at_the_error_line_and_goes_to_a_line():
    app, events, rows = make_app(control=RecordingControl())
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("f", "e")  # a failed node: its compiler error is at line 7
        assert isinstance(app.screen, EditorScreen)
        area = app.screen.query_one(TextArea)
        assert area.cursor_location == (6, 0)
        await pilot.press("ctrl+g")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press(*["backspace"] * 4, "3", "enter")
        assert isinstance(app.screen, EditorScreen) and area.cursor_location == (2, 0)


async def test_repair_only_failed_nodes():
    ctl = RecordingControl()
    app, events, _ = make_app(control=ctl)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("g", "r")
        await pilot.pause(0.2)
        assert ctl.calls == []  # the best node did not fail
        await pilot.press("f", "r")
        await sent(pilot, ctl, 1)
        assert ctl.calls == [("repair", app.task_id, app.node_id)]


async def test_pause_budget_stop():
    ctl = RecordingControl()
    app, events, _ = make_app(control=ctl)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tid = app.task_id
        await pilot.press("p", "p", "P")
        await sent(pilot, ctl, 3)
        assert ctl.calls == [("pause", None), ("resume", None), ("pause", tid)]  # in order
        app.sink(ev.TaskStatus(task_id=tid, status="paused"))
        await settle(pilot, app)
        await pilot.press("P")
        await sent(pilot, ctl, 4)
        assert ctl.calls[-1] == ("resume", tid)
        await pilot.press("b")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press("enter")
        await sent(pilot, ctl, 5)
        assert ctl.calls[-1] == ("add_budget", tid, 16)
        await pilot.press("b", *["backspace"] * 12, *"-3", "enter")
        await pilot.pause(0.2)
        assert ctl.calls[-1] == ("add_budget", tid, 16)  # rejected with a notification
        assert any("positive whole number" in m for m in notes(app))
        await pilot.press("s")
        await sent(pilot, ctl, 6)
        assert ctl.calls[-1] == ("stop_task", tid)


async def test_a_failed_command_says_could_not_and_never_the_success_text():
    """The toast used to start with the success text ("search paused ...") and then say "failed"."""
    ctl = RecordingControl(fail="run.db: opened read-only")
    app, events, _ = make_app(control=ctl)
    results: list[SteerResult] = []
    async with app.run_test(size=SIZE, message_hook=lambda m: isinstance(m, SteerResult) and results.append(m)) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("p")
        await until(pilot, lambda: results, "the command's outcome")
        assert not results[0].ok
        assert results[0].text == "could not pause the search: run.db: opened read-only"
        assert not any(m.startswith("search paused") for m in notes(app))


async def test_budget_change_reaches_the_table():
    """`b` changed the store but the table kept showing the old budget."""
    app, events, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tid = app.task_id
        table = app.query_one("#profile")
        assert str(table.get_cell(tid, "evals")).endswith("/64")
        app.sink(ev.TaskBudget(task_id=tid, budget=80))
        await settle(pilot, app)
        assert str(table.get_cell(tid, "evals")).endswith("/80")


async def test_exhausted_op_shows_why_and_budget_says_nothing_would_run():
    ctl = RecordingControl()
    app, events, _ = make_app(control=ctl)
    why = "exhausted after 9 candidates: the builtin proposer has nothing new to try from any node"
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tid = app.task_id
        app.sink(ev.TaskStatus(task_id=tid, status="done", detail=why))
        await settle(pilot, app)
        assert str(app.query_one("#profile").get_cell(tid, "status")) == "exhausted"
        assert app.query_one(SearchTree).border_subtitle == why
        await pilot.press("b")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, PromptScreen) and ctl.calls == []
        assert any(why in m and "would run nothing" in m for m in notes(app))


async def test_pause_and_stop_on_a_finished_op_change_nothing():
    """P, P, s on a finished op used to leave it 'searching' forever."""
    ctl = RecordingControl()
    app, events, _ = make_app(control=ctl)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        tid = app.task_id
        app.sink(ev.TaskStatus(task_id=tid, status="done", detail="budget of 64 spent"))
        await settle(pilot, app)
        await pilot.press("P", "P", "s")
        await pilot.pause(0.2)
        assert ctl.calls == []
        assert any("nothing to pause" in m for m in notes(app)) and any("already done" in m for m in notes(app))
        assert str(app.query_one("#profile").get_cell(tid, "status")) == "done"


async def test_paused_search_is_visible_in_header_and_rows():
    app, events, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        assert header(app).splitlines()[1].startswith("search")
        for tid in app.model.tasks:
            app.sink(ev.TaskStatus(task_id=tid, status="paused", detail="paused by the user"))
        await settle(pilot, app)
        assert header(app).splitlines()[1].startswith("paused")
        assert all(str(app.query_one("#profile").get_cell(t, "status")) == "paused" for t in app.model.tasks)
        assert app.paused_all  # so `p` now resumes


async def test_llm_counter_shows_running_totals():
    """12 calls of 150 tokens: the engine sends running totals; the header said 11,700 tokens."""
    app, events, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed([e for e in events if not isinstance(e, ev.LLMUsage)])
        for k in range(1, 13):
            app.sink(ev.LLMUsage(prompt_tokens=100 * k, completion_tokens=50 * k, cost_usd=0.001 * k, calls=k))
        await settle(pilot, app)
        assert "LLM 1,800 tok $0.0120" in header(app)


async def test_llm_failures_are_visible():
    """429 and 500 answers were invisible: now in the header and as a notification."""
    app, events, _ = make_app()
    async with app.run_test(size=(160, 30)) as pilot:
        app.feed(events)
        await settle(pilot, app)
        app.sink(ev.LLMUsage(prompt_tokens=300, completion_tokens=0, cost_usd=0.0, calls=3, failures=1,
                             last_error="HTTP 429 rate limited (after 4 attempts)"))
        await settle(pilot, app)
        assert "1 failed: HTTP 429 rate limited" in header(app)
        assert any(m.startswith("LLM call failed: HTTP 429") for m in notes(app))


async def test_actions_without_engine_say_so():
    app, events, _ = make_app(control=None)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("p")
        assert any("No engine attached" in m for m in notes(app))


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
        assert any(m.startswith("export failed") for m in notes(app))


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


async def test_keymap_from_the_config_rebinds_by_binding_id():
    ctl = RecordingControl()
    events, rows = scripted_run(12)
    app = KforgeApp(control=ctl, details=DictDetails(rows), keymap={"pause-all": "space", "zoom": "Z"})
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("1", "p")
        await pilot.pause(0.2)
        assert ctl.calls == []  # p no longer pauses
        await pilot.press("space")
        await sent(pilot, ctl, 1)
        assert ctl.calls == [("pause", None)]
        await pilot.press("question_mark")  # help lists the key in effect, with the id to rebind
        assert isinstance(app.screen, HelpScreen) and app.screen.keys["pause-all"] == "space"
    with pytest.raises(UsageError, match="unknown binding id.*pause-everything"):
        KforgeApp(keymap={"pause-everything": "space"})


def test_unknown_theme_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown theme 'nope'"):
        KforgeApp(control=None, run_dir=None, theme="nope")
    assert KforgeApp(control=None, run_dir=None, theme="light").theme == "kforge-light"


class ScriptedEngine:
    """An engine double for the app's engine thread: plays events, records commands, and ends
    the way the real one does (cancelled, or after request_stop)."""

    def __init__(self, sink, events, *, fail: Exception | None = None):
        self.sink, self.events, self.fail = sink, events, fail
        self.calls: list[tuple] = []
        self.thread: threading.Thread | None = None
        self.cancelled = False
        self._stop: asyncio.Event | None = None

    async def run(self):
        self.thread = threading.current_thread()
        self._stop = asyncio.Event()
        for e in self.events:
            self.sink(e)
        if self.fail:
            raise self.fail
        try:
            await self._stop.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return {"tasks": []}

    def request_stop(self, end_to_end=None):
        self.calls.append(("request_stop", end_to_end))
        self._stop.set()

    def pause(self, task_id=None):
        self.calls.append(("pause", task_id))


def engine_app(events, rows, **kw):
    box: dict = {}

    def make_engine(settings, sink):
        box["engine"] = ScriptedEngine(sink, events, **kw)
        return box["engine"]

    return KforgeApp(details=DictDetails(rows), settings="scripted", make_engine=make_engine), box


async def test_live_engine_runs_on_its_own_thread_and_quit_mid_search_stops_it():
    events, rows = scripted_run(8)
    app, box = engine_app(events, rows)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app)
        await until(pilot, lambda: len(app.query_one(SearchTree)._tn) == 8, "the tree")
        engine = box["engine"]
        assert engine.thread is not threading.current_thread()  # its writes never block the UI loop
        await pilot.press("p")
        await until(pilot, lambda: engine.calls, "the pause on the engine's thread")
        assert engine.calls == [("pause", None)]
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen) and "A search is running" in app.screen.question
        await pilot.press("n")
        assert app.is_running and not engine.cancelled
        await pilot.press("q", "y")
        await until(pilot, lambda: not app.is_running, "the app to exit", 15)
    assert engine.cancelled and app.host.join(5)
    assert app.return_code == 0


async def test_quit_after_the_search_offers_the_end_to_end_check():
    """The end of the search is signalled: phase done, cand/min frozen, and quitting offers the
    end-to-end check (as headless runs it) instead of saying a search is running."""
    events, rows = scripted_run(8, finish=True)
    events = [e for e in events if not isinstance(e, ev.RunFinished)] + [ev.Phase(name="done", ts=T0 + 20)]
    app, box = engine_app(events, rows)
    app.clock = lambda: T0 + 100
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.model.phase == "done", "phase done")
        await settle(pilot, app)
        assert header(app).splitlines()[1].startswith("done")
        rate = app.model.per_minute(T0 + 100)
        assert rate > 0 and app.model.per_minute(T0 + 10_000) == rate  # frozen at the end of the search
        assert "0:00:20" in header(app)
        await pilot.press("q")
        assert isinstance(app.screen, ChoiceScreen) and "end to end" in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: not app.is_running, "the app to exit after the check", 15)
    assert box["engine"].calls == [("request_stop", True)] and not box["engine"].cancelled


async def test_quit_without_confirm_when_finished():
    app, events, _ = make_app(finish=True)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_engine_error_is_shown_not_a_crash():
    start = ev.RunStarted(run_dir="", model="m.py", device="cpu", device_name="cpu", proposer="built-in")
    app, _ = engine_app([start], {}, fail=RuntimeError("nvcc exploded\nsecond line"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any(m == "engine stopped: nvcc exploded" for m in notes(app)), "the error")
        await settle(pilot, app)
        assert app.is_running
        await pilot.press("q")  # the run is over: no confirmation
        await pilot.pause()
    assert app.return_code == 0 and isinstance(app.engine_error, RuntimeError)


async def test_the_run_log_follows_its_tail_unless_scrolled_up():
    """Issue 22: once lines arrived the log did not follow them; a user reading back keeps
    the place they scrolled to, and is followed again once back at the end."""
    from textual.containers import VerticalScroll
    from textual.widgets import TabPane

    app, events, _ = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        await settle(pilot, app)
        logs = app.query_one(LogTabs)
        logs.active = "log-run"
        scroll = logs.query_one("#log-run", TabPane).query_one(VerticalScroll)

        async def lines(k: int, start: int):
            app.feed([ev.LogLine(level="info", message=f"line {start + i}") for i in range(k)])
            await settle(pilot, app)
            await pilot.pause(0.1)

        await lines(80, 0)
        assert scroll.max_scroll_y > 0 and scroll.scroll_y == scroll.max_scroll_y
        scroll.scroll_to(y=0, animate=False)
        await pilot.pause(0.1)
        await lines(20, 80)
        assert scroll.scroll_y == 0 < scroll.max_scroll_y  # reading back: left where it was
        scroll.scroll_end(animate=False)
        await pilot.pause(0.1)
        await lines(20, 100)
        assert scroll.scroll_y == scroll.max_scroll_y > 0  # at the end again: followed
