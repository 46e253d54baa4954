"""The evaluator pool: submit a candidate, get an EvalResult - never an exception.

    static check (in-process: it only parses) -> compile + binary check (subprocess; up to
    compile_jobs at once) -> one worker: load -> verify -> time (in a fresh runner process)

One long-lived worker (a supervisor, sandbox/worker.py) per GPU on cuda, a small pool on cpu
(default 1: timing on a small box needs its cores). Candidates that have compiled queue for a
free worker while others compile. Neither the engine nor the supervisor ever loads candidate
code: each candidate runs in a fresh runner process the supervisor starts, so a crash, a hang
(killed at its deadline, `eval_deadline`: "timeout") or a sticky CUDA error costs one runner,
not the prepared input sets. The supervisor itself is killed and restarted only if it stops
answering (that deadline + SUPERVISOR_GRACE_S) or dies, and recycled every `restart_every` evaluations.

Triton (`EvaluatorPool("triton")`, issue 13): the static check is `triton_check.check_source`
(Python's ast, in this process: no candidate code runs here; a failure is "static_error" with the
first diagnostic, as for C). There is no compiler: the checked source is written once to
`cache_dir/triton/src/<sha256>.py` and its path (`source_path`) goes to a worker, whose runner
loads it with Triton (JIT in the load stage; `compile_s` is the JIT time). Stages: static ->
load -> verify -> time. Workers use the GPU when one is visible (one per GPU); else one worker
runs on the CPU with TRITON_INTERPRET=1 set in its environment only (CI; `device="cpu"` forces
it). `baseline()` asks a triton worker for the seed: on a GPU `Baseline.seed` is Inductor's
kernel for the region on the candidate ABI (`inductor_seed.Seed.to_json()`), None on the CPU.

Memory (issue 14): an evaluation that cannot run for lack of memory, even with one input set,
comes back as status "infra_error": not a candidate failure (result.INFRA_STATUSES).

Deadline (`eval_deadline`): eval_timeout_s is what a small region's evaluation gets; a region
whose input sets fill an arena the checks must hash gets more, in proportion to the arena's
bytes (the worker reports them when it prepares the task), so a GiB-sized region is not
"timeout" for the harness's own work. A timeout's message gives the deadline and the bytes.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from kforge_tui.regions.task import Task
from kforge_tui.sandbox import settings
from kforge_tui.sandbox.result import Baseline, EvalResult, EvaluatorLost, Mismatch, Timing
from kforge_tui.sandbox.trampoline import die_with_parent

STDERR_TAIL_LINES = 200
READY_TIMEOUT_S = 180.0  # importing torch (and creating a CUDA context) on a cold box
SUPERVISOR_GRACE_S = 60.0  # beyond a candidate's own deadline before the supervisor is killed
BACKENDS = ("cpu", "cuda", "triton")  # candidate languages

# Seconds per GiB of arena for one checked call, by where candidates run. Past ArenaWatch's
# COPY_LIMIT (inputs.py) every checked call hashes every byte of the arena (`checksum`: the
# integrity check against state kept in slack, not to be skipped); under it the arena is
# compared with an image at memory speed, which the base deadline covers. cpu, measured on the
# 2-core CI box (2026-12-07, shared: load average 4-6): `checksum` alone 4.6-5.1 s/GiB idle,
# 20.7 loaded (eager int64 passes); whole evaluations of a float32 embedding table (4 sets,
# honest kernel), 262144x256 (1.0 GiB arena): 384 s and 369 s, 364 s and 348 s of it in the
# arena watch over 27-28 checked calls; 131072x256 (0.5 GiB): 266 s, 249 s over 26 calls. That
# is 13-19 s a GiB-call; 20 covers the worst. That was the eager hash, still the rate where
# Inductor cannot compile it (no C++ compiler) or where it is not known (EAGER_CHECK_S_PER_GIB).
# The compiled hash (`inputs.warm_checksum`, reported by the worker at prepare): the same
# 262144x256 table (4 sets, 2.03 GiB arena), same box, 2026-12-07, two honest candidates:
# 19-36 s an evaluation, 4.4 s of it in the arena watch over 23 checked calls (0.09 s a
# GiB-call in the watch, 0.4 whole); 3 is ~7x that whole figure, for a loaded box.
# cuda: one compiled pass at memory speed.
CHECK_S_PER_GIB = {"cpu": 3.0, "cuda": 0.5}
EAGER_CHECK_S_PER_GIB = 20.0
# Checked calls of one evaluation at most, beside 2 per input set (verification: each set once,
# up to as many again): edge cases 5, replays 4 + 6 + 4, the float64 check 1, and every timed
# call of a long-running region (warm-up and MIN_SAMPLES) 8. The counts are drawn per candidate;
# the measured evaluation above made 27 with 4 sets.
CHECKED_CALLS = 28
WATCH_COPY_LIMIT = 256 << 20  # inputs.ArenaWatch.COPY_LIMIT (not imported: the pool stays torch-free)


def eval_deadline(base_s: float, arena_bytes: int, sets: int = 1, device: str = "cpu",
                  s_per_gib: float | None = None, hash_compiled: bool | None = None) -> float:
    """Seconds a candidate's evaluation may take: `base_s`, plus, for an arena the checks must
    hash on every call, its GiB times the checked calls times `s_per_gib` (unless given:
    CHECK_S_PER_GIB of the device, on the cpu only where the worker said its hash is compiled,
    else EAGER_CHECK_S_PER_GIB; 0 keeps the deadline at `base_s`). A fixed deadline made every
    candidate of a GiB-sized region "timeout" in the harness's own checks (the arena watch of a
    1 GiB embedding table alone took 53 s of 60)."""
    if s_per_gib is not None:
        per = s_per_gib
    elif device == "cuda":
        per = CHECK_S_PER_GIB["cuda"]
    else:
        per = CHECK_S_PER_GIB["cpu"] if hash_compiled else EAGER_CHECK_S_PER_GIB
    if not arena_bytes or arena_bytes <= WATCH_COPY_LIMIT or per <= 0:
        return float(base_s)
    extra = per * arena_bytes / 2**30 * (CHECKED_CALLS + 2 * max(1, sets))
    return float(math.ceil(base_s + extra))  # whole seconds: a verdict says "after 540 s"


def describe_deadline(deadline_s: float, base_s: float | None = None, arena_bytes: int | None = None,
                      sets: int | None = None) -> str:
    """The deadline a timed-out candidate had and what it was made of, for its verdict: the
    user sees how big the input sets were and whether the time went to the harness's checks."""
    text = f"no result after {deadline_s:g} s"
    if base_s is None or not arena_bytes:
        return text
    size = f"{arena_bytes / 2**30:.3g} GiB" if arena_bytes >= 2**30 else f"{arena_bytes / 2**20:.3g} MiB"
    of = f" of {sets} input set{'s' if sets != 1 else ''}" if sets else ""
    if deadline_s > base_s:
        return (f"{text} (deadline {base_s:g} s + {deadline_s - base_s:.0f} s for checks that hash the "
                f"{size} arena{of} on every call)")
    return f"{text} (deadline {base_s:g} s; a {size} arena{of})"


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

    def __init__(self, backend: str, device: int, cache_dir: str | None = None,
                 env: dict | None = None):
        self.backend = backend
        self.device = device
        self.cache_dir = cache_dir
        self.env = env or {}  # set (value) or removed (None) in the worker's environment
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.lines_seen = 0
        self.evaluations = 0
        self.prepared: set[str] = set()
        # task id -> (arena bytes, sets, hash compiled or None: not said), from prepare
        self.sizes: dict[str, tuple[int, int, bool | None]] = {}
        self.info: dict = {}
        self._next = 1
        self._stderr_task: asyncio.Task | None = None
        self.inductor_dir: str | None = None

    async def spawn(self) -> None:
        # The worker dies with the process that spawned it (PR_SET_PDEATHSIG, set before the
        # worker module runs): an owner killed with `kill -9` left its workers running under
        # init. Its zygote and runners follow when their sockets to it close.
        cmd = die_with_parent("kforge_tui.sandbox.worker", "--backend", self.backend, "--device", str(self.device))
        if self.cache_dir:
            cmd += ["--cache-dir", str(self.cache_dir)]
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Inductor's own cache, private to this worker process: Inductor links its C++ kernels
        # straight to their final path in the cache, so a worker killed mid-compile (a timeout,
        # or close() on a busy worker) would leave a truncated .so that every later process
        # with the same graph fails to load ("file too short"), the user's own torch.compile
        # included. The baselines a worker compiles are kept in its memory anyway.
        self._drop_inductor_dir()
        self.inductor_dir = tempfile.mkdtemp(prefix="kforge-inductor-")
        env["TORCHINDUCTOR_CACHE_DIR"] = self.inductor_dir
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, limit=64 * 2**20, start_new_session=True)
        self.prepared = set()
        self.sizes = {}
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

    def note_sizes(self, tid: str, rep: dict) -> None:
        """What a prepare reply says of the task's sets (the deadline follows their bytes)."""
        if rep.get("arena_bytes"):
            self.sizes[tid] = (int(rep["arena_bytes"]), int(rep.get("sets") or 1), rep.get("hash_compiled"))

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
        self._drop_inductor_dir()

    def _drop_inductor_dir(self) -> None:
        if self.inductor_dir:
            shutil.rmtree(self.inductor_dir, ignore_errors=True)
            self.inductor_dir = None

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
                 restart_every: int = 500, prepare_timeout_s: float = 600.0,
                 memory: dict | None = None, device: str | None = None,
                 eval_s_per_gib: float | None = None):
        if backend not in BACKENDS:
            from kforge_tui.errors import UsageError

            raise UsageError(f"backend must be cpu, cuda or triton, not {backend!r}")
        self.backend = backend
        # where candidates run: cpu | cuda; Triton on the GPU when one is visible, else on the
        # CPU under Triton's interpreter (`device` forces one: tests)
        if device is not None and device not in ("cpu", "cuda"):
            from kforge_tui.errors import UsageError

            raise UsageError(f"device must be cpu or cuda, not {device!r}")
        self.device_kind = device or (triton_device() if backend == "triton" else backend)
        settings.check_worker_settings()
        self.n_workers = workers
        self.cache_dir = Path(cache_dir)
        self.compile_jobs = compile_jobs or os.cpu_count() or 1
        # a small region's deadline; one whose sets fill a hashed arena gets more (eval_deadline),
        # eval_s_per_gib seconds a GiB-call (None: the device's CHECK_S_PER_GIB; 0: fixed deadline)
        self.eval_timeout_s = eval_timeout_s
        self.eval_s_per_gib = eval_s_per_gib
        self.compile_timeout_s = compile_timeout_s
        self.prepare_timeout_s = prepare_timeout_s
        self.arch = arch
        self.timing = timing or {}
        self.restart_every = restart_every
        self.memory = memory or {}  # {"free_bytes": n, "limit_bytes": n}: memory knobs (tests)
        self.stats: dict = {"evaluations": 0, "restarts": 0, "in_flight": 0, "timeouts": 0, "crashes": 0,
                            "infra_errors": 0}
        self._workers: list[_Worker] = []
        self._idle: asyncio.Queue[_Worker] | None = None
        self._compile_sem: asyncio.Semaphore | None = None
        self._started = False
        self._start_lock = asyncio.Lock()
        # Set by a caller running several pools on the same GPUs (cuda and triton): one
        # evaluation per GPU across them, held only while a worker runs it - static checks and
        # compiles stay parallel.
        self.device_gate: asyncio.Semaphore | None = None
        # Triton's JIT ahead of the worker (GPU only: the interpreter compiles nothing). On by
        # default since its server warms up before forking: side by side on one H100
        # (2026-12-06, eval_throughput --backend triton --n 96 --in-flight 8) 111.5 candidates/min
        # against 80.0 with the runner's own JIT (0.42 s there), latency 3.2 s against 5.8.
        # KFORGE_TRITON_COMPILE_AHEAD=0 turns it off.
        self._precompiler = None
        self._precompiler_start: asyncio.Future | None = None  # its start and warm-up, begun by start()
        if backend == "triton" and self.device_kind == "cuda" and settings.worker_setting("KFORGE_TRITON_COMPILE_AHEAD", True):
            from kforge_tui.sandbox.triton_precompile import Precompiler

            self._precompiler = Precompiler(self.cache_dir)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            n = self.n_workers
            if n is None:
                n = _gpu_count() if self.device_kind == "cuda" else 1
            n = max(1, n)
            self._idle = asyncio.Queue()
            self._compile_sem = asyncio.Semaphore(self.compile_jobs)
            env = {}
            if self.backend == "triton":  # the interpreter exactly when candidates run on the CPU
                env["TRITON_INTERPRET"] = "1" if self.device_kind == "cpu" else None
            ws = [_Worker(self.backend, i if self.device_kind == "cuda" else 0, str(self.cache_dir.resolve()),
                          env=env)
                  for i in range(n)]
            await asyncio.gather(*(w.spawn() for w in ws))
            for w in ws:
                self._workers.append(w)
                self._idle.put_nowait(w)
            if self.arch is None:
                self.arch = ws[0].info.get("arch") or ("native" if self.device_kind == "cpu" else None)
            if self._precompiler is not None:
                self._precompiler.arch = self.arch
                self._precompiler_start = asyncio.ensure_future(self._precompiler.start())
            self._started = True

    async def close(self) -> None:
        if self._precompiler is not None:
            if self._precompiler_start is not None:  # a start still under way is not waited for
                self._precompiler_start.cancel()
                await asyncio.gather(self._precompiler_start, return_exceptions=True)
            await self._precompiler.close()
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
    async def _take_worker(self) -> "_Worker":
        """An idle worker, and the device gate (when set) for as long as it is held."""
        assert self._idle is not None
        if self.device_gate is not None:
            await self.device_gate.acquire()
        try:
            return await self._idle.get()
        except BaseException:
            if self.device_gate is not None:
                self.device_gate.release()
            raise

    def _give_back(self, w: "_Worker") -> None:
        assert self._idle is not None
        self._idle.put_nowait(w)
        if self.device_gate is not None:
            self.device_gate.release()

    async def _run_on_worker(self, tj: dict, run_dir: str, payload: dict, timeout: float,
                             on_event=None, capture_id: str | None = None) -> tuple[dict | None, str, _Worker | None, float]:
        """(reply, failure, worker, queued_s): failure is "", "timeout:<text>" or "crash:<text>"."""
        await self.start()
        assert self._idle is not None
        t0 = time.perf_counter()
        w = await self._take_worker()
        queued = time.perf_counter() - t0
        try:
            if w.proc is None or w.proc.returncode is not None:
                await self._restart(w)
            tid = Task.from_json(tj).task_id
            prep_s = 0.0
            if tid not in w.prepared:
                tp = time.perf_counter()
                try:
                    rep = await w.request({"cmd": "prepare", "task": tj, "run_dir": run_dir,
                                           "cache_dir": str(self.cache_dir), "timing": self.timing,
                                           "memory": self.memory, "capture_id": capture_id},
                                          self.prepare_timeout_s)
                except asyncio.TimeoutError:
                    await self._restart(w)
                    return None, f"timeout:preparing the task took over {self.prepare_timeout_s:g} s", w, queued
                except WorkerDied as e:
                    await self._restart(w)
                    return None, f"crash:{e} while preparing the task\n{e.tail}", w, queued
                if not rep.get("ok"):
                    kind = "infra_error" if rep.get("infra") else "crash"
                    return None, f"{kind}:worker could not prepare the task: {rep.get('error')}", w, queued
                w.prepared.add(tid)
                w.note_sizes(tid, rep)
                prep_s = time.perf_counter() - tp
            base_s = timeout
            arena_bytes, sets, hashed = w.sizes.get(tid, (0, 1, None))
            if payload.get("cmd") == "evaluate":
                timeout = eval_deadline(base_s, arena_bytes, sets, self.device_kind, self.eval_s_per_gib, hashed)
            since = w.lines_seen
            try:
                rep = await w.request({**payload, "task": tj, "run_dir": run_dir,
                                       "cache_dir": str(self.cache_dir), "timing": self.timing,
                                       "memory": self.memory, "capture_id": capture_id,
                                       "deadline_s": timeout, "deadline_base_s": base_s},
                                      timeout + SUPERVISOR_GRACE_S, on_event)
            except asyncio.TimeoutError:
                tail = w.tail_text(since)
                self.stats["timeouts"] += 1
                await self._restart(w)
                said = describe_deadline(timeout, base_s, arena_bytes or None, sets)
                return None, (f"timeout:{said}, nor in the {SUPERVISOR_GRACE_S:g} s grace after it; worker "
                              f"killed and restarted\n{tail}"), w, queued
            except WorkerDied as e:
                self.stats["crashes"] += 1
                await self._restart(w)
                return None, f"crash:{e}\n{e.tail}", w, queued
            rep["_stderr"] = w.tail_text(since)
            rep["_prepare_s"] = prep_s  # the task's sets, references and baselines, once per worker
            if rep.get("result", {}).get("fatal"):
                self.stats["crashes"] += 1
                await self._restart(w)
            return rep, "", w, queued
        finally:
            if payload.get("cmd") == "evaluate":
                w.evaluations += 1
                if w.evaluations >= self.restart_every and w.proc is not None:
                    await self._restart(w)
            self._give_back(w)

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
        w = await self._take_worker()
        tid = Task.from_json(tj).task_id
        no_seed = None  # why Inductor's seed was given up, on the second try
        try:
            while True:
                if w.proc is None or w.proc.returncode is not None:
                    await self._restart(w)
                hung = False
                try:
                    rep = await w.request({"cmd": "prepare", "task": tj, "run_dir": run_dir,
                                           "cache_dir": str(self.cache_dir), "timing": self.timing,
                                           "with_compile": with_compile, "memory": self.memory,
                                           "seed": self.backend == "triton", "no_seed": no_seed,
                                           "capture_id": Task.from_json(task_json).capture_id},
                                          self.prepare_timeout_s)
                except (asyncio.TimeoutError, WorkerDied) as e:
                    # a hang or a crash: not something a second try without the seed would mend
                    rep, hung = {"ok": False, "error": str(e) or "timeout"}, True
                if rep.get("ok"):
                    w.note_sizes(tid, rep)
                    break
                # a failure on the device may have left the worker's CUDA context unusable (a
                # device-side assert is sticky): the next attempt or task gets a fresh worker
                await self._restart(w)
                if (self.backend == "triton" and no_seed is None and not rep.get("infra")
                        and not hung):
                    # running Inductor's kernels apart from its wrapper (the seed) is the riskiest
                    # part of a Triton baseline: try once more with torch.compile's whole call,
                    # so the region is still searched (without a seed) rather than lost
                    no_seed = str(rep.get("error"))[:200]
                    continue
                what = " (out of memory: an infrastructure limit, not the task)" if rep.get("infra") else ""
                raise WorkFailed(f"baseline of {tid} failed{what}: {rep.get('error')}")
            w.prepared.add(tid)
        finally:
            self._give_back(w)
        b = rep["baseline"]
        return Baseline(eager=Timing(**b["eager"]),
                        compiled=Timing(**b["compiled"]) if b.get("compiled") else None,
                        floor_us=b.get("floor_us"), floor_note=b.get("floor_note", ""),
                        bandwidth_gbs=b.get("bandwidth_gbs"), peak_tflops=b.get("peak_tflops"),
                        floor_bound=b.get("floor_bound", ""), sets=b.get("sets"), note=b.get("note", ""),
                        seed=b.get("seed"), eager_of=b.get("eager_of", ""))

    def _task_json(self, task_json: dict) -> dict:
        return Task.from_json(task_json).with_backend(self.backend).to_json()

    async def evaluate(self, task_json: dict, run_dir: str, source: str, on_stage=None) -> EvalResult:
        return await recorded(self.stats, self._evaluate(task_json, run_dir, source, on_stage))

    async def _evaluate(self, task_json: dict, run_dir: str, source: str, on_stage) -> EvalResult:
        built = await build_candidate(self.backend, task_json, source, target=self._compile_target,
                                      cache_dir=self.cache_dir, compile_timeout_s=self.compile_timeout_s,
                                      on_stage=on_stage)
        if isinstance(built, EvalResult):
            return built
        tj = self._task_json(task_json)
        cache = await self._compile_ahead(tj, built, on_stage)
        try:
            return await self._run_built(tj, task_json, run_dir, built.code, on_stage, built.base, built.log)
        finally:
            if cache:
                self._precompiler.discard(cache)

    async def _compile_ahead(self, tj: dict, built: "Built", on_stage) -> str | None:
        """Triton on a GPU: compile the candidate's kernels before it queues for the worker
        (sandbox/triton_precompile.py), so the GPU's one evaluation slot no longer waits for
        Triton's JIT. The runner links the directory returned here into its cache; None (no
        GPU, off, or the compile ahead failed) leaves the JIT to the runner, as before."""
        if self._precompiler is None:
            return None
        if on_stage:
            await _call(on_stage, "compile")
        task = Task.from_json(tj)
        t = time.perf_counter()
        cache, rep = await self._precompiler.compile(built.code["source_path"], [m.to_json() for m in task.inputs],
                                                     [m.to_json() for m in task.outputs])
        built.base["stage_s"]["compile_ahead"] = time.perf_counter() - t
        if cache:
            built.code["precompiled"] = cache
            built.base["compile_s"] = rep.get("seconds")  # the JIT, done here: the runner's is a load
        return cache

    async def _compile_target(self) -> tuple[str | None, asyncio.Semaphore | None]:
        """(arch, compile slots), known once the workers run: the target is the first worker's."""
        await self.start()
        return self.arch, self._compile_sem

    async def evaluate_built(self, task_json: dict, run_dir: str, lib_path: str, on_stage=None) -> EvalResult:
        """Load, verify and time an already built library (no source or binary check): the
        runtime defences on their own, for tests and for a second opinion on a kept library.
        On the triton backend `lib_path` is a candidate's Python file (the worker's loader
        still checks it: it never trusts the wire)."""
        self.stats["in_flight"] += 1
        try:
            tj = self._task_json(task_json)
            code = {"source_path" if self.backend == "triton" else "lib_path": str(lib_path)}
            return await self._run_built(tj, task_json, run_dir, code, on_stage, {"stage_s": {}}, "")
        finally:
            self.stats["in_flight"] -= 1
            self.stats["evaluations"] += 1

    async def _run_built(self, tj: dict, task_json: dict, run_dir: str, code: dict, on_stage,
                         base: dict, compile_log: str) -> EvalResult:
        stage_s = base["stage_s"]
        if on_stage:
            await _call(on_stage, "load")
        t = time.perf_counter()
        last = ["load"]

        async def on_event(stage: str) -> None:
            last[0] = stage
            if on_stage:
                await _call(on_stage, stage)

        rep, failure, w, queued = await self._run_on_worker(
            tj, run_dir, {"cmd": "evaluate", **code}, self.eval_timeout_s, on_event,
            capture_id=Task.from_json(task_json).capture_id)
        stage_s["queue"] = queued
        if w is not None:
            base["worker"] = f"local/{self.device_kind}{w.device}"
        if failure:
            kind, _, text = failure.partition(":")
            if kind == "infra_error":
                self.stats["infra_errors"] += 1
            first, _, rest = text.partition("\n")
            stage_s["worker"] = time.perf_counter() - t - queued
            return EvalResult(kind, "load" if "preparing" in first else last[0],
                              _one_line(first if kind == "timeout" else
                                        f"{first}: {_last_line(rest)}" if rest.strip() else first),
                              log=compile_log + "\n--- worker stderr (tail) ---\n" + rest, **base)
        if not rep.get("ok"):
            return EvalResult("crash", "load", _one_line(f"worker error: {rep.get('error')}"),
                              log=rep.get("_stderr", ""), **base)
        r = rep["result"]
        worker_s = r.get("stage_s") or {}
        stage_s.update(worker_s)
        if rep.get("_prepare_s"):
            stage_s["prepare"] = rep["_prepare_s"]
        # the request's way there and back (pipes, JSON, this loop's turn), outside the worker's own
        stage_s["channel"] = max(0.0, time.perf_counter() - t - queued - (rep.get("_prepare_s") or 0.0)
                                 - sum(v for k, v in worker_s.items() if k != "jit"))
        if r.get("jit_s") is not None and base.get("compile_s") is None:
            base["compile_s"] = r["jit_s"]  # Triton: its JIT, done in the load stage
        if r.get("status") == "infra_error":
            self.stats["infra_errors"] += 1
        log = "\n".join(x for x in (compile_log, r.get("log", ""), rep.get("_stderr") and
                                    "--- worker stderr ---\n" + rep["_stderr"]) if x)
        mm = r.get("mismatch")
        return EvalResult(r["status"], r["stage"], _one_line(r.get("message", "")), log=log,
                          mismatch=Mismatch(**mm) if mm else None,
                          timing=Timing(**r["timing"]) if r.get("timing") else None,
                          baseline=Timing(**r["baseline"]) if r.get("baseline") else None,
                          compiled=Timing(**r["compiled"]) if r.get("compiled") else None,
                          floor_us=r.get("floor_us"), checks=r.get("checks") or {}, **base)


async def recorded(stats: dict, evaluation) -> EvalResult:
    """The Evaluator contract around one evaluation: counted in `stats`, and an evaluator's own
    bug a recorded failure, never an exception (cancellation and EvaluatorLost go through)."""
    stats["in_flight"] += 1
    try:
        return await evaluation
    except (asyncio.CancelledError, EvaluatorLost):
        raise
    except Exception as e:
        import traceback

        return EvalResult("crash", "static", f"internal error in the evaluator: {type(e).__name__}: "
                          f"{_one_line(str(e), 200)}", log=traceback.format_exc())
    finally:
        stats["in_flight"] -= 1
        stats["evaluations"] += 1


@dataclass
class Built:
    """A candidate past its static check, compile and binary check, ready for a worker: what
    the local pool hands its workers and what cluster/ sends to a remote one."""

    code: dict  # {"lib_path": ...} (C/C++/CUDA) or {"source_path": ...} (Triton)
    base: dict  # EvalResult fields known so far: resources, compile_s, cached, stage_s
    log: str = ""  # the compiler's output


def _static_failure(rep, stage_s: dict) -> EvalResult:
    diags = list(getattr(rep, "diagnostics", []) or [])
    first = diags[0].text() if diags else "static check failed"
    more = f" (+{len(diags) - 1} more)" if len(diags) > 1 else ""
    return EvalResult("static_error", "static", _one_line(first + more), log=rep.text(),
                      error_line=rep.first_line, stage_s=stage_s)


async def build_candidate(backend: str, task_json: dict, source: str, *, target, cache_dir: str | Path,
                          compile_timeout_s: float = 120.0, on_stage=None) -> Built | EvalResult:
    """The CPU half of an evaluation: static check (parsing only: no candidate code runs) ->
    compile + binary check (a subprocess; C/C++/CUDA) or the checked source into the cache
    (Triton). A `Built` to hand a worker, or the failure as an EvalResult. Kept apart from the
    pool so the same checks run wherever candidates are built (here, or a Ray CPU task).

    `target()` is awaited only once the static check passed and gives (arch, compile slots or
    None): the local pool starts its workers there, so a static error costs no worker."""
    from contextlib import nullcontext

    stage_s: dict[str, float] = {}
    try:
        task = Task.from_json(task_json).with_backend(backend)
        sig = task.signature(backend)
        header = task.header(backend) if backend != "triton" else ""
    except Exception as e:
        return EvalResult("static_error", "static", f"bad task: {_one_line(str(e), 200)}")
    if not isinstance(source, str):
        return EvalResult("static_error", "static", f"source is {type(source).__name__}, not text")
    if backend == "triton":
        from kforge_tui.sandbox.triton_check import check_source
    else:
        from kforge_tui.sandbox.static import check_source

    # -- static (in-process: parsing only; Triton: Python's ast)
    if on_stage:
        await _call(on_stage, "static")
    t = time.perf_counter()
    rep = check_source(source, sig)
    stage_s["static"] = time.perf_counter() - t
    if not rep.ok:
        return _static_failure(rep, stage_s)
    arch, compile_sem = await target()
    if backend == "triton":  # no compiler: the worker's loader JITs the checked source
        resources = {"scratch_bytes": rep.scratch_bytes} if rep.scratch_bytes else {}
        return Built({"source_path": str(store_source(cache_dir, source))},
                     dict(resources=resources, stage_s=stage_s))

    # -- compile (subprocess)
    from kforge_tui.sandbox.compile import compile_candidate

    if on_stage:
        await _call(on_stage, "compile")
    t = time.perf_counter()
    async with compile_sem or nullcontext():
        stage_s["compile_queue"] = time.perf_counter() - t  # waiting for a compile slot
        t = time.perf_counter()
        cr = await compile_candidate(source, backend, arch, cache_dir, compile_timeout_s, header=header)
    stage_s["compile"] = time.perf_counter() - t
    if cr.check_seconds is not None:  # the binary check (ELF, instructions): a stage of its own
        stage_s["binary_check"] = cr.check_seconds
        stage_s["compile"] = max(0.0, stage_s["compile"] - cr.check_seconds)
    base = dict(resources=dict(cr.resources or {}), compile_s=cr.seconds, cached=bool(cr.cached),
                stage_s=stage_s)
    if not cr.ok:
        if cr.timed_out:
            return EvalResult("timeout", "compile",
                              _one_line(cr.message or f"compile timed out after {compile_timeout_s:g} s"),
                              log=cr.log, error_line=cr.error_line, **base)
        if getattr(cr, "stage", "compile") == "link-check":  # the binary check refused it
            return EvalResult("static_error", "static", _one_line(cr.message or "binary check failed"),
                              log=cr.log, error_line=cr.error_line, **base)
        return EvalResult("compile_error", "compile", _one_line(cr.message or "compile failed"),
                          log=cr.log, error_line=cr.error_line, **base)
    return Built({"lib_path": str(cr.lib_path)}, base, cr.log or "")


def store_source(cache_dir: str | Path, source: str) -> Path:
    """cache_dir/triton/src/<sha256>.py, written once (atomic rename, owner-only)."""
    import hashlib

    d = Path(cache_dir) / "triton" / "src"
    d.mkdir(parents=True, exist_ok=True)
    data = source.encode("utf-8", errors="surrogatepass")
    path = d / f"{hashlib.sha256(data).hexdigest()}.py"
    if path.exists():
        return path
    tmp = d / f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


def triton_device() -> str:
    """Where Triton candidates run: "cuda" when a GPU is visible (and the interpreter is not
    asked for), else "cpu" under Triton's interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False"):
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def _gpu_count() -> int:
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except Exception:
        return 1
