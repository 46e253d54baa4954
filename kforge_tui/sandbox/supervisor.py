"""The supervisor: the worker process's side that never loads candidate code.

It builds the input sets (captured calls, random draws matched to their statistics, edge cases;
how many follows free memory and the region's bytes, `plan_sets`), computes every reference
(eager, and float64 for edge cases), times eager and torch.compile (sandbox/timing.py), writes
poison, guards and fresh input values, and judges every output (sandbox/verify.py). A runner per
candidate (sandbox/runner.py) is taken from the zygote's spares; nothing a candidate did can reach
the next one. An out-of-memory anywhere in the harness is retried with fewer sets and, when even
one set does not fit, is an `infra_error`: never charged to the budget, never sent to repair.
"""
from __future__ import annotations

import gc
import os
import socket
import time
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from kforge_tui.sandbox import references
from kforge_tui.sandbox.backends import device_kind, make_backend
from kforge_tui.sandbox.timing import RemoteTiming
from kforge_tui.sandbox.channel import RunnerGone, recv, send
from kforge_tui.sandbox.settings import worker_setting
from kforge_tui.sandbox.zygote import RunnerHandle, Zygote

SPARES = {"cpu": 1, "cuda": 3}  # spare runners kept (started, or starting between timed windows)
# Backends whose spares still starting may go on beside a candidate's timing loop, and whether they
# do by default (KFORGE_SPARES_BESIDE_TIMING=1/0 overrides). The cpu is not one of them, even when
# asked: a start there takes the cores the timed call runs on. On cuda a start is host work and a
# CUDA context beside a kernel on the GPU (H200, 2026-12-03: a timed softmax's median and p90
# unchanged by runners starting beside it; 147 -> 160-163 cand/min at 8 in flight).
SPARES_BESIDE_TIMING = {"cuda": True}


# --------------------------------------------------------------------------- supervisor

class InfraError(Exception):
    """The evaluation could not run (memory, runner start): not the candidate's doing."""


class _Timeout(Exception):
    pass


@dataclass
class PreparedTask:
    """What the supervisor keeps per task between candidates (renamed from TaskState)."""

    task: object
    gm: object  # the region's GraphModule on the device (the reference)
    sets: list
    arena: object
    slots: list
    stats: list
    note: str
    baseline: dict
    floor: float | None
    floor_note: str
    k: int
    plan_note: str = ""
    edge: bool = True
    ref64: object = None
    sensitivity: bool = False  # the one-ulp run of the edge cases fits (verify.Verifier)
    compiled_fn: object = None
    retries: list = field(default_factory=list)
    image: object = None  # the buffer the whole-arena check keeps its image in (verify.ArenaWatch)
    bank: object = None  # fresh values and references for timed calls (verify.FreshBank)
    slices64: int = 1  # the float64 and one-ulp runs in dim-0 slices (references.in_slices)
    eager_fn: object = None  # what "eager" times: the model's own calls where they reproduce
    #                          the region (regions/eager.py eager_function), else gm

    def reference(self, inputs: list) -> list:
        import torch

        with torch.no_grad():
            out = self.gm(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def close(self) -> None:
        for s in self.sets:
            s.expected = []
            s.saved = []
        self.sets = []
        self.image = None
        if self.bank is not None:
            self.bank.clear()
        if self.arena is not None:
            self.arena.close()
            self.arena = None


def estimate_workspace(task, f64: bool = False) -> int:
    """Upper bound of the bytes the reference allocates besides its inputs: every value the graph
    produces (run on meta tensors), plus float64 copies of the inputs for the float64 run."""
    import torch
    import torch.fx

    from kforge_tui.regions.graph import to_graph_module
    from kforge_tui.regions.meta import DTYPE_BYTES, FLOAT_DTYPES
    from kforge_tui.sandbox.verify import graph64

    def nbytes(x) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, (tuple, list)):
            return sum(nbytes(y) for y in x)
        return 0

    extra = 0
    try:
        gm = to_graph_module(graph64(task.graph) if f64 else task.graph, "meta")
        ins = []
        for m in task.inputs:
            if not m.present:
                ins.append(None)
                continue
            dt = getattr(torch, "float64" if f64 and m.dtype in FLOAT_DTYPES else m.dtype)
            ins.append(torch.empty_strided(m.shape, m.strides, dtype=dt, device="meta"))
            if f64 and m.dtype in FLOAT_DTYPES:
                extra += m.numel * 8
        total = [0]

        class Count(torch.fx.Interpreter):
            def run_node(self, n):
                r = super().run_node(n)
                if n.op == "call_function":
                    total[0] += nbytes(r)
                return r

        with torch.no_grad():
            Count(gm).run(*ins)
        return total[0] + extra
    except Exception:
        b = sum(m.numel * DTYPE_BYTES[m.dtype] for m in list(task.inputs) + list(task.outputs) if m.present)
        return 4 * b * (8 if f64 else 1)


def _entry_bytes(task) -> int:
    """One call's input and output values, contiguous (a bank entry)."""
    from kforge_tui.regions.meta import DTYPE_BYTES

    return sum(m.numel * DTYPE_BYTES[m.dtype] for m in list(task.inputs) + list(task.outputs) if m.present)


@dataclass
class Plan:
    k: int
    host_saved: bool
    edge: bool
    edge64: bool
    note: str
    bank: int = 0  # fresh timed-call entries kept for the task (inputs.FreshBank)
    slices64: int = 1  # the float64 run in this many dim-0 slices (references.reference64)
    sensitivity: bool = False  # the one-ulp run of the edge cases fits (with or without float64)


class Budget:
    """Memory knobs: `free_bytes` overrides what the planner believes is free (tests, or a cap
    on a shared box); `limit_bytes` makes supervisor allocations beyond it fail like a real OOM;
    `share` is the fraction of the device's whole memory this worker may plan with, when workers
    of several pools share one device (evaluators.PoolPerLanguage). Without it, the worker that
    prepares a GiB-sized task first plans with all that is free and the next one, in another
    process, finds no room for even one set."""

    def __init__(self, cfg: dict | None):
        cfg = cfg or {}
        self.free = cfg.get("free_bytes")
        self.limit = cfg.get("limit_bytes")
        self.share = cfg.get("share")
        self.used = 0

    def account(self, n: int) -> None:
        import torch

        if self.limit is not None and self.used + n > self.limit:
            raise torch.OutOfMemoryError(f"simulated out of memory: {self.used + n} bytes over the "
                                         f"{self.limit} byte limit")
        self.used += n


class Worker(RemoteTiming):
    """The supervisor."""

    MAX_TASKS = 4

    def __init__(self, backend_name: str, device_index: int, zygote: Zygote, cache_dir: str | None = None):
        import torch

        self.torch = torch
        self.lang = backend_name  # the candidates' language: cpu | cuda | triton
        # the harness's temporaries (a MiB-sized compare, a fresh draw) come from the heap again
        # instead of a new mapping each (glibc maps blocks over 128 KiB afresh, and every first
        # touch of their pages faulted: a third of a small region's check time on the cpu)
        from kforge_tui.sandbox.runner import _keep_freed_memory

        _keep_freed_memory("cpu", device_index)
        self.backend = make_backend(device_kind(backend_name), device_index)  # device, clock, memory
        self.backend.setup()
        self.zygote = zygote
        self.tasks: OrderedDict[str, PreparedTask] = OrderedDict()
        self.evaluations = 0
        self.spares: deque[RunnerHandle] = deque()
        self.n_spares = worker_setting("KFORGE_RUNNER_SPARES", SPARES.get(self.backend.name, 1))
        beside = worker_setting("KFORGE_SPARES_BESIDE_TIMING", None)
        self.spares_beside = (self.backend.name in SPARES_BESIDE_TIMING
                              and (SPARES_BESIDE_TIMING[self.backend.name] if beside is None else beside))
        self.probe_path: str | None = None
        self.cache_dir = cache_dir
        if cache_dir:
            self._ensure_probe(cache_dir)
            self._top_up()

    # ------------------------------------------------------------------ runners
    def _ensure_probe(self, cache_dir: str) -> None:
        if self.probe_path is None:
            from kforge_tui.sandbox.backends import probe

            try:
                self.probe_path = probe.build(cache_dir) or ""
            except Exception:
                self.probe_path = ""

    def _spawn_args(self) -> dict:
        args = {"probe": self.probe_path or None}
        if self.lang == "triton" and self.cache_dir:
            args["triton_warm_dir"] = os.path.join(self.cache_dir, "triton", "warm")
        return args

    def _top_up(self) -> None:
        while len(self.spares) < max(1, self.n_spares):
            self.spares.append(self.zygote.spawn(self._spawn_args()))

    def _take_runner(self, deadline: float) -> RunnerHandle:
        """A started runner; its replacement is forked at once, so it starts up while this
        candidate loads and verifies (and is stopped while anything is timed: `_spares_paused`)."""
        self._top_up()
        for _ in range(3):
            r = self.spares.popleft()
            if r.wait_ready(max(1.0, min(120.0, deadline - time.perf_counter()))):
                self._top_up_safely()
                return r
            err = r.error
            r.kill()
            if getattr(r, "oom", False):
                raise InfraError(f"runner could not start: {err}")
            self._top_up()
        raise InfraError(f"runner could not start: {err}")

    @contextmanager
    def _spares_paused(self, candidate: bool = False):
        """Nothing starts or ends beside a timed call: spares still starting (a CUDA context,
        OpenMP pool and imports share the device and the cores) are stopped (SIGSTOP) for the
        timed window and go on (SIGCONT) after it, and runners killed earlier are reaped first.
        Waiting for the spares instead cost 0.15 s of the worker's 0.44 s a candidate on the
        H200 (2026-12-01); stopped, they start in the gaps between timing loops, and `SPARES`
        keeps enough of them that one is ready at take. Yields how many were stopped.
        With `spares_beside` a candidate's loop (`candidate`) lets them go on: see
        `SPARES_BESIDE_TIMING`."""
        self.zygote.reap_dying()
        if candidate and self.spares_beside:
            yield 0
            return
        paused = [r for r in self.spares if not r.poll_ready() and r.pause()]
        try:
            yield len(paused)
        finally:
            for r in paused:
                r.resume()

    # ------------------------------------------------------------------ per task
    def prepare(self, req: dict, emit) -> dict:
        task = self._task(req)
        self._ensure_probe(req.get("cache_dir") or self.cache_dir or ".")
        if self.cache_dir is None and req.get("cache_dir"):
            self.cache_dir = req["cache_dir"]
        with self._spares_paused():  # its eager and torch.compile baselines are timed here
            st = self._state(task, req)
            seeded = self.lang == "triton" and self.backend.name == "cuda"
            want_seed = seeded and (req.get("with_compile") or req.get("seed")) and "seed_note" not in st.baseline
            if want_seed and req.get("no_seed"):  # the pool's second try: the seed failed the first
                st.baseline["seed"] = None
                st.baseline["seed_note"] = f"no Inductor seed: running its kernels failed ({req['no_seed']})"
                self._add_note(st, st.baseline["seed_note"])
                want_seed = False
            if want_seed:
                # torch.compile of the region *is* Inductor's Triton code: one compile gives the
                # compile baseline and the seed, so the seed is the kernel the baseline measured
                compiled, note, seed = self._time_inductor(st, req.get("timing"))
                if compiled is not None or st.baseline.get("compiled") is None:
                    st.baseline["compiled"] = compiled
                st.baseline["seed"] = seed
                st.baseline["seed_note"] = note
                self._add_note(st, note)
            if not want_seed and req.get("with_compile") and st.baseline.get("compiled") is None:
                st.baseline["compiled"], note = self._time_compiled(st, req.get("timing"))
                if note:
                    st.baseline["floor_note"] = (st.baseline.get("floor_note", "") + "; " + note).strip("; ")
        if self.lang == "triton" and not seeded and "seed_note" not in st.baseline:
            st.baseline["seed"] = None
            st.baseline["seed_note"] = ("no Inductor seed from the worker: no GPU, Triton candidates run "
                                        "under Triton's interpreter on the CPU (TRITON_INTERPRET=1)")
            self._add_note(st, st.baseline["seed_note"])
        self._top_up()
        # the arena's bytes and the sets in it: the pool's deadline for a candidate follows them
        rep = {"baseline": st.baseline, "note": st.note, "arena_bytes": self._arena_bytes(st),
               "sets": len(st.sets)}
        if rep["arena_bytes"] > self._watch_copy_limit():  # checks hash it on every call
            from kforge_tui.sandbox import inputs

            rep["hash_compiled"] = inputs.warm_checksum(st.arena.tensor.device)
        return rep

    @staticmethod
    def _watch_copy_limit() -> int:
        from kforge_tui.sandbox.inputs import ArenaWatch

        return ArenaWatch.COPY_LIMIT

    @staticmethod
    def _arena_bytes(st: "PreparedTask") -> int:
        t = getattr(st.arena, "tensor", None)
        return int(t.numel() * t.element_size()) if t is not None else 0

    @staticmethod
    def _add_note(st: "PreparedTask", note: str) -> None:
        if note and note not in st.baseline.get("note", ""):
            st.baseline["note"] = (st.baseline.get("note", "") + "; " + note).strip("; ")

    def _task(self, req: dict):
        from kforge_tui.regions.task import Task

        return Task.from_json(req["task"]).with_backend(self.lang)

    def plan_sets(self, task, n_calls: int, budget: Budget) -> "Plan":
        """How many input sets, where the private input copies live, and which checks fit, for
        the free memory and the region's bytes (issue 14).

        Per set: the arena (inputs and outputs with guards), the expected outputs and - unless
        the region is too big for it - a private device copy of the inputs (else a host copy and
        a keyed device hash). Beside the sets: the reference's workspace (every value its graph
        makes, an upper bound from a run on meta tensors), what re-writing a set's values keeps
        alive for a moment, the float64 run of the edge cases (in dim-0 slices, `slices64`,
        when it does not fit whole: `references.reference64`) with the one-ulp sensitivity run
        beside its result, the copy of the arena the whole-arena check compares with
        (verify.ArenaWatch), and its CUDA context, and a margin. The richest configuration that
        still leaves enough sets to rotate wins; with no room for even that, the richest that
        fits at all (edge cases are never dropped for more sets), else the leanest one with a
        single set."""
        from kforge_tui.regions.meta import DTYPE_BYTES
        from kforge_tui.sandbox import verify

        ins, outs, per_arena = verify.set_layout(task)
        in_b = sum(x.total for x in ins if x is not None)
        out_b = sum(m.nbytes for m in task.outputs)
        gaps = sum(x.span for x, m in zip(outs, task.outputs) if x.span > m.nbytes)
        ws = estimate_workspace(task)
        ws64_run = estimate_workspace(task, f64=True)  # the float64 run's copies and values
        out64 = sum(m.numel * 8 for m in task.outputs)  # its result, kept whole for the judge
        batch = references.batch_of(task)

        def ws64(n: int) -> int:  # n slices: a slice's run beside the whole result; then the
            return max(out64 + ws64_run // n, out64 + out_b + (in_b + ws) // n)  # one-ulp run beside it
        cmp_ws = min(max((m.numel for m in task.outputs), default=0), verify.CHUNK) * 8 * 6
        free = self.backend.free_bytes()
        if budget.free is not None:
            free = min(free, int(budget.free))
        if budget.share is not None and budget.share < 1:
            free = min(free, int(self.backend.total_bytes() * budget.share))
        avail = free - self.backend.reserve_bytes(self.n_spares) - cmp_ws
        desired = max(4, n_calls + 3)
        big = per_arena > 4 * self.backend.cache_bytes  # rotation matters little past the cache
        need = 2 if big else 4
        host_ok = self.backend.name != "cpu"  # on cpu "host" is the same memory
        # (host_saved, edge, edge64, sensitivity), most checks first; device copies before host
        # copies. Without a float64 run the edge cases are judged against PyTorch's own result,
        # allowing its change under one-ulp input changes when that run fits (whole: its input
        # copies, result and workspace)
        edged = [(True, True), (False, True), (False, False)]
        options = [(False, True, e64, sens) for e64, sens in edged]
        if host_ok:
            options += [(True, True, e64, sens) for e64, sens in edged]
        options += [(False, False, False, False)] + ([(True, False, False, False)] if host_ok else [])
        def fit(per_set: int, work: int) -> int:
            """Sets that fit beside `work`: with an image of the arena for the whole-arena check
            when the arena is small enough for one (verify.ArenaWatch), else its block hashes."""
            if not per_set:
                return desired
            k = (avail - work) // per_set
            if k * per_arena <= verify.ArenaWatch.COPY_LIMIT:
                k = (avail - work) // (per_set + per_arena)
            return int(min(k, desired))

        slicings = [1] + ([n for n in (2, 4, 8, 16, 32, 64) if n <= batch] if batch else [])
        best = None
        for host, edge, e64, sens in options:
            if not edge and best is not None and best[0] >= 1 and best[2]:
                # edge cases with fewer sets, never more sets without them: a kernel precise
                # only on ordinary inputs is caught by nothing else, while a replay is also
                # caught by fresh values in a set's own buffers (a 32 MiB softmax in 1088 MiB
                # took 4 sets and no edge cases, in 1056 MiB one set and float64 edge cases)
                break
            per_set = per_arena + out_b + gaps + (0 if host else in_b)
            base = ws + (0 if host else out_b + in_b)  # re-writing a set: new copy, old reference
            if edge and not host:
                base += out_b + in_b  # an edge case keeps the originals (host mode restores them)
            for n in (slicings if e64 else [1]):
                work = base + (ws64(n) if e64 else out_b + in_b + ws if sens else 0)
                k = fit(per_set, work)
                if best is None or (k >= 1 and best[0] < 1):  # the first that fits at all
                    best = (k, host, edge, e64, sens, per_set, work, n)
                if k >= min(desired, need):
                    best = (k, host, edge, e64, sens, per_set, work, n)
                    break
            if best[0] >= min(desired, need):
                break
        if best[0] < 1:  # nothing fits even one set: the leanest configuration, with one
            host, edge, e64, sens = options[-1]
            per_set = per_arena + out_b + gaps + (0 if host else in_b)
            best = (1, host, edge, e64, sens, per_set, ws + (0 if host else out_b + in_b), 1)
        k, host, edge, e64, sens, per_set, work, slices = best
        k = max(1, k)
        image = k * per_arena if k * per_arena <= verify.ArenaWatch.COPY_LIMIT else 0
        bank = 0 if host else self._bank_capacity(task, avail - work - k * per_set - image)
        gib = 2 ** 30
        note = (f"{k} input set{'s' if k > 1 else ''} of {per_set / gib:.3g} GiB each in "
                f"{free / gib:.3g} GiB free"
                + (f", this worker's {budget.share:.0%} share of the device"
                   if budget.share is not None and budget.share < 1 else "")
                + f" (reference workspace {ws / gib:.3g} GiB); input copies "
                f"{'in host memory, device hashes' if host else 'on the device'}; edge cases "
                + (("judged against float64" + (f" (run in {slices} slices of dim 0)" if slices > 1 else ""))
                   if e64 else "judged at the task dtype, allowing PyTorch's own one-ulp sensitivity "
                   "(no room for a float64 run)" if sens
                   else "judged at the task dtype (no room for a float64 run or a one-ulp run)"
                   if edge else "skipped (no room)"))
        return Plan(k, host, edge, e64, note, bank, slices if e64 else 1, sensitivity=sens)

    BANK_ENTRIES = 128  # a timing loop's warm-up and max_iters, with room
    BANK_SHARE = 0.25  # of the memory left after the sets
    BANK_MAX_BYTES = {"cpu": 512 << 20, "cuda": 4 << 30}

    def _bank_capacity(self, task, left: int) -> int:
        """Entries of the task's fresh-value bank that fit: a share of what the sets leave, at
        most BANK_MAX_BYTES; none when fewer than 8 fit (a big region draws its few timed calls'
        values on the spot)."""
        room = min(max(0, left) * self.BANK_SHARE, self.BANK_MAX_BYTES.get(self.backend.name, 512 << 20))
        n = int(min(self.BANK_ENTRIES, room // max(_entry_bytes(task), 1)))
        return n if n >= 8 else 0

    def _state(self, task, req: dict, *, max_sets: int | None = None) -> PreparedTask:
        tid = task.task_id
        if tid in self.tasks and max_sets is None:
            self.tasks.move_to_end(tid)
            return self.tasks[tid]
        if tid in self.tasks:
            self.tasks.pop(tid).close()
        from kforge_tui.regions.eager import eager_function
        from kforge_tui.regions.graph import to_graph_module
        from kforge_tui.regions.task import load_calls
        from kforge_tui.sandbox import bench, verify

        torch = self.torch

        cap_id = req.get("capture_id") or task.capture_id
        calls = load_calls(req["run_dir"], cap_id) if req.get("run_dir") else []
        budget = Budget(req.get("memory"))
        while len(self.tasks) >= self.MAX_TASKS:
            self.tasks.popitem(last=False)[1].close()
        plan = self.plan_sets(task, len(calls), budget)
        while plan.k < 4 and self.tasks:  # make room: older tasks go first
            self.tasks.popitem(last=False)[1].close()
            self._collect()
            plan = self.plan_sets(task, len(calls), budget)
        k, plan_note = plan.k, plan.note
        if max_sets is not None:
            k = min(k, max_sets)
        gm = to_graph_module(task.graph, self.backend.device)
        stats = verify._captured_stats(task, calls)
        if not calls and req.get("run_dir"):  # every real call over the capture cap: its statistics
            stats = verify.summarised_stats(task, req["run_dir"], cap_id) or stats
        retries = []
        while True:
            budget.used = 0
            arena_box = []

            def alloc(n: int):
                a = self.backend.new_arena(n)
                arena_box.append(a)
                return a.tensor

            try:
                def ref(inputs: list) -> list:
                    with torch.no_grad():
                        out = gm(*inputs)
                    return list(out) if isinstance(out, (tuple, list)) else [out]

                with self.backend.stream_context():
                    sets, note, _ = verify.build_sets(
                        task, calls, 3, self.backend.device, int.from_bytes(os.urandom(4), "little"),
                        ref, min_sets=4, max_sets=k, alloc=alloc, account=budget.account,
                        host_saved=plan.host_saved, stats=stats)
                    self.backend.sync_all()
                    eager_fn, eager_of = gm, "the region's aten graph"
                    native = eager_function(task, sets[0].tensors(), sets[0].expected)
                    if native is not None:
                        eager_fn, eager_of = native
                    eager, _ = bench.time_calls(self.backend, lambda s: eager_fn(*s.tensors()), sets,
                                                {**bench.DEFAULT_TIMING, **(req.get("timing") or {}),
                                                 "max_wall_s": 2.5})
                break
            except Exception as e:
                if not verify.is_oom(e):
                    for a in arena_box:
                        a.close()
                    raise
                failure = str(e).splitlines()[0][:240]
            # out of memory: collected after the except block, whose traceback kept the try's
            # tensors (half-built sets, a reference's temporaries) alive and cached
            sets = None
            for a in arena_box:
                a.close()
            self._collect()
            retries.append(f"out of memory with {k} input set{'s' if k > 1 else ''} ({failure})")
            if k <= 1:
                raise InfraError("out of memory even with one input set: " + "; ".join(retries))
            k = max(1, k // 2)
        if retries:
            plan_note += f"; retried with {k} set{'s' if k > 1 else ''} after " + "; ".join(retries)
        slots = [([g.slot if g is not None else None for g in s.inputs], [g.slot for g in s.outputs])
                 for s in sets]
        floor, floor_note, extra = self._floor(task, req)
        baseline = {"eager": asdict(eager), "eager_of": eager_of, "compiled": None, "floor_us": floor,
                    "floor_note": floor_note, **extra, "sets": len(sets), "note": f"{note}; {plan_note}"}
        ref64, slices, sensitivity = None, 1, plan.sensitivity
        if plan.edge64 and plan.slices64 > 1 and not references.sliceable(task, ref, sets[0].tensors(),
                                                                          sets[0].expected, plan.slices64):
            plan_note = plan_note.replace(f"judged against float64 (run in {plan.slices64} slices of dim 0)",
                                          "judged at the task dtype (its float64 run does not fit whole, and "
                                          "the region does not compute its rows one by one)")
            baseline["note"] = f"{note}; {plan_note}"
            sensitivity = False  # the one-ulp run was planned in slices too
        elif plan.edge64:
            ref64, slices = verify.reference64(task, self.backend.device, plan.slices64), plan.slices64
        bank = plan.bank if max_sets is None and not retries else 0
        if budget.limit is not None:  # a simulated limit holds for the bank too
            bank = min(bank, max(0, budget.limit - budget.used) // max(_entry_bytes(task), 1))
        st = PreparedTask(task, gm, sets, arena_box[-1], slots, stats, note, baseline, floor, floor_note,
                          len(sets), plan_note, edge=plan.edge, ref64=ref64, sensitivity=sensitivity,
                          retries=retries,
                          bank=verify.FreshBank(bank if bank >= 8 else 0), slices64=slices,
                          eager_fn=eager_fn)
        self.tasks[tid] = st
        while len(self.tasks) > self.MAX_TASKS:
            self.tasks.popitem(last=False)[1].close()
        return st

    def _collect(self) -> None:
        gc.collect()
        self.backend.empty_cache()

    def _floor(self, task, req: dict):
        from kforge_tui.regions import floor as rfloor
        from kforge_tui.sandbox import bench

        cache = req.get("cache_dir") or self.cache_dir or "."
        bw = bench.bandwidth(self.backend, cache)
        pk = None
        if self.backend.name != "cpu" and rfloor.flops(task) > 0:
            try:
                pk = bench.peak(self.backend, cache, task.dtype)
            except Exception:
                pk = None
        f = rfloor.floor(task, bw["gbs"], pk["tflops"] if pk else None)
        note = f"{f.note}; {bw['note']}" + (f"; {pk['note']}" if pk else "")
        return f.us, note, {"bandwidth_gbs": bw["gbs"], "peak_tflops": pk["tflops"] if pk else None,
                            "floor_bound": f.bound}

    # ------------------------------------------------------------------ a candidate
    def evaluate(self, req: dict, emit) -> dict:
        from kforge_tui.sandbox import verify

        task = self._task(req)
        self._ensure_probe(req.get("cache_dir") or self.cache_dir or ".")
        deadline = time.perf_counter() + float(req.get("deadline_s") or 60.0)
        self.evaluations += 1
        attempts = []
        max_sets = None
        while True:
            try:
                st = self._state(task, req, max_sets=max_sets)
            except InfraError as e:
                return self._infra(str(e), attempts)
            try:
                t0 = time.perf_counter()
                res = self._evaluate_once(st, req, emit, deadline)
                named = sum(v for k, v in res["stage_s"].items() if k != "jit")  # (jit is within load)
                res["stage_s"]["other"] = max(0.0, time.perf_counter() - t0 - named)
                if attempts:
                    res["log"] += "\nretried after: " + "; ".join(attempts)
                return res
            except InfraError as e:
                attempts.append(str(e))
                if st.k <= 1 or len(attempts) >= 4:
                    return self._infra(f"{e} (with {st.k} input set{'s' if st.k > 1 else ''})", attempts)
                max_sets = max(1, st.k // 2)
            finally:
                self._top_up_safely()

    def _top_up_safely(self) -> None:
        try:
            self._top_up()
        except Exception:
            pass

    @staticmethod
    def _infra(message: str, attempts: list) -> dict:
        return {"status": "infra_error", "stage": "load", "message": message.replace("\n", " ")[:400],
                "log": "\n".join(attempts), "mismatch": None, "timing": None, "baseline": None,
                "floor_us": None, "stage_s": {}, "fatal": False, "checks": {}}

    def _evaluate_once(self, st: PreparedTask, req: dict, emit, deadline: float) -> dict:
        from kforge_tui.sandbox import verify

        torch = self.torch
        stage_s: dict[str, float] = {}
        res = {"status": "ok", "stage": "load", "message": "", "log": f"inputs: {st.note}; {st.plan_note}",
               "mismatch": None, "timing": None, "baseline": st.baseline["eager"], "floor_us": st.floor,
               "stage_s": stage_s, "fatal": False, "checks": {}}
        t = time.perf_counter()
        try:
            runner = self._take_runner(deadline)
        except InfraError:
            raise
        stage_s["runner"] = time.perf_counter() - t  # waiting for a started runner (0 when one was ready)
        t = time.perf_counter()
        sets_idx = {id(s): i for i, s in enumerate(st.sets)}
        info, fds = st.arena.handle()
        cand_dir = None
        if self.lang == "triton":
            cand_dir = self._candidate_dir(req)
            code = {"source_path": req["source_path"], "cand_dir": cand_dir,
                    "reuse_cache": [req["precompiled"]] if req.get("precompiled") else []}
        else:
            code = {"lib": req["lib_path"]}
        job = {"cmd": "job", **code, "arena": info,
               "slots": [([x.to_json() if x is not None else None for x in ins], [x.to_json() for x in outs])
                         for ins, outs in st.slots],
               "names": [s.name for s in st.sets], "backend": self.backend.name,
               "inputs": [m.to_json() for m in st.task.inputs],
               "outputs": [m.to_json() for m in st.task.outputs]}
        log_lines: list[str] = []

        def remaining() -> float:
            r = deadline - time.perf_counter()
            if r <= 0:
                raise _Timeout()
            return r

        def rx() -> dict:
            try:
                msg = recv(runner.sock, remaining())
            except (socket.timeout, TimeoutError):
                raise _Timeout() from None
            if msg.get("ev") == "oom":
                raise InfraError(f"out of memory in the kernel process: {msg.get('error', '')}")
            if msg.get("ev") == "error":
                raise _RunnerError(msg.get("error", ""), msg.get("device_error", ""))
            if msg.get("ev") == "sigsys":
                raise _SyscallRefused(msg.get("nr"))
            return msg

        census = RunnerCensus(runner.pid, self.backend.name, req.get("lib_path"),
                              self._allow_dirs(cand_dir),
                              ignore_fds=(getattr(st.arena, "fd_target", lambda: "")(),))

        def call(s) -> verify.CallReport:
            send(runner.sock, {"cmd": "call", "set": sets_idx[id(s)]})
            m = rx()
            if m.get("candidate_error"):
                raise verify.CandidateError(m["candidate_error"])
            return verify.CallReport(int(m.get("rc", 0)), m.get("problem") or census.after_call())

        v = verify.Verifier(st.task, st.sets, call, st.reference, device=self.backend.device,
                            sync=self.backend.sync_all, stats=st.stats, reference64=st.ref64, edge=st.edge,
                            sensitivity=st.sensitivity,
                            log=log_lines, arena=st.arena.tensor, image=st.image, bank=st.bank,
                            slices=st.slices64)
        v.census = census
        try:
            with _HarnessThreads(torch, st.task):
                return self._drive(st, req, emit, runner, job, fds, v, res, stage_s, rx, remaining, t)
        finally:
            if v.watch is not None and st.arena is not None:
                st.image = v.watch.image  # allocated at its first snapshot; the next candidate's
            res["checks"] = {**v.checks, "runner": "fresh process per candidate", "runner_pid": runner.pid,
                             "edge_float64": st.ref64 is not None,
                             "edge_sensitivity": st.ref64 is not None or st.sensitivity}
            if log_lines:
                res["log"] += "\n" + "\n".join(log_lines)
            try:
                send(runner.sock, {"cmd": "exit"})
            except OSError:
                pass
            runner.kill(wait=False)
            if cand_dir and not os.environ.get("KFORGE_KEEP_TRITON_DIRS"):
                import shutil

                shutil.rmtree(cand_dir, ignore_errors=True)

    def _candidate_dir(self, req: dict) -> str:
        """A fresh directory per Triton evaluation (the candidate's file and its Triton cache),
        made by the supervisor, removed when the runner is gone (KFORGE_KEEP_TRITON_DIRS keeps
        it for debugging)."""
        import tempfile

        root = os.path.join(self.cache_dir or req.get("cache_dir") or tempfile.gettempdir(), "triton", "runs")
        os.makedirs(root, mode=0o700, exist_ok=True)
        stem = os.path.splitext(os.path.basename(req["source_path"]))[0][:16]
        return tempfile.mkdtemp(prefix=f"{stem}-{self.evaluations}-", dir=root)

    # Triton loader statuses -> (EvalResult status, stage)
    TRITON_LOAD = {"static_error": ("static_error", "static"), "compile_error": ("compile_error", "compile"),
                   "torch_op": ("verify_error", "load"), "load_error": ("load_error", "load"),
                   "launch_error": ("load_error", "load")}

    def _load_failure(self, res: dict, m: dict) -> dict:
        if self.lang != "triton":
            return self._fail(res, "load_error", "load", m["error"])
        status, stage = self.TRITON_LOAD.get(m.get("status") or "", ("load_error", "load"))
        msg = m["error"]
        if m.get("status") == "launch_error" and msg.startswith("device error"):
            status = "crash"
            msg += " (kernel process discarded)"
        elif m.get("status") == "launch_error":
            msg = f"the first call failed: {msg}"
        if m.get("log"):
            res["log"] += "\n--- Triton ---\n" + m["log"]
        if m.get("jit_s") is not None:
            res["jit_s"] = m["jit_s"]
        return self._fail(res, status, stage, msg)

    def _allow_dirs(self, cand_dir: str | None) -> tuple[str, ...]:
        """Where a Triton candidate's first call may map code from: its own directory (Triton's
        compiled kernels) and installed Python code (lazy imports)."""
        if not cand_dir:
            return ()
        from kforge_tui.sandbox.runner import _python_dirs

        return (os.path.realpath(cand_dir),) + _python_dirs()

    def _drive(self, st, req, emit, runner, job, fds, v, res, stage_s, rx, remaining, t):
        """load -> verify (before timing) -> time -> verify (after timing) -> final census."""
        from kforge_tui.sandbox import seccomp, verify

        census = v.census
        if True:  # (one block: every way out of the protocol is handled below)
            try:
                census.start()  # the idle runner, before it maps the task and loads the candidate
                send(runner.sock, job, fds)
                m = rx()
                stage_s["load"] = time.perf_counter() - t  # Triton: its JIT (first call) included
                if m.get("jit_s") is not None:
                    stage_s["jit"] = float(m["jit_s"])
                    res["jit_s"] = float(m["jit_s"])
                if m.get("error"):
                    return self._load_failure(res, m)
                problem = m.get("problem") or census.loaded(self.lang == "triton")
                if problem:
                    return self._fail(res, "verify_error", "load", problem)
                emit("verify")
                res["stage"] = "verify"
                t = time.perf_counter()
                with self.backend.stream_context():
                    mm = v.before_timing()
                stage_s["verify"] = time.perf_counter() - t
                if mm is not None:
                    res["mismatch"] = asdict(mm)
                    return self._fail(res, "verify_error", "verify", mm.summary())
                emit("time")
                res["stage"] = "time"
                t = time.perf_counter()
                with self._spares_paused(candidate=True):
                    stage_s["spares"] = time.perf_counter() - t  # stopping the ones still starting
                    timing, mm = self._time_remote(runner, v, st, req, rx, remaining)
                stage_s["time"] = time.perf_counter() - t - stage_s["spares"]
                if timing is not None:
                    res["timing"] = timing
                if mm is not None:
                    res["mismatch"] = asdict(mm)
                    return self._fail(res, "verify_error", "time", mm.summary())
                t = time.perf_counter()
                with self.backend.stream_context():
                    mm = v.after_timing()
                if mm is not None:
                    res["mismatch"] = asdict(mm)
                    return self._fail(res, "verify_error", "time", mm.summary())
                send(runner.sock, {"cmd": "final"})
                m = rx()
                stage_s["verify"] += time.perf_counter() - t
                if m.get("device_error"):
                    return self._fail(res, "crash", "time", f"{m['device_error']} (kernel process discarded)")
                problem = m.get("problem") or census.final()
                if problem:
                    return self._fail(res, "verify_error", "time", problem)
            except verify.CandidateError as e:
                return self._fail(res, "verify_error", res["stage"], self._rc_text(str(e)))
            except _Timeout:
                runner.kill()
                from kforge_tui.sandbox.pool import describe_deadline

                base = req.get("deadline_base_s")
                said = describe_deadline(float(req.get("deadline_s") or 60),
                                         float(base) if base is not None else None,
                                         self._arena_bytes(st), len(st.sets))
                spent = sorted(((k, x) for k, x in v.checks.get("seconds", {}).items() if x >= 1),
                               key=lambda kv: -kv[1])[:3]
                where = ("; the harness's checks so far: " + ", ".join(f"{k.replace('_', ' ')} {x:.0f} s"
                                                                     for k, x in spent)) if spent else ""
                return self._fail(res, "timeout", res["stage"],
                                  f"{said} in the {res['stage']} stage; the kernel's process was killed{where}")
            except _SyscallRefused as e:
                runner.kill()
                return self._fail(res, "verify_error", res["stage"], seccomp.describe(e.nr))
            except RunnerGone:
                status = runner.exit_status()
                if status in (seccomp.EXIT_STATUS, -31):  # the filter's handler, or SIGSYS itself
                    return self._fail(res, "verify_error", res["stage"], seccomp.describe(None))
                from kforge_tui.sandbox.pool import describe_exit

                return self._fail(res, "crash", res["stage"],
                                  describe_exit(status).replace("worker", "kernel process"))
            except _RunnerError as e:
                if e.device:
                    return self._fail(res, "crash", res["stage"], f"{e.device} (kernel process discarded)")
                return self._fail(res, "verify_error", res["stage"], f"the kernel's process failed: {e}")
            except Exception as e:
                if verify.is_oom(e):
                    raise InfraError(f"out of memory in the supervisor: {str(e).splitlines()[0][:200]}") from None
                raise
        from kforge_tui.sandbox import bench

        timing = res["timing"]
        if not timing or not timing.get("n"):
            return self._fail(res, "crash", "time", "the kernel's process returned no timing")
        if bench.below_floor(timing["median_us"], st.floor):
            return self._fail(res, "impossible_timing", "time",
                              f"median {timing['median_us']:.3g} us is below the roofline floor "
                              f"{st.floor:.3g} us ({st.floor_note}); not a win")
        t = time.perf_counter()
        with self._spares_paused():
            fresh = self._adjacent_baselines(st, req)
        res["stage_s"]["baselines"] = time.perf_counter() - t
        res["baseline"] = fresh.get("eager") or st.baseline["eager"]
        res["compiled"] = fresh.get("compiled")
        eager = res["baseline"]["median_us"]
        comp = (res["compiled"] or {}).get("median_us")
        res["message"] = (f"{timing['median_us']:.3g} us (p10 {timing['p10_us']:.3g}, p90 {timing['p90_us']:.3g}, "
                          f"n {timing['n']}) vs eager {eager:.3g} us: {eager / timing['median_us']:.2f}x"
                          + (f", vs torch.compile {comp:.3g} us: {comp / timing['median_us']:.2f}x"
                             if comp else ""))
        return res
    def _rc_text(self, msg: str) -> str:
        if self.lang == "triton":  # the loader's own words (a Python launcher has no CUDA codes)
            return msg
        parts = msg.split()
        try:
            rc = int(parts[parts.index("returned") + 1])
            return msg.replace(f"returned {rc}", f"returned {self.backend.error_name(rc)}")
        except (ValueError, IndexError):
            return msg

    @staticmethod
    def _fail(res: dict, status: str, stage: str, message: str) -> dict:
        res.update(status=status, stage=stage, message=message.replace("\n", " "))
        return res


class _HarnessThreads:
    """The supervisor's own checks on a small region run on one thread: OpenMP fan-out costs
    more than it saves there, and on a loaded box each parallel op waits for every thread to be
    scheduled (measured on the 2-core CI box under load: 16 s -> 0.8 s for one verification).
    Eager and torch.compile are timed with all threads (outside this)."""

    SMALL = 1 << 22  # elements

    def __init__(self, torch, task):
        self.torch = torch
        self.small = max([m.numel for m in list(task.inputs) + list(task.outputs) if m.present] or [0]) < self.SMALL

    def __enter__(self):
        self.n = self.torch.get_num_threads()
        if self.small and self.n > 1:
            self.torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        if self.small and self.n > 1:
            self.torch.set_num_threads(self.n)


class _SyscallRefused(Exception):
    def __init__(self, nr):
        super().__init__(f"system call {nr}")
        self.nr = int(nr) if isinstance(nr, int) else None


class RunnerCensus:
    """The runner's process state as /proc shows it, read from the supervisor: threads (with
    their names), open files, executable mappings, POSIX timers. The runner cannot open /proc
    itself under its syscall filter, and a candidate cannot forge what is read from outside.
    The runner reports only what has no system call: its FP environment and signal handlers."""

    def __init__(self, pid: int, backend: str, lib_path: str | None, allow_dirs: tuple = (),
                 ignore_fds: tuple = ()):
        self.pid = pid
        self.ignore_fds = {x for x in ignore_fds if x}
        self.lib_path = lib_path
        self.allow_dirs = allow_dirs
        self.allow_threads = ("cuda",) if backend == "cuda" else ()
        self.base: dict = {}
        self.after: dict = {}
        self.names: dict = {}

    def start(self) -> None:
        from kforge_tui.sandbox.backends import probe

        self.base = self._census()
        self.names = dict(self.base["names"])

    def _census(self) -> dict:
        from kforge_tui.sandbox.backends import probe

        c = probe.proc_census(self.pid)
        c["fds"] = {k: v for k, v in c["fds"].items() if v not in self.ignore_fds}  # the arena's
        return c

    def _new_threads(self) -> list[str]:
        from kforge_tui.sandbox.backends import probe

        now = probe.thread_names(self.pid)
        new = {t: n for t, n in now.items() if t not in self.names}
        lazy = {t: n for t, n in new.items() if self.allow_threads and n.startswith(self.allow_threads)}
        self.names.update(lazy)  # the CUDA driver's own (named cuda-*), started lazily
        return [n for t, n in new.items() if t not in lazy]

    def loaded(self, triton: bool) -> str:
        from kforge_tui.sandbox.backends import probe

        self.after = self._census()
        problems = [x for x in probe.diff(self.base, self.after, self.lib_path, at_load=True,
                                          allow_dirs=self.allow_dirs) if not x.endswith("left running")]
        nt = self._new_threads()
        if nt:
            problems.insert(0, f"{len(nt)} new thread{'s' if len(nt) > 1 else ''} started")
        if not problems:
            return ""
        return (("worker state changed when the candidate was loaded and first called: " if triton else
                 "worker state changed when the library was loaded (static initialiser or constructor): ")
                + "; ".join(problems))

    def after_call(self) -> str:
        nt = self._new_threads()
        if nt:
            return (f"worker state changed: {len(nt)} new thread{'s' if len(nt) > 1 else ''} left "
                    f"running after the call (work outside the timed call)")
        return ""

    def final(self) -> str:
        from kforge_tui.sandbox.backends import probe

        st = self.after_call()
        if st:
            return st
        probs = [x for x in probe.diff(self.after, self._census(), self.lib_path,
                                       allow_dirs=self.allow_dirs) if not x.endswith("left running")]
        return "worker state changed after the calls: " + "; ".join(probs) if probs else ""


class _RunnerError(Exception):
    def __init__(self, text: str, device: str = ""):
        super().__init__(text)
        self.device = device

