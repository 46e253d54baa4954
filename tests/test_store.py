"""The run store (kforge_tui/store.py, docs/store_api.md) on real SQLite files, with real
reader and writer processes and a real SIGKILL."""
from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge_tui.errors import UsageError
from kforge_tui.store import SCHEMA_NAME, RunStore, list_runs, owner_pid, register_run, registered_runs
from kforge_tui.regions.meta import TensorMeta
from kforge_tui.regions.task import Task

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


GRAPH = {"inputs": ["in0"], "nodes": [{"name": "relu", "target": "aten.relu.default",
                                        "args": [{"ref": "in0"}], "kwargs": {}}],
         "outputs": [{"ref": "relu"}]}


def _task(n=8, op="softmax") -> Task:
    x = TensorMeta("in0", (4, n), "float32", (n, 1))
    return Task(op, "pointwise", GRAPH, (x,), (TensorMeta("out0", (4, n), "float32", (n, 1)),),
                calls=2)


def _new(tmp_path, name="run") -> RunStore:
    return RunStore.create(tmp_path / name, model="m.py:build", settings={"budget": 5},
                           device={"backend": "cpu", "name": "Xeon"}, proposer="builtin")


def _result(speedup_us=(10.0, 5.0)) -> dict:
    eager, mine = speedup_us
    t = lambda us: {"median_us": us, "p10_us": us, "p90_us": us, "min_us": us, "n": 50,  # noqa
                    "method": "wall"}
    return {"status": "ok", "stage": "time", "message": "ok", "timing": t(mine),
            "baseline": t(eager), "speedup": eager / mine}


# ----------------------------------------------------------------------- round trip

def test_create_and_read_everything(tmp_path):
    s = _new(tmp_path)
    assert (s.run_dir / "captures").is_dir() and (s.run_dir / "cache").is_dir()
    assert s.path == s.run_dir / "run.db"
    info = s.run_info()
    assert (info["model"], info["settings"], info["device"]["name"], info["proposer"],
            info["status"]) == ("m.py:build", {"budget": 5}, "Xeon", "builtin", "running")
    t = _task()
    s.add_task(t, 5)
    s.add_task(t, 99)  # idempotent (resume): budget unchanged, no second root
    [row] = s.tasks()
    assert (row["task_id"], row["op"], row["shape"], row["dtype"], row["budget"], row["status"]) \
        == (t.task_id, "softmax", [4, 8], "float32", 5, "waiting")
    assert Task.from_json(row["task"]) == t
    assert (row["evaluated"], row["best_node"], row["verified"], row["speedup"]) == (0, None, False, None)
    root = s.root_node(t.task_id)
    assert s.add_node(t.task_id, None, action="root", proposer="x") == root
    r = s.node(root)
    assert (r["action"], r["source"], r["status"], r["speedup"], r["parent_id"]) == \
        ("root", None, "ok", 1.0, None)

    s.set_baseline(t.task_id, {"eager": {"median_us": 10.0}, "compiled": None, "floor_us": 1.5})
    s.set_task_status(t.task_id, "searching")
    s.set_budget(t.task_id, 7)
    a = s.add_node(t.task_id, root, action="family:x", proposer="builtin", source="int a;",
                   params={"vec": 4}, prompt="P", response="R")
    assert s.node(a)["status"] == "pending" and [p["id"] for p in s.pending_nodes()] == [a]
    s.finish_node(a, status="ok", message="2.00x", result=_result(), reward=0.69,
                  time_us=5.0, speedup=2.0)
    b = s.add_node(t.task_id, a, action="set:vec=8", proposer="builtin", source="int b;")
    s.finish_node(b, status="compile_error", message="L1 error", result=None, reward=-2.0)
    c = s.add_node(t.task_id, None, action="hand", proposer="hand", source="int c;",
                   hand_written=True)
    assert s.node(c)["parent_id"] == root and s.node(c)["hand_written"] is True
    row = s.task(t.task_id)
    assert (row["evaluated"], row["failed"], row["pending"], row["best_node"], row["best_us"],
            row["speedup"], row["verified"], row["budget"], row["status"]) == \
        (2, 1, 1, a, 5.0, 2.0, True, 7, "searching")
    assert (row["baseline_us"], row["floor_us"]) == (10.0, 1.5)
    n = s.node(a)
    assert n["params"] == {"vec": 4} and n["result"]["timing"]["median_us"] == 5.0
    assert (n["prompt"], n["response"], n["finished"] is not None) == ("P", "R", True)
    with pytest.raises(KeyError):
        s.add_node("nope", None, action="x", proposer="x")
    with pytest.raises(KeyError):
        s.add_node(t.task_id, 12345, action="x", proposer="x")

    s.save_profile([{"op": "softmax", "share": 0.5}])
    s.set_end_to_end({"speedup": 1.1})
    s.set_run_status("finished")
    with pytest.raises(ValueError):
        s.set_run_status("bogus")
    s.close()

    s = RunStore.open(tmp_path / "run")  # everything survived a close
    assert s.profile() == [{"op": "softmax", "share": 0.5}]
    assert s.run_info()["end_to_end"] == {"speedup": 1.1}
    assert s.run_info()["status"] == "finished"
    assert len(s.nodes(t.task_id)) == 4
    s.close()


def test_the_winner_counts_side_by_side_re_timings_and_not_lucky_draws(tmp_path):
    s = _new(tmp_path)
    t = _task()
    s.add_task(t, budget=5)
    s.set_baseline(t.task_id, {"eager": {"median_us": 10.0, "p10_us": 10.0, "p90_us": 10.0}})

    def node(speedup, parent=None, action="x", status="ok"):
        i = s.add_node(t.task_id, parent, action=action, proposer="builtin", source="src")
        s.finish_node(i, status=status, message="", result=None, reward=0.0,
                      time_us=10.0 / speedup if speedup else None, speedup=speedup)
        return i

    a, b = node(2.0), node(1.5)
    assert s.task(t.task_id)["best_node"] == a  # before any re-timing: the best figure seen
    ca = node(1.2, a, f"confirm:#{a}")  # a was a lucky draw
    cb = node(1.4, b, f"confirm:#{b}")
    row = s.task(t.task_id)
    assert row["best_node"] == cb and row["speedup"] == pytest.approx(1.4)
    assert row["evaluated"] == 2  # re-timings are not candidates
    c = node(1.45)  # a later candidate, not re-timed: counts with its own figure
    assert s.task(t.task_id)["best_node"] == c
    node(None, c, f"confirm:#{c}", status="verify_error")  # its re-check failed: it is out
    assert s.task(t.task_id)["best_node"] == cb and s.task(t.task_id)["failed"] == 0
    assert ca != cb


def test_create_refuses_existing_run(tmp_path):
    _new(tmp_path).close()
    with pytest.raises(UsageError, match="already holds a run"):
        _new(tmp_path)


def test_seq_and_incremental_reads(tmp_path):
    s = _new(tmp_path)
    t = _task()
    s.add_task(t, 5)
    s0 = s.max_seq()
    a = s.add_node(t.task_id, None, action="a", proposer="p")
    s1 = s.max_seq()
    assert s1 > s0 and [r["id"] for r in s.nodes(since_seq=s0)] == [a]
    assert s.nodes(since_seq=s1) == []
    s.finish_node(a, status="ok", message="", result=None, reward=0.1, time_us=1, speedup=1.1)
    changed = s.nodes(t.task_id, since_seq=s1)
    assert [r["id"] for r in changed] == [a] and changed[0]["seq"] == s.max_seq()
    s.set_task_status(t.task_id, "done")
    assert s.max_seq() > changed[0]["seq"] and s.nodes(since_seq=changed[0]["seq"]) == []


def test_llm_usage_commands_events(tmp_path):
    s = _new(tmp_path)
    assert s.llm_totals() == {"calls": 0, "failures": 0, "prompt_tokens": 0,
                              "completion_tokens": 0, "cost_usd": 0.0, "last_error": ""}
    s.add_llm_usage(model="openai/x", prompt_tokens=100, completion_tokens=20, cost_usd=0.01,
                    ok=True)
    s.add_llm_usage(model="openai/x", prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
                    ok=False, error="HTTP 429")
    tot = s.llm_totals()
    assert (tot["calls"], tot["failures"], tot["prompt_tokens"], tot["completion_tokens"]) == \
        (2, 1, 100, 20) and tot["cost_usd"] == pytest.approx(0.01)
    assert tot["last_error"] == "HTTP 429"  # what the TUI shows next to the counter

    ui = RunStore.open(tmp_path / "run")  # a UI in another connection posts commands
    i1 = ui.post_command("pause", {"task_id": None})
    i2 = ui.post_command("add_budget", {"task_id": "t", "extra": 10})
    got = s.take_commands()
    assert [(c["id"], c["name"], c["args"]) for c in got] == \
        [(i1, "pause", {"task_id": None}), (i2, "add_budget", {"task_id": "t", "extra": 10})]
    assert s.take_commands() == []
    ui.close()

    s.append_event({"type": "Phase", "name": "profile", "ts": 1.0})
    s.append_event({"type": "Phase", "name": "search", "ts": 2.0})
    evs = s.events()
    assert [e["name"] for e in evs] == ["profile", "search"]
    assert [e["name"] for e in s.events(since_id=evs[0]["id"])] == ["search"]


def test_a_run_is_readable_by_its_owner_only(tmp_path):
    """Runs hold captured tensors, outputs and prompts; SQLite gives -wal/-shm run.db's mode."""
    old = os.umask(0o022)  # a shell's usual umask: the store must not rely on the CLI's 077
    try:
        s = _new(tmp_path)
        s.add_task({"task_id": "t1", "op": "softmax", "inputs": [{"shape": [4, 8], "dtype": "float32"}]}, 5)
        mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
        assert mode(s.run_dir) == mode(s.run_dir / "captures") == mode(s.run_dir / "cache") == 0o700
        for name in ("run.db", "run.db-wal", "run.db-shm", "owner.lock"):
            assert mode(s.run_dir / name) == 0o600, name
        s.close()
    finally:
        os.umask(old)


def test_the_owner_lock_tells_a_live_run_from_a_finished_one(tmp_path):
    s = _new(tmp_path)  # the creator runs the search until it closes the store
    assert owner_pid(s.run_dir) == os.getpid()
    with pytest.raises(UsageError, match=f"being run by another kforge process \\(pid {os.getpid()}\\)"):
        RunStore.open(s.run_dir, owner=True)
    s.close()
    assert owner_pid(s.run_dir) is None
    with RunStore.open(s.run_dir, owner=True) as again:  # resume: the next owner
        assert owner_pid(again.run_dir) == os.getpid()
    assert owner_pid(tmp_path / "never-a-run") is None


def test_the_run_registry_lists_live_run_dirs_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    a, b = _new(tmp_path, "a"), _new(tmp_path / "deep" / "er", "b")
    for s in (a, b, a):
        register_run(s.run_dir)
        s.close()
    assert registered_runs() == [a.run_dir.resolve(), b.run_dir.resolve()]
    assert stat.S_IMODE((tmp_path / "data" / "kforge" / "runs.txt").stat().st_mode) == 0o600
    (b.run_dir / "run.db").unlink()
    assert registered_runs() == [a.run_dir.resolve()]


def test_readonly_refuses_writes(tmp_path):
    _new(tmp_path).close()
    r = RunStore.open(tmp_path / "run", readonly=True)
    assert r.run_info()["model"] == "m.py:build"
    with pytest.raises(UsageError, match="read-only"):
        r.set_run_status("stopped")


def test_list_runs(tmp_path):
    a = _new(tmp_path, "a")
    a.add_task(_task(), 3)
    a.close()
    time.sleep(0.01)
    _new(tmp_path, "nested/b").close()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "run.db").write_text("not sqlite")
    runs = list_runs(tmp_path)
    assert [Path(r["run_dir"]).name for r in runs] == ["b", "a"]  # newest first, junk skipped
    assert runs[1]["tasks"] == 1 and runs[1]["model"] == "m.py:build"
    assert list_runs(tmp_path / "missing") == []
    assert (tmp_path / "junk" / "run.db").read_text() == "not sqlite"


# ----------------------------------------------------------------- bad files untouched

def _foreign_sqlite(p: Path):
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE photos (id INTEGER, name TEXT)")
    con.execute("INSERT INTO photos VALUES (1, 'cat')")
    con.commit()
    con.close()


def _wrong_schema(p: Path):
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES ('schema', 'other-app'), ('version', '1')")
    con.execute("CREATE TABLE run (id INTEGER)")
    con.commit()
    con.close()


def _truncated_store(p: Path):
    src = RunStore.create(p.parent / "src", model="m", settings={}, device={}, proposer="b")
    for i in range(30):
        src.add_task(_task(8 + i), 5)
    src.close()
    data = (p.parent / "src" / "run.db").read_bytes()
    p.write_bytes(data[:4096] + b"\x00" * 100 + data[8000:9000])


@pytest.mark.parametrize("make, why", [
    (lambda p: p.write_text("hello, I am a text file named run.db\n" * 50), "not a kforge run store"),
    (lambda p: p.write_bytes(os.urandom(8192)), "not a kforge run store"),
    (lambda p: p.write_bytes(b""), "not a kforge run store"),
    (_foreign_sqlite, "not a kforge run store"),
    (_wrong_schema, "schema 'other-app'"),
    (_truncated_store, "run store"),
], ids=["text", "random", "empty", "foreign-sqlite", "wrong-schema", "truncated"])
def test_open_bad_file_is_one_line_and_untouched(tmp_path, make, why):
    d = tmp_path / "bad"
    d.mkdir()
    db = d / "run.db"
    make(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    listing = sorted(os.listdir(d))
    for readonly in (False, True):
        with pytest.raises(UsageError) as e:
            RunStore.open(d, readonly=readonly)
        assert why in str(e.value) and "\n" not in str(e.value)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(os.listdir(d)) == listing  # no -wal / -shm / -journal appeared


def test_open_missing(tmp_path):
    with pytest.raises(UsageError, match="run.db not found"):
        RunStore.open(tmp_path / "nothing")


def test_open_newer_version_refused(tmp_path):
    s = _new(tmp_path)
    s.close()
    con = sqlite3.connect(s.path)
    con.execute("UPDATE meta SET value = '999' WHERE key = 'version'")
    con.commit()
    con.close()
    assert SCHEMA_NAME == "kforge-run"
    with pytest.raises(UsageError, match="newer kforge"):
        RunStore.open(tmp_path / "run")


# ----------------------------------------------------------------- processes

WRITER = r"""
import sys, time
from kforge_tui.store import RunStore
from kforge_tui.regions.meta import TensorMeta
from kforge_tui.regions.task import Task
run_dir, n, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
x = TensorMeta("in0", (4, 8), "float32", (8, 1))
g = {"inputs": ["in0"], "nodes": [{"name": "relu", "target": "aten.relu.default",
     "args": [{"ref": "in0"}], "kwargs": {}}], "outputs": [{"ref": "relu"}]}
t = Task("softmax", "pointwise", g, (x,), (TensorMeta("out0", (4, 8), "float32", (8, 1)),))
s = RunStore.create(run_dir, model="m", settings={}, device={}, proposer="builtin")
s.add_task(t, n)
print("ready", flush=True)
for i in range(n):
    a = s.add_node(t.task_id, None, action=f"a{i}", proposer="builtin", source="x" * 2000)
    s.finish_node(a, status="ok", message="", result={"i": i}, reward=0.1, time_us=1.0,
                  speedup=1.0 + i / 1000)
    b = s.add_node(t.task_id, a, action=f"b{i}", proposer="builtin")  # left in flight
    print("done", a, flush=True)
    time.sleep(pause)
"""


def test_reader_process_follows_writer(tmp_path):
    run_dir = tmp_path / "live"
    n = 60
    w = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(n), "0.005"],
                         stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert w.stdout.readline().strip() == "ready"
        r = RunStore.open(run_dir, readonly=True)
        seen: dict[int, dict] = {}
        last_seq, polls, deadline = 0, 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            seq = r.max_seq()
            assert seq >= last_seq  # never goes backwards
            if seq != last_seq:
                for row in r.nodes(since_seq=last_seq):
                    assert row["seq"] > last_seq
                    seen[row["id"]] = row
                last_seq = seq
                polls += 1
            finished = [x for x in seen.values() if x["action"].startswith("a")
                        and x["status"] == "ok"]
            if len(finished) == n:
                break
            time.sleep(0.002)
        assert w.wait(timeout=60) == 0
    finally:
        w.kill()
    assert len(finished) == n and polls > 3  # saw it change while it was being written
    assert r.task(r.tasks()[0]["task_id"])["evaluated"] == n
    r.close()


def test_kill_9_loses_only_in_flight(tmp_path):
    run_dir = tmp_path / "killed"
    w = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), "100000", "0"],
                         stdout=subprocess.PIPE, text=True, env=ENV)
    acked = []
    try:
        assert w.stdout.readline().strip() == "ready"
        while len(acked) < 200:
            line = w.stdout.readline()
            assert line, "writer died early"
            acked.append(int(line.split()[1]))
        os.kill(w.pid, signal.SIGKILL)
        w.wait(timeout=30)
    finally:
        w.kill()
    assert w.returncode == -signal.SIGKILL
    s = RunStore.open(run_dir)
    assert s._con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    nodes = {r["id"]: r for r in s.nodes()}
    for a in acked:  # every evaluation the writer reported as committed is there, finished
        assert nodes[a]["status"] == "ok" and nodes[a]["result"]["i"] >= 0
    pend = s.pending_nodes()
    assert pend and all(p["action"].startswith(("a", "b")) for p in pend)
    # at most the last a (in flight at the kill) is unfinished among the a-nodes
    unfinished_a = [r for r in nodes.values() if r["action"].startswith("a")
                    and r["status"] == "pending"]
    assert len(unfinished_a) <= 1
    assert s.task(s.tasks()[0]["task_id"])["evaluated"] >= len(acked)
    # and the store keeps working after the crash
    s.add_node(s.tasks()[0]["task_id"], None, action="after", proposer="p")
    s.close()
