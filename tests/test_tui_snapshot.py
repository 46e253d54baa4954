"""Snapshot of the main screen in a known state (pytest-textual-snapshot; baseline under __snapshots__)."""
from __future__ import annotations

from kforge_tui.tui.app import KforgeApp
from kforge_tui.tui.demo import T0, scripted_run
from kforge_tui.tui.details import DictDetails


def _app():
    events, rows = scripted_run(14, finish=True)
    app = KforgeApp(control=None, run_dir=None, details=DictDetails(rows), clock=lambda: T0 + 60)
    app.feed(events)
    return app


async def _open_best(pilot):
    await pilot.pause(0.3)
    await pilot.press("g")
    await pilot.pause(0.2)


def test_main_screen_dark(snap_compare):
    assert snap_compare(_app(), terminal_size=(100, 30), run_before=_open_best)


def test_main_screen_light(snap_compare):
    async def light(pilot):
        await _open_best(pilot)
        await pilot.press("t")
        await pilot.pause(0.2)

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=light)
