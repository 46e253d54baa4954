"""Issue 23 without a cluster: the `--cluster` value, the refusal rule over device facts, the
store's worker column on old stores, and the one-line exit-2 errors of the real CLI (Ray
missing, nobody at the address)."""
from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kforge_tui.cluster import parse_cluster, workers_text
from kforge_tui.cluster.facts import collect, mismatch
from kforge_tui.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "tests" / "fixtures" / "engine" / "softmax_model.py")
H200 = {"device": "cuda", "host": "gpu-1", "name": "NVIDIA H200", "compute_capability": "9.0", "sms": 132,
        "memory_gb": 140, "driver": "570.86.15", "torch_cuda": "12.8", "torch": "2.13.0+cu128",
        "compiler": "Build cuda_12.8.r12.8/compiler.35404655_0", "kforge": "0.1.0+abc", "arch": "sm_90"}


def test_cluster_values():
    assert parse_cluster(None) is None and parse_cluster("local") is None and parse_cluster("") is None
    assert parse_cluster("ray") == "ray"
    assert parse_cluster("ray://10.0.0.7:10001") == "ray://10.0.0.7:10001"
    for bad in ("ray://nohost", "ray://h:port", "dask", "ray:10.0.0.7:10001"):
        with pytest.raises(UsageError, match="--cluster must be local, ray or ray://HOST:PORT"):
            parse_cluster(bad)


def test_workers_text():
    assert workers_text({"a": 4, "b": 4}) == "2 nodes × 4 workers"
    assert workers_text({"a": 1}) == "1 node × 1 worker"
    assert workers_text({"a": 4, "b": 1}) == "5 workers on 2 nodes (4+1)"


def test_device_facts_decide_which_node_may_time_candidates():
    """A different GPU, a MIG slice, another driver or torch each refuse a node, with the
    reason in words; the host name does not. CPU facts are this machine's own, read by a
    fresh process as a node's are."""
    assert mismatch(H200, dict(H200, host="gpu-2")) == ""
    assert mismatch(H200, dict(H200, name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")) == (
        "GPU NVIDIA A100-SXM4-80GB (the run's: NVIDIA H200); compute capability 8.0 (the run's: 9.0)")
    assert mismatch(H200, dict(H200, sms=16, memory_gb=17)) == "SMs 16 (the run's: 132); GPU memory GB 17 (the run's: 140)"
    assert mismatch(H200, dict(H200, driver="550.54.14")) == "driver 550.54.14 (the run's: 570.86.15)"
    assert mismatch(H200, dict(H200, torch="2.4.0")) == "torch 2.4.0 (the run's: 2.13.0+cu128)"
    assert mismatch(H200, {"device": "cuda", "error": "reading the device facts failed: boom"}) == \
        "reading the device facts failed: boom"
    here = collect("cpu")
    assert here["device"] == "cpu" and here["cpus"] >= 1 and here["torch"] and here["cpu"], here
    assert mismatch(here, collect("cpu")) == ""
    assert mismatch(here, dict(here, cpus=here["cpus"] + 1)).startswith("CPUs usable ")
    assert mismatch(here, H200).startswith("device cuda (the run's: cpu)")


def test_old_stores_get_the_worker_column(tmp_path):
    from kforge_tui.store import RunStore

    run = tmp_path / "run"
    s = RunStore.create(run, model="m.py", settings={}, device={}, proposer="builtin")
    s.add_task({"task_id": "t", "op": "softmax", "inputs": [{"shape": [2, 3], "dtype": "float32"}]}, 4)
    nid = s.add_node("t", None, action="a", proposer="p", source="x")
    s.close()
    con = sqlite3.connect(run / "run.db")  # a store from before the column
    con.execute("ALTER TABLE nodes DROP COLUMN worker")
    con.commit()
    con.close()
    ro = RunStore.open(run, readonly=True)
    assert ro.node(nid)["worker"] is None  # read-only: nothing written, the row still has the key
    ro.close()
    rw = RunStore.open(run)
    rw.finish_node(nid, status="ok", message="", result=None, reward=0.0, worker="10.0.0.7:1d63c0b3/cuda0")
    assert rw.node(nid)["worker"] == "10.0.0.7:1d63c0b3/cuda0"
    rw.close()


def _kforge(*args, env=None, code=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.pop("RAY_ADDRESS", None)
    e.update(env or {})
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "kforge_tui", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), env=e, timeout=120)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nobody listens there


def _one_line_exit_2(r, *words, run_dir=None):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("kforge: error: "), r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]
    if run_dir is not None:
        assert not Path(run_dir).exists()  # refused before a run directory was made


def test_cli_cluster_errors_are_one_line_and_exit_2(tmp_path):
    run = tmp_path / "run"
    base = ["optimize", MODEL, "--device", "cpu", "--headless", "--run-dir", str(run)]
    _one_line_exit_2(_kforge(*base, "--cluster", "dask"), "--cluster must be local, ray or ray://HOST:PORT",
                     run_dir=run)
    port = _closed_port()
    _one_line_exit_2(_kforge(*base, "--cluster", f"ray://127.0.0.1:{port}"),
                     f"cannot reach the Ray cluster at ray://127.0.0.1:{port}", run_dir=run)
    _one_line_exit_2(_kforge(*base, "--cluster", "ray", env={"RAY_ADDRESS": f"127.0.0.1:{port}"}),
                     f"cannot reach the Ray cluster at 127.0.0.1:{port}", run_dir=run)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'cluster = "ray://127.0.0.1:{port}"\n')
    _one_line_exit_2(_kforge(*base, env={"KFORGE_CONFIG": str(cfg)}), "cannot reach the Ray cluster", run_dir=run)
    # Ray not installed: `import ray` fails as it does without the extra
    no_ray = ("import sys; sys.modules['ray'] = None\nfrom kforge_tui.cli import main\n"
              "sys.argv[0] = 'kforge'; sys.exit(main(sys.argv[1:]))")
    _one_line_exit_2(_kforge(*base, "--cluster", "ray", code=no_ray), "needs Ray", "pip install 'kforge-tui[ray]'",
                     run_dir=run)
    from kforge_tui.store import RunStore

    RunStore.create(run, model=MODEL, settings={"model": MODEL, "device": "cpu"}, device={},
                    proposer="builtin").close()
    _one_line_exit_2(_kforge("resume", str(run), "--cluster", "dask"), "--cluster must be")
    _one_line_exit_2(_kforge("resume", str(run), "--cluster", f"ray://127.0.0.1:{port}"), "cannot reach")


def test_local_use_never_imports_ray():
    code = ("import sys\nfrom kforge_tui import cli, cluster, engine\nfrom kforge_tui.tui.widgets import status\n"
            "cli.build_parser().parse_args(['optimize', 'm.py', '--cluster', 'ray'])\n"
            "print('ray' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.stdout.strip() == "False", r.stderr[-2000:]
