"""The engine: one asyncio orchestration of load → profile → capture → baselines → search → end to end.

Data flows one way (workload → search → sandbox → store → integrate). Every state change is
written to the run store first and then emitted as a typed event (events.py), so a UI that
attaches later (follow mode) sees the same thing as one that was there from the start, and a
killed run loses only what was in flight. The engine never imports Textual and never loads
candidate code: candidates run in sandbox worker processes behind the `Evaluator` interface.

Per task, the loop keeps up to `parallel` expansions in flight (a slot semaphore shared by all
tasks bounds the total): select a leaf with MCTS, reserve a child node in the store, ask the
proposer for source, evaluate it, back the reward up, emit. UI commands (control.py) arrive by
method call (in-process TUI) or through the store's command table (a TUI in another process).
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from kforge_tui import events as ev
from kforge_tui.device import device_info, release_cached_memory, resolve_backend
from kforge_tui.errors import UsageError, WorkFailed
from kforge_tui.figures import retiming_action
from kforge_tui.evaluators import (  # noqa: F401 (re-exported)
    _Slots, default_parallel, device_of, kernel_backends, PoolPerLanguage)
from kforge_tui.run_settings import OptimizeSettings, reserve_run_dir, settings_for_resume  # noqa: F401
from kforge_tui.sandbox.result import EvaluatorLost
from kforge_tui.search.languages import route, search_plan
from kforge_tui.workload.select import check_ops
from kforge_tui.search.proposers.base import NodeView, Proposal, ProposalContext
from kforge_tui.search.state import SearchState, _baseline_json, _view
from kforge_tui.regions.task import Task


class Engine:
    """Runs one optimisation; implements control.EngineControl for UIs."""

    def __init__(self, settings: OptimizeSettings, sink: ev.EventCallback | None = None, *,
                 evaluator=None, proposer=None):
        self.settings = settings
        self._sink = sink or (lambda e: None)
        self._evaluator = evaluator
        self._proposer = proposer
        self.store = None
        self.loaded = None
        self.run_dir: Path | None = Path(settings.run_dir) if settings.run_dir else None
        self.tasks: dict[str, SearchState] = {}
        self._paused_all = False
        self._stop = False
        self._made_dir: bool | None = None  # whether _create_store made the run directory itself
        self._slots: _Slots | None = None
        self._serve_wake: asyncio.Event | None = None
        self._lost = ""  # why the evaluator is gone (EvaluatorLost): the run stops
        self._searching = asyncio.Event()  # set once the evaluator and the baselines are ready
        self._user_tasks: set = set()  # hand-written kernels and repairs being evaluated
        self._started_at = time.time()
        self._task_backend: str | None = None
        self.languages: list[str] = []  # kernel languages searched (search/languages.py)

    # ----------------------------------------------------------------- events

    def emit(self, event: ev.Event) -> None:
        if isinstance(event, ev.STORED) and self.store is not None:
            try:  # phases, log lines and task reasons: an attached TUI reads them from the store
                self.store.append_event(event.to_json())
            except Exception:
                pass
        try:
            self._sink(event)
        except Exception:  # a consumer's bug must not kill the search
            pass

    def log(self, message: str, level: str = "info") -> None:
        self.emit(ev.LogLine(level=level, message=message))

    # ----------------------------------------------------------------- main flow

    async def run(self) -> dict:
        s = self.settings
        if not s.resume:
            s.device = resolve_backend(s.device)
        backend = s.device
        info = device_info(backend)
        auto_parallel = not s.parallel
        if not s.parallel:
            s.parallel = default_parallel(backend)
        if s.compile_baseline is None:
            s.compile_baseline = backend == "cuda"
        self._slots = _Slots(max(1, s.parallel))
        self._serve_wake = asyncio.Event()
        self._task_backend, self.languages = search_plan(backend, s.backend)
        proposer = self._proposer or self._make_proposer()
        self._proposer = proposer

        if s.resume:
            self._open_existing()
        else:
            self._create_store(info, proposer)
        self._started_at = time.time()
        self.emit(ev.RunStarted(run_dir=str(self.run_dir), model=s.model, device=backend,
                                device_name=info.name, proposer=proposer.name, settings=s.to_json(),
                                ts=self._started_at))
        beat = asyncio.create_task(self._heartbeat())
        try:
            if self._evaluator is None and s.cluster:
                await self._start_cluster(backend, auto_parallel)
            if not s.resume:
                await self._prepare(backend)
                await asyncio.to_thread(release_cached_memory)  # the profile's cache, for the workers
                from kforge_tui.store import register_run

                register_run(self.run_dir)  # only a run whose model loaded is worth listing
            else:
                self._restore_tasks()
            if not self.tasks:
                raise UsageError(f"{s.model}: no region to optimise found "
                                 f"({'none of ' + ','.join(s.ops) if s.ops else 'profile shows none'}); "
                                 "nothing to optimise")
            if self._evaluator is None:
                from kforge_tui.evaluators import PoolPerLanguage

                self._evaluator = PoolPerLanguage(sorted({ts.task.backend for ts in self.tasks.values()}
                                                         | set(self.languages)))
                await self._evaluator.start()
            await self._baselines()
            self.emit(ev.Phase(name="search", detail=f"{len(self.tasks)} regions, budget {s.budget} each"))
            self.store.set_run_status("running")
            self._searching.set()
            poller = asyncio.create_task(self._poll_commands())
            try:
                await asyncio.gather(*(self._search_task(ts) for ts in self.tasks.values()))
                await self._user_work_done()
                self.emit(ev.Phase(name="done", detail="the search is over"))
                while s.serve and not self._stop:
                    await self._serve_once()
                await self._user_work_done()
            finally:
                poller.cancel()
            summary = await self._finish()
            if self._lost:
                raise EvaluatorLost(self._lost)
            return summary
        except BaseException as e:
            if isinstance(e, UsageError) and self._made_dir is not None and not self.tasks:
                self._discard_run()  # a mistyped model leaves nothing behind to block the next try
            if self.store is not None:
                status = "stopped" if isinstance(e, (KeyboardInterrupt, asyncio.CancelledError, EvaluatorLost)) \
                    else "failed"
                try:
                    self.store.set_run_status(status)
                except Exception:
                    pass
            if isinstance(e, EvaluatorLost):  # stopped cleanly: say how to go on
                raise EvaluatorLost(f"{e}; the run is stopped with everything evaluated so far: "
                                    f"`kforge resume {self.run_dir}` continues it") from None
            raise
        finally:
            beat.cancel()
            if self._evaluator is not None and self._proposer is not None:
                try:
                    await self._evaluator.close()
                except Exception:
                    pass
            if self.store is not None:
                self.store.close()

    async def _start_cluster(self, backend: str, auto_parallel: bool) -> None:
        """--cluster: reach the cluster and admit its nodes before anything is captured, so a
        cluster that cannot run this device fails the run in seconds, with the reason."""
        from kforge_tui.cluster import make_evaluator

        s = self.settings
        self.log(f"evaluation on the Ray cluster ({s.cluster}): starting a worker on every node")
        evaluator = make_evaluator(s.cluster, backend, log=self.log,
                                   on_workers=lambda nodes: self.emit(ev.Workers(nodes=nodes)))
        await evaluator.start(list(self.languages))
        self._evaluator = evaluator
        if auto_parallel or s.resume:  # enough in flight to keep every slot busy while others build
            s.parallel = max(s.parallel, 2 * evaluator.n_workers)
            self._slots = _Slots(s.parallel)

    def _make_proposer(self):
        if self.settings.llm:
            from kforge_tui.search.proposers.llm import LLMProposer

            return LLMProposer(self.settings.llm, api_base=self.settings.api_base)
        from kforge_tui.search.proposers.builtin import BuiltinProposer

        return BuiltinProposer()

    def _create_store(self, info, proposer) -> None:
        from kforge_tui.store import RunStore

        existed = self.run_dir is not None and self.run_dir.exists()
        if self.run_dir is None:
            try:  # made here, so removed with the run if it fails
                self.run_dir = reserve_run_dir(self.settings)
            except OSError as e:
                raise UsageError(f"cannot create a run directory under {self.settings.run_root}: "
                                 f"{e.strerror or e}") from None
        if (self.run_dir / "run.db").exists():
            raise UsageError(f"{self.run_dir} already holds a run; use `kforge resume {self.run_dir}` "
                             "or another --run-dir")
        self.settings.run_dir = str(self.run_dir)
        try:
            self.store = RunStore.create(self.run_dir, model=self.settings.model,  # 0700, owner lock held
                                         settings=self.settings.to_json(), device=info.to_json(),
                                         proposer=proposer.name)
        except BaseException:
            if not existed:  # all in it is this call's
                import shutil
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        self._made_dir = not existed

    def _discard_run(self) -> None:
        """Remove what _create_store made (the directory, or only its files in a directory the user gave)."""
        import shutil

        self.store.close()
        self.store = None
        if self._made_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        for name in ("run.db", "run.db-wal", "run.db-shm", "owner.lock"):
            (self.run_dir / name).unlink(missing_ok=True)
        for name in ("captures", "cache"):
            shutil.rmtree(self.run_dir / name, ignore_errors=True)

    def _open_existing(self) -> None:
        from kforge_tui.store import RunStore

        self.store = RunStore.open(self.run_dir, owner=True)  # UsageError while another process runs it

    async def _prepare(self, backend: str) -> None:
        """Load, capture the regions with their real tensors, profile them, pick the tasks."""
        from dataclasses import replace

        from kforge_tui.workload.capture import save_captures, trace_model
        from kforge_tui.workload.loader import load_model
        from kforge_tui.workload.profile import profile_regions
        from kforge_tui.workload.select import select

        s = self.settings
        self.emit(ev.Phase(name="load", detail=s.model))
        self.loaded = await asyncio.to_thread(load_model, s.model, backend)
        self.emit(ev.Phase(name="capture", detail="the graph as torch.compile sees it, real tensors"))
        with ev.forward_log("kforge.workload", self.log):  # skips and caps reach the user
            traced = await asyncio.to_thread(trace_model, self.loaded, self._task_backend,
                                             max_calls=s.max_calls)
        if s.ops:  # before the profile: a mistyped name fails now, not after the timing
            check_ops(traced.tasks(), s.ops)
        self.emit(ev.Phase(name="profile", detail=f"{len(traced.records)} regions"))
        prof = await asyncio.to_thread(profile_regions, self.loaded, traced,  # headroom needs compile
                                       compile_top=max(3 * s.top, 12) + len(s.ops or ()))
        rows = [r.to_json() for r in prof.rows]
        self.store.save_profile(rows)
        self.emit(ev.ProfileReady(rows=rows))
        for note in prof.notes:
            self.log(f"profile: {note}")
        tasks = []
        for t in traced.tasks():
            row = prof.row_for(t.key)
            if row is None or not row.target:
                continue
            tasks.append(replace(t, calls=row.calls, total_us=row.total_us, share=row.share,
                                 compiled_us=row.compiled_us))
        serves, passed, left = getattr(self._proposer, "serves", None), [], []
        chosen = select(tasks, s.ops, s.top, prof, passed=passed, left=left,
                        serves=serves and (lambda t: serves(t, self.languages)))
        for t in passed:
            self.log(f"{t.op} {'x'.join(map(str, t.shape))}: passed over, no built-in kernel design fits "
                     "this region (an LLM can write one: --llm MODEL)")
        if left:
            self.log(f"--ops: {len(left)} more matching region(s) not searched, --top {s.top} is full: "
                     + ", ".join(f"{t.op} {'x'.join(map(str, t.shape))}" for t in left[:6])
                     + (" …" if len(left) > 6 else "") + f" (--top {len(chosen) + len(left)} searches them)")
        if passed and not chosen:
            raise UsageError("no region this model's profile ranks has a built-in kernel design; "
                             "--llm MODEL writes kernels for any region")
        notes = await asyncio.to_thread(save_captures, self.run_dir, chosen, traced)
        for t in chosen:
            self.log(f"{t.task_id}: {t.op} ({t.kind}) at {t.source or t.module or 'the model'}; "
                     f"{notes.get(t.task_id, 'no calls captured')}")
            self.store.add_task(t, s.budget)
            self._add_task_state(t, s.budget, root_id=None)

    def _add_task_state(self, task: Task, budget: int, root_id: int | None, rows=None) -> SearchState:
        from kforge_tui.search import mcts

        s = self.settings
        if rows:
            tree = mcts.Tree.rebuild(task.task_id, rows, budget=budget, seed=s.seed,
                                     time_limit_s=s.time_limit_s, target_speedup=s.target_speedup)
        else:
            if root_id is None:
                root_id = self.store.add_node(task.task_id, None, action="root", proposer="pytorch",
                                              status="ok")
                self.store.finish_node(root_id, status="ok", message="PyTorch reference", result=None,
                                       reward=0.0, speedup=1.0)
            tree = mcts.Tree(task.task_id, budget=budget, seed=s.seed, root_id=root_id,
                             time_limit_s=s.time_limit_s, target_speedup=s.target_speedup)
        ts = SearchState(task=task, tree=tree)
        for row in rows or [self.store.node(root_id)]:
            ts.views[row["id"]] = _view(row)
            if row.get("status") == "ok" and row.get("speedup") and row["action"] != "root":
                ts.best_speedup = max(ts.best_speedup, row["speedup"])
        self.tasks[task.task_id] = ts
        self.emit(ev.TaskAdded(task_id=task.task_id, op=task.op, shape=list(task.shape),
                               dtype=task.dtype, budget=budget, calls=task.calls,
                               total_us=task.total_us, share=task.share))
        for row in rows or [self.store.node(root_id)]:  # the root too, so a live tree has its top line
            self._replay_node(task.task_id, row)
        return ts

    def _restore_tasks(self) -> None:
        """Resume: rebuild trees from the store; nodes that were in flight when the run died are lost."""
        for row in self.store.pending_nodes():  # kept visible, but not counted against the budget
            self.store.finish_node(row["id"], status="lost", message="lost: the run stopped while it was in flight",
                                   result=None, reward=_fail_reward())
        for t in self.store.tasks():
            task = Task.from_json(t["task"])
            every = [r for r in self.store.nodes(task.task_id) if r["status"] != "lost"]  # re-timings: not in the tree
            rows = [r for r in every if not (r.get("action") or "").startswith("confirm:")]
            ts = self._add_task_state(task, t["budget"], root_id=None, rows=rows)
            ts.confirm_of = {r["id"]: r["parent_id"] for r in every if r not in rows}
            ts.baseline = t.get("baseline")
            ts.status = t["status"]
            # what the user asked before the run was interrupted still holds (stored control state)
            ctl = t.get("control") or {}
            if ctl.get("stopped"):
                ts.stopped = True
                ts.tree.stop()
            ts.paused = bool(ctl.get("paused"))
            if ts.status in ("done", "failed", "stopped"):  # a live view shows how it ended, not "waiting"
                self.emit(ev.TaskStatus(task_id=task.task_id, status=ts.status,
                                        detail="stopped by the user" if ts.status == "stopped" else ""))
        self._paused_all = bool(self.store.control().get("*", {}).get("paused"))
        held = [tid for tid, ts in self.tasks.items() if ts.stopped or ts.paused or self._paused_all]
        self.log(f"resumed {len(self.tasks)} regions from {self.run_dir}"
                 + (f"; stopped or paused as you left them: {', '.join(held)}" if held else ""))

    def _replay_node(self, task_id: str, row: dict) -> None:
        self.emit(ev.NodeAdded(task_id=task_id, node_id=row["id"], parent_id=row["parent_id"],
                               action=row["action"], proposer=row["proposer"]))
        if row["status"] != "pending":  # at its own time: a resumed run's rate counts only new work
            from kforge_tui.summary import figure_fields

            self.emit(ev.NodeFinished(task_id=task_id, node_id=row["id"], status=row["status"],
                                      message=row.get("message") or "", time_us=row.get("time_us"),
                                      speedup=row.get("speedup"), reward=row.get("reward") or 0.0,
                                      ts=row.get("finished") or time.time(),
                                      **figure_fields(row.get("result"))))

    async def _baselines(self) -> None:
        self.emit(ev.Phase(name="baseline", detail="timing eager PyTorch" +
                           (" and torch.compile" if self.settings.compile_baseline else "")))
        failed = []
        for ts in self.tasks.values():
            if ts.baseline is None:
                lang = "triton" if "triton" in self.languages else ts.task.backend  # the seed's worker
                try:
                    b = await self._evaluator.baseline(ts.task.with_backend(lang).to_json(), str(self.run_dir),
                                                       with_compile=bool(self.settings.compile_baseline))
                except WorkFailed as e:
                    # one region PyTorch itself cannot run as captured costs that region, not the
                    # run: it is listed failed with the reason and the others are searched
                    failed.append(str(e))
                    self.log(f"{ts.task.task_id}: not searched: {e}", "warning")
                    self._set_status(ts, "failed", f"no baseline: {e}")
                    self._pass_on_budget(ts)
                    ts.tree.stop()
                    continue
                ts.baseline = _baseline_json(b)
                self.store.set_baseline(ts.task.task_id, ts.baseline)
            b = ts.baseline
            if b.get("seed"):  # Inductor's own Triton kernel for the region: the seed node
                from kforge_tui.search import inductor_seed

                inductor_seed.remember(ts.task.with_backend("triton"), b["seed"])
            self.emit(ev.TaskBaseline(task_id=ts.task.task_id, eager_us=b["eager"]["median_us"],
                                      compiled_us=(b.get("compiled") or {}).get("median_us"),
                                      floor_us=b.get("floor_us"),
                                      baseline={k: v for k, v in b.items() if k != "seed"}))
        if failed and len(failed) == len(self.tasks):
            raise WorkFailed(f"no region could be timed: {failed[0]}")

    # ----------------------------------------------------------------- search

    async def _search_task(self, ts: SearchState, confirm: bool = True) -> None:
        tid = ts.task.task_id
        if ts.baseline is None:  # its baseline failed (_baselines said why): nothing to compare with
            return
        if ts.stopped:  # stored control state: a stop survives kill and resume
            if ts.status != "stopped":
                self._set_status(ts, "stopped", "stopped by the user")
            return
        if ts.tree.done():
            if ts.status not in ("done", "failed", "stopped"):
                self._set_status(ts, "done" if ts.tree.best() else "failed", self._reason(ts))
            return
        ts.exhausted = ""
        self._set_status(ts, "paused" if ts.paused or self._paused_all else "searching")
        ts.started = time.time()
        await self._seed_node(ts)
        while True:
            ts.wake.clear()
            paused = ts.paused or self._paused_all
            if self._stop or ts.stopped or ts.tree.done():
                break
            launched = False
            if not paused and len(ts.inflight) < self.settings.parallel and not ts.tree.done():
                leaf = ts.tree.select()
                if leaf is not None:
                    ctx = self._context(ts, leaf, leaf.mode)
                    if not self._proposer.can_expand(ctx):
                        ts.tree.mark_exhausted(leaf)
                        continue
                    await self._slots.acquire()  # a global cap on evaluations in flight
                    child, node_id = self._reserve(ts, leaf, ctx.mode)
                    self._spawn(ts, self._expand(ts, leaf, child, node_id, ctx))
                    launched = True
                elif not ts.inflight:
                    ts.tree.stop()  # nothing left to expand anywhere: the space is exhausted
                    ts.exhausted = (f"{ev.EXHAUSTED} after {ts.tree.evaluated} candidates: no node "
                                    "of the tree can be expanded further")
                    break
            if launched:
                continue
            waiters = set(ts.inflight) | {asyncio.ensure_future(ts.wake.wait())}
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED, timeout=1.0)
            for w in waiters - set(ts.inflight):
                w.cancel()
        if ts.inflight:
            await asyncio.gather(*ts.inflight, return_exceptions=True)
        if self._exhausted(ts) and not ts.stopped:
            self.log(f"{tid}: {self._exhausted(ts)}", "warning")
            self._pass_on_budget(ts)
        if confirm and not ts.stopped and not self._stop and ts.tree.best() is not None:
            await self._confirm(ts)
        if ts.stopped:
            self._set_status(ts, "stopped", "stopped by the user")
        elif ts.tree.best() is None:
            self._set_status(ts, "failed", f"no verified candidate ({self._outcomes(ts)}{self._reason(ts)})")
        else:
            self._set_status(ts, "done", self._reason(ts))

    def _pass_on_budget(self, ts: SearchState) -> None:
        """A search out of ideas hands its unspent budget to the searches still running."""
        from kforge_tui.search.node_zero import shares

        left = ts.tree.budget - ts.tree.evaluated
        others = [o for o in self.tasks.values() if o is not ts and not o.stopped and not o.tree.done()]
        if left <= 0 or self._stop or not others:
            return
        for o, n in [(ts, -left)] + list(zip(others, shares(left, len(others)))):
            o.tree.add_budget(n)
            self.store.set_budget(o.task.task_id, o.tree.budget)
            self.emit(ev.TaskBudget(task_id=o.task.task_id, budget=o.tree.budget))
            o.wake.set()
        self.log(f"{ts.task.task_id}: {left} unspent candidate(s) passed on to "
                 f"{', '.join(o.task.task_id for o in others)}")

    async def _seed_node(self, ts: SearchState) -> None:
        """Node zero (search/node_zero.py): Inductor's own kernel, the root's first child."""
        from kforge_tui.search.node_zero import ACTION, PROPOSER, node_zero

        if "triton" not in self.languages or self._stop or ts.stopped or ts.tree.done() \
                or any(v.action == ACTION for v in ts.views.values()):
            return
        source, params, why = node_zero(ts.task, (ts.baseline or {}).get("note", ""))
        tid, root = ts.task.task_id, ts.tree.root.node_id
        if source is None:
            self.log(f"{tid}: no Inductor seed (node zero): {why}", "warning")
            return
        async with self._slots:
            node_id = self.store.add_node(tid, root, action=ACTION, proposer=PROPOSER, source=source,
                                          params=params, status="pending")
            child = ts.tree.add_child(ts.tree.root, node_id=node_id, action=ACTION, params=params,
                                      mode="root")
            ts.views[node_id] = NodeView(node_id, root, ACTION, source, params=params)
            self.emit(ev.NodeAdded(task_id=tid, node_id=node_id, parent_id=root, action=ACTION,
                                   proposer=PROPOSER))
            await self._evaluate(ts, child, node_id, source)

    CONFIRM_TOP = 2  # best candidates re-timed side by side before one is called the winner
    CONFIRM_MAX, CONFIRM_WITHIN = 5, 1.5  # re-timings a task at most; up front only within 1.5x the best

    async def _confirm(self, ts: SearchState) -> None:
        """Re-evaluate the best few verified candidates once more (fresh verification; eager
        and torch.compile timed next to each, sandbox worker `_adjacent_baselines`) and let the
        best re-timing be the task's winner (store._TASKS_SQL), so that the maximum of many
        noisy ratios does not win by luck. Re-timings are stored as `confirm:#<id>` children,
        not charged to the budget and not part of the MCTS tree.

        One far behind the fastest (CONFIRM_WITHIN) is not re-timed up front. A re-timing can
        come out slower or noisier than its search figure: a winner or leader not re-timed is
        re-timed in turn, until both are re-timings (or CONFIRM_MAX were made: the log says)."""
        tid = ts.task.task_id
        confirmed = set(ts.confirm_of.values())
        top = sorted((v for v in ts.views.values() if v.status == "ok" and v.speedup and v.source
                      and v.parent_id is not None and not v.action.startswith("confirm:")
                      and v.node_id not in confirmed),
                     key=lambda v: v.time_us or float("inf"))[:self.CONFIRM_TOP]
        for v in [v for v in top if (v.time_us or 0) <= self.CONFIRM_WITHIN * (top[0].time_us or 0)]:
            if self._stop or ts.stopped:
                return
            await self._retime(ts, v)
        while not (self._stop or ts.stopped):
            row = self.store.task(tid)  # the winner (quiet), then the fastest figure, noisy or not
            due = [ts.views[n] for n in (row["best_node"], row["leader_node"]) if n in ts.views
                   and not ts.views[n].action.startswith("confirm:") and n not in ts.confirm_of.values()]
            if not due:
                return
            if len(ts.confirm_of) >= self.CONFIRM_MAX:
                self.log(f"{tid}: #{due[0].node_id} leads on its search figure alone: {self.CONFIRM_MAX} "
                         "re-timings made, none faster or quieter", "warning")
                return
            await self._retime(ts, due[0])

    async def _retime(self, ts: SearchState, v: NodeView) -> None:
        """One `confirm:#<id>` re-timing of candidate `v` (see _confirm)."""
        tid = ts.task.task_id
        action = retiming_action(v.node_id)
        node_id = self.store.add_node(tid, v.node_id, action=action, proposer="kforge",
                                      source=v.source, params=v.params, status="pending")
        ts.views[node_id] = NodeView(node_id, v.node_id, action, v.source, params=v.params)
        ts.confirm_of[node_id] = v.node_id
        self.emit(ev.NodeAdded(task_id=tid, node_id=node_id, parent_id=v.node_id, action=action,
                               proposer="kforge"))
        try:
            async with self._slots:
                r = await self._evaluator.evaluate(route(ts.task, v.source, self.languages).to_json(),
                                                   str(self.run_dir), v.source)
        except EvaluatorLost as e:
            self._evaluator_lost(ts, None, node_id, e)
            return
        except Exception as e:  # the first figure stands; say why it was not confirmed
            self.store.finish_node(node_id, status="lost", message=f"re-timing failed: {e}",
                                   result=None, reward=_fail_reward())
            return
        if r.status == "infra_error":
            self.store.finish_node(node_id, status="lost", message=f"not re-timed: {r.message}",
                                   result=None, reward=_fail_reward())
            return
        ok = r.status == "ok"
        time_us = r.timing.median_us if ok and r.timing else None
        self.store.finish_node(node_id, status=r.status, message=r.message, result=r.to_json(),
                               reward=_fail_reward() if not ok else 0.0, time_us=time_us,
                               speedup=r.speedup if ok else None, worker=getattr(r, "worker", None))
        from kforge_tui.summary import figure_fields, fmt_pct, fmt_us

        view = ts.views[node_id]
        view.status, view.message, view.time_us, view.speedup = r.status, r.message, time_us, r.speedup
        figs = figure_fields(r.to_json())
        self.emit(ev.NodeFinished(task_id=tid, node_id=node_id, status=r.status, message=r.message,
                                  time_us=time_us, speedup=r.speedup, reward=0.0, **figs))
        self.log(f"{tid}: #{v.node_id} re-timed side by side: "  # times: the ratios are the TUI's
                 + (f"{fmt_us(v.time_us)} in the search, {fmt_us(time_us)} now "
                    f"(spread {fmt_pct(figs['spread'])})" if ok and time_us
                    else f"failed now ({r.status}: {r.message})"),
                 "info" if ok else "warning")

    def _reason(self, ts: SearchState) -> str:
        """Why a task's search ended, in the words the TUI shows under its tree."""
        if self._stop and not ts.tree.done():
            return "the run was stopped"
        if self._exhausted(ts):
            return self._exhausted(ts)
        return {"budget": f"budget of {ts.tree.budget} spent", "target": "target speedup reached",
                "time": "time limit reached"}.get(ts.tree.stop_reason, ts.tree.stop_reason or "done")

    @staticmethod
    def _outcomes(ts: SearchState) -> str:
        """How the evaluated candidates failed ("2 timeout, 1 verify_error: "), so a search that
        ran out of moves says whether its kernels were wrong or never finished; when every one
        failed alike, the first one's message as well."""
        failed = [v for v in ts.views.values() if v.source is not None and v.status not in ("ok", "pending")]
        if not failed:
            return ""
        tally = Counter(v.status for v in failed)
        text = ", ".join(f"{n} {st}" for st, n in tally.most_common())
        if len(tally) == 1 and failed[0].message:
            text += f" ({failed[0].message.splitlines()[0][:160]})"
        return text + "; "

    def _exhausted(self, ts: SearchState) -> str:
        """Why nothing is left to try for this task ("" while something is)."""
        if ts.exhausted:
            return ts.exhausted
        if ts.tree.stop_reason == "exhausted":
            return (f"{ev.EXHAUSTED} after {ts.tree.evaluated} candidates: the {self._proposer.name} "
                    "proposer has nothing new to try from any node")
        return ""

    def _spawn(self, ts: SearchState, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        ts.inflight.add(task)

        def _done(t, ts=ts):
            ts.inflight.discard(t)
            ts.wake.set()
            if not t.cancelled() and t.exception() is not None:
                self.log(f"{ts.task.task_id}: internal error in an expansion: {t.exception()!r}", "error")

        task.add_done_callback(_done)
        return task

    def _user_work(self, ts: SearchState, coro) -> None:
        """Start what the user asked for (a hand-written kernel, a repair) now, whatever the op's
        search is doing (searching, stopped, done): it waits only for the evaluator to be ready
        and then for the next free slot, ahead of the search's own candidates (_Slots)."""
        async def when_ready():
            await self._searching.wait()
            await coro

        task = self._spawn(ts, when_ready())
        self._user_tasks.add(task)
        task.add_done_callback(self._user_tasks.discard)

    async def _user_work_done(self) -> None:
        while self._user_tasks and not self._stop:
            await asyncio.gather(*list(self._user_tasks), return_exceptions=True)

    async def _heartbeat(self) -> None:
        """The owner's heartbeat in the store: with the owner lock, how a TUI attached from
        another process tells a live run from a dead (or hung) one."""
        while True:
            try:
                if self.store is not None:
                    self.store.beat(self._started_at)
            except Exception:
                pass
            await asyncio.sleep(1.0)

    def _context(self, ts: SearchState, leaf, mode: str) -> ProposalContext:
        from kforge_tui.search import context

        return context.build(ts, leaf, mode, device=device_info(device_of(ts.task.backend)).to_json(),
                             seed=self.settings.seed * 100003 + ts.tree.evaluated + len(ts.views),
                             languages=self.languages)

    def _reserve(self, ts: SearchState, leaf, mode: str):
        """Put the child in the store and the tree *before* proposing: in-flight exclusion starts now."""
        tid = ts.task.task_id
        node_id = self.store.add_node(tid, leaf.node_id, action="proposing", proposer=self._proposer.name,
                                      status="pending")
        child = ts.tree.add_child(leaf, node_id=node_id, action="proposing", mode=mode)
        ts.views[node_id] = NodeView(node_id, leaf.node_id, "proposing", None)
        self.emit(ev.NodeAdded(task_id=tid, node_id=node_id, parent_id=leaf.node_id,
                               action="proposing", proposer=self._proposer.name))
        self.emit(ev.NodeStage(task_id=tid, node_id=node_id, stage="proposing"))
        return child, node_id

    async def _expand(self, ts: SearchState, leaf, child, node_id: int, ctx: ProposalContext,
                      slot_held: bool = True) -> None:
        """One MCTS expansion: propose, evaluate, back up, emit. Releases the slot it was given
        (a repair the user asked for takes one first, at the front of the queue)."""
        if not slot_held:
            await self._slots.acquire(front=True)
            self.emit(ev.NodeStage(task_id=ts.task.task_id, node_id=node_id, stage="proposing"))
        try:
            await self._expand_inner(ts, leaf, child, node_id, ctx)
        finally:
            self._slots.release()

    async def _expand_inner(self, ts: SearchState, leaf, child, node_id: int, ctx: ProposalContext) -> None:
        from kforge_tui.search import context

        tid = ts.task.task_id
        context.refresh(ctx, ts.views, node_id)  # expansions reserved together see each other's
        try:
            proposal = await self._proposer.propose(ctx)
        except Exception as e:  # a proposer bug is a failed proposal, not a dead search
            proposal = Proposal(source=None, action=f"{ctx.mode}", proposer=self._proposer.name,
                                error=f"proposer raised {type(e).__name__}: {e}")
        self._account(proposal)
        self.store.set_node_fields(node_id, action=proposal.action, source=proposal.source,
                                   params=proposal.params or {}, prompt=proposal.prompt,
                                   response=proposal.response, proposer=proposal.proposer)
        child.action, child.params = proposal.action, dict(proposal.params or {})
        ts.views[node_id] = NodeView(node_id, leaf.node_id, proposal.action, proposal.source,
                                     params=proposal.params or {})
        self.emit(ev.NodeAdded(task_id=tid, node_id=node_id, parent_id=leaf.node_id,
                               action=proposal.action, proposer=proposal.proposer))
        if proposal.source is None:
            msg = proposal.error or "the proposer returned no code"
            await self._record(ts, child, node_id, status="proposal_error", message=msg, result=None)
            return
        await self._evaluate(ts, child, node_id, proposal.source)

    async def _evaluate_hand(self, ts: SearchState, child, node_id: int, source: str) -> None:
        await self._slots.acquire(front=True)
        try:
            await self._evaluate(ts, child, node_id, source)
        finally:
            self._slots.release()

    async def _evaluate(self, ts: SearchState, child, node_id: int, source: str) -> None:
        tid = ts.task.task_id

        def on_stage(stage: str) -> None:
            self.emit(ev.NodeStage(task_id=tid, node_id=node_id, stage=stage))

        try:
            result = await self._evaluator.evaluate(route(ts.task, source, self.languages).to_json(),
                                                    str(self.run_dir), source, on_stage=on_stage)
        except EvaluatorLost as e:
            self._evaluator_lost(ts, child, node_id, e)
            return
        except Exception as e:  # the evaluator promises not to raise; if it does, record it
            await self._record(ts, child, node_id, status="crash",
                               message=f"evaluator error: {type(e).__name__}: {e}", result=None)
            return
        if result.status == "infra_error":
            self._infra_failure(ts, child, node_id, result.message)
            return
        ts.infra_failures = 0
        await self._record(ts, child, node_id, status=result.status, message=result.message,
                           result=result)

    def _lose(self, ts, child, node_id: int, message: str) -> None:
        """Keep a node nobody could evaluate visible as lost: not charged, not in the tree."""
        self.store.finish_node(node_id, status="lost", message=message, result=None, reward=_fail_reward())
        if child is not None:
            ts.tree.cancel(child)
        self.emit(ev.NodeFinished(task_id=ts.task.task_id, node_id=node_id, status="lost", message=message,
                                  time_us=None, speedup=None, reward=_fail_reward()))

    def _evaluator_lost(self, ts, child, node_id: int, e: Exception) -> None:
        """Where candidates run is gone (EvaluatorLost, a cluster that stopped answering): the
        candidate is lost, not charged, and the run stops; `kforge resume` continues it."""
        if not self._lost:
            self._lost = str(e)
            self.log(f"{e}: stopping the run", "error")
        self._lose(ts, child, node_id, f"not evaluated: {e}")
        self.request_stop(end_to_end=False)

    def _infra_failure(self, ts, child, node_id: int, message: str) -> None:
        """The machine, not the candidate, failed (out of memory even with the fewest input
        sets, ...): the node is kept visible as lost, never charged to the budget and never
        sent to repair. Three in a row stop the task with the reason."""
        tid = ts.task.task_id
        self._lose(ts, child, node_id, f"not charged: {message}")
        ts.infra_failures += 1
        self.log(f"{tid}: infrastructure failure, not charged to the budget: {message}", "warning")
        if ts.infra_failures >= 3:
            self.log(f"{tid}: stopped after 3 infrastructure failures in a row", "error")
            self.stop_task(tid, by_user=False)  # not stored: a resume tries again

    async def _record(self, ts: SearchState, child, node_id: int, *, status: str, message: str, result) -> None:
        from kforge_tui.search import mcts

        tid = ts.task.task_id
        ok = status == "ok"
        speedup = result.speedup if (ok and result is not None) else None
        time_us = result.timing.median_us if (ok and result and result.timing) else None
        reward = mcts.reward(speedup) if ok and speedup else mcts.FAIL_REWARD
        from kforge_tui.summary import figure_fields

        rj = result.to_json() if result is not None else None
        self.store.finish_node(node_id, status=status, message=message, result=rj, reward=reward,
                               time_us=time_us, speedup=speedup,
                               worker=getattr(result, "worker", None))
        ts.tree.complete(child, reward=reward, ok=ok, time_us=time_us, speedup=speedup, message=message)
        v = ts.views[node_id]
        v.status, v.message, v.time_us, v.speedup = status, message, time_us, speedup
        if result is not None:
            v.resources = result.resources or {}
            if not ok:
                v.error_log = (result.mismatch.summary() + "\n" if result.mismatch else "") + (result.log or "")
        else:
            v.error_log = message
        ts.iteration += 1
        self.emit(ev.NodeFinished(task_id=tid, node_id=node_id, status=status, message=message,
                                  time_us=time_us, speedup=speedup, reward=reward, **figure_fields(rj)))
        if ok and speedup and speedup > ts.best_speedup:
            ts.best_speedup = speedup
            self.emit(ev.BestImproved(task_id=tid, node_id=node_id, time_us=time_us, speedup=speedup,
                                      iteration=ts.tree.evaluated))

    def _account(self, p: Proposal) -> None:
        if p.prompt_tokens or p.completion_tokens or p.cost_usd or p.prompt is not None:
            self.store.add_llm_usage(model=p.proposer, prompt_tokens=p.prompt_tokens,
                                     completion_tokens=p.completion_tokens, cost_usd=p.cost_usd,
                                     ok=p.source is not None, error=p.error)
            if p.source is None and p.error:  # 429/5xx after retries, prose, a cut-off answer
                self.log(f"LLM call failed: {p.error}", "warning")
            t = self.store.llm_totals()  # running totals of the whole run, resumes included
            self.emit(ev.LLMUsage(prompt_tokens=t["prompt_tokens"], completion_tokens=t["completion_tokens"],
                                  cost_usd=t["cost_usd"], calls=t["calls"], failures=t["failures"],
                                  last_error=t["last_error"]))

    def _set_status(self, ts: SearchState, status: str, detail: str = "") -> None:
        ts.status = status
        self.store.set_task_status(ts.task.task_id, status)
        self.emit(ev.TaskStatus(task_id=ts.task.task_id, status=status, detail=detail))

    # ----------------------------------------------------------------- serving after the search

    async def _serve_once(self) -> None:
        """Live TUI: after the budget, still evaluate hand-written kernels and repairs on request."""
        self._serve_wake.clear()
        work = [ts for ts in self.tasks.values() if not ts.tree.done() and not ts.stopped]
        if work:  # more budget after the search (hand-written kernels and repairs run on their own)
            self.emit(ev.Phase(name="search", detail=f"{len(work)} regions"))
            # not re-timed: the winner rule weighs an unconfirmed candidate by its own figure
            await asyncio.gather(*(self._search_task(ts, confirm=False) for ts in work))
            self.emit(ev.Phase(name="done", detail="the search is over"))
            return
        try:
            await asyncio.wait_for(self._serve_wake.wait(), timeout=1.0)
        except asyncio.TimeoutError:
            pass

    async def _poll_commands(self) -> None:
        """Commands posted into the store by a TUI in another process (control.py)."""
        while True:
            await asyncio.sleep(0.5)
            try:
                for cmd in self.store.take_commands():
                    self._apply_command(cmd["name"], cmd.get("args") or {})
            except Exception as e:
                self.log(f"could not read commands: {e}", "warning")

    def _apply_command(self, name: str, args: dict) -> None:
        handler = {"pause": self.pause, "resume": self.resume, "add_budget": self.add_budget,
                   "stop_task": self.stop_task, "submit_source": self.submit_source,
                   "repair": self.repair, "request_stop": self.request_stop}.get(name)
        if handler is None:
            self.log(f"unknown command {name!r} ignored", "warning")
            return
        handler(**args)

    async def _finish(self) -> dict:
        from kforge_tui.summary import show_json

        s = self.settings
        e2e = None
        verified = [ts for ts in self.tasks.values() if ts.tree.best() is not None]
        if s.end_to_end and verified:
            self.emit(ev.Phase(name="integrate", detail="end-to-end check of the patched model"))
            # The sandbox workers go first: their processes (CUDA contexts, spare runners, compile
            # jobs) made the whole-model timings of this process noisy (H200, 2026-12-01: the
            # same forwards read 4.9 ms here and 2.7 ms in a process of their own).
            if self._evaluator is not None and self._proposer is not None:
                try:
                    await self._evaluator.close()
                except Exception:  # noqa: BLE001 - a worker that will not close: time anyway
                    pass
                self._evaluator = None
            try:
                if self.loaded is None:
                    from kforge_tui.workload.loader import load_model

                    self.loaded = await asyncio.to_thread(load_model, s.model, s.device)
                from kforge_tui.integrate.e2e import check_with_fallback

                # the check records its report and decision in the store itself; its progress
                # lines come from its thread to this loop
                loop = asyncio.get_running_loop()
                e2e = await asyncio.to_thread(check_with_fallback, self.loaded, str(self.run_dir),
                                              None, None, lambda m: loop.call_soon_threadsafe(self.log, m))
            except Exception as e:  # the search results stand even if the model can't be rebuilt
                self.log(f"end-to-end check skipped: {type(e).__name__}: {e}", "warning")
        cut_short = self._stop and any(not ts.tree.done() for ts in self.tasks.values())
        self.store.set_run_status("stopped" if cut_short else "finished")
        summary = show_json(str(self.run_dir), store=self.store)
        summary["end_to_end"] = e2e
        self.emit(ev.Phase(name="done"))
        self.emit(ev.RunFinished(summary=summary))
        return summary

    # ----------------------------------------------------------------- EngineControl

    def _wake(self, task_id: str | None = None) -> None:
        for ts in ([self.tasks[task_id]] if task_id in self.tasks else self.tasks.values()):
            ts.wake.set()
        if self._serve_wake is not None:
            self._serve_wake.set()

    def _chosen(self, task_id: str | None) -> list[SearchState]:
        return list(self.tasks.values()) if task_id is None else [self.tasks[task_id]] if task_id in self.tasks else []

    def pause(self, task_id: str | None = None) -> None:
        """Pause searching tasks (None: all, and any that starts later); a finished task keeps its status."""
        if task_id is None:
            self._paused_all = True
        self._control(task_id, paused=True)
        for ts in self._chosen(task_id):
            if ts.status == "searching":
                ts.paused = True
                self._set_status(ts, "paused", "paused by the user")
        self._wake(task_id)

    def resume(self, task_id: str | None = None) -> None:
        if task_id is None:
            self._paused_all = False
        self._control(task_id, paused=False)
        for ts in self._chosen(task_id):
            if ts.paused and task_id is None:
                self._control(ts.task.task_id, paused=False)
            ts.paused = False
            if ts.status == "paused" and not (task_id is not None and self._paused_all):
                self._set_status(ts, "searching")
        self._wake(task_id)

    def add_budget(self, task_id: str, extra: int) -> None:
        ts = self.tasks.get(task_id)
        if ts is None or extra <= 0:
            return
        if self._exhausted(ts):  # more budget would run nothing: say why instead of pretending
            self.log(f"{task_id}: budget not raised: {self._exhausted(ts)}; edit a node or ask for a repair",
                     "warning")
            return
        ts.tree.add_budget(int(extra))
        self.store.set_budget(task_id, ts.tree.budget)
        self.emit(ev.TaskBudget(task_id=task_id, budget=ts.tree.budget))
        self.log(f"{task_id}: budget now {ts.tree.budget}")
        self._wake(task_id)

    def stop_task(self, task_id: str, *, by_user: bool = True) -> None:
        """Stop an op; a stop the user asked for is stored and holds after kill and resume."""
        ts = self.tasks.get(task_id)
        if ts is None or ts.status in ("done", "failed", "stopped"):
            return  # nothing runs: a finished task keeps the status that says how it ended
        ts.stopped = True
        ts.tree.stop()
        if by_user:
            self._control(task_id, stopped=True)
        if ts.status != "searching":  # no search loop is running for it to notice
            self._set_status(ts, "stopped", "stopped by the user")
        else:  # at once, to every view; "stopped" follows when its in-flight candidates finish
            self.emit(ev.TaskStatus(task_id=task_id, status="stopping",
                                    detail=f"stopping: {len(ts.inflight)} in flight finish first"))
        self._wake(task_id)

    def _control(self, task_id: str | None, **flags) -> None:
        """Stored control state (store.set_control): survives kill and resume."""
        if self.store is not None:
            try:
                self.store.set_control(task_id, **flags)
            except Exception as e:
                self.log(f"could not store {flags} for {task_id or 'the search'}: {e}", "warning")

    @staticmethod
    def _in_tree(ts: SearchState, node_id: int) -> int | None:
        """The tree node a UI command names: a re-timing (`confirm:`) stands for the node it
        re-timed, which is what the search tree holds."""
        node_id = ts.confirm_of.get(node_id, node_id)
        return node_id if ts.tree.nodes.get(node_id) is not None else None

    def submit_source(self, task_id: str, parent_id: int, source: str) -> None:
        """A hand-written kernel: in the store and the tree at once (queued), evaluated next."""
        ts = self.tasks.get(task_id)
        pid = self._in_tree(ts, parent_id) if ts is not None else None
        if pid is None:
            return
        node_id = self.store.add_node(task_id, pid, action="hand", proposer="hand", source=source,
                                      hand_written=True, status="pending")
        child = ts.tree.add_child(ts.tree.nodes[pid], node_id=node_id, action="hand", mode="hand")
        ts.views[node_id] = NodeView(node_id, pid, "hand", source)
        self.emit(ev.NodeAdded(task_id=task_id, node_id=node_id, parent_id=pid, action="hand",
                               proposer="hand"))
        self.emit(ev.NodeStage(task_id=task_id, node_id=node_id, stage="queued"))
        self._user_work(ts, self._evaluate_hand(ts, child, node_id, source))

    def repair(self, task_id: str, node_id: int) -> None:
        """A repair of a failed node: reserved (queued) at once, proposed and evaluated next."""
        ts = self.tasks.get(task_id)
        nid = self._in_tree(ts, node_id) if ts is not None else None
        if nid is None:
            return
        leaf = ts.tree.nodes[nid]
        ctx = self._context(ts, leaf, "repair")
        child, new_id = self._reserve(ts, leaf, "repair")
        self.emit(ev.NodeStage(task_id=task_id, node_id=new_id, stage="queued"))
        self._user_work(ts, self._expand(ts, leaf, child, new_id, ctx, slot_held=False))

    def request_stop(self, end_to_end: bool | None = None) -> None:
        if end_to_end is not None:
            self.settings.end_to_end = end_to_end
        self._stop = True
        self._wake()


def _fail_reward() -> float:
    from kforge_tui.search import mcts

    return mcts.FAIL_REWARD


__all__ = ["Engine", "OptimizeSettings", "settings_for_resume"]
