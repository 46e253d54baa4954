"""Follow mode against real run stores written by other processes, StoreControl, and highlighting."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from kforge_tui import events as ev
from kforge_tui.follow import StoreControl, StoreFollower
from kforge_tui.store import RunStore, owner_pid
from kforge_tui.tui.app import KforgeApp
from kforge_tui.tui.demo import write_store
from kforge_tui.tui.highlight import render_source
from kforge_tui.tui.messages import SteerResult
from kforge_tui.tui.widgets.tree import SearchTree

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def test_follower_replays_a_finished_run(tmp_path):
    write_store(tmp_path, 6)
    f = StoreFollower(tmp_path)
    names = [type(e).__name__ for e in f.poll()]
    assert names[0] == "RunStarted" and names[-1] == "RunFinished"
    assert names.count("TaskAdded") == 3 and names.count("NodeAdded") == 18 and names.count("BestImproved") == 3
    assert names.count("NodeFinished") == 15  # every non-root node, failed ones included
    assert f.poll() == []  # nothing changed: nothing emitted
    f.close()


def test_follower_shows_the_stored_phase_log_and_reasons(tmp_path):
    """An attached TUI said 'starting' all along, with an empty run log: the engine now stores its
    phases, log lines and the reasons of task statuses, and the follower replays them."""
    write_store(tmp_path, 4, finish=False)
    tid = "softmax_4096x256_float32"
    with RunStore.open(tmp_path) as s:
        for e in (ev.Phase(name="search", detail="3 ops"), ev.LogLine(level="warning", message="gelu: slow compile"),
                  ev.TaskStatus(task_id=tid, status="done", detail="exhausted after 3 candidates: nothing left")):
            s.append_event(e.to_json())
        s.set_task_status(tid, "done")
    with RunStore.open(tmp_path, owner=True):  # a live owner holds the lock
        f = StoreFollower(tmp_path)
        out = f.poll()
        phases = [e for e in out if isinstance(e, ev.Phase)]
        assert [p.name for p in phases] == ["search"]
        assert any(isinstance(e, ev.LogLine) and e.message == "gelu: slow compile" for e in out)
        statuses = [e for e in out if isinstance(e, ev.TaskStatus) and e.task_id == tid]
        assert statuses[-1].detail.startswith("exhausted")  # the stored reason lands after the bare row status
        assert f.poll() == []
    # the owner is gone while the store still says "running": the next poll says so, once
    (gone,) = f.poll()
    assert isinstance(gone, ev.Phase) and gone.name == "interrupted" and f"kforge resume {tmp_path}" in gone.detail
    assert f.poll() == []
    f.close()
    # a view opened after the owner died says it with its first screen, after the replayed phases
    f = StoreFollower(tmp_path)
    assert [e.name for e in f.poll() if isinstance(e, ev.Phase)] == ["search", "interrupted"]
    f.close()


def test_follower_llm_usage_is_running_totals(tmp_path):
    write_store(tmp_path, 3)
    f = StoreFollower(tmp_path)
    first = [e for e in f.poll() if isinstance(e, ev.LLMUsage)]
    assert [(e.prompt_tokens, e.completion_tokens, e.calls) for e in first] == [(1200, 800, 1)]
    with RunStore.open(tmp_path) as s:
        s.add_llm_usage(model="m", prompt_tokens=100, completion_tokens=50, cost_usd=0.5, ok=False,
                        error="HTTP 500 upstream exploded")
    (usage,) = [e for e in f.poll() if isinstance(e, ev.LLMUsage)]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.calls, usage.failures) == (1300, 850, 2, 1)
    assert usage.last_error == "HTTP 500 upstream exploded"
    f.close()


def test_follower_reports_a_budget_change(tmp_path):
    write_store(tmp_path, 3)
    f = StoreFollower(tmp_path)
    f.poll()
    with RunStore.open(tmp_path) as s:
        s.set_budget("gelu_8x1024x3072_float16", 80)
    out = f.poll()
    assert [(e.task_id, e.budget) for e in out if isinstance(e, ev.TaskBudget)] == [("gelu_8x1024x3072_float16", 80)]
    assert not any(isinstance(e, ev.TaskAdded) for e in out)
    f.close()


def test_store_control_posts_commands_the_engine_takes(tmp_path):
    write_store(tmp_path, 3)
    c = StoreControl(tmp_path)
    c.pause()
    c.add_budget("t1", 8)
    c.submit_source("t1", 4, "int x;")
    c.close()
    with RunStore.open(tmp_path) as store:
        taken = [(x["name"], x["args"]) for x in store.take_commands()]
    assert taken == [("pause", {"task_id": None}), ("add_budget", {"task_id": "t1", "extra": 8}),
                     ("submit_source", {"task_id": "t1", "parent_id": 4, "source": "int x;"})]


WRITER = "import sys; from kforge_tui.tui.demo import write_store; write_store(sys.argv[1], 10, delay=0.2)"


async def test_app_follows_a_store_another_process_writes(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], env=ENV)
    try:
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
            await pilot.press("g")  # details come from the real store
            assert app.details.get(app.node_id)["source"].startswith("#include")
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0


OWNER = """
import sys, time
from kforge_tui.store import RunStore
from kforge_tui.tui.demo import write_store
write_store(sys.argv[1], 4, finish=False)
with RunStore.open(sys.argv[1], owner=True):  # the owning process: holds the lock, takes no command
    print("owning", flush=True)
    time.sleep(60)
"""


async def test_attached_tui_steers_through_a_read_write_connection(tmp_path):
    """Attached to a run another process owns, `p` and `b` used to fail with "run.db: opened
    read-only" and the owner never heard of them."""
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "owning"
        assert owner_pid(tmp_path) == proc.pid
        results: list[SteerResult] = []
        app = KforgeApp(run_dir=str(tmp_path), follow=True)
        hook = lambda m: isinstance(m, SteerResult) and results.append(m)  # noqa: E731
        async with app.run_test(size=(100, 30), message_hook=hook) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.task_id:
                    break
            await pilot.press("p", "b", "enter")
            for _ in range(100):
                await pilot.pause(0.05)
                if len(results) == 2:
                    break
            assert [r.ok for r in results] == [True, True], [r.text for r in results]
            assert results[0].text.startswith("search paused") and not results[0].become_owner
        with RunStore.open(tmp_path, readonly=True) as s:
            waiting = [(c["name"], c["args"]) for c in s.untaken_commands()]
        assert waiting == [("pause", {"task_id": None}), ("add_budget", {"task_id": app.task_id, "extra": 16})]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert owner_pid(tmp_path) is None  # the kernel dropped the lock with the process


def test_cuda_source_is_coloured():
    from rich.console import Console

    console = Console(width=100, color_system="256", force_terminal=True)
    segs = list(console.render(render_source("__global__ void k(float* x) { return; }", lexer="cuda")))
    styled = {s.text.strip(): s.style for s in segs if s.text.strip()}
    assert styled["__global__"].color is not None and styled["void"].color is not None
    assert styled["__global__"].color != styled["k"].color  # keywords differ from identifiers


def test_untaken_commands_wait_for_the_next_owner(tmp_path):
    """A command posted as the owner exits is not lost: the next owner (resume) takes it."""
    write_store(tmp_path, 3)
    StoreControl(tmp_path).submit_source("t1", 2, "int y;")
    with RunStore.open(tmp_path, owner=True) as s:
        assert [c["name"] for c in s.untaken_commands()] == ["submit_source"]
        assert [c["args"]["source"] for c in s.take_commands()] == ["int y;"]
        assert s.untaken_commands() == []
    assert owner_pid(tmp_path) is None
