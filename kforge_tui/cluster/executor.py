"""RayEvaluator: the engine's evaluator when a run says `--cluster ray` (see the package doc).

Slots. Every alive node gets one EvalActor per GPU (`num_gpus=1`; on the CPU one per node),
pinned there with NodeAffinitySchedulingStrategy; each slot reads its device facts and is
refused, with the reason in the run log, unless they are the run's (facts.mismatch). Slots
wait in one queue; a candidate is built by a Ray CPU task on an accepted node, then taken by
the first free slot, which verifies and times it next to its eager (and torch.compile)
baselines. The watcher (every REFRESH_S) admits nodes that join, drops slots whose node left,
and replaces a slot whose actor died on a node that is still there (at most REPLACE_MAX times).

Faults. A Ray system error (actor or node died, object lost, worker crashed) or no answer by
the deadline means the slot is gone: it is killed and never queued again, and the candidate is
taken by the next free slot. A candidate that loses MAX_ATTEMPTS slots in a row (one that kills
whatever runs it) comes back as infra_error: not charged. When no slot is left, or the cluster
stops answering, for `wait_s` (KFORGE_CLUSTER_WAIT_S, default 120 s) evaluate and baseline
raise EvaluatorLost and the engine stops the run; `kforge resume` continues it.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from kforge_tui.cluster.facts import PROBE_TIMEOUT_S, collect, describe, mismatch
from kforge_tui.errors import UsageError, WorkFailed
from kforge_tui.regions.task import Task
from kforge_tui.sandbox.pool import (READY_TIMEOUT_S, SUPERVISOR_GRACE_S, _call, _one_line, eval_deadline,
                                     recorded)
from kforge_tui.sandbox.result import Baseline, EvalResult, EvaluatorLost, Timing

NAMESPACE = "kforge"


def ray_address(spec: str) -> str:
    """What ray.init is given for a parsed `--cluster` value."""
    return (os.environ.get("RAY_ADDRESS") or "auto") if spec == "ray" else spec

CONNECT_TIMEOUT_S = 45.0  # ray.init to an address nobody answers at would wait for minutes
REFRESH_S = 5.0
MAX_ATTEMPTS = 3
REPLACE_MAX = 3  # new actors for one node whose actors keep dying
DEFAULT_WAIT_S = 120.0


def _ray():
    # Ray's auto-init starts or joins *some* cluster on any API call made while disconnected
    # (a Ray Client past its reconnect grace period): a ray.kill of a lost slot then blocked the
    # event loop in ray.init. This process connects only through connect_ray.
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    try:
        import ray
    except ImportError:
        raise UsageError("--cluster ray needs Ray on this machine: pip install 'kforge-tui[ray]'") from None
    return ray


def _where(spec: str) -> str:
    addr = ray_address(spec)
    return "this machine (ray start)" if addr == "auto" else addr


def _reachable(address: str) -> str:
    """"" when something listens at HOST:PORT (or the address is `auto`), else why not: a
    GCS address nobody answers at makes ray.init wait for minutes."""
    if address in ("auto", "local"):
        return ""
    hostport = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return f"{address!r} is not HOST:PORT"
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        return e.strerror or str(e)
    return ""


def connect_ray(spec: str, device: str) -> bool:
    """ray.init to the cluster a parsed `--cluster` names (a UsageError, one line, when it
    cannot be reached or cannot run --device); True when this call connected."""
    ray = _ray()
    where = _where(spec)
    owned = False
    if not ray.is_initialized():
        address = ray_address(spec)
        why = _reachable(address)
        if why:
            raise UsageError(f"cannot reach the Ray cluster at {where}: {why}")
        # the driver must outlive a head that stops answering long enough to stop the run cleanly
        os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(int(wait_s_default() + 120)))
        _init(ray, address, where)
        owned = True
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if device == "cuda" and not any(n.get("Resources", {}).get("GPU", 0) >= 1 for n in nodes):
        raise UsageError(f"--device cuda: no node of the Ray cluster at {where} has a GPU "
                         f"({len(nodes)} node{'s' * (len(nodes) != 1)} alive, none with a GPU)")
    if device == "cpu" and not any(n.get("Resources", {}).get("CPU", 0) >= 1 for n in nodes):
        raise UsageError(f"no node of the Ray cluster at {where} offers a CPU to evaluate on")
    return owned


def _init(ray, address: str, where: str, tries: int = 3) -> None:
    """ray.init with a deadline (a thread: ray.init has none of its own). A Ray Client server
    that answered but failed to start this client's session (its per-client server died at
    start, seen on loaded machines) is asked again."""
    import concurrent.futures as cf

    for attempt in range(tries):
        ex = cf.ThreadPoolExecutor(max_workers=1)
        fut = ex.submit(ray.init, address=address, namespace=NAMESPACE, log_to_driver=False,
                        logging_level="ERROR")
        ex.shutdown(wait=False)
        try:
            fut.result(timeout=CONNECT_TIMEOUT_S)
            return
        except cf.TimeoutError:
            raise UsageError(f"cannot reach the Ray cluster at {where}: no answer in {CONNECT_TIMEOUT_S:g} s") from None
        except Exception as e:
            if attempt + 1 < tries and address.startswith("ray://") and "from server" in str(e):
                time.sleep(2.0)
                continue
            raise UsageError(f"cannot reach the Ray cluster at {where}: {_gist(e)}") from None


def _gist(e: BaseException) -> str:
    """One line for an error whose text may hold a remote traceback: its first and last lines."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()] or [type(e).__name__]
    return _one_line(lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}", 300)


def _future(ref) -> asyncio.Future:
    """An asyncio future for a Ray object: cancelling it abandons the wait, never the Ray
    future (Ray Client fails loudly, at exit, filling a future that was cancelled)."""
    loop = asyncio.get_running_loop()
    out = loop.create_future()

    def done(f) -> None:
        def put() -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                out.set_exception(f.exception())
            else:
                out.set_result(f.result())
        try:
            loop.call_soon_threadsafe(put)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    ref.future().add_done_callback(done)
    out.add_done_callback(lambda f: f.cancelled() or f.exception())  # abandoned: nobody reads it
    return out


def wait_s_default() -> float:
    try:
        return float(os.environ.get("KFORGE_CLUSTER_WAIT_S") or DEFAULT_WAIT_S)
    except ValueError:
        return DEFAULT_WAIT_S


@dataclass
class _Slot:
    actor: object
    node_id: str
    node: str  # "10.0.0.7:1d63c0b3": the node part of a worker label
    label: str  # "10.0.0.7:1d63c0b3/cuda1": what the store's `worker` column says
    dead: bool = False


class RayEvaluator:
    """Implements sandbox.result.Evaluator over Ray actors (see the module doc)."""

    def __init__(self, spec: str, device: str, *, pool_kwargs: dict | None = None, per_node: int | None = None,
                 max_nodes: int | None = None, compile_timeout_s: float = 120.0, wait_s: float | None = None,
                 log=None, on_workers=None):
        self.spec = spec
        self.device = device
        self.pool_kwargs = dict(pool_kwargs or {})  # EvaluatorPool options of every slot (tests: timing)
        self.per_node = per_node  # slots per CPU node (default 1); a GPU node has one per GPU
        self.max_nodes = max_nodes  # use at most this many nodes (benchmarks of 1, 2, ... nodes)
        self.compile_timeout_s = compile_timeout_s
        self.wait_s = wait_s_default() if wait_s is None else wait_s
        self._log_cb = log
        self._on_workers = on_workers
        self.backends = [device]
        self.reference: dict = {}  # the run's device facts
        self.arch: str | None = None
        self.compile_jobs = None  # compiles are Ray tasks: as many as the cluster's CPUs allow
        self.slots: list[_Slot] = []
        self.refused: dict[str, str] = {}  # slot or node label -> why it may not evaluate
        self.stats = {"evaluations": 0, "in_flight": 0, "requeued": 0, "infra_errors": 0}
        self._seen: dict[str, int] = {}  # node id -> slots it should have
        self._admitting: set[str] = set()  # node ids whose actors are starting
        self._jobs: set[asyncio.Future] = set()
        self._replaced: dict[str, int] = {}
        self._captured: dict[tuple, list] = {}
        self._idle: asyncio.Queue | None = None
        self._lost = ""
        self._lost_event: asyncio.Event | None = None
        self._watcher: asyncio.Task | None = None
        self._owns_ray = False
        self._started = False
        self._rr = 0
        self._made = 0
        self._token = os.urandom(4).hex()
        self._workers_seen: dict = {}
        self._start_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    def _log(self, message: str, level: str = "info") -> None:
        if self._log_cb is not None:
            try:
                self._log_cb(message, level)
            except Exception:
                pass

    @property
    def n_workers(self) -> int:
        return sum(1 for s in self.slots if not s.dead)

    def workers_per_node(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.slots:
            if not s.dead:
                out[s.node] = out.get(s.node, 0) + 1
        return out

    async def start(self, backends: list[str] | None = None) -> None:
        """Connect, read the run's facts here, admit every node that matches; UsageError (one
        line, with each refusal's reason) when none does."""
        async with self._start_lock:
            if not self._started:
                await self._start(backends)

    async def _start(self, backends: list[str] | None) -> None:
        self.backends = list(backends or self.backends)
        self._owns_ray = await asyncio.to_thread(connect_ray, self.spec, self.device)
        self.reference = await asyncio.to_thread(collect, self.device)
        if self.reference.get("error"):
            raise UsageError(f"cannot read this machine's device facts: {self.reference['error']}")
        self.arch = self.reference.get("arch")
        self._idle = asyncio.Queue()
        self._lost_event = asyncio.Event()
        await self._discover(wait=True)
        if not self.n_workers:
            why = "; ".join(f"{k}: {v}" for k, v in self.refused.items()) or "no node has a free slot"
            await self.close()
            raise UsageError(f"no node of the Ray cluster at {_where(self.spec)} may evaluate this run "
                             f"(the run's device: {describe(self.reference)}): {why}")
        self._watcher = asyncio.create_task(self._watch())
        self._started = True

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        for j in list(self._jobs):
            j.cancel()
        ray = _ray()
        live = [s for s in self.slots if not s.dead]

        async def bye(s: _Slot) -> None:
            try:  # its workers stop and its directory goes (a lost cluster cannot be asked)
                if not self._lost:
                    await asyncio.wait_for(self._await(s.actor.close.remote(), 30, lost_ok=True), 35)
            except BaseException:
                pass
            self._kill(s.actor)

        await asyncio.gather(*(bye(s) for s in live), return_exceptions=True)
        self.slots.clear()
        self._started = False
        if (self._owns_ray or self._lost) and ray.is_initialized():
            import warnings

            with warnings.catch_warnings():  # a lost Ray Client says so again on its way out
                warnings.simplefilter("ignore")
                ray.shutdown()
            self._owns_ray = False

    # ------------------------------------------------------------------ nodes and slots
    def _slots_for(self, node: dict) -> int:
        res = node.get("Resources") or {}
        if self.device == "cuda":
            return int(res.get("GPU", 0))
        return (self.per_node or 1) if res.get("CPU", 0) >= 1 else 0

    async def _discover(self, wait: bool = False) -> None:
        """Admit nodes that joined (and replace dead slots of nodes still there); drop slots
        whose node left. Raises when the cluster does not answer. Admissions run in the
        background unless `wait` (start): a node that died unseen must not stall the watcher."""
        ray = _ray()
        if not ray.is_initialized():  # a Ray Client that gave up reconnecting
            raise ConnectionError("disconnected from the cluster")
        nodes = await asyncio.wait_for(asyncio.to_thread(ray.nodes), 30)
        alive = {n["NodeID"]: n for n in nodes if n.get("Alive")}
        for s in self.slots:
            if not s.dead and s.node_id not in alive:
                self._drop(s, "its node left the cluster")
        todo = []
        for nid, n in alive.items():
            want = self._slots_for(n)
            if not want or nid in self._admitting:
                continue
            live = sum(1 for s in self.slots if s.node_id == nid and not s.dead)
            if nid not in self._seen:
                used = len({s.node_id for s in self.slots if not s.dead} | self._admitting)
                if self.max_nodes is not None and used >= self.max_nodes:
                    continue
                self._seen[nid] = want
                todo.append((nid, n, want))
            elif (live < self._seen[nid] and any(s.node_id == nid for s in self.slots)
                  and self._replaced.get(nid, 0) < REPLACE_MAX):
                self._replaced[nid] = self._replaced.get(nid, 0) + 1  # an actor died, its node lives
                todo.append((nid, n, self._seen[nid] - live))
            else:
                continue
            self._admitting.add(nid)
        jobs = [asyncio.ensure_future(self._admit_node(nid, n, k)) for nid, n, k in todo]
        self._jobs.update(jobs)
        for j in jobs:
            j.add_done_callback(self._jobs.discard)
        if wait and jobs:
            await asyncio.gather(*jobs)
        self._workers_changed()

    async def _admit_node(self, nid: str, node: dict, k: int) -> None:
        try:
            await asyncio.gather(*(self._admit(nid, node) for _ in range(k)))
        finally:
            self._admitting.discard(nid)
            self._workers_changed()

    async def _admit(self, nid: str, node: dict) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from kforge_tui.cluster.actor import EvalActor

        name = f"{node.get('NodeManagerAddress', '?')}:{nid[:8]}"
        self._made += 1  # named, so `ray list actors` and tests can find each slot
        actor = EvalActor.options(name=f"kforge-eval-{self._token}-{self._made}", namespace=NAMESPACE,
                                  num_cpus=1, num_gpus=1 if self.device == "cuda" else 0,
                                  scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)
                                  ).remote(self.device, self.pool_kwargs)
        label = name
        try:
            ident = await self._await(actor.identity.remote(), PROBE_TIMEOUT_S)
            label = f"{name}/{self.device}{ident['index']}"
            facts = await self._await(actor.facts.remote(), PROBE_TIMEOUT_S)
            why = mismatch(self.reference, facts)
            if not why:
                await self._await(actor.start.remote(self.backends), READY_TIMEOUT_S + 60)
        except Exception as e:  # pending for lack of resources, died, or the cluster went away
            why = f"its evaluation actor did not start ({_one_line(str(e) or type(e).__name__, 160)})"
        if why:
            self._kill(actor)
            self.refused[label] = why
            self._log(f"cluster: {label} refused: {why}", "warning")
            return
        self.refused.pop(label, None)
        slot = _Slot(actor, nid, name, label)
        self.slots.append(slot)
        self._idle.put_nowait(slot)
        self._log(f"cluster: {label} evaluates on {describe(facts)}")

    @staticmethod
    def _kill(actor) -> None:
        ray = _ray()
        if not ray.is_initialized():  # disconnected: nobody to ask, and asking would auto-init Ray
            return
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone, or the cluster with it
            pass

    def _drop(self, s: _Slot, why: str) -> None:
        """A slot that failed once is gone for good (killed; the watcher may start another)."""
        if not s.dead:
            s.dead = True
            self._kill(s.actor)
            self._log(f"cluster: {s.label} gone: {why}", "warning")
            self._workers_changed()

    def _workers_changed(self) -> None:
        now = self.workers_per_node()
        if now != self._workers_seen:
            self._workers_seen = now
            if self._on_workers is not None:
                try:
                    self._on_workers(dict(now))
                except Exception:
                    pass

    async def _watch(self) -> None:
        failing = empty = None
        while True:
            await asyncio.sleep(REFRESH_S)
            now = time.monotonic()
            try:
                await self._discover()
                failing = None
            except Exception as e:
                failing = failing or now
                if now - failing > self.wait_s:
                    self._fail(f"the Ray cluster at {_where(self.spec)} stopped answering "
                               f"({_one_line(str(e) or type(e).__name__, 160)})")
                    return
                continue
            empty = (empty or now) if not self.n_workers else None
            if empty is not None and now - empty > self.wait_s:
                self._fail(f"no node of the Ray cluster at {_where(self.spec)} could evaluate for "
                           f"{self.wait_s:g} s (every slot is gone)")
                return

    def _fail(self, why: str) -> None:
        self._lost = why
        self._log(f"cluster: {why}; the run stops", "error")
        if self._lost_event is not None:
            self._lost_event.set()

    # ------------------------------------------------------------------ Ray calls
    async def _await(self, ref, timeout: float, lost_ok: bool = False):
        """The value of `ref`, or its Ray error; EvaluatorLost as soon as the cluster is lost;
        asyncio.TimeoutError past `timeout`."""
        fut = _future(ref)
        waits = {fut}
        lost = None
        if self._lost_event is not None and not lost_ok:
            lost = asyncio.ensure_future(self._lost_event.wait())
            waits.add(lost)
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if lost is not None:
                lost.cancel()
        if fut in done:
            return fut.result()
        if lost is not None and lost in done:
            raise EvaluatorLost(self._lost)
        raise asyncio.TimeoutError()

    async def _take(self) -> _Slot:
        while True:
            if self._lost:
                raise EvaluatorLost(self._lost)
            get = asyncio.ensure_future(self._idle.get())
            lost = asyncio.ensure_future(self._lost_event.wait())
            await asyncio.wait({get, lost}, return_when=asyncio.FIRST_COMPLETED)
            lost.cancel()
            if not get.done():
                get.cancel()
                continue
            slot = get.result()
            if self._lost:
                self._idle.put_nowait(slot)
                continue
            if not slot.dead:
                return slot

    def _release(self, s: _Slot) -> None:
        if not s.dead:
            self._idle.put_nowait(s)

    def _captures(self, tj: dict, run_dir: str) -> list:
        """[ObjectRef] of the task's captured calls (put once per task), or [] when none."""
        cid = Task.from_json(tj).capture_id
        key = (str(run_dir), cid)
        if key not in self._captured:
            d = Path(run_dir) / "captures" / cid
            files = {p.name: p.read_bytes() for p in sorted(d.glob("call_*.pt"))} if d.is_dir() else {}
            if (d / "summarised.json").is_file():  # calls over the cap: their statistics and held values
                files["summarised.json"] = (d / "summarised.json").read_bytes()
            self._captured[key] = [_ray().put(files)] if files else []
        return self._captured[key]

    async def _on_slot(self, what: str, method: str, *args, timeout: float):
        """(slot, value, lost) of `method(*args)` on the first free slot that lives through it:
        a slot lost on the way goes, and the call goes to the next free one; (None, None, lost)
        after MAX_ATTEMPTS lost slots. A RayTaskError (our own code raised there) propagates."""
        lost: list[str] = []
        while len(lost) < MAX_ATTEMPTS:
            slot = await self._take()
            try:
                value = await self._await(getattr(slot.actor, method).remote(*args), timeout)
            except Exception as e:
                kind = self._fault(e)
                if kind in ("task", "raise"):
                    self._release(slot)
                    raise
                if kind == "connection":  # the slot is not to blame: wait for the watcher's verdict
                    self._release(slot)
                    await self._connection_trouble(e)
                    continue
                why = _one_line(str(e).splitlines()[0] if str(e) else f"no answer in {timeout:g} s", 160)
                self._drop(slot, why)
                lost.append(f"{slot.label}: {why}")
                self.stats["requeued"] += 1
                self._log(f"cluster: {what} re-queued: {slot.label} was lost while evaluating it ({why})",
                          "warning")
                continue
            self._release(slot)
            return slot, value, lost
        return None, None, lost

    def _fault(self, e: Exception) -> str:
        """"task": our code raised on the node; "slot": that actor, node or its objects are gone
        (or gave no answer in time); "connection": this process cannot talk to the cluster
        (Ray Client's channel closed, the GCS gone); "raise": EvaluatorLost, or anything else
        (a bug of ours, here)."""
        ex = _ray().exceptions
        if isinstance(e, EvaluatorLost):
            return "raise"
        if isinstance(e, ex.RayTaskError):
            return "task"
        if isinstance(e, (asyncio.TimeoutError, ex.RayActorError, ex.WorkerCrashedError, ex.NodeDiedError,
                          ex.ObjectLostError, ex.OwnerDiedError, ex.TaskUnschedulableError,
                          ex.ActorUnschedulableError, ex.OutOfMemoryError, ex.ObjectFetchTimedOutError)):
            return "slot"
        if self._lost or isinstance(e, (ConnectionError, OSError, ex.RaySystemError, ex.RpcError)) or \
                (isinstance(e, ValueError) and "closed channel" in str(e)):
            return "connection"
        return "raise"

    async def _connection_trouble(self, e: Exception) -> None:
        """Wait until the watcher says the cluster is lost (EvaluatorLost) or answers again."""
        self._log(f"cluster: no answer from the cluster ({_one_line(str(e) or type(e).__name__, 160)}); "
                  "waiting", "warning")
        try:
            await asyncio.wait_for(self._lost_event.wait(), self.wait_s + 3 * REFRESH_S)
        except asyncio.TimeoutError:
            return
        raise EvaluatorLost(self._lost)

    def _task_json(self, task_json: dict) -> dict:
        return Task.from_json(task_json).with_backend(task_json.get("backend") or self.device).to_json()

    # ------------------------------------------------------------------ Evaluator API
    async def baseline(self, task_json: dict, run_dir: str, with_compile: bool = False) -> Baseline:
        ray = _ray()
        await self.start()
        tj = self._task_json(task_json)
        tid = Task.from_json(tj).task_id
        timeout = self.pool_kwargs.get("prepare_timeout_s", 600.0) + SUPERVISOR_GRACE_S
        try:
            slot, b, lost = await self._on_slot(f"the baseline of {tid}", "baseline", tj, self._captures(tj, run_dir),
                                                with_compile, timeout=timeout)
        except ray.exceptions.RayTaskError as e:
            raise WorkFailed(_one_line(str(getattr(e, "cause", None) or e), 300)) from None
        if slot is None:
            raise WorkFailed(f"baseline of {tid}: {MAX_ATTEMPTS} evaluation slots were lost under it "
                             f"({'; '.join(lost)})")
        self._log(f"cluster: baseline of {tid} timed on {slot.label}")
        return Baseline(**{**b, "eager": Timing(**b["eager"]),
                           "compiled": Timing(**b["compiled"]) if b.get("compiled") else None})

    async def evaluate(self, task_json: dict, run_dir: str, source: str, on_stage=None) -> EvalResult:
        return await recorded(self.stats, self._evaluate_until_lost(task_json, run_dir, source, on_stage))

    async def _evaluate_until_lost(self, task_json: dict, run_dir: str, source: str, on_stage) -> EvalResult:
        """Through connection trouble: once the cluster answers again the candidate starts over;
        once the watcher calls the cluster lost, EvaluatorLost."""
        while True:
            try:
                return await self._evaluate(task_json, run_dir, source, on_stage)
            except Exception as e:
                if self._fault(e) != "connection":
                    raise
                await self._connection_trouble(e)

    # input sets a remote worker may build for a task (captured calls, fresh draws, edge cases):
    # an upper bound on its arena for the wait below, which only decides when a slot is lost
    ARENA_SETS = 8

    def _eval_wait(self, tj: dict) -> float:
        """How long a slot may take over one evaluation before it counts as lost: preparing the
        task plus the deadline the remote pool gives the candidate (`eval_deadline`, which
        grows with the arena's bytes), on an upper bound of that arena."""
        task = Task.from_json(tj)
        per_set = sum(m.nbytes for m in task.inputs + task.outputs if m.present)
        device = "cuda" if tj.get("backend") in ("cuda", "triton") else "cpu"
        deadline = eval_deadline(self.pool_kwargs.get("eval_timeout_s", 60.0), self.ARENA_SETS * per_set,
                                 self.ARENA_SETS, device, self.pool_kwargs.get("eval_s_per_gib"))
        return deadline + self.pool_kwargs.get("prepare_timeout_s", 600.0) + 2 * SUPERVISOR_GRACE_S

    async def _evaluate(self, task_json: dict, run_dir: str, source: str, on_stage) -> EvalResult:
        ray = _ray()
        await self.start()
        tj = self._task_json(task_json)
        tid = Task.from_json(tj).task_id
        if on_stage:
            await _call(on_stage, "static")
        built = await self._build(tj, source)
        if isinstance(built, EvalResult):
            return built
        if on_stage:
            await _call(on_stage, "load")
        payload = ray.put(built["payload"])  # once, whichever slot ends up with it
        timeout = self._eval_wait(tj)
        slot, rj, lost = await self._on_slot(f"a candidate of {tid}", "evaluate", tj, self._captures(tj, run_dir),
                                             built["kind"], payload, timeout=timeout)
        if slot is None:
            self.stats["infra_errors"] += 1
            return EvalResult("infra_error", "load", f"{MAX_ATTEMPTS} evaluation slots were lost under this "
                              f"candidate: {'; '.join(lost)}", log=built["log"])
        r = EvalResult.from_json(rj)
        base = built["base"]
        r.stage_s = {**base.get("stage_s", {}), **r.stage_s}
        r.resources = {**base.get("resources", {}), **r.resources}
        for k in ("compile_s", "cached"):
            if k in base:
                setattr(r, k, base[k])
        r.log = "\n".join(x for x in (built["log"], r.log) if x)
        if lost:
            r.log += "\n--- re-queued (slots lost under this candidate) ---\n" + "\n".join(lost)
        r.worker = slot.label
        return r

    async def _build(self, tj: dict, source: str):
        """The build task's reply for `source`, or an EvalResult (its failure, or no node left
        to build on). Runs on an accepted node: on the CPU, -march=native must be theirs."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from kforge_tui.cluster.actor import build_task

        backend = tj["backend"]
        errors: list[str] = []
        while len(errors) < MAX_ATTEMPTS:
            nodes = sorted({s.node_id for s in self.slots if not s.dead})
            if not nodes:
                slot = await self._take()  # waits for a node to join (or the run to stop)
                self._release(slot)
                continue
            self._rr += 1
            nid = nodes[self._rr % len(nodes)]
            ref = build_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(
                backend, tj, source, self.arch, self.compile_timeout_s)
            try:
                b = await self._await(ref, self.compile_timeout_s + 120)
            except Exception as e:
                kind = self._fault(e)
                if kind == "raise":
                    raise
                if kind == "task":
                    return EvalResult("crash", "compile", f"internal error in the build task: "
                                      f"{_one_line(str(getattr(e, 'cause', None) or e), 200)}", log=str(e))
                if kind == "connection":
                    await self._connection_trouble(e)
                    continue
                errors.append(_one_line(str(e) or type(e).__name__, 160))
                continue
            if "result" in b:  # refused or failed where it was built: that node is its worker
                r = EvalResult.from_json(b["result"])
                r.worker = f"{next((x.node for x in self.slots if x.node_id == nid), nid[:8])}/build"
                return r
            return b
        self.stats["infra_errors"] += 1
        return EvalResult("infra_error", "compile", f"could not build on the cluster: {'; '.join(errors)}")
