"""Snapshot of the main screen in a known state (pytest-textual-snapshot; baseline under __snapshots__).

The screen is taken once the app has drawn what the keys asked for (conditions, not fixed
sleeps: on a loaded 2-core machine 0.3 s was not always enough for the first draw, and the
snapshot caught a half-drawn screen). The SVGs are drawn by the Textual release the test extra
pins: another release draws other pixels, so it is named when the test cannot hold.
"""
from __future__ import annotations

import asyncio
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from kforge_tui.tui.app import KforgeApp
from kforge_tui.tui.demo import T0, scripted_run
from kforge_tui.tui.details import DictDetails

PINNED = next(d.split("==")[1] for d in tomllib.loads(
    (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    if d.startswith("textual=="))
pytestmark = pytest.mark.skipif(version("textual") != PINNED,
                                reason=f"the snapshots are drawn with textual {PINNED} (pip install -e '.[test]'); "
                                       f"this is {version('textual')}")


def _app():
    events, rows = scripted_run(14, finish=True)
    app = KforgeApp(control=None, run_dir=None, details=DictDetails(rows), clock=lambda: T0 + 60)
    app.feed(events)
    return app


async def _until(pilot, cond, what: str, timeout: float = 20.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"never saw {what}")
        await pilot.pause(0.05)
    await pilot.pause()  # one more refresh after the condition


async def _open_best(pilot):
    app = pilot.app
    await _until(pilot, lambda: app.flushes > 0 and app.node_id is not None, "the first draw")
    await pilot.press("g")
    t = app.model.tasks[app.task_id]
    await _until(pilot, lambda: app.node_id == t.best_node and not app._open_pending, "the best node open")
    app.clear_notifications()


def test_main_screen_dark(snap_compare):
    assert snap_compare(_app(), terminal_size=(100, 30), run_before=_open_best)


def test_main_screen_light(snap_compare):
    async def light(pilot):
        await _open_best(pilot)
        await pilot.press("t")
        await _until(pilot, lambda: pilot.app.theme == "kforge-light" and not pilot.app._open_pending, "the light theme")

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=light)
