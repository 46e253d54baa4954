"""Verification: does a candidate compute what PyTorch computes, on every input, honestly?

DESIGN.md "Verification and timing" in code. Everything here runs inside the worker process (it
touches candidate outputs) but imports no candidate code itself: the candidate is a callable
`call(input_set) -> int` handed in by the worker, so this module is testable with plain Python.

Decisions, stated once:
  * The reference is PyTorch at the task dtype, not a float64 re-computation: the promise is
    "the model computes what it computed before", and PyTorch's own roundings (e.g. the bf16
    rms_norm spelling that rounds before multiplying by the weight) are part of that. The
    tolerance table is sized for an honest kernel that rounds differently from PyTorch.
  * Every candidate run is preceded by a poison fill of its output, twice per input set: first a
    finite sentinel (a kernel that skips elements leaves the sentinel, also where the reference is
    NaN), then NaN (a kernel that skips elements where the reference happens to equal the
    sentinel is still caught).
  * Tensors live inside guarded buffers (a guard zone before and after) so writes outside the
    output - e.g. stashing a result past its end to replay later - are caught, and inputs are
    compared bitwise, gaps and guards included, with a copy saved before the run.
  * A second pass re-runs the candidate with *new values in the same buffers*, so a kernel that
    replays an earlier result (keyed on a pointer or "first call") is caught even without
    static state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from kforge_tui.sandbox.result import Mismatch
from kforge_tui.task import Task, TensorMeta, TensorStats

# dtype of the OUTPUT -> (rtol, atol). A pair (g, e) is close when
#   g == e (same inf / exact), or |g - e| <= atol * scale + rtol * |e|,
# with scale = max |e| over the finite reference of that input set. The absolute part is
# relative to the output's magnitude so that tiny outputs (softmax over 262144 logits is ~4e-6
# per element) are still checked to rtol instead of passing on an absolute 1e-5.
TOLERANCES: dict[str, tuple[float, float]] = {
    # f32: honest kernels differ from PyTorch by summation order, ~1e-6 relative on large
    # reductions; 1e-4 is 100x headroom, and a bf16-rounded result (~2e-3) fails by 20x.
    "float32": (1e-4, 1e-5),
    # f16: unit roundoff 2^-11 = 4.9e-4; PyTorch rounds once, a kernel may round once more
    # differently: 2 ulps (2^-9 = 2e-3) relative.
    "float16": (2e-3, 1e-3),
    # bf16: unit roundoff 2^-8 = 3.9e-3; 2 ulps = 2^-6 = 1.6e-2, the same reasoning as f16.
    "bfloat16": (1.6e-2, 8e-3),
    # f64 outputs do not occur in the catalogue; kept so the table is total.
    "float64": (1e-9, 1e-10),
}

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}

# A finite sentinel no catalogue op produces in practice (exact in f16/bf16/f32).
SENTINEL = -12288.0
GUARD_BYTES = 4096  # keeps the tensor 4096-byte aligned inside its buffer
GUARD_BYTE = 0xA5
FIRST_N = 5  # mismatching elements listed in a report


class CandidateError(Exception):
    """The candidate misbehaved in a way that is not a value mismatch (bad return code)."""


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES[dtype]


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


# ------------------------------------------------------------------------ guarded buffers

def _span(shape, stride) -> int:
    """Elements a strided tensor's storage must hold (1 + max offset)."""
    if not shape or any(s == 0 for s in shape):
        return 0 if shape and any(s == 0 for s in shape) else 1
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _contig_stride(shape) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


class Guarded:
    """A tensor inside a byte buffer with guard zones either side (all of it checked after runs)."""

    def __init__(self, shape, dtype: torch.dtype, device, stride=None):
        shape = tuple(shape)
        stride = tuple(stride) if stride is not None else _contig_stride(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.nbytes = _span(shape, stride) * itemsize
        self.base = torch.full((self.nbytes + 2 * GUARD_BYTES,), GUARD_BYTE, dtype=torch.uint8,
                               device=device)
        region = self.base[GUARD_BYTES:GUARD_BYTES + self.nbytes]
        self.tensor = region.view(dtype).as_strided(shape, stride)
        self._saved: torch.Tensor | None = None

    def guards_intact(self) -> bool:
        head = self.base[:GUARD_BYTES]
        tail = self.base[GUARD_BYTES + self.nbytes:]
        return bool((head == GUARD_BYTE).all()) and bool((tail == GUARD_BYTE).all())

    def fill(self, value: float) -> None:
        """Fill the data region (gaps of a strided view too), leaving the guards as they are."""
        self.base[GUARD_BYTES:GUARD_BYTES + self.nbytes].view(self.tensor.dtype).fill_(value)

    def save(self) -> None:
        self._saved = self.base.clone()

    def restore(self) -> None:
        """Undo whatever a previous candidate did to this buffer (inputs are shared by candidates)."""
        if self._saved is not None:
            self.base.copy_(self._saved)

    def reset_guards(self) -> None:
        self.base[:GUARD_BYTES].fill_(GUARD_BYTE)
        self.base[GUARD_BYTES + self.nbytes:].fill_(GUARD_BYTE)

    def unchanged(self) -> bool:
        return self._saved is not None and bool(torch.equal(self.base, self._saved))


# ------------------------------------------------------------------------ input sets

@dataclass
class InputSet:
    """One set of kernel inputs in guarded buffers, its expected output and its own output buffer."""

    name: str  # "captured[0]", "random[2]"
    inputs: dict[str, Guarded | None]
    expected: torch.Tensor
    out: Guarded
    notes: list[str] = field(default_factory=list)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {k: (g.tensor if g is not None else None) for k, g in self.inputs.items()}


DEFAULT_STATS = {"weight": TensorStats(1.0, 0.2, 0.0, 2.0), "bias": TensorStats(0.0, 0.2, -1.0, 1.0)}
DEFAULT_X = TensorStats(0.0, 1.0, -6.0, 6.0)


def draw(meta: TensorMeta, stats: TensorStats | None, gen: torch.Generator) -> torch.Tensor:
    """Normal(mean, std) clipped to [min, max], drawn in float32 on the cpu, cast to the dtype."""
    st = stats or DEFAULT_STATS.get(meta.name, DEFAULT_X)
    std = st.std if st.std > 0 else 0.0
    v = torch.randn(meta.shape, generator=gen, dtype=torch.float32) * std + st.mean
    lo, hi = (st.min, st.max) if st.max >= st.min else (st.max, st.min)
    return v.clamp_(lo, hi).to(torch_dtype(meta.dtype))


def build_sets(task: Task, calls: list[dict], n_random: int, device, seed: int,
               reference: Callable[[dict], torch.Tensor], min_sets: int = 0) -> tuple[list[InputSet], str]:
    """Captured calls plus `n_random` fresh draws (more if fewer than `min_sets` in all).

    Returns the sets and a one-line note of where the inputs came from (said in every log).
    """
    gen = torch.Generator().manual_seed(seed)
    sources: list[tuple[str, dict[str, torch.Tensor | None]]] = []
    for k, call in enumerate(calls):
        sources.append((f"captured[{k}]", {m.name: call["inputs"].get(m.name) for m in task.inputs}))
    stats: dict[str, TensorStats] = {}
    if calls:
        for name, d in (calls[0].get("stats") or {}).items():
            stats[name] = TensorStats(**d)
    n_random = max(n_random, min_sets - len(sources))
    for k in range(n_random):
        sources.append((f"random[{k}]", {m.name: (draw(m, stats.get(m.name), gen) if m.present else None)
                                         for m in task.inputs}))
    note = (f"{len(calls)} captured calls + {n_random} random draws matched to captured value statistics"
            if calls else f"no captured calls: {n_random} random draws from default N(0,1) "
                          f"(weight N(1,0.2), bias N(0,0.2))")
    out_dtype = torch_dtype(task.output.dtype)
    sets = []
    for name, vals in sources:
        guarded: dict[str, Guarded | None] = {}
        for m in task.inputs:
            v = vals.get(m.name)
            if v is None or not m.present:
                guarded[m.name] = None
                continue
            g = Guarded(m.shape, torch_dtype(m.dtype), device, m.stride)
            g.tensor.copy_(v.reshape(m.shape).to(torch_dtype(m.dtype)))
            guarded[m.name] = g
        inp = {k: (g.tensor if g is not None else None) for k, g in guarded.items()}
        expected = reference(inp).detach().clone()
        if tuple(expected.shape) != tuple(task.output.shape) and expected.numel() == task.output.numel:
            expected = expected.reshape(task.output.shape)
        sets.append(InputSet(name, guarded, expected.contiguous(),
                             Guarded(task.output.shape, out_dtype, device)))
    return sets, note


# ------------------------------------------------------------------------ comparison

def compare(expected: torch.Tensor, got: torch.Tensor, dtype: str, input_set: str,
            poison: float | None = None) -> Mismatch | None:
    """None when `got` matches; else a Mismatch naming the first reason in priority order."""
    rtol, atol = tolerance(dtype)
    e = expected.detach().to(torch.float64).reshape(-1)
    g = got.detach().to(torch.float64, copy=True).reshape(-1)  # a copy: the snapshot everything uses
    total = e.numel()
    if g.numel() != total:
        return Mismatch(input_set, float("inf"), float("inf"), total, total, [],
                        f"output has {g.numel()} elements, expected {total}")
    e_nan, g_nan = torch.isnan(e), torch.isnan(g)
    finite_e = e[torch.isfinite(e)]
    scale = float(finite_e.abs().max()) if finite_e.numel() else 1.0
    diff = (g - e).abs()
    close = (g == e) | (diff <= atol * scale + rtol * e.abs())
    bad = ~(close | (e_nan & g_nan))
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    # every test below reads the one snapshot `g`: the buffer itself may still be changing
    # (work left running on another stream or thread)
    if poison is not None and poison == poison:  # a finite sentinel survives exactly
        sentinel = float(torch.tensor(poison, dtype=got.dtype).double())
        survived = int((bad & (g == sentinel)).sum())
    else:
        survived = 0
    if survived:
        reason = "unwritten elements (poison survived)"
    elif int((g_nan & ~e_nan).sum()):
        reason = "NaN where the reference is finite (unwritten or computed NaN)"
    elif int((e_nan & ~g_nan).sum()):
        reason = "finite where the reference is NaN"
    else:
        reason = "values differ beyond tolerance"
    both = torch.isfinite(e) & torch.isfinite(g)
    d = diff[both]
    max_abs = float(d.max()) if d.numel() else float("nan")
    rel = d / e[both].abs().clamp_min(1e-30)
    max_rel = float(rel.max()) if rel.numel() else float("nan")
    if not both.all():
        max_abs = max_abs if int((bad & both).sum()) else float("inf")
    idx = torch.nonzero(bad).reshape(-1)[:FIRST_N].tolist()
    shape = tuple(expected.shape)
    first = []
    for flat in idx:
        first.append({"index": list(_unravel(flat, shape)), "expected": _num(e[flat]),
                      "got": _num(g[flat])})
    return Mismatch(input_set, max_abs, max_rel, n_bad, total, first,
                    f"{reason} (rtol {rtol:g}, atol {atol:g} x max|ref| {scale:.3g})")


def _num(t: torch.Tensor) -> float | str:
    v = float(t)
    return v if v == v and abs(v) != float("inf") else str(v)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape or (1,)):
        out.append(flat % s)
        flat //= s
    return tuple(reversed(out))


def special_mismatch(input_set: str, total: int, reason: str) -> Mismatch:
    """A failure that is not about values (inputs changed, writes outside the output)."""
    return Mismatch(input_set, float("nan"), float("nan"), total, total, [], reason)


# ------------------------------------------------------------------------ the procedure

def check_run(s: InputSet, dtype: str, poison: float, label: str | None = None) -> Mismatch | None:
    """After a run on `s`: guards, inputs bitwise unchanged, then values (in that order)."""
    label = label or s.name
    total = s.expected.numel()
    if not s.out.guards_intact():
        return special_mismatch(label, total, "wrote outside the output buffer (guard zone changed)")
    for name, g in s.inputs.items():
        if g is not None and not g.unchanged():
            return special_mismatch(label, total, f"inputs modified ({name} changed by the kernel)")
    return compare(s.expected, s.out.tensor, dtype, label, poison)


def prepare_run(s: InputSet, poison: float) -> None:
    s.out.reset_guards()
    s.out.fill(poison)
    for g in s.inputs.values():
        if g is not None and g._saved is None:
            g.save()


def run_checked(call: Callable[[InputSet], int], s: InputSet, dtype: str, poison: float,
                sync: Callable[[], None], label: str | None = None,
                scrub: Callable[[], None] | None = None) -> Mismatch | None:
    prepare_run(s, poison)
    if scrub is not None:
        scrub()
    rc = call(s)
    sync()
    if rc != 0:
        raise CandidateError(f"kforge_launch returned {rc} on {label or s.name}")
    return check_run(s, dtype, poison, label)


def restore_inputs(sets: list[InputSet]) -> None:
    for s in sets:
        for g in s.inputs.values():
            if g is not None:
                g.restore()


def verify_candidate(call: Callable[[InputSet], int], sets: list[InputSet], dtype: str,
                     sync: Callable[[], None], scrub: Callable[[], None] | None = None) -> Mismatch | None:
    """Every set twice (sentinel then NaN poison), then new values in reused buffers.

    `sync` waits for the candidate's work on the harness's own stream only (so work moved to
    another stream is unfinished when checked); `scrub` overwrites memory the reference used.
    Raises CandidateError for a non-zero return code.
    """
    restore_inputs(sets)  # the sets are shared by every candidate of the task
    for s in sets:
        for poison in (SENTINEL, float("nan")):
            mm = run_checked(call, s, dtype, poison, sync, scrub=scrub)
            if mm is not None:
                return mm
    if len(sets) >= 2:
        mm = _rerun_in_place(call, sets[0], sets[-1], dtype, sync, scrub)
        if mm is not None:
            return mm
    return None


def _rerun_in_place(call, a: InputSet, b: InputSet, dtype: str, sync, scrub) -> Mismatch | None:
    """Run b's values in a's buffers (same pointers, new contents): catches replayed results."""
    saved = {k: (g.tensor.clone() if g is not None else None) for k, g in a.inputs.items()}
    try:
        for k, g in a.inputs.items():
            if g is not None:
                g.tensor.copy_(b.inputs[k].tensor)
                g.save()
        probe = InputSet(f"{b.name} values in the buffers of {a.name} (replay check)", a.inputs,
                         b.expected, a.out)
        return run_checked(call, probe, dtype, SENTINEL, sync, scrub=scrub)
    finally:
        for k, g in a.inputs.items():
            if g is not None:
                g.tensor.copy_(saved[k])
                g.save()
