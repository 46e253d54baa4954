"""What runs on a cluster node: one evaluation actor per slot (a GPU, or the node's CPU), and
the CPU task that builds candidates. Both are thin: the work is the local sandbox's own code.

The actor's process never loads candidate code either. It hosts a one-worker EvaluatorPool
per kernel language, whose supervisor subprocess starts a fresh runner per candidate, exactly
as on one machine; a runner crash costs one runner, a supervisor crash a restart inside the
pool, and only the death of the actor (its node, `ray kill`) is the executor's business.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import ray

from kforge_tui.config import cache_dir, private_dir
from kforge_tui.regions.task import Task

_CALL_FILE = re.compile(r"^(call_\d+\.pt|summarised\.json)$")


def _compile_cache() -> Path:
    """The node's compile cache: the one local runs on that machine use (KFORGE_CACHE)."""
    return private_dir(private_dir(cache_dir()) / "compile")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _own_threads() -> None:
    """Ray sets OMP_NUM_THREADS to an actor's CPU share (1); a worker here must run with what
    it would run with locally (KFORGE_CPU_THREADS, else the cores it may use) or its timings
    are not the run's. Setting it explicitly also stops Ray from setting it again per call."""
    from kforge_tui.sandbox.worker import thread_env

    os.environ.pop("OMP_NUM_THREADS", None)
    os.environ.pop("OMP_THREAD_LIMIT", None)
    thread_env()


@ray.remote(max_restarts=0)
class EvalActor:
    """One evaluation slot. Async: `status` and `facts` answer while an evaluation runs."""

    def __init__(self, device: str, pool_kwargs: dict | None = None):
        _own_threads()
        self.device = device
        self.pool_kwargs = dict(pool_kwargs or {})
        self.root: Path | None = None  # made on first use: a refused slot leaves nothing behind
        self.pools: dict = {}
        self.captured: set[str] = set()
        self.busy_since: float | None = None
        self.doing: str | None = None  # "baseline" or "evaluate" while busy
        self.evaluations = 0
        self._lock = asyncio.Lock()

    def _dir(self, name: str) -> Path:
        """The run's captured tensors and built candidates on this node: owner-only, private to
        this actor (mkdtemp is 0700), removed by close(); what a killed actor left is removed by
        the next one on the node."""
        if self.root is None:
            tmp = Path(tempfile.gettempdir())
            for old in tmp.glob("kforge-ray-*-*"):
                pid = old.name.split("-")[2]
                if pid.isdigit() and not _alive(int(pid)):
                    shutil.rmtree(old, ignore_errors=True)
            self.root = Path(tempfile.mkdtemp(prefix=f"kforge-ray-{os.getpid()}-"))
        return private_dir(self.root / name)

    def identity(self) -> dict:
        ctx = ray.get_runtime_context()
        gpus = [str(g) for g in ray.get_gpu_ids()]
        return {"node_id": ctx.get_node_id(), "host": socket.gethostname(), "pid": os.getpid(),
                "index": gpus[0] if gpus else "0"}

    async def facts(self) -> dict:
        from kforge_tui.cluster.facts import collect

        return await asyncio.to_thread(collect, self.device)

    async def status(self) -> dict:
        return {"busy_s": None if self.busy_since is None else time.monotonic() - self.busy_since,
                "doing": self.doing, "evaluations": self.evaluations, "pid": os.getpid()}

    async def start(self, backends: list[str]) -> None:
        """Start the workers now (importing torch takes seconds), not on the first candidate.
        Several languages share this node's device: each pool plans with an equal share of its
        memory (sandbox/supervisor.Budget)."""
        if len(backends) > 1:
            mem = self.pool_kwargs.get("memory") or {}
            self.pool_kwargs["memory"] = {**mem, "share": 1 / len(backends)}
        for b in backends:
            await self._pool(b)

    async def _pool(self, backend: str):
        from kforge_tui.sandbox.pool import EvaluatorPool

        async with self._lock:
            pool = self.pools.get(backend)
            if pool is None:
                pool = EvaluatorPool(backend, workers=1, cache_dir=_compile_cache(), device=self.device,
                                     **self.pool_kwargs)
                await pool.start()
                self.pools[backend] = pool
            return pool

    async def _captures(self, task_json: dict, captures: list) -> None:
        """Write the task's captured calls into this node's run directory, once per task.
        `captures` is [ObjectRef] (nested, so Ray sends the tensors only when asked) or []."""
        cid = Task.from_json(task_json).capture_id
        if cid in self.captured:
            return
        files = (await captures[0]) if captures else {}
        d = private_dir(self._dir("run") / "captures" / cid)
        for name, data in files.items():
            if not _CALL_FILE.match(name):  # names come over the wire: no path in them
                continue
            fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        self.captured.add(cid)

    @contextmanager
    def _busy(self, doing: str):
        self.busy_since, self.doing = time.monotonic(), doing
        try:
            yield
        finally:
            self.busy_since = self.doing = None

    async def baseline(self, task_json: dict, captures: list, with_compile: bool) -> dict:
        with self._busy("baseline"):
            await self._captures(task_json, captures)
            pool = await self._pool(task_json["backend"])
            return asdict(await pool.baseline(task_json, str(self._dir("run")), with_compile=with_compile))

    async def evaluate(self, task_json: dict, captures: list, kind: str, payload: bytes) -> dict:
        """Load, verify and time a candidate built elsewhere (its checks passed there); the
        worker's loader still checks a Triton source itself."""
        with self._busy("evaluate"):
            await self._captures(task_json, captures)
            pool = await self._pool(task_json["backend"])
            suffix = ".py" if kind == "source_path" else ".so"
            path = self._dir("code") / f"{hashlib.sha256(payload).hexdigest()}{suffix}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            try:
                r = await pool.evaluate_built(task_json, str(self._dir("run")), str(path))
            finally:
                path.unlink(missing_ok=True)
            self.evaluations += 1
            return r.to_json()

    async def close(self) -> None:
        for pool in self.pools.values():
            try:
                await pool.close()
            except Exception:
                pass
        self.pools.clear()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


@ray.remote(num_cpus=1)
def build_task(backend: str, task_json: dict, source: str, arch: str | None, compile_timeout_s: float) -> dict:
    """Static check, compile and binary check on a CPU worker of the cluster. Returns the built
    library (or checked Triton source) as bytes, or the failure as EvalResult JSON."""
    from kforge_tui.sandbox.pool import build_candidate
    from kforge_tui.sandbox.result import EvalResult

    async def target():
        return arch, None

    t = time.perf_counter()
    built = asyncio.run(build_candidate(backend, task_json, source, target=target, cache_dir=_compile_cache(),
                                        compile_timeout_s=compile_timeout_s))
    host = socket.gethostname()
    if isinstance(built, EvalResult):
        return {"result": built.to_json(), "host": host}
    ((kind, path),) = built.code.items()
    built.base["stage_s"]["build_task"] = time.perf_counter() - t
    return {"kind": kind, "payload": Path(path).read_bytes(), "base": built.base, "log": built.log, "host": host}
