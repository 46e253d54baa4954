"""Spare runners never start beside a timed call: the supervisor stops (SIGSTOP) the ones still
starting for the timed window and lets them go on after it (supervisor.Worker._spares_paused).

Real processes: a worker's zygote forks real runners; the check runs in a child Python (the
zygote must fork from a process without threads, as in the worker)."""
from __future__ import annotations

import json
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
        with worker._spares_paused() as n:
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
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True, text=True,
                       timeout=280)
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
