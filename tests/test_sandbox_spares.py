"""Spare runners never start beside a timed call: the supervisor stops (SIGSTOP) the ones still
starting for the timed window and lets them go on after it (supervisor.Worker._spares_paused).

Real processes: a worker's zygote forks real runners; the check runs in a child Python (the
zygote must fork from a process without threads, as in the worker)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import json, sys, time
    from kforge_tui.sandbox.worker import thread_env
    thread_env()
    import torch  # noqa: F401  (as the worker: imported before the zygote forks)
    from kforge_tui.sandbox.supervisor import Worker
    from kforge_tui.sandbox.zygote import Zygote

    def state(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    worker = Worker("cpu", 0, Zygote("cpu", 0, -1), sys.argv[1])
    tries = []
    for _ in range(6):
        worker.spares.append(worker.zygote.spawn(worker._spawn_args()))  # forked just now: starting
        with worker._spares_paused(candidate=True) as n:  # a candidate's loop, the case that may differ
            inside = [(r.ready, state(r.pid)) for r in worker.spares]
            time.sleep(0.5)  # a stopped runner cannot finish its start meanwhile
            after_wait = [r.poll_ready() for r in worker.spares]
        ready = [r.wait_ready(60) for r in worker.spares]
        states = [state(r.pid) for r in worker.spares]
        tries.append({"paused": n, "inside": inside, "after_wait": after_wait, "ready": ready,
                      "states": states})
        for r in list(worker.spares)[1:]:
            worker.spares.remove(r)
            r.kill()
    print(json.dumps(tries))
""")


@pytest.mark.timeout(300)
def test_spares_still_starting_are_stopped_for_the_timed_window_and_go_on_after(tmp_path):
    """On the cpu even when asked to let them run (KFORGE_SPARES_BESIDE_TIMING=1): a start takes
    the cores the timed call runs on."""
    env = {**os.environ, "KFORGE_SPARES_BESIDE_TIMING": "1"}
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True, text=True,
                       timeout=280, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    tries = json.loads(r.stdout.strip().splitlines()[-1])
    assert sum(t["paused"] for t in tries) >= 1, tries  # a runner forked a moment ago is still starting
    for t in tries:
        # inside the window every spare is either started already or stopped
        assert all(ready or st == "T" for ready, st in t["inside"]), t
        n_stopped = sum(st == "T" for _, st in t["inside"])
        assert n_stopped == t["paused"], t
        # the stopped ones made no progress while stopped: still not ready at the window's end
        assert sum(not ok for ok in t["after_wait"]) >= n_stopped, t
        # after the window each one finishes its start and runs again
        assert all(t["ready"]) and "T" not in t["states"], t


REAP_PROGRAM = textwrap.dedent("""
    import json, os, sys
    from kforge_tui.sandbox.worker import thread_env
    thread_env()
    import torch  # noqa: F401
    from kforge_tui.sandbox.supervisor import Worker
    from kforge_tui.sandbox.zygote import Zygote

    worker = Worker("cpu", 0, Zygote("cpu", 0, -1), sys.argv[1])
    tries = []
    for _ in range(4):
        used = [worker.zygote.spawn(worker._spawn_args()) for _ in range(2)]
        started = [r.wait_ready(60) for r in used]
        for r in used:
            r.kill(wait=False)  # as after a candidate: the zygote reaps it later
        queued = list(worker.zygote.dying)
        with worker._spares_paused():
            alive = [os.path.exists(f"/proc/{r.pid}") for r in used]
            left = list(worker.zygote.dying)
        tries.append({"started": started, "queued": queued, "pids": [r.pid for r in used],
                      "alive_inside": alive, "dying_inside": left})
    print(json.dumps(tries))
""")


@pytest.mark.timeout(300)
def test_runners_killed_without_waiting_are_gone_before_the_timed_window(tmp_path):
    """`RunnerHandle.kill(wait=False)` leaves a used runner's teardown for later; by the time
    anything is timed it must be over: the process no longer exists (reaped, not a zombie)."""
    r = subprocess.run([sys.executable, "-c", REAP_PROGRAM, str(tmp_path)], capture_output=True,
                       text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    tries = json.loads(r.stdout.strip().splitlines()[-1])
    for t in tries:
        assert all(t["started"]), t
        assert sorted(t["queued"]) == sorted(t["pids"]), t  # kill(wait=False) did defer the reap
        assert t["alive_inside"] == [False, False] and t["dying_inside"] == [], t


KILLED_PROGRAM = textwrap.dedent("""
    import json, sys, time
    from kforge_tui.sandbox.worker import thread_env
    thread_env()
    import torch  # noqa: F401
    from kforge_tui.sandbox.supervisor import Worker
    from kforge_tui.sandbox.zygote import Zygote, _proc_state

    worker = Worker("cpu", 0, Zygote("cpu", 0, -1), sys.argv[1])
    started = worker.zygote.spawn(worker._spawn_args())
    ok = started.wait_ready(60)
    spare = worker.zygote.spawn(worker._spawn_args())  # forked just now: still starting
    paused = spare.pause()  # as for a timed window
    print(json.dumps({"ok": ok, "paused": paused, "zygote": worker.zygote.pid,
                      "runners": [started.pid, spare.pid],
                      "states": [_proc_state(started.pid), _proc_state(spare.pid)]}), flush=True)
    time.sleep(600)  # killed here, inside the window
""")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.mark.timeout(300)
def test_a_worker_killed_inside_a_timed_window_leaves_no_runner_behind(tmp_path):
    """`kill -9` of the worker (its owner's death does that, PR_SET_PDEATHSIG) while a spare is
    stopped for a timed window: the zygote sees the worker's socket close and kills every runner
    it forked, the stopped one included (it would wait for a SIGCONT forever), then exits."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", KILLED_PROGRAM, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()[-3000:] if p.poll() is not None else "no report from the worker"
        got = json.loads(line)
        assert got["ok"] and got["paused"], got
        assert got["states"][1] == "T" and got["states"][0] != "T", got
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        left = [got["zygote"], *got["runners"]]
        end = time.monotonic() + 10
        while time.monotonic() < end and any(_running(q) for q in left):
            time.sleep(0.05)
        assert not any(_running(q) for q in left), {q: _running(q) for q in left}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("name,value", [("KFORGE_SPARES_BESIDE_TIMING", "yes"), ("KFORGE_RUNNER_SPARES", "three")])
def test_a_bad_worker_setting_is_refused_before_any_worker_starts(tmp_path, monkeypatch, name, value):
    """In the engine's process, as one line naming the setting (a worker dying of it read as an
    internal error)."""
    from kforge_tui.errors import UsageError
    from kforge_tui.sandbox.pool import EvaluatorPool

    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=f"^{name}='{value}': expected "):
        EvaluatorPool("cpu", cache_dir=tmp_path)
    monkeypatch.setenv(name, "1")
    EvaluatorPool("cpu", cache_dir=tmp_path)  # a good value passes
