"""The header, rows and run log say what the run really does (issue 22), on scripted events and
real stores: the rate counts only the running process's work, a resumed run's restored nodes do
not inflate it, a Ctrl-C'd run is not "finished", a killed one is "interrupted", phases are in the
run log from the first line with how long each took, and a stop shows at once."""
from __future__ import annotations

import io

from kforge_tui import events as ev
from kforge_tui.follow import StoreFollower
from kforge_tui.store import RunStore
from kforge_tui.tui.app import KforgeApp, closing_report
from kforge_tui.tui.demo import T0, scripted_run, write_store
from kforge_tui.tui.details import DictDetails
from kforge_tui.tui.model import Dirty, RunModel
from kforge_tui.tui.widgets.status import run_state

SIZE = (100, 30)


def fold(events) -> RunModel:
    m, d = RunModel(), Dirty()
    for e in events:
        m.apply(e, d)
    m.settle(d)
    return m


def test_cand_per_min_counts_this_process_only():
    """It said 2.2/min for 138 candidates in 12:06, and counted restored nodes after a resume."""
    events, _ = scripted_run(14, finish=False)
    restart = T0 + 1000  # a resume: the process starts long after the nodes it restores
    resumed = [ev.RunStarted(run_dir="", model="m", device="cpu", device_name="cpu", proposer="p", ts=restart)]
    resumed += [e for e in events if not isinstance(e, ev.RunStarted)]  # replayed at their own times
    m = fold(resumed)
    assert m.evaluated_here == 0 and m.per_minute(restart + 60) == 0.0
    m2 = fold(events)
    done = m2.evaluated_here
    assert done == sum(t.evaluated for t in m2.tasks.values()) > 0
    assert m2.per_minute(T0 + 600) == done / 10.0  # over the process's elapsed time: 10 minutes


def test_phases_are_run_log_lines_with_how_long_the_last_one_took():
    m = fold([ev.RunStarted(run_dir="", model="m", device="cpu", device_name="cpu", proposer="p", ts=T0),
              ev.Phase(name="load", detail="m.py", ts=T0), ev.Phase(name="capture", ts=T0 + 3.2),
              ev.Phase(name="profile", ts=T0 + 15.0)])
    lines = [e.message for e in m.logs]
    assert lines == ["[load] m.py", "[capture] (load took 3.2 s)", "[profile] (capture took 11.8 s)"]
    assert m.phase == "profile" and m.phase_elapsed(T0 + 20.0) == 5.0


def test_a_stopped_run_is_not_finished_and_its_searching_rows_say_interrupted(tmp_path):
    """After Ctrl-C of a resumed owner the header said `finished` while every row said `searching`."""
    write_store(tmp_path, 4, finish=False)
    with RunStore.open(tmp_path) as s:
        s.set_run_status("stopped")
    f = StoreFollower(tmp_path)
    m = fold(f.poll())
    f.close()
    assert run_state(m) == "stopped"
    assert {t.state for t in m.tasks.values()} == {"interrupted"}
    assert all("kforge resume" in t.reason for t in m.tasks.values())


def test_a_killed_owner_reads_interrupted_and_nothing_in_flight(tmp_path):
    write_store(tmp_path, 4, finish=False)  # "running", and nobody holds the owner lock
    f = StoreFollower(tmp_path)
    m = fold(f.poll())
    f.close()
    assert run_state(m) == "interrupted" and not m.in_flight
    assert any(n.status == "lost" for n in m.nodes.values())  # what was in flight when it died
    assert m.logs[-1].message.startswith("[interrupted]") and f"kforge resume {tmp_path}" in m.logs[-1].message


class RecordingControl:
    """EngineControl that records calls (a fixed control: no owner, no store)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a: self.calls.append((name, *a))


async def test_stop_shows_stopping_before_the_owner_answers():
    ctl = RecordingControl()
    events, rows = scripted_run(8)
    app = KforgeApp(control=ctl, run_dir=None, details=DictDetails(rows), clock=lambda: T0 + 60)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        while app.task_id is None:
            await pilot.pause(0.05)
        tid = app.task_id
        await pilot.press("s")
        await pilot.pause(0.2)
        assert ctl.calls == [("stop_task", tid)]
        assert str(app.query_one("#profile").get_cell(tid, "status")) == "stopping"
        # the engine's own "searching" (sent before it took the stop) does not undo it
        app.sink(ev.TaskStatus(task_id=tid, status="searching"))
        await pilot.pause(0.2)
        assert str(app.query_one("#profile").get_cell(tid, "status")) == "stopping"
        app.sink(ev.TaskStatus(task_id=tid, status="stopped", detail="stopped by the user"))
        await pilot.pause(0.2)
        assert str(app.query_one("#profile").get_cell(tid, "status")) == "stopped"
        # `p` reads Pause all, then Resume all
        keys = lambda: {b.binding.description for b in app.active_bindings.values()}  # noqa: E731
        assert "Pause all" in keys() and "Resume all" not in keys()
        await pilot.press("p")
        await pilot.pause(0.2)
        assert "Resume all" in keys() and "Pause all" not in keys()


def test_closing_a_view_of_a_live_run_says_it_goes_on(tmp_path, capsys):
    write_store(tmp_path, 4, finish=False)
    app = KforgeApp(run_dir=str(tmp_path), follow=True)
    with RunStore.open(tmp_path, owner=True):  # a live owner
        assert closing_report(app, str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "the run goes on in process" in out and f"`kforge tui {tmp_path}` reattaches" in out
    assert "no verified kernel" not in out and "op " not in out  # no empty table, no failure
    assert closing_report(app, str(tmp_path)) == 0  # the owner is gone: the table, and how to resume
    out = capsys.readouterr().out
    assert f"kforge resume {tmp_path}" in out and "[interrupted]" in out


async def test_help_palette_and_mismatch_views_read_right():
    """Help showed `id (config )` and wrapped actions; the palette mixed in Textual's Quit,
    Maximize and Theme and repeated names as descriptions; the mismatch table ran numbers together."""
    from rich.console import Console

    from kforge_tui.tui.palette import KforgeCommands
    from kforge_tui.tui.screens.help import HelpScreen
    from kforge_tui.tui.widgets.logs import mismatch_text

    console = Console(width=90, record=True, file=io.StringIO())  # the dialog's width at 100 columns
    console.print(HelpScreen(KforgeApp.ACTION_BINDINGS).table())
    text = console.export_text()
    assert "id (config [keymap])" in text
    for b in KforgeApp.ACTION_BINDINGS:  # one line per key: its id is on the line of its words
        assert any(b.id in ln and ln.split("│")[1].strip() for ln in text.splitlines()), b.id

    events, rows = scripted_run(8, finish=True)
    app = KforgeApp(control=None, run_dir=None, details=DictDetails(rows), clock=lambda: T0 + 60)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(events)
        while app.task_id is None:
            await pilot.pause(0.05)
        entries = list(KforgeCommands(app.screen)._commands())
    assert app.COMMANDS == {KforgeCommands}  # no system commands
    titles = [t for t, _, _ in entries]
    assert not {"Quit", "Maximize", "Minimize", "Theme", "Keys", "Screenshot"} & set(titles)  # Textual's own
    assert "Quit (q)" in titles  # kforge's, which asks first during a search
    assert "Pause all (p)" in titles and "Resume all (p)" not in titles  # what p does now
    for title, _, help_text in entries:
        assert help_text and help_text.lower() != title.split(" (")[0].lower(), title

    mm = {"reason": "values differ", "input_set": "random[1]", "max_abs_err": 0.001, "max_rel_err": 0.01,
          "mismatched": 1, "total": 10, "first": [{"index": [3], "expected": 0.12293329834938050,
                                                  "got": 0.12393330037593842}]}
    row = mismatch_text({"result": {"mismatch": mm}}).splitlines()[-1]
    assert row.split() == ["[3]", "0.122933298", "0.1239333"]


async def test_user_work_goes_to_the_front_of_the_queue():
    """A hand edit waited ~70 s behind every other op's candidates: the slot gate serves what the
    user asked for first (in the order asked), then the search's own candidates."""
    import asyncio

    from kforge_tui.engine import _Slots

    slots, order = _Slots(1), []
    await slots.acquire()  # a candidate in flight holds the only slot

    async def take(name: str, front: bool) -> None:
        await slots.acquire(front=front)
        order.append(name)
        slots.release()

    waiters = [asyncio.create_task(take(n, f)) for n, f in
               (("search-1", False), ("search-2", False), ("hand", True), ("repair", True))]
    await asyncio.sleep(0)
    slots.release()
    await asyncio.gather(*waiters)
    assert order == ["hand", "repair", "search-1", "search-2"]


def test_at_80_to_200_columns_statuses_are_whole_words_and_tree_titles_keep_the_shape():
    """Issue 22 at 120 columns: `searchi`, `exhaust`, and tree titles that cut the shape so that
    same-named ops could not be told apart."""
    import dataclasses

    from kforge_tui.tui.app import tree_title
    from kforge_tui.tui.widgets.profile import STATES, fit_columns

    m = fold(scripted_run(12)[0])
    tasks = list(m.tasks.values())
    for width in (80, 100, 120, 160, 200):
        keys, widths = fit_columns(tasks, width - 2)
        assert "status" in keys and widths["status"] >= max(map(len, STATES)), width
        assert sum(w + 2 for w in widths.values()) <= width - 2 or widths["op"] == 10, width
    t = dataclasses.replace(tasks[0], op="batch_norm+add+relu+max_pool2d", shape=(2, 256, 14, 14))
    for width in range(24, 90, 3):
        title = tree_title(t, width)
        assert title.endswith(" 2x256x14x14") and len(title) <= width - 4, (width, title)
    assert tree_title(t, 90) == "search tree [2] batch_norm+add+relu+max_pool2d 2x256x14x14"
