"""Follow mode against a real run store written by another process, plus StoreControl and highlighting."""
from __future__ import annotations

import subprocess
import sys

from kforge_tui.follow import StoreControl, StoreFollower
from kforge_tui.store import RunStore
from kforge_tui.tui.app import KforgeApp
from kforge_tui.tui.demo import write_store
from kforge_tui.tui.highlight import render_source
from kforge_tui.tui.widgets.tree import SearchTree


def test_follower_replays_a_finished_run(tmp_path):
    write_store(tmp_path, 6)
    f = StoreFollower(tmp_path)
    names = [type(e).__name__ for e in f.poll()]
    assert names[0] == "RunStarted" and names[-1] == "RunFinished"
    assert names.count("TaskAdded") == 3 and names.count("NodeAdded") == 18 and names.count("BestImproved") == 3
    assert names.count("NodeFinished") == 15  # every non-root node, failed ones included
    assert f.poll() == []  # nothing changed: nothing emitted
    f.close()


def test_store_control_posts_commands_the_engine_takes(tmp_path):
    write_store(tmp_path, 3)
    with RunStore.open(tmp_path) as store:
        c = StoreControl(store)
        c.pause()
        c.add_budget("t1", 8)
        c.submit_source("t1", 4, "int x;")
        taken = [(x["name"], x["args"]) for x in store.take_commands()]
    assert taken == [("pause", {"task_id": None}), ("add_budget", {"task_id": "t1", "extra": 8}),
                     ("submit_source", {"task_id": "t1", "parent_id": 4, "source": "int x;"})]


WRITER = "import sys; from kforge_tui.tui.demo import write_store; write_store(sys.argv[1], 10, delay=0.2)"


async def test_app_follows_a_store_another_process_writes(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)])
    try:
        import asyncio

        for _ in range(200):
            if (tmp_path / "run.db").exists():
                break
            await asyncio.sleep(0.05)
        app = KforgeApp(control=None, run_dir=str(tmp_path), follow=True)
        async with app.run_test(size=(100, 30)) as pilot:
            seen = set()
            for _ in range(400):
                await pilot.pause(0.05)
                seen.add(len(app.model.nodes))
                if app.model.finished:
                    break
            assert app.model.finished, "the follower never saw the run finish"
            assert len(seen) > 2  # it grew while we watched, not one final read
            await pilot.pause(0.2)
            tree = app.query_one(SearchTree)
            assert len(tree._tn) == 10 and app.query_one("#profile").row_count == 3
            assert isinstance(app.control, StoreControl)
            await pilot.press("g")  # details come from the real store
            assert app.details.get(app.node_id)["source"].startswith("#include")
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0


def test_cuda_source_is_coloured():
    from rich.console import Console

    console = Console(width=100, color_system="256", force_terminal=True)
    segs = list(console.render(render_source("__global__ void k(float* x) { return; }", lexer="cuda")))
    styled = {s.text.strip(): s.style for s in segs if s.text.strip()}
    assert styled["__global__"].color is not None and styled["void"].color is not None
    assert styled["__global__"].color != styled["k"].color  # keywords differ from identifiers
