"""Timing across the two processes, and the baselines timed beside each candidate.

The loop itself is `bench.time_calls`; this module is where it meets the sandbox's processes:

  * `RemoteTiming.time_remote` (supervisor): asks the runner to run its timing loop and answers
    its checkpoints (`before` a checked call: fresh inputs, the fill window; `after`: the
    verdict), then refuses a report the wall clock contradicts;
  * the runner's side of the same checkpoints is the `Remote` checks of sandbox/runner.py;
  * eager and torch.compile of the region are timed in the supervisor by the same loop, at
    `prepare` (`_time_compiled`, or `_time_inductor` on a GPU for Triton, which also yields the
    Inductor seed) and again next to every candidate (`_adjacent_baselines`).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from kforge_tui.sandbox.channel import send

if TYPE_CHECKING:
    from kforge_tui.sandbox.supervisor import PreparedTask


class RemoteTiming:
    """Mixin of the supervisor (`supervisor.Worker`): every timing it takes or asks for."""

    def _time_inductor(self, st: "PreparedTask", timing: dict | None):
        """(compiled timing or None, note, seed JSON or None): the region compiled by Inductor
        for the GPU (`inductor_seed.compile_region`, autotuned on set 0), timed as the
        torch.compile baseline; its Triton code rewritten to the candidate ABI is the seed."""
        from kforge_tui.sandbox import bench
        from kforge_tui.search import inductor_seed

        try:
            with self.backend.stream_context():
                t0 = time.perf_counter()
                call, seed, note = inductor_seed.compile_region(st.task, st.sets[0].tensors(), "cuda")
                compile_s = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - the task goes on without a compile baseline or seed
            compiled, note = self._time_compiled(st, timing)
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            return compiled, f"no Triton seed: Inductor's compile of the region failed ({why}); {note}", None
        fn = lambda *xs: call(list(xs))  # noqa: E731
        try:
            with self.backend.stream_context():
                t, _ = bench.time_calls(self.backend, lambda s: fn(*s.tensors()), st.sets,
                                        {**bench.DEFAULT_TIMING, **(timing or {}), "max_wall_s": 2.5})
            st.compiled_fn = fn
            compiled = asdict(t)
        except Exception as e:  # noqa: BLE001
            compiled = None
            note = (note + "; " if note else "") + f"timing torch.compile failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
        text = f"torch.compile took {compile_s:.1f} s to compile (Inductor, autotuned on the GPU)"
        if seed is not None:
            text += f"; Triton seed: Inductor's {len(seed.kernels)} kernel{'s' if len(seed.kernels) > 1 else ''}"
        return compiled, "; ".join(x for x in (text, note) if x), (seed.to_json() if seed is not None else None)


    def _time_compiled(self, st: PreparedTask, timing: dict | None):
        from kforge_tui.sandbox import bench

        try:
            fn = self.torch.compile(st.gm)
            with self.backend.stream_context():
                t0 = time.perf_counter()
                fn(*st.sets[0].tensors())
                compile_s = time.perf_counter() - t0
                t, _ = bench.time_calls(self.backend, lambda s: fn(*s.tensors()), st.sets,
                                        {**bench.DEFAULT_TIMING, **(timing or {}), "max_wall_s": 2.5})
            st.compiled_fn = fn
            return asdict(t), f"torch.compile took {compile_s:.1f} s to compile"
        except Exception as e:  # inductor missing a compiler etc.: the baseline goes on without it
            return None, f"torch.compile unavailable: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"



    # What the baselines timed next to each candidate cost: a short loop each (the task's full
    # baseline at prepare stays in the store for the tables).
    ADJACENT_TIMING = {"warmup": 2, "min_iters": 10, "max_iters": 40, "budget_s": 0.08,
                       "max_wall_s": 1.0}

    def _adjacent_baselines(self, st: PreparedTask, req: dict) -> dict:
        """Eager (and torch.compile, when the task has it) timed again right after this
        candidate, on the same input sets in the same process: a node's speedup is over the
        eager time measured with it, not a figure cached at the start of the task (issue 16).
        On any failure the prepared figures stand."""
        from kforge_tui.sandbox import bench

        out: dict = {}
        cfg = {**bench.DEFAULT_TIMING, **(req.get("timing") or {}), **self.ADJACENT_TIMING}
        fns = {"eager": st.eager_fn or st.gm}
        if getattr(st, "compiled_fn", None) is not None:
            fns["compiled"] = st.compiled_fn
        for name, fn in fns.items():
            try:
                with self.backend.stream_context():
                    t, _ = bench.time_calls(self.backend, lambda s, fn=fn: fn(*s.tensors()), st.sets, cfg)
                out[name] = asdict(t)
            except Exception:  # noqa: BLE001 - the prepared baseline is the fallback
                continue
        return out

    def _time_remote(self, runner, v, st: PreparedTask, req: dict, rx, remaining):
        from kforge_tui.sandbox import verify

        cfg = {**(req.get("timing") or {})}
        wall0 = time.perf_counter()
        send(runner.sock, {"cmd": "time", "cfg": cfg, "seed": int.from_bytes(os.urandom(6), "little") | 1})
        with self.backend.stream_context():
            while True:
                m = rx()
                ev = m.get("ev")
                if ev == "before":
                    slots = v.timed_before(st.sets[int(m["set"])], bool(m.get("refresh")),
                                           set_index=int(m["set"]))
                    send(runner.sock, {"go": 1, "slots": slots})
                elif ev == "after":
                    problem = m.get("problem") or v.census.after_call()
                    mm = v.timed_after(st.sets[int(m["set"])],
                                       verify.CallReport(int(m.get("rc", 0)), problem))
                    rep = {"mismatch": asdict(mm) if mm is not None else None}
                    nxt = m.get("next")
                    if mm is None and isinstance(nxt, dict):
                        # the next timed call prepared with this verdict: one round trip per call
                        j = int(nxt["set"])
                        rep["next"] = {"set": j, "slots": v.timed_before(st.sets[j], bool(nxt.get("refresh")),
                                                                         set_index=j)}
                    send(runner.sock, rep)
                elif ev == "timed" or ev == "called":
                    v.home()
                    if m.get("candidate_error"):
                        raise verify.CandidateError(m["candidate_error"])
                    t = m.get("timing")
                    mm = m.get("mismatch")
                    wall = time.perf_counter() - wall0
                    if t and t.get("n") and t["median_us"] * t["n"] * 0.5e-6 > wall + 0.01:
                        return t, verify.special_mismatch(
                            "timing report", 1, "worker state changed: the kernel's process reported "
                            f"timings longer than the {wall:.3g} s the loop took (a forged report)")
                    return t, (verify.Mismatch(**mm) if mm else None)

