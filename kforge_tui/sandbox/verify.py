"""Verification: does a candidate compute what the region's PyTorch graph computes, honestly?

This module is the procedure (`Verifier`: which calls, on which values, in which order); its
vocabulary is in sandbox/inputs.py (input sets, guarded buffers, fresh values, edge cases),
sandbox/references.py (PyTorch eager and float64 runs of the region) and sandbox/judge.py
(tolerances, `compare`, `judge_f64`), all re-exported here.

DESIGN.md "Verification and timing" in code, for region tasks (any number of inputs and
outputs, any dtype of meta.KERNEL_DTYPES, real strides). This module runs in the *supervisor*
(the worker process that never loads candidate code): it owns the input sets, computes every
reference, writes poison and guards, and judges outputs. The candidate is reached through a
callable `call(input_set) -> int | CallReport` - in the worker a round trip to a runner process
that shares the buffers, in tests a plain Python function - so all of this is testable in
process.

Decisions, stated once:
  * The reference is the region's own graph run by PyTorch eager at the task dtypes: the promise
    is "the model computes what it computed before", PyTorch's roundings included. The tolerance
    table (per OUTPUT dtype) is sized for an honest kernel that rounds differently; integer and
    bool outputs must match exactly.
  * Nothing the harness writes is predictable: before every checked call each output is filled
    with fresh random finite values of its dtype (no constant sentinel a kernel could look for)
    and the guard zones around every output with fresh random bytes. An element whose value
    after the call still equals the fill is reported as "poison survived".
  * Inputs live in guarded buffers too and are compared bitwise (guards and gaps included) with a
    private copy after every call: "inputs modified". Output guards and the gaps of strided
    outputs must keep their random bytes: "wrote outside the output".
  * Replay: results kept from an earlier call (keyed on pointers, a counter, or a few sampled
    elements) are caught by re-running with fresh values in the same buffers and with only a
    few elements changed in place ("replay"); the timing loop also checks a random subset of
    timed calls, some on newly written values.
  * The number and order of verification calls vary per candidate.
  * Edge cases: large magnitudes (+-100, and -inf masks for softmax/exp-like regions), tiny and
    denormal values, zeros, rows of equal values - judged against PyTorch at the task dtype
    *and* against a float64 run of the graph with an error bound in ulps of the output dtype
    (or a small multiple of PyTorch's own error, whichever is larger): "edge-case inputs". A
    region with no room for the float64 run is judged against PyTorch's own result, allowing
    a small multiple of its change under one-ulp input changes where that run fits.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

import torch

from kforge_tui.regions.meta import FLOAT_DTYPES, TensorMeta
# The verifier's vocabulary lives in three modules (input sets, references, the judge); callers
# keep importing it from here.
from kforge_tui.sandbox.inputs import *  # noqa: F401,F403
from kforge_tui.sandbox.inputs import (EDGE_TEXT, ArenaWatch, InputSet, _captured_inputs,  # noqa: F401
                                       _equal_words,
                                       RealValues, _captured_stats, checksum, draw, draw_into, edge_into,
                                       edge_kinds, fill_bytes, fill_random, generator, place,
                                       poison_scale, relocate, scrub)
from kforge_tui.sandbox.judge import *  # noqa: F401,F403
from kforge_tui.sandbox.judge import (MANTISSA, _label, _unravel_many, compare, is_oom, judge_f64,
                                      special_mismatch)
from kforge_tui.sandbox.references import check_outputs, fresh_outputs, graph64, reference64  # noqa: F401
from kforge_tui.sandbox.result import Mismatch


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise the same result (NaN where NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


class CandidateError(Exception):
    """The candidate misbehaved in a way that is not a value mismatch (bad return code)."""



# ------------------------------------------------------------------------ the procedure

@dataclass
class CallReport:
    """What the runner says about one call besides the outputs."""

    rc: int = 0
    problem: str = ""  # "floating-point environment changed ...", "worker state changed ..."


class Verifier:
    """Drives one candidate's verification in the supervisor.

    `call(s)` runs the candidate on input set `s` and returns its int return code or a
    CallReport; `reference(inputs)` is PyTorch eager on the region (list of outputs);
    `sync()` waits for the harness's own writes and for the candidate's work on the harness
    stream only (work moved elsewhere is unfinished when checked)."""

    def __init__(self, task, sets: list[InputSet], call, reference, *, device="cpu", sync=None,
                 stats: list | None = None, reference64=None, seed: int | None = None,
                 edge: bool = True, log: list | None = None, arena=None, image=None, bank=None,
                 slices: int = 1, sensitivity: bool = True):
        self.task = task
        self.sets = sets
        self.call = call
        self.reference = reference
        self.reference64 = reference64
        self.device = device
        self.sync = sync or (lambda: None)
        self.stats = stats if stats is not None else [None] * len(task.inputs)
        seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self.rng = random.Random(seed)
        self.gen = generator(device, self.rng.getrandbits(62))
        self.edge = edge
        # the one-ulp run of edge cases with no float64 run (`_judge_sensitive`): the
        # supervisor's plan says whether it fits beside the sets
        self.sensitivity = sensitivity
        self.off_tolerance: list[int] = []  # outputs the last check found off the tolerance (`_values`)
        self.log = log if log is not None else []
        # "seconds": the harness's own time by part (where a GiB-sized task's verify goes);
        # "arena_watch" is inside the others and inside the timed loop's checks
        self.checks = {"calls": 0, "sets": len(sets), "edge_cases": [], "replay_checks": 0,
                       "timed_checks": 0, "fresh_timed": 0, "seconds": {}}
        self._poison_seed: dict[int, int] = {}
        self._guard_snap: dict[int, list] = {}
        # the whole arena the sets live in (None in process: tests without one): checked after
        # every call outside the outputs, and where timed calls' tensors are placed anew
        self.arena = arena
        self.watch = ArenaWatch(arena, self.rng.getrandbits(62), image) if arena is not None else None
        if self.watch is not None:
            self.watch.spent = self.checks["seconds"]
        self._home = {id(x): ([g.slot if g is not None else None for g in x.inputs],
                              [g.slot for g in x.outputs]) for x in sets}
        self.moved = False
        self._last_timed = None
        self.sum_seed = self.rng.getrandbits(62)  # this candidate's key for input hashes
        self._sums: dict[int, list] = {}
        self.bank = bank  # inputs.FreshBank of the task, or None
        self.slices = slices  # the one-ulp run in dim-0 slices (a region references.sliceable says may)
        self._bank_order = list(range(len(bank.entries))) if bank is not None else []
        self.rng.shuffle(self._bank_order)

    def _touched(self, s: InputSet) -> None:
        """The harness wrote into s's buffers (the arena image takes them before the next call)."""
        if self.watch is not None:
            self.watch.touch_set(s)

    def _restore(self, s: InputSet) -> None:
        self._touched(s)
        if s.restore_inputs():
            s.expected = []
            s.expected = fresh_outputs(self.task, self.reference(s.tensors()), s.tensors())
        self._rehash(s)

    def _rehash(self, s: InputSet) -> None:
        if s.host_saved:
            self._sums[id(s)] = [checksum(g.base, self.sum_seed) if g is not None else None for g in s.inputs]

    # -- one checked call
    def _stale(self, s: InputSet) -> list | None:
        """Plausible stale outputs for s: another set's expected outputs (what a real buffer
        holds after the previous call), or s's own rolled by one row. A kernel that leaves an
        output alone when it "looks done" is caught."""
        others = [o for o in self.sets if o is not s and o.expected]
        src = self.rng.choice(others).expected if others else s.expected
        out = []
        for e in src:
            if src is s.expected and e.dim() and e.shape[0] > 1:
                e = torch.roll(e, 1, 0)
            elif src is s.expected and e.dim():
                e = torch.roll(e, 1, -1)
            out.append(e)
        return out

    def _poison(self, s: InputSet, stale: bool | None = None) -> None:
        """Fresh random fills of every output (sometimes a plausible stale output instead) and
        fresh random guard bytes (kept to check)."""
        seed = self.rng.getrandbits(62)
        if stale is None:
            stale = self.rng.random() < 0.25
        fills = self._stale(s) if stale else None
        self._poison_seed[id(s)] = ("stale", fills) if fills is not None else seed
        g = generator(self.device, seed)
        scale = poison_scale(seed)
        self._touched(s)
        snaps = []
        for o in s.outputs:
            fill_bytes(o.head, self.gen)
            fill_bytes(o.tail, self.gen)
            if o.has_gaps:
                fill_bytes(o.data, self.gen)
            if fills is not None:
                o.tensor.copy_(fills[len(snaps)])
            else:
                fill_random(o.tensor, g, scale)
            snaps.append((o.head.clone(), o.tail.clone(),
                          o.data.clone() if o.has_gaps else None))
        self._guard_snap[id(s)] = snaps

    def poison_values(self, s: InputSet) -> list | None:
        """Regenerate the fills of s's outputs (for "poison survived"); None when out of memory."""
        seed = self._poison_seed.get(id(s))
        if seed is None:
            return None
        if isinstance(seed, tuple):
            return seed[1]
        g = generator(self.device, seed)
        scale = poison_scale(seed)
        out = []
        try:
            for o in s.outputs:
                t = torch.empty_strided(o.tensor.shape, o.tensor.stride(), dtype=o.tensor.dtype,
                                        device=o.tensor.device) if not o.has_gaps else \
                    torch.empty(o.data.numel(), dtype=torch.uint8, device=o.data.device) \
                    .view(o.tensor.dtype).as_strided(o.tensor.shape, o.tensor.stride())
                fill_random(t, g, scale)
                out.append(t)
        except Exception as e:
            if is_oom(e):
                return None
            raise
        return out

    def prepare(self, s: InputSet, stale: bool | None = None) -> None:
        self._poison(s, stale)
        self.sync()
        if self.watch is not None:
            self.watch.snapshot(s.outputs)

    def check(self, s: InputSet, label: str, report: CallReport | None = None,
              values: bool = True) -> Mismatch | None:
        """After a call on `s`: runner problems, guards, gaps, inputs (bitwise), then values.
        With `values=False` (edge cases judged against float64 instead) a value mismatch counts
        only where the poison survived: the output was not written.

        With an arena, one compare of every byte outside the call's output data (ArenaWatch)
        covers the guards and the inputs; only when it finds a change are they looked at one by
        one, to say which was written."""
        total = sum(e.numel() for e in s.expected) or 1
        if report is not None and report.problem:
            return special_mismatch(label, total, report.problem)
        arena_changed = self.watch.changed() if self.watch is not None and self.watch.armed else None
        for j, (o, snap) in enumerate(zip(s.outputs, self._guard_snap.get(id(s), []))):
            head, tail, data = snap
            if arena_changed is not False and not (torch.equal(o.head, head) and torch.equal(o.tail, tail)):
                return special_mismatch(label, total, f"wrote outside the output buffer (guard zone of "
                                                      f"output {j} changed)")
            if data is not None:
                cov = o.covered()
                if not torch.equal(torch.where(cov, 0, o.data), torch.where(cov, 0, data)):
                    return special_mismatch(label, total, f"wrote outside the output (into the gaps "
                                                          f"of strided output {j})")
        if arena_changed is not False:
            mm = self._inputs_changed(s, label, total)
            if mm is not None:
                return mm
        if arena_changed:
            return special_mismatch(label, total, "wrote outside the outputs: harness memory between "
                                                  "the tensors changed (state kept where no tensor is)")
        mm = self._values(s, label, values)
        if mm is not None and values and "poison survived" not in mm.reason and self._reference_redone(s, label):
            # the stored reference was not what PyTorch computes on these inputs now: judge again
            mm = self._inputs_changed(s, label, total) or self._values(s, label, values)
        return mm

    def _inputs_changed(self, s: InputSet, label: str, total: int) -> Mismatch | None:
        for i, (g, saved) in enumerate(zip(s.inputs, s.saved)):
            if g is None or saved is None:
                continue
            if s.host_saved:
                changed = checksum(g.base, self.sum_seed) != self._sums.get(id(s), [None] * (i + 1))[i]
            else:
                changed = not _equal_words(g.base, saved)
            if changed:
                return special_mismatch(label, total, f"inputs modified (input {i} changed by the kernel)")
        return None

    def _values(self, s: InputSet, label: str, values: bool) -> Mismatch | None:
        """The first value mismatch (with `values=False` only an unwritten output or an exact
        dtype's); the float outputs off the tolerance are kept in `off_tolerance` for a judge
        that allows more (`_judge_sensitive`), which need not compare them again."""
        pois = None
        self.off_tolerance = []
        for j, (exp, o, m) in enumerate(zip(s.expected, s.outputs, self.task.outputs)):
            mm = compare(exp, o.tensor, m.dtype, _label(label, j, len(s.outputs)))
            if mm is not None:
                if "values differ" in mm.reason or "NaN" in mm.reason or "finite" in mm.reason:
                    pois = pois if pois is not None else self.poison_values(s)
                    if pois is not None:
                        mm = compare(exp, o.tensor, m.dtype, _label(label, j, len(s.outputs)), pois[j]) or mm
                if values or "poison survived" in mm.reason or m.dtype not in FLOAT_DTYPES:
                    return mm
                self.off_tolerance.append(j)
        return None

    def _reference_redone(self, s: InputSet, label: str) -> bool:
        """Before a value mismatch stands: PyTorch run again on s's inputs (checked unchanged
        just before). True, with s's reference replaced, when the stored one differs from it.

        A set's reference is computed once (at prepare, or when values are written) and every
        later candidate is judged against it, so one wrong computation of it fails every
        candidate of the task. Seen once in ~720 CPU runs of the KernelBench gemm_bias_gelu
        fixture on a loaded 2-core box: captured[0]'s stored reference was off by up to 1.3e-4
        in 16 of its 32 rows (negative GELU outputs, as if erf's argument were ~2e-4 larger),
        while all three candidates' outputs equalled PyTorch's result on those inputs to one
        ulp, as did every later run of the reference on them (new workers, in process).
        Judging against the new run cannot pass a wrong kernel: it is PyTorch on the same
        inputs (bitwise unchanged, checked again after it), held to the same tolerance."""
        try:
            fresh = fresh_outputs(self.task, self.reference(s.tensors()), s.tensors())
            self.sync()
        except Exception as e:
            if is_oom(e):
                return False
            raise
        if len(fresh) == len(s.expected) and all(_same(a, b) for a, b in zip(fresh, s.expected)):
            return False
        self.log.append(f"{label}: the stored reference of {s.name} differed from PyTorch run again on the "
                        f"same inputs; judged against the new run")
        self.checks["reference_reruns"] = self.checks.get("reference_reruns", 0) + 1
        s.expected = fresh
        return True

    def run_checked(self, s: InputSet, label: str | None = None, stale: bool | None = None,
                    values: bool = True) -> Mismatch | None:
        label = label or s.name
        self.prepare(s, stale)
        rep = self.call(s)
        if not isinstance(rep, CallReport):
            rep = CallReport(int(rep) if rep is not None else 0)
        self.sync()
        self.checks["calls"] += 1
        if rep.rc != 0:
            raise CandidateError(f"kforge_launch returned {rep.rc} on {label}")
        return self.check(s, label, rep, values=values)

    # -- values written into a set's buffers
    def write_values(self, s: InputSet, values=None, expected: list | None = None) -> None:
        """New input values into s's own buffers (a list of tensors, or a function writing them
        in place), then a new private copy and a new reference (`expected`: the reference
        already computed for exactly these values)."""
        if callable(values):
            values(s.tensors())
        elif values is not None:
            for g, v in zip(s.inputs, values):
                if g is not None and v is not None:
                    g.tensor.copy_(v)
        self._touched(s)
        s.expected = []  # release the old reference first: a big region has room for one
        s.save_inputs()
        s.expected = expected if expected is not None else \
            fresh_outputs(self.task, self.reference(s.tensors()), s.tensors())
        self._rehash(s)
        self.sync()

    def fresh_values(self):
        def write(targets):
            for t, m, st in zip(targets, self.task.inputs, self.stats):
                if t is not None:
                    draw_into(t, m, st, self.gen)
        return write

    def _perturbed_reference(self, s: InputSet) -> list | None:
        """PyTorch's outputs on s's inputs with every float element moved by about one ulp (a
        random sign each): how far honest rounding can move this region's result
        (`judge_f64`). None when it does not fit in memory. The inputs are copied once and
        moved in pieces (no sign tensor or wide temporary of a region's size)."""
        from kforge_tui.sandbox.inputs import _flat_views
        from kforge_tui.sandbox.references import in_slices

        def perturbed(inputs: list) -> list:
            ins = []
            for t, m in zip(inputs, self.task.inputs):
                if t is None or m.dtype not in FLOAT_DTYPES:
                    ins.append(t)
                    continue
                eps = 2.0 ** -MANTISSA[m.dtype]
                work = torch.float64 if m.dtype == "float64" else torch.float32
                c = t.clone()
                for _, piece in _flat_views(c):
                    f = torch.empty(piece.shape, dtype=work, device=piece.device).bernoulli_(0.5, generator=self.gen)
                    f.mul_(2 * eps).add_(1 - eps)  # 1 +- eps
                    piece.copy_(piece.to(work) * f)
                ins.append(c)
            return ins

        try:
            outs = in_slices(self.task, lambda ins: [o.detach() for o in self.reference(ins)], s.tensors(),
                             self.slices, prep=perturbed)
            return check_outputs(self.task, outs)
        except Exception as e:
            if is_oom(e):
                self.log.append("edge case: one-ulp sensitivity skipped (out of memory)")
                return None
            raise

    def _random_set(self, prefer_random: bool = True) -> InputSet:
        pool = [s for s in self.sets if s.kind == "random"] if prefer_random else []
        return self.rng.choice(pool or self.sets)

    # -- phases
    def verification(self) -> Mismatch | None:
        """Every set at least once, in random order, some sets twice (fresh poison each time)."""
        for s in self.sets:
            self._restore(s)  # whatever an earlier candidate (or check) did to the shared buffers
        self.sync()
        order = list(self.sets)
        self.rng.shuffle(order)
        extra = self.rng.randint(1, max(1, len(self.sets)))
        order += [self.rng.choice(self.sets) for _ in range(extra)]
        stale_at = self.rng.randrange(1, len(order)) if len(order) > 1 else 0
        for j, s in enumerate(order):
            mm = self.run_checked(s, stale=True if j == stale_at else (False if j == 0 else None))
            if mm is not None:
                return mm
        return None

    def replay_fresh(self, when: str) -> Mismatch | None:
        """A streak of calls on the same buffers, fresh values written in before one of the later
        calls: a result replayed from an earlier call (keyed on a pointer, a counter, a streak of
        identical pointers) fails."""
        s = self._random_set()
        n = self.rng.randint(3, 6)
        change = self.rng.randint(2, n - 1)
        for j in range(n):
            label = None
            if j == change:
                self.write_values(s, self.fresh_values())
                self.checks["replay_checks"] += 1
                label = f"{s.name} buffers with fresh values after {j} calls on them {when} (replay check)"
            elif j > change:
                label = f"{s.name} buffers, call {j + 1} of a streak {when} (replay check)"
            mm = self.run_checked(s, label)
            if mm is not None:
                return mm
        return None

    def replay_few(self, when: str) -> Mismatch | None:
        """A few elements changed in place: a replay keyed on sampled elements fails."""
        s = self._random_set()
        # inputs held at real values (offsets, indices) keep them: a changed offset is no test of
        # the kernel, it is an invalid call
        cand = [i for i, (g, m) in enumerate(zip(s.inputs, self.task.inputs))
                if g is not None and m.numel and not isinstance(self.stats[i], RealValues)]
        if not cand:
            return None
        i = max(cand, key=lambda i: self.task.inputs[i].numel) if self.rng.random() < 0.7 else self.rng.choice(cand)
        g, m = s.inputs[i], self.task.inputs[i]
        for _ in range(self.rng.randint(1, 3)):  # the kernel has just seen these buffers
            mm = self.run_checked(s)
            if mm is not None:
                return mm
        n = self.rng.randint(1, min(8, m.numel))
        flat = torch.randint(0, m.numel, (n,), generator=self.gen, device=self.gen.device).unique().to(g.tensor.device)
        n = flat.numel()
        new = draw(TensorMeta("x", (n,), m.dtype), self.stats[i], self.gen, self.device).to(g.tensor.device)
        def change(targets, i=i, flat=flat, new=new, m=m):
            t = targets[i]
            coords = _unravel_many(flat, tuple(m.shape))
            old = t[coords]
            nv = new
            if m.dtype == "bool":
                nv = ~old
            elif m.dtype in FLOAT_DTYPES:
                nv = torch.where(nv == old, nv + 1, nv)
            t[coords] = nv.to(t.dtype)

        self.write_values(s, change)
        self.checks["replay_checks"] += 1
        return self.run_checked(s, f"{s.name} with {n} element{'s' if n > 1 else ''} of input {i} changed "
                                   f"in place {when} (replay check)")

    def edge_cases(self) -> Mismatch | None:
        if not self.edge:
            return None
        kinds = edge_kinds(self.task)
        self.rng.shuffle(kinds)
        for kind in kinds:
            s = self._random_set()
            orig_saved, orig_expected = s.saved, (s.expected if not s.host_saved else None)
            orig_sums0 = s.sums0
            try:
                self.write_values(s, lambda ts, kind=kind: edge_into(kind, self.task, ts, self.stats, self.gen))
                ref64 = self._reference64(s, f"edge case {kind}")
                pert = self._perturbed_reference(s) if ref64 is not None or self.sensitivity else None
                label = f"edge-case inputs ({EDGE_TEXT[kind]}) in {s.name}"
                # values are judged below, against float64 where that run exists, else against
                # PyTorch's own result allowing its sensitivity: an edge case can be too
                # ill-conditioned for PyTorch's own rounding to be the yardstick
                mm = self.run_checked(s, label, values=ref64 is None and pert is None)
                self.checks["edge_cases"].append(kind)
                if mm is not None:
                    if not mm.reason.startswith("edge-case inputs"):
                        mm.reason = f"edge-case inputs ({EDGE_TEXT[kind]}): {mm.reason}"
                    return mm
                reason = f"edge-case inputs ({EDGE_TEXT[kind]}):"
                if ref64 is not None:
                    mm = self._judge_f64(s, ref64, pert, label, reason)
                    del ref64
                elif pert is not None:
                    mm = self._judge_sensitive(s, pert, label, reason)
                if mm is not None:
                    return mm
            finally:
                if s.host_saved:  # the canonical values come back from the host copy
                    s.dirty = True
                    self._restore(s)
                else:
                    s.expected = []
                    self._touched(s)
                    for g, c in zip(s.inputs, orig_saved):
                        if g is not None and c is not None:
                            g.base.copy_(c)
                    s.saved, s.expected, s.sums0 = orig_saved, orig_expected, orig_sums0
                    self._rehash(s)
                self.sync()
        return None

    def _reference64(self, s: InputSet, what: str) -> list | None:
        """The float64 run of the region on s's current inputs (None, logged, when there is
        none or it does not fit)."""
        if self.reference64 is None:
            return None
        try:
            return check_outputs(self.task, self.reference64(s.tensors()))
        except Exception as e:
            self.log.append(f"{what}: float64 reference "
                            + ("skipped (out of memory)" if is_oom(e) else f"unavailable ({type(e).__name__})"))
            return None

    def _judge_f64(self, s: InputSet, ref64: list, pert: list | None, label: str,
                   reason: str) -> Mismatch | None:
        """Every float output of the last call on s against the float64 run (`judge_f64`); the
        mismatch's reason starts with `reason`."""
        for j, (r, t, o, m) in enumerate(zip(ref64, s.expected, s.outputs, self.task.outputs)):
            if m.dtype in FLOAT_DTYPES:
                mm = judge_f64(r, t, o.tensor, m.dtype, _label(label, j, len(s.outputs)),
                               pert[j] if pert is not None else None)
                if mm is not None:
                    mm.reason = mm.reason.replace("edge-case inputs:", reason, 1)
                    return mm
        return None

    def _judge_sensitive(self, s: InputSet, pert: list, label: str, reason: str) -> Mismatch | None:
        """Edge cases with no float64 run (a region of GiBs): each float output within the
        tolerance of PyTorch's own, or, where it is not, within EDGE_FACTOR x how far one-ulp
        input changes move PyTorch's result (`judge_f64` with PyTorch's result standing for
        the float64 one). At +-100 an SDPA's scores are ~1e5 and its softmax one-hot, so a
        kernel that sums in another order picks other winners where PyTorch's rounding would
        too: KernelBench 97 at its own size, judged at the tolerance alone, rejected all 13 of
        its candidates on an H100 (2026-12-07)."""
        for j in self.off_tolerance:  # the float outputs the call's check found off the tolerance
            t, o, m = s.expected[j], s.outputs[j], self.task.outputs[j]
            lab = _label(label, j, len(s.outputs))
            mm = judge_f64(t, t, o.tensor, m.dtype, lab, pert[j], against="PyTorch's own result")
            if mm is not None:
                mm.reason = mm.reason.replace("edge-case inputs:", reason, 1)
                return mm
        return None

    def ordinary_f64(self) -> Mismatch | None:
        """One ordinary set (its own random or captured values) judged against float64 in ulps,
        as the edge cases are. The tolerance table alone leaves ~100x headroom on ordinary
        inputs; a kernel that is precise only on inputs that look like edge cases (|x| large,
        -inf, tiny, equal rows) and approximates elsewhere (a short polynomial exp) would pass
        both checks without this one."""
        if not self.edge:
            return None
        s = self._random_set()
        ref64 = self._reference64(s, "ordinary inputs")
        if ref64 is None:
            return None
        pert = self._perturbed_reference(s)
        label = f"ordinary inputs in {s.name} judged against float64"
        return self.run_checked(s, label) or self._judge_f64(
            s, ref64, pert, label, "values differ from the float64 reference on ordinary inputs:")

    def before_timing(self) -> Mismatch | None:
        steps = [("edge_cases", self.edge_cases), ("replay", lambda: self.replay_few("before timing")),
                 ("ordinary_f64", self.ordinary_f64)]
        self.rng.shuffle(steps)
        return self._run_steps([("verification", self.verification)] + steps)

    def after_timing(self) -> Mismatch | None:
        steps = [("replay", lambda: self.replay_fresh("after timing")),
                 ("replay", lambda: self.replay_few("after timing"))]
        self.rng.shuffle(steps)
        return self._run_steps(steps)

    def _run_steps(self, steps) -> Mismatch | None:
        """Each (name, step) in turn until one finds a mismatch; its seconds go to checks."""
        spent = self.checks["seconds"]
        for name, step in steps:
            t0 = time.perf_counter()
            try:
                mm = step()
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
            if mm is not None:
                return mm
        return None

    # -- timed calls (the runner's checkpoints)
    def timed_before(self, s: InputSet, refresh: bool = True, set_index: int | None = None) -> list | None:
        """Before a timed call (every one is checked): s's tensors move to new random places in
        the arena (the runner gets the slots, returned), get input values never seen before and
        fresh poison; the arena is snapshotted. Nothing about a measured call differs from a
        real one that a kernel could key on: not the values, not the addresses, not the
        distances between its buffers."""
        slots = None
        if self.arena is not None:
            ins, outs = place(s, self.arena.numel(), self.rng)
            relocate(s, self.arena, ins, outs)
            self.moved = True
            slots = [[x.to_json() if x is not None else None for x in ins], [x.to_json() for x in outs]]
        last = self._last_timed
        if not refresh and last is not None and last is not s and not s.host_saved and last.saved:
            # a replay probe (bench.plan): exactly the previous call's inputs, elsewhere, with
            # the same work here as for new inputs (a reference computed), so nothing but the
            # values differs between a probe and a counted call
            prev = [c for c in last.saved]

            def same(targets, prev=prev, s=s):
                for g, c in zip(s.inputs, prev):
                    if g is not None and c is not None:
                        g.base.copy_(c)
            self.write_values(s, same)
            self.checks["replay_probes"] = self.checks.get("replay_probes", 0) + 1
        elif refresh or slots is not None:
            self._fresh_timed(s)
            self.checks["fresh_timed"] += 1
        self._last_timed = s
        self.prepare(s, stale=False)
        return slots

    def _fresh_timed(self, s: InputSet) -> None:
        """Values this candidate has not seen: the task's bank entries in this candidate's own
        order, each once; past them, a new draw (kept in the bank for later candidates)."""
        bank = self.bank if not s.host_saved else None
        if bank is not None and self._bank_order:
            vals, expected = bank.entries[self._bank_order.pop()]
            self.write_values(s, vals, expected=expected)
            return
        self.write_values(s, self.fresh_values())
        if bank is not None and len(bank.entries) < bank.capacity:
            try:
                bank.add([g.tensor.clone(memory_format=torch.contiguous_format) if g is not None else None
                          for g in s.inputs], list(s.expected))
            except Exception as e:  # noqa: BLE001 - a full bank only costs the next candidates a draw
                if not is_oom(e):
                    raise
                bank.capacity = len(bank.entries)

    def timed_after(self, s: InputSet, report: CallReport | None = None) -> Mismatch | None:
        self.sync()
        self.checks["timed_checks"] += 1
        return self.check(s, f"timed-run output ({s.name})", report)

    def home(self) -> None:
        """After the timed calls: every set back at its own slots with its values (the timed
        calls' placements overlapped them), the arena scrubbed again."""
        if not self.moved:
            return
        scrub(self.arena, self.gen)
        if self.watch is not None:
            self.watch.touch_all()
        for x in self.sets:
            ins, outs = self._home[id(x)]
            relocate(x, self.arena, ins, outs)
            if x.host_saved:
                x.dirty = True
            self._restore(x)
        self._guard_snap.clear()
        self.moved = False
        self._last_timed = None
        self.sync()


def verify_candidate(call, sets: list[InputSet], task, reference, *, sync=None, device="cpu",
                     stats=None, reference64=None, seed=None, edge: bool = True) -> Mismatch | None:
    """Everything before and after timing, in process (tests; the worker drives a Verifier)."""
    v = Verifier(task, sets, call, reference, device=device, sync=sync, stats=stats,
                 reference64=reference64, seed=seed, edge=edge)
    return v.before_timing() or v.after_timing()

