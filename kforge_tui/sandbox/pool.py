"""The evaluator pool: submit a candidate, get an EvalResult - never an exception.

    static check (in-process: it only parses) -> compile (subprocess; up to compile_jobs at once)
    -> one worker process: load -> verify -> time

One long-lived worker per GPU on cuda, a small pool on cpu (default 1: timing on a small box
needs its cores). Candidates that have compiled queue for a free worker while others compile.
The engine process never loads candidate code; a worker that hangs is killed after
eval_timeout_s ("timeout"), one that dies is reported with its signal and stderr tail ("crash"),
and one whose CUDA context is corrupted exits by itself; each is restarted before the next
candidate. Workers are also recycled every `restart_every` evaluations, because dlopen'ed
candidate libraries accumulate in a process.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import time
from collections import deque
from pathlib import Path

from kforge_tui.sandbox.result import Baseline, EvalResult, Mismatch, Timing
from kforge_tui.task import Task

STDERR_TAIL_LINES = 200
READY_TIMEOUT_S = 180.0  # importing torch (and creating a CUDA context) on a cold box


class WorkerDied(Exception):
    def __init__(self, returncode: int | None, tail: str):
        self.returncode = returncode
        self.tail = tail
        super().__init__(describe_exit(returncode))


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "worker exited"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"worker killed by {name}"
    return f"worker exited with status {rc}"


class _Worker:
    """One worker subprocess and its JSON-lines channel."""

    def __init__(self, backend: str, device: int):
        self.backend = backend
        self.device = device
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.lines_seen = 0
        self.evaluations = 0
        self.prepared: set[str] = set()
        self.info: dict = {}
        self._next = 1
        self._stderr_task: asyncio.Task | None = None

    async def spawn(self) -> None:
        cmd = [sys.executable, "-m", "kforge_tui.sandbox.worker", "--backend", self.backend,
               "--device", str(self.device)]
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, limit=64 * 2**20, start_new_session=True)
        self.prepared = set()
        self.evaluations = 0
        self._stderr_task = asyncio.create_task(self._drain_stderr(self.proc))
        ready = await asyncio.wait_for(self._read_reply(0, None), READY_TIMEOUT_S)
        if not ready.get("ok"):
            raise WorkerDied(None, ready.get("error", "") + "\n" + self.tail_text())
        self.info = ready

    async def _drain_stderr(self, proc) -> None:
        while True:
            line = await proc.stderr.readline()
            if not line:
                return
            self.tail.append(line.decode(errors="replace").rstrip("\n"))
            self.lines_seen += 1

    def tail_text(self, since: int | None = None) -> str:
        lines = list(self.tail)
        if since is not None:
            new = self.lines_seen - since
            lines = lines[-new:] if new > 0 else []
        return "\n".join(lines)

    async def _read_reply(self, rid, on_event) -> dict:
        assert self.proc is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                rc = await self.proc.wait()
                if self._stderr_task:
                    try:
                        await asyncio.wait_for(self._stderr_task, 2.0)
                    except (asyncio.TimeoutError, Exception):
                        pass
                raise WorkerDied(rc, self.tail_text())
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # cannot happen by design (fd 1 is redirected); never trust it anyway
            if msg.get("event") == "stage":
                if on_event is not None:
                    await _call(on_event, msg.get("stage"))
                continue
            if msg.get("id") == rid:
                return msg

    async def request(self, payload: dict, timeout: float, on_event=None) -> dict:
        assert self.proc is not None and self.proc.stdin is not None
        rid = self._next
        self._next += 1
        self.proc.stdin.write((json.dumps({"id": rid, **payload}) + "\n").encode())
        try:
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            rc = await self.proc.wait()
            raise WorkerDied(rc, self.tail_text()) from None
        return await asyncio.wait_for(self._read_reply(rid, on_event), timeout)

    async def kill(self) -> None:
        p = self.proc
        if p is None:
            return
        if p.returncode is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the whole session: a candidate may have forked
            except (ProcessLookupError, PermissionError):
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        try:
            await asyncio.wait_for(p.wait(), 10)
        except asyncio.TimeoutError:
            pass
        if self._stderr_task:
            self._stderr_task.cancel()
        self.proc = None

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                await self.request({"cmd": "exit"}, 5)
                await asyncio.wait_for(self.proc.wait(), 5)
            except Exception:
                pass
        await self.kill()


async def _call(cb, *args) -> None:
    try:
        r = cb(*args)
        if inspect.isawaitable(r):
            await r
    except Exception:
        pass  # a UI callback must never fail an evaluation


def _one_line(s: str, n: int = 300) -> str:
    s = " ".join((s or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


class EvaluatorPool:
    """Implements sandbox.result.Evaluator over local worker processes."""

    def __init__(self, backend: str, *, workers: int | None = None, cache_dir: str | Path,
                 compile_jobs: int | None = None, eval_timeout_s: float = 60.0,
                 compile_timeout_s: float = 120.0, arch: str | None = None, timing: dict | None = None,
                 restart_every: int = 50, prepare_timeout_s: float = 600.0):
        if backend not in ("cpu", "cuda"):
            from kforge_tui.errors import UsageError

            raise UsageError(f"backend must be cpu or cuda, not {backend!r}")
        self.backend = backend
        self.n_workers = workers
        self.cache_dir = Path(cache_dir)
        self.compile_jobs = compile_jobs or os.cpu_count() or 1
        self.eval_timeout_s = eval_timeout_s
        self.compile_timeout_s = compile_timeout_s
        self.prepare_timeout_s = prepare_timeout_s
        self.arch = arch
        self.timing = timing or {}
        self.restart_every = restart_every
        self.stats: dict = {"evaluations": 0, "restarts": 0, "in_flight": 0, "timeouts": 0, "crashes": 0}
        self._workers: list[_Worker] = []
        self._idle: asyncio.Queue[_Worker] | None = None
        self._compile_sem: asyncio.Semaphore | None = None
        self._started = False
        self._start_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            n = self.n_workers
            if n is None:
                n = _gpu_count() if self.backend == "cuda" else 1
            n = max(1, n)
            self._idle = asyncio.Queue()
            self._compile_sem = asyncio.Semaphore(self.compile_jobs)
            ws = [_Worker(self.backend, i if self.backend == "cuda" else 0) for i in range(n)]
            await asyncio.gather(*(w.spawn() for w in ws))
            for w in ws:
                self._workers.append(w)
                self._idle.put_nowait(w)
            if self.arch is None:
                self.arch = ws[0].info.get("arch") or ("native" if self.backend == "cpu" else None)
            self._started = True

    async def close(self) -> None:
        await asyncio.gather(*(w.close() for w in self._workers), return_exceptions=True)
        self._workers.clear()
        self._started = False

    async def __aenter__(self) -> "EvaluatorPool":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _restart(self, w: _Worker) -> None:
        self.stats["restarts"] += 1
        await w.kill()
        try:
            await w.spawn()
        except Exception:
            await w.kill()  # left dead; the next request on it respawns

    # ------------------------------------------------------------------ worker access
    async def _run_on_worker(self, tj: dict, run_dir: str, payload: dict, timeout: float,
                             on_event=None, capture_id: str | None = None) -> tuple[dict | None, str, _Worker | None, float]:
        """(reply, failure, worker, queued_s): failure is "", "timeout:<text>" or "crash:<text>"."""
        await self.start()
        assert self._idle is not None
        t0 = time.perf_counter()
        w = await self._idle.get()
        queued = time.perf_counter() - t0
        try:
            if w.proc is None or w.proc.returncode is not None:
                await self._restart(w)
            tid = Task.from_json(tj).task_id
            if tid not in w.prepared:
                try:
                    rep = await w.request({"cmd": "prepare", "task": tj, "run_dir": run_dir,
                                           "cache_dir": str(self.cache_dir), "timing": self.timing,
                                           "capture_id": capture_id}, self.prepare_timeout_s)
                except asyncio.TimeoutError:
                    await self._restart(w)
                    return None, f"timeout:preparing the task took over {self.prepare_timeout_s:g} s", w, queued
                except WorkerDied as e:
                    await self._restart(w)
                    return None, f"crash:{e} while preparing the task\n{e.tail}", w, queued
                if not rep.get("ok"):
                    return None, f"crash:worker could not prepare the task: {rep.get('error')}", w, queued
                w.prepared.add(tid)
            since = w.lines_seen
            try:
                rep = await w.request({**payload, "task": tj, "run_dir": run_dir,
                                       "cache_dir": str(self.cache_dir), "timing": self.timing,
                                       "capture_id": capture_id},
                                      timeout, on_event)
            except asyncio.TimeoutError:
                tail = w.tail_text(since)
                self.stats["timeouts"] += 1
                await self._restart(w)
                return None, f"timeout:no result after {timeout:g} s; worker killed and restarted\n{tail}", w, queued
            except WorkerDied as e:
                self.stats["crashes"] += 1
                await self._restart(w)
                return None, f"crash:{e}\n{e.tail}", w, queued
            rep["_stderr"] = w.tail_text(since)
            if rep.get("result", {}).get("fatal"):
                self.stats["crashes"] += 1
                await self._restart(w)
            return rep, "", w, queued
        finally:
            if payload.get("cmd") == "evaluate":
                w.evaluations += 1
                if w.evaluations >= self.restart_every and w.proc is not None:
                    await self._restart(w)
            self._idle.put_nowait(w)

    # ------------------------------------------------------------------ Evaluator API
    async def baseline(self, task_json: dict, run_dir: str, with_compile: bool = False) -> Baseline:
        """Eager (and torch.compile on request) timings and the roofline floor of a task.

        Raises KforgeError (one line) when the worker cannot run the reference at all: that is a
        task problem, not a candidate's.
        """
        from kforge_tui.errors import WorkFailed

        tj = self._task_json(task_json)
        await self.start()
        assert self._idle is not None
        w = await self._idle.get()
        try:
            if w.proc is None or w.proc.returncode is not None:
                await self._restart(w)
            try:
                rep = await w.request({"cmd": "prepare", "task": tj, "run_dir": run_dir,
                                       "cache_dir": str(self.cache_dir), "timing": self.timing,
                                       "with_compile": with_compile,
                                       "capture_id": Task.from_json(task_json).task_id}, self.prepare_timeout_s)
            except (asyncio.TimeoutError, WorkerDied) as e:
                await self._restart(w)
                raise WorkFailed(f"baseline of {Task.from_json(tj).task_id} failed: "
                                 f"{e or 'timeout'}") from None
            if not rep.get("ok"):
                raise WorkFailed(f"baseline of {Task.from_json(tj).task_id} failed: {rep.get('error')}")
            w.prepared.add(Task.from_json(tj).task_id)
        finally:
            self._idle.put_nowait(w)
        b = rep["baseline"]
        return Baseline(eager=Timing(**b["eager"]),
                        compiled=Timing(**b["compiled"]) if b.get("compiled") else None,
                        floor_us=b.get("floor_us"), floor_note=b.get("floor_note", ""),
                        bandwidth_gbs=b.get("bandwidth_gbs"))

    def _task_json(self, task_json: dict) -> dict:
        return Task.from_json(task_json).with_backend(self.backend).to_json()

    async def evaluate(self, task_json: dict, run_dir: str, source: str, on_stage=None) -> EvalResult:
        self.stats["in_flight"] += 1
        try:
            return await self._evaluate(task_json, run_dir, source, on_stage)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the contract: a recorded failure, never an exception
            import traceback

            return EvalResult("crash", "static", f"internal error in the evaluator: {type(e).__name__}: "
                              f"{_one_line(str(e), 200)}", log=traceback.format_exc())
        finally:
            self.stats["in_flight"] -= 1
            self.stats["evaluations"] += 1

    async def _evaluate(self, task_json: dict, run_dir: str, source: str, on_stage) -> EvalResult:
        from kforge_tui.sandbox.compile import compile_candidate
        from kforge_tui.sandbox.static import check_source
        from kforge_tui.workload import catalogue

        stage_s: dict[str, float] = {}
        try:
            tj = self._task_json(task_json)
            task = Task.from_json(tj)
            sig = catalogue.signature(task, self.backend)
        except Exception as e:
            return EvalResult("static_error", "static", f"bad task: {_one_line(str(e), 200)}")
        if not isinstance(source, str):
            return EvalResult("static_error", "static", f"source is {type(source).__name__}, not text")

        # -- static (in-process: parsing only, no candidate code runs)
        if on_stage:
            await _call(on_stage, "static")
        t = time.perf_counter()
        rep = check_source(source, sig)
        stage_s["static"] = time.perf_counter() - t
        if not rep.ok:
            diags = list(getattr(rep, "diagnostics", []) or [])
            first = diags[0].text() if diags else "static check failed"
            more = f" (+{len(diags) - 1} more)" if len(diags) > 1 else ""
            return EvalResult("static_error", "static", _one_line(first + more), log=rep.text(),
                              error_line=rep.first_line, stage_s=stage_s)

        # -- compile (subprocess)
        if on_stage:
            await _call(on_stage, "compile")
        await self.start()
        assert self._compile_sem is not None
        t = time.perf_counter()
        async with self._compile_sem:
            stage_s["compile_queue"] = time.perf_counter() - t  # waiting for a compile slot
            t = time.perf_counter()
            cr = await compile_candidate(source, self.backend, self.arch, self.cache_dir,
                                         self.compile_timeout_s)
        stage_s["compile"] = time.perf_counter() - t
        base = dict(resources=dict(cr.resources or {}), compile_s=cr.seconds, cached=bool(cr.cached),
                    stage_s=stage_s)
        if not cr.ok:
            if cr.timed_out:
                return EvalResult("timeout", "compile",
                                  _one_line(cr.message or f"compile timed out after {self.compile_timeout_s:g} s"),
                                  log=cr.log, error_line=cr.error_line, **base)
            return EvalResult("compile_error", "compile", _one_line(cr.message or "compile failed"),
                              log=cr.log, error_line=cr.error_line, **base)

        # -- load, verify, time in a worker
        if on_stage:
            await _call(on_stage, "load")
        t = time.perf_counter()
        last = ["load"]

        async def on_event(stage: str) -> None:
            last[0] = stage
            if on_stage:
                await _call(on_stage, stage)

        rep, failure, _w, queued = await self._run_on_worker(
            tj, run_dir, {"cmd": "evaluate", "lib_path": str(cr.lib_path)}, self.eval_timeout_s, on_event,
            capture_id=Task.from_json(task_json).task_id)
        stage_s["queue"] = queued
        if failure:
            kind, _, text = failure.partition(":")
            first, _, rest = text.partition("\n")
            stage_s["worker"] = time.perf_counter() - t - queued
            return EvalResult(kind, "load" if "preparing" in first else last[0],
                              _one_line(first if kind == "timeout" else
                                        f"{first}: {_last_line(rest)}" if rest.strip() else first),
                              log=(cr.log or "") + "\n--- worker stderr (tail) ---\n" + rest, **base)
        if not rep.get("ok"):
            return EvalResult("crash", "load", _one_line(f"worker error: {rep.get('error')}"),
                              log=rep.get("_stderr", ""), **base)
        r = rep["result"]
        stage_s.update(r.get("stage_s") or {})
        log = "\n".join(x for x in (cr.log, r.get("log", ""), rep.get("_stderr") and
                                    "--- worker stderr ---\n" + rep["_stderr"]) if x)
        mm = r.get("mismatch")
        return EvalResult(r["status"], r["stage"], _one_line(r.get("message", "")), log=log,
                          mismatch=Mismatch(**mm) if mm else None,
                          timing=Timing(**r["timing"]) if r.get("timing") else None,
                          baseline=Timing(**r["baseline"]) if r.get("baseline") else None,
                          floor_us=r.get("floor_us"), **base)


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


def _gpu_count() -> int:
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except Exception:
        return 1
