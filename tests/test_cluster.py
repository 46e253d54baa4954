"""Issue 23 on a real local Ray cluster: `ray.cluster_utils.Cluster` starts a head and worker
nodes, each a raylet with its own worker processes on this machine, and kforge's real CLI
evaluates candidates there (real compiles, real sandbox workers, a real HTTP LLM server so
that both runs of a comparison get the same candidates in the same order).

The tests share one cluster and run in file order: the last one stops the head.
  head       no CPU for work: only the GCS and the Ray Client server (ray://)
  A, B       two CPUs each: one evaluation slot and build tasks
  C          started with one CPU in its affinity mask: its device facts differ, it is refused
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'kforge-tui[ray]')")

from fake_llm_server import FakeLLMServer, Reply  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "tests" / "fixtures" / "engine" / "softmax_model.py")
GOOD = (ROOT / "tests" / "fixtures" / "engine" / "softmax_cpu.cpp").read_text()
TIMING = {"warmup": 2, "min_iters": 6, "max_iters": 12, "budget_s": 0.03}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _candidates() -> list[str]:
    """Five honest kernels, one that does not compile, one with wrong results."""
    good = [GOOD.replace("schedule(static)", f"schedule({s})") for s in
            ("static", "dynamic", "guided", "static, 8", "dynamic, 4")]
    return good + [GOOD.replace("expf(", "expf_undeclared("), GOOD.replace("1.f / s", "1.01f / s")]


def _fenced(src: str) -> str:
    return f"Here is a kernel.\n\n```cpp\n{src}\n```\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OPENAI_API_KEY="sk-test", **extra)


def _optimize(run_dir: Path, llm_url: str, budget: int, *cluster, env=None) -> list[str]:
    return [sys.executable, "-m", "kforge_tui", "optimize", MODEL, "--device", "cpu", "--headless", "--top", "1",
            "--budget", str(budget), "--parallel", "4", "--no-apply", "--llm", "openai/fake-coder",
            "--api-base", llm_url, "--run-dir", str(run_dir), *cluster]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    client_port = _free_port()
    node_env = {"PYTHONPATH": str(ROOT)}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                      "ray_client_server_port": client_port})
    try:
        good = [c.add_node(num_cpus=2, env_vars=node_env, object_store_memory=100 * 2**20) for _ in range(2)]
        cpus = sorted(os.sched_getaffinity(0))
        bad = None
        if len(cpus) >= 2:  # children inherit the mask: node C's workers may use one CPU only
            os.sched_setaffinity(0, {cpus[0]})
            try:
                bad = c.add_node(num_cpus=2, env_vars=node_env, object_store_memory=100 * 2**20)
            finally:
                os.sched_setaffinity(0, set(cpus))
        c.wait_for_nodes()
        c.client_port = client_port
        c.good = [n.node_id for n in good]
        c.bad = bad.node_id if bad is not None else None
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _nodes(db: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM nodes WHERE parent_id IS NOT NULL ORDER BY id")]
    finally:
        con.close()


def _search(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not (r["action"] or "").startswith("confirm:")]


def _events(db: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return [json.loads(e) for (e,) in con.execute("SELECT event FROM events ORDER BY id")]
    finally:
        con.close()


def _node_of(worker: str | None) -> str:
    """The node id prefix of a worker label "ip:1d63c0b3/cpu0"."""
    return (worker or "").split("/")[0].rpartition(":")[2]


def test_a_node_with_other_device_facts_is_refused(cluster, monkeypatch, tmp_path):
    if cluster.bad is None:
        pytest.skip("one CPU here: no node with a different CPU mask can be made")
    from kforge_tui.cluster.executor import RayEvaluator
    from kforge_tui.errors import UsageError
    from kforge_tui.regions.build import task_of
    import torch

    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    task = task_of(lambda x: torch.softmax(x, -1), (torch.randn(16, 128),), backend="cpu")
    tri = task_of(lambda x: torch.softmax(x, -1), (torch.randn(8, 64),), backend="triton")
    tri_src = (ROOT / "tests" / "cheats" / "triton" / "_honest_softmax.py").read_text()
    has_triton = importlib.util.find_spec("triton") is not None
    logs, workers = [], []

    async def main():
        ev = RayEvaluator("ray", "cpu", pool_kwargs={"timing": TIMING}, log=lambda m, lvl: logs.append(m),
                          on_workers=workers.append)
        await ev.start()
        try:
            r = await ev.evaluate(task.to_json(), str(tmp_path), GOOD)
            bad = await ev.evaluate(task.to_json(), str(tmp_path), GOOD.replace("expf(", "expf_undeclared("))
            # Triton under its interpreter: the slot starts a triton worker the first time
            t = await ev.evaluate(tri.to_json(), str(tmp_path), tri_src) if has_triton else None
            return dict(ev.refused), ev.workers_per_node(), r, bad, t
        finally:
            await ev.close()

    refused, per_node, r, bad, t = asyncio.run(main())
    assert sorted(k.rpartition(":")[2] for k in per_node) == sorted(n[:8] for n in cluster.good), per_node
    (label, why), = refused.items()
    assert cluster.bad[:8] in label and "CPUs usable 1 (the run's: " in why, refused
    assert any("refused" in m and cluster.bad[:8] in m for m in logs), logs
    assert r.ok, (r.status, r.message)
    assert _node_of(r.worker) in {n[:8] for n in cluster.good}
    assert r.compile_s is not None and r.stage_s.get("build_task") and r.stage_s.get("verify") is not None
    assert bad.status == "compile_error" and "expf_undeclared" in bad.log  # the build task's own verdict
    assert bad.worker.endswith("/build") and _node_of(bad.worker) in {n[:8] for n in cluster.good}
    if t is not None:
        assert t.ok and t.compile_s is not None, (t.status, t.message)  # Triton's JIT, on the slot
    assert workers and workers[-1] == per_node
    assert not ray.is_initialized()  # the evaluator connected, so it disconnected

    from kforge_tui.cluster.executor import connect_ray

    try:  # --device cuda on a cluster of CPUs: one line (exit 2 from the CLI)
        with pytest.raises(UsageError, match="no node of the Ray cluster .* has a GPU"):
            connect_ray("ray", "cuda")
    finally:
        ray.shutdown()


def _freeze_a_busy_slot(timeout_s: float = 300.0) -> tuple[str, int]:
    """(node id, actor pid) of an evaluation slot that has finished a candidate and has just
    started another, stopped (SIGSTOP) so that its candidate is in flight when its node dies.
    "Just started" (under a quarter of a second, well under any evaluation's time here) keeps
    the call from ending between the status answer and the signal."""
    ray.init(address=os.environ["RAY_ADDRESS"], namespace="kforge", logging_level="ERROR", log_to_driver=False)
    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for a in ray.util.list_named_actors(all_namespaces=True):
                if a["namespace"] != "kforge" or not a["name"].startswith("kforge-eval-"):
                    continue
                try:
                    h = ray.get_actor(a["name"], namespace="kforge")
                    st = ray.get(h.status.remote(), timeout=10)
                except Exception:
                    continue
                if st["evaluations"] >= 1 and st["doing"] == "evaluate" and st["busy_s"] < 0.25:
                    node = ray.get(h.identity.remote(), timeout=10)["node_id"]
                    os.kill(st["pid"], signal.SIGSTOP)
                    return node, st["pid"]
            time.sleep(0.1)
        raise AssertionError("no evaluation slot was ever busy after a first candidate")
    finally:
        ray.shutdown()  # a driver must not hold a node that is about to be removed


def test_optimize_on_the_cluster_loses_nothing_when_a_node_dies(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    sources = _candidates()
    budget = len(sources)
    with FakeLLMServer() as srv:  # the same candidates, in the same order, for both runs
        srv.push(*(Reply(content=_fenced(s)) for s in sources))
        local = subprocess.run(_optimize(tmp_path / "local", srv.url, budget), capture_output=True, text=True,
                               cwd=str(ROOT), env=_env(), timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]

    run = tmp_path / "ray"
    with FakeLLMServer() as srv:
        srv.push(*(Reply(content=_fenced(s)) for s in sources))
        p = subprocess.Popen(_optimize(run, srv.url, budget, "--cluster", "ray"), cwd=str(ROOT), env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid = None
        try:
            victim, pid = _freeze_a_busy_slot()
            node = next(n for n in cluster.list_all_nodes() if n.node_id == victim)
            t_kill = time.time()
            cluster.remove_node(node)
            out, err = p.communicate(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)  # the stopped actor, if its node's end left it
                except ProcessLookupError:
                    pass
    assert p.returncode == 0, err[-3000:]

    rows = _nodes(run / "run.db")
    search = _search(rows)
    # every candidate finished exactly once: one node per proposed source, none pending or lost
    assert len(search) == budget and sorted(r["source"] for r in search) == sorted(sources), \
        [(r["id"], r["status"], r["message"]) for r in search]
    assert all(r["status"] not in ("pending", "lost") for r in rows), [(r["id"], r["status"]) for r in rows]
    # ... with the same verdict as on this machine: the verified set is the local run's
    here = {r["source"]: r["status"] for r in _search(_nodes(tmp_path / "local" / "run.db"))}
    there = {r["source"]: r["status"] for r in search}
    assert there == here
    assert {s for s, st in there.items() if st == "ok"} == set(sources[:5])
    # evaluations on both nodes, none on the refused one; after the kill only the survivor
    on = {_node_of(r["worker"]) for r in search if r["status"] == "ok"}
    good = {n[:8] for n in cluster.good}
    assert on == good, (on, good)
    survivor = (good - {victim[:8]}).pop()
    # (a second's margin for a result sent just before the kill; nothing need finish after it:
    # the re-queued evaluation, checked below, may be done within a second of the kill)
    late = [r for r in rows if r["finished"] and r["finished"] > t_kill + 1 and r["worker"]]
    assert all(_node_of(r["worker"]) == survivor for r in late), late
    # the evaluation in flight on the dead node (a candidate, or a winner's re-timing when the
    # slot frozen was re-timing one) went back in the queue and was evaluated elsewhere
    logs = [e["message"] for e in _events(run / "run.db") if e.get("type") == "LogLine"]
    assert any("re-queued" in m and victim[:8] in m for m in logs), [m for m in logs if "cluster:" in m]
    moved = [r for r in rows if "re-queued" in (json.loads(r["result"] or "{}").get("log") or "")]
    assert moved and all(_node_of(r["worker"]) == survivor and r["finished"] > t_kill for r in moved), moved
    if cluster.bad is not None:
        assert any("refused" in m and cluster.bad[:8] in m for m in logs), logs[:20]
    workers = [e["nodes"] for e in _events(run / "run.db") if e.get("type") == "Workers"]
    assert max(len(w) for w in workers) == 2 and all(workers), workers  # the header's workers per node
    assert list(workers[-1].values()) == [1] and survivor in next(iter(workers[-1])), workers
    show = json.loads(subprocess.run([sys.executable, "-m", "kforge_tui", "show", str(run), "--json"],
                                     capture_output=True, text=True, cwd=str(ROOT), env=_env(),
                                     timeout=120).stdout)
    (task,) = show["tasks"]
    assert task["evaluated"] == budget and task["verified"] is True


def test_a_cluster_that_stops_answering_stops_the_run_and_resume_goes_on_here(cluster, tmp_path):
    """Ray Client (ray://): the head stops; the run stops cleanly and `resume --cluster local`
    finishes it on this machine, with nothing evaluated twice or charged for the lost."""
    run = tmp_path / "run"
    sources = _candidates()[:5]
    budget = 6
    with FakeLLMServer() as srv:
        srv.push(*(Reply(content=_fenced(s)) for s in sources))
        srv.default = Reply(content=_fenced(GOOD.replace("#pragma omp simd", "#pragma omp simd simdlen(8)")))
        p = subprocess.Popen(_optimize(run, srv.url, budget, "--cluster", f"ray://127.0.0.1:{cluster.client_port}"),
                             cwd=str(ROOT), env=_env(KFORGE_CLUSTER_WAIT_S="5"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 300
            while time.time() < deadline and p.poll() is None:
                if (run / "run.db").exists():
                    try:
                        if sum(1 for r in _nodes(run / "run.db") if r["worker"]) >= 2:
                            break
                    except sqlite3.OperationalError:
                        pass
                time.sleep(0.2)
            assert p.poll() is None, p.communicate()[1][-3000:]
            cluster.remove_node(cluster.head_node)
            out, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 1, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("kforge: error: ") and "stopped answering" in last and \
            f"kforge resume {run}" in last, err[-2000:]
        before = {r["id"]: r for r in _nodes(run / "run.db")}
        assert all(r["status"] != "pending" for r in before.values())
        lost = [i for i, r in before.items() if r["status"] == "lost"]
        con = sqlite3.connect(f"file:{run / 'run.db'}?mode=ro", uri=True)
        assert con.execute("SELECT status FROM run").fetchone()[0] == "stopped"
        con.close()

        r = subprocess.run([sys.executable, "-m", "kforge_tui", "resume", str(run), "--cluster", "local",
                            "--headless"], capture_output=True, text=True, cwd=str(ROOT), env=_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    after = {r["id"]: r for r in _nodes(run / "run.db")}
    for i, row in before.items():  # what was finished stays as it was; the lost stay lost
        if row["status"] != "lost":
            assert {k: after[i][k] for k in ("status", "source", "time_us", "worker")} == \
                {k: row[k] for k in ("status", "source", "time_us", "worker")}
    assert all(after[i]["status"] == "lost" for i in lost)
    search = [r for r in _search(list(after.values())) if r["status"] != "lost"]
    assert len(search) == budget and all(r["status"] != "pending" for r in search)
    new = [r for i, r in after.items() if i not in before and r["worker"]]
    assert new and all(r["worker"].startswith("local/") for r in new), new


def test_a_disconnected_evaluator_never_starts_a_ray_of_its_own():
    """Past its Ray Client's reconnect grace period the driver is disconnected; any Ray call
    then auto-started (or joined) some local Ray inside ray.init, on the event loop: the run
    hung instead of stopping. Dropping a lost slot and the watcher's next look must not call
    Ray at all. In a fresh process, so that Ray is imported the way the CLI imports it."""
    code = """
import asyncio, time
from kforge_tui.cluster import executor as X
ray = X._ray()
ev = X.RayEvaluator("ray://127.0.0.1:9", "cpu", wait_s=1)
slot = X._Slot(actor=object(), node_id="n", node="h:n", label="h:n/cpu0")
t = time.monotonic()
ev._drop(slot, "its node left the cluster")  # kills the actor: nobody to ask
try:
    asyncio.run(ev._discover())
    raise SystemExit("_discover answered while disconnected")
except ConnectionError:
    pass
assert not ray.is_initialized() and slot.dead and time.monotonic() - t < 5, time.monotonic() - t
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                       env={k: v for k, v in _env().items() if k != "RAY_ADDRESS"}, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
