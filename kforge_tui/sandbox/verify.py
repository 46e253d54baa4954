"""Verification: does a candidate compute what the region's PyTorch graph computes, honestly?

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
    (or a small multiple of PyTorch's own error, whichever is larger): "edge-case inputs".
"""
from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from typing import Callable

import torch

from kforge_tui.regions.meta import DTYPE_BYTES, FLOAT_DTYPES, TensorMeta, TensorStats, storage_span
from kforge_tui.sandbox.result import Mismatch

# dtype of the OUTPUT -> (rtol, atol). A pair (g, e) is close when
#   g == e (same inf / exact), or |g - e| <= atol * scale + rtol * |e|,
# with scale = max |e| over the finite reference of that output. The absolute part is relative
# to the output's magnitude so that tiny outputs (softmax over 262144 logits is ~4e-6 per
# element) are still checked to rtol instead of passing on an absolute 1e-5.
TOLERANCES: dict[str, tuple[float, float]] = {
    # f32: honest kernels differ from PyTorch by summation order, ~1e-6 relative on large
    # reductions; 1e-4 is 100x headroom, and a bf16-rounded result (~2e-3) fails by 20x.
    "float32": (1e-4, 1e-5),
    # f16: unit roundoff 2^-11 = 4.9e-4; PyTorch rounds once, a kernel may round once more
    # differently: 2 ulps (2^-9 = 2e-3) relative.
    "float16": (2e-3, 1e-3),
    # bf16: unit roundoff 2^-8 = 3.9e-3; 2 ulps = 2^-6 = 1.6e-2, the same reasoning as f16.
    "bfloat16": (1.6e-2, 8e-3),
    "float64": (1e-9, 1e-10),
}
EXACT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")

# Edge-case judge against float64: an element passes when its error is within ULPS[dtype] ulps
# of the output dtype, or within EDGE_FACTOR x PyTorch's own error (that element's, or its worst
# relative error over the output), or below the smallest normal number (denormal flushing is
# tolerated). f32: an exp approximated by a cubic (~1e-4 relative, ~800 ulps) fails; __expf
# with +-100 arguments (<= ~50 ulps) passes.
ULPS = {"float32": 128, "float16": 4, "bfloat16": 4, "float64": 2**20}
EDGE_FACTOR = 8.0
# ... and never below SCALE_ULPS ulps of the output's largest finite value: an element near zero
# that is a difference of large terms (w * norm + b with +-100 weights) carries the rounding of
# those terms, as `compare`'s atol x max|ref| says for ordinary inputs.
SCALE_ULPS = 8.0
TINY = {"float32": torch.finfo(torch.float32).tiny, "float16": torch.finfo(torch.float16).tiny,
        "bfloat16": torch.finfo(torch.bfloat16).tiny, "float64": torch.finfo(torch.float64).tiny}
MANTISSA = {"float32": 23, "float16": 10, "bfloat16": 7, "float64": 52}

GUARD_BYTES = 4096  # guard zone either side of every tensor (tensors start ALIGN-aligned)
FIRST_N = 5  # mismatching elements listed in a report
CHUNK = 1 << 25  # elements compared at once (bounds the float64 scratch of a comparison)
SOFTMAX_LIKE_OPS = {"exp", "exp2", "expm1", "amax", "_softmax", "softmax", "_log_softmax", "log_softmax",
                    "logsumexp", "_safe_softmax", "sigmoid"}
EDGE_KINDS = ("large", "masked", "tiny", "zeros", "equal_rows")
EDGE_TEXT = {"large": "large magnitudes +-100", "masked": "large magnitudes with -inf masks",
             "tiny": "tiny and denormal values", "zeros": "all zeros",
             "equal_rows": "rows of equal values"}


class CandidateError(Exception):
    """The candidate misbehaved in a way that is not a value mismatch (bad return code)."""


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (0.0, 0.0))


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def is_oom(e: BaseException) -> bool:
    """An allocation failure of the harness (device or host), simulated ones included."""
    if isinstance(e, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                            or "cannot allocate memory" in text)


# ------------------------------------------------------------------------ guarded buffers

@dataclass(frozen=True)
class Slot:
    """Where one guarded tensor lives inside an arena (plain data: crosses to the runner)."""

    offset: int  # of the head guard
    span: int  # bytes of the data region (storage span of the strided tensor)
    shape: tuple
    stride: tuple
    dtype: str

    @property
    def total(self) -> int:
        return self.span + 2 * GUARD_BYTES

    @classmethod
    def of(cls, meta: TensorMeta, offset: int = 0) -> "Slot":
        span = storage_span(meta.shape, meta.strides) * DTYPE_BYTES[meta.dtype]
        return cls(offset, span, tuple(meta.shape), tuple(meta.strides), meta.dtype)

    def to_json(self) -> list:
        return [self.offset, self.span, list(self.shape), list(self.stride), self.dtype]

    @classmethod
    def from_json(cls, d) -> "Slot":
        return cls(int(d[0]), int(d[1]), tuple(d[2]), tuple(d[3]), d[4])


def _align(n: int, a: int = GUARD_BYTES) -> int:
    return (n + a - 1) // a * a


class Guarded:
    """A tensor inside a byte buffer with guard zones either side (all of it checked after runs)."""

    def __init__(self, arena: torch.Tensor, slot: Slot):
        self.slot = slot
        self.base = arena[slot.offset:slot.offset + slot.total]
        self.head = self.base[:GUARD_BYTES]
        self.tail = self.base[GUARD_BYTES + slot.span:]
        self.data = self.base[GUARD_BYTES:GUARD_BYTES + slot.span]
        dt = torch_dtype(slot.dtype)
        if slot.span:
            self.tensor = self.data.view(dt).as_strided(slot.shape, slot.stride)
        else:
            self.tensor = torch.empty_strided(slot.shape, slot.stride, dtype=dt, device=arena.device)
        self.nbytes = slot.span
        self.numel = self.tensor.numel()
        self.has_gaps = slot.span > self.numel * self.tensor.element_size()
        self._covered: torch.Tensor | None = None

    def covered(self) -> torch.Tensor:
        """Bool mask over the data bytes: True where an element of the view lives."""
        if self._covered is None:
            es = self.tensor.element_size()
            n = self.slot.span // es
            idx = torch.zeros(n, dtype=torch.bool, device=self.base.device)
            flat = torch.arange(n, device=self.base.device).as_strided(self.slot.shape, self.slot.stride)
            idx[flat.reshape(-1)] = True
            self._covered = idx.repeat_interleave(es)
        return self._covered

    def fill(self, value: float) -> None:
        self.data.view(self.tensor.dtype).fill_(value)


def new_arena(nbytes: int, device) -> torch.Tensor:
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


# ------------------------------------------------------------------------ random values

def generator(device, seed: int) -> torch.Generator:
    dev = torch.device(device)
    g = torch.Generator(device=dev if dev.type != "cpu" else "cpu")
    g.manual_seed(int(seed) & ((1 << 63) - 1))
    return g


def _stats_of(d) -> TensorStats | None:
    if d is None:
        return None
    if isinstance(d, TensorStats):
        return d
    try:
        return TensorStats(**d)
    except TypeError:
        return None


DEFAULT_X = TensorStats(0.0, 1.0, -6.0, 6.0)


def _int_range(meta: TensorMeta, st: TensorStats | None) -> tuple[int, int]:
    info = torch.iinfo(torch_dtype(meta.dtype))
    if st is None:
        lo, hi = 0, 1  # no capture: 0/1 stay valid as indices of any non-trivial dimension
    else:
        lo, hi = int(math.ceil(st.min)), int(math.floor(st.max))
        if hi < lo:
            lo, hi = int(st.min), int(st.min)
    return max(lo, info.min), min(hi, info.max)


def draw(meta: TensorMeta, stats: TensorStats | None, gen: torch.Generator, device="cpu") -> torch.Tensor:
    """Fresh values like the captured ones: floats Normal(mean, std) clipped to [min, max];
    integers uniform in the captured [min, max] (indices stay valid); bool random bits.
    Contiguous, of the meta's shape and dtype, drawn on `device`."""
    dt = torch_dtype(meta.dtype)
    shape = tuple(meta.shape)
    if meta.dtype == "bool":
        return torch.randint(0, 2, shape, generator=gen, device=device, dtype=torch.uint8).bool()
    if meta.dtype not in FLOAT_DTYPES:
        lo, hi = _int_range(meta, stats)
        return torch.randint(lo, hi + 1, shape, generator=gen, device=device, dtype=torch.int64).to(dt)
    st = stats or DEFAULT_X
    wide = torch.float64 if meta.dtype == "float64" else torch.float32
    v = torch.randn(shape, generator=gen, device=device, dtype=wide)
    v.mul_(st.std if st.std > 0 else 0.0).add_(st.mean)
    lo, hi = (st.min, st.max) if st.max >= st.min else (st.max, st.min)
    return v.clamp_(lo, hi).to(dt)


def draw_into(t: torch.Tensor, meta: TensorMeta, stats: TensorStats | None, gen: torch.Generator) -> None:
    """`draw` written straight into t (any strides), with no temporary of t's size (a region of
    many GiB has no room for one)."""
    if t.numel() == 0:
        return
    if meta.dtype == "bool":
        t.copy_(torch.randint(0, 2, t.shape, generator=gen, device=t.device, dtype=torch.uint8).bool()
                if t.numel() <= CHUNK else torch.ones((), dtype=torch.bool, device=t.device))
        if t.numel() > CHUNK:
            for _, piece in _flat_views(t):
                piece.copy_(torch.randint(0, 2, piece.shape, generator=gen, device=t.device,
                                          dtype=torch.uint8).bool())
        return
    if meta.dtype not in FLOAT_DTYPES:
        lo, hi = _int_range(meta, stats)
        t.random_(lo, hi + 1, generator=gen)
        return
    st = stats or DEFAULT_X
    lo, hi = (st.min, st.max) if st.max >= st.min else (st.max, st.min)
    t.normal_(st.mean, st.std if st.std > 0 else 0.0, generator=gen)
    t.clamp_(lo, hi)


def _flat_views(t: torch.Tensor):
    """Writable views of t covering it in pieces of about CHUNK elements (leading dims)."""
    if t.numel() <= CHUNK or t.dim() == 0:
        yield 0, t
        return
    if t.dim() == 1:
        for a in range(0, t.shape[0], CHUNK):
            yield a, t[a:a + CHUNK]
        return
    per = t[0].numel()
    step = max(1, CHUNK // max(per, 1))
    for a in range(0, t.shape[0], step):
        yield a * per, t[a:a + step]


def checksum(buf: torch.Tensor, seed: int) -> int:
    """A keyed hash of a byte buffer computed where it lives (a device pass, no copy of it):
    sum over 32-bit words of (word + 1) * h(index), h an odd multiplier from the seed, wrapping
    in 64 bits. With a seed the kernel never sees, a change it makes to an input cannot be made
    to keep the sum. Used where a region is too big for a private copy on the device."""
    a = (seed | 1) & ((1 << 61) - 1)
    b = (seed >> 3) & ((1 << 61) - 1)
    n = buf.numel()
    n4 = n // 4
    acc = 0
    words = buf[:n4 * 4].view(torch.int32)
    for lo in range(0, n4, CHUNK):
        w = words[lo:lo + CHUNK].to(torch.int64)
        idx = torch.arange(lo, lo + w.numel(), device=buf.device, dtype=torch.int64)
        h = (idx * a + b) | 1
        acc = (acc + int(((w + 1) * h).sum())) & ((1 << 64) - 1)
    if n4 * 4 < n:
        tail = buf[n4 * 4:].to(torch.int64)
        acc = (acc + int((tail * torch.arange(1, tail.numel() + 1, device=buf.device)).sum()) * a) & ((1 << 64) - 1)
    return acc


def fill_random(t: torch.Tensor, gen: torch.Generator, scale: float = 1.0) -> None:
    """Random finite values of t's dtype, in place (poison: looks like garbage, not a marker)."""
    if t.numel() == 0:
        return
    if t.dtype == torch.bool:
        t.copy_(torch.randint(0, 2, t.shape, generator=gen, device=t.device, dtype=torch.uint8).bool())
    elif t.is_floating_point():
        t.uniform_(-scale, scale, generator=gen)
    else:
        info = torch.iinfo(t.dtype)
        lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
        t.random_(lo, hi, generator=gen)


def garbage_pools(outputs, device, seed: int) -> list:
    """One pool of random garbage per output (numel + 1024 elements), from `seed`: the runner
    copies windows of it into the outputs of unchecked timed calls, and the supervisor can
    rebuild it to know what a checked call filled from the same windows held."""
    gen = generator(device, seed)
    scale = poison_scale(seed)
    out = []
    for m in outputs:
        p = torch.empty(m.numel + 1024, dtype=torch_dtype(m.dtype), device=device)
        fill_random(p, gen, scale)
        out.append(p)
    return out


def poison_scale(seed: int) -> float:
    """Magnitude of one poison fill: 0.1 to 1000, per fill (no fixed range to look for)."""
    return 10.0 ** random.Random(seed).uniform(-1, 3)


def fill_bytes(t: torch.Tensor, gen: torch.Generator) -> None:
    if t.numel():
        t.random_(0, 256, generator=gen)


# ------------------------------------------------------------------------ input sets

@dataclass
class InputSet:
    """One set of kernel inputs in guarded buffers, its expected outputs and output buffers."""

    name: str  # "captured[0]", "random[2]"
    inputs: list  # Guarded | None, in ABI order
    outputs: list  # Guarded, in ABI order, with the exact output strides
    expected: list  # torch.Tensor per output (supervisor only; empty in a runner)
    saved: list = field(default_factory=list)  # private copy of each input buffer (bitwise)
    kind: str = "random"  # captured | random
    # Regions too big for a private device copy: the set's canonical values live in (pinned)
    # host memory, written once; a harness re-write marks the set dirty, and restore() puts the
    # canonical values back (and the caller recomputes the reference). Inputs are checked with
    # keyed device hashes instead of a bitwise comparison.
    host_saved: bool = False
    sums0: list = field(default_factory=list)  # hashes of the canonical values (host mode)
    sum_seed: int = 0
    dirty: bool = False

    def tensors(self) -> list:
        return [g.tensor if g is not None else None for g in self.inputs]

    def out_tensors(self) -> list:
        return [g.tensor for g in self.outputs]

    def save_inputs(self) -> None:
        if self.host_saved:
            if self.saved:  # canonical values are written once; later writes only mark the set
                self.dirty = True
                return
            self.saved = [_host_copy(g.base) if g is not None else None for g in self.inputs]
            self.sums0 = [checksum(g.base, self.sum_seed) if g is not None else None for g in self.inputs]
        else:
            self.saved = [g.base.clone() if g is not None else None for g in self.inputs]

    def restore_inputs(self) -> bool:
        """Put the saved values back; True when the reference must be recomputed (host mode)."""
        if self.host_saved:
            changed = self.dirty or any(g is not None and checksum(g.base, self.sum_seed) != h
                                        for g, h in zip(self.inputs, self.sums0))
            if changed:
                for g, c in zip(self.inputs, self.saved):
                    if g is not None and c is not None:
                        g.base.copy_(c, non_blocking=False)
                self.dirty = False
            return changed
        for g, c in zip(self.inputs, self.saved):
            if g is not None and c is not None:
                g.base.copy_(c)
        return False


# Every tensor starts at a random multiple of ALIGN bytes within its page: page-aligned guard
# zones would otherwise make every harness buffer 4096-byte aligned, which a PyTorch tensor in a
# real forward (64-byte aligned) rarely is - a harness detector with no name, import or state
# (`if (((uintptr_t)x & 4095) == 0) compute(); else skip_half();`).
ALIGN = 64
_layout_rng = random.Random(int.from_bytes(os.urandom(8), "little"))


def set_layout(task) -> tuple[list, list, int]:
    """Slots of one set's inputs (None for absent) and outputs, and the bytes they take (each
    slot with a page of room for the random shift `layout` gives it)."""
    off = 0
    ins, outs = [], []
    for m in task.inputs:
        if not m.present:
            ins.append(None)
            continue
        s = Slot.of(m, off)
        ins.append(s)
        off += _align(s.total + GUARD_BYTES)
    for m in task.outputs:
        s = Slot.of(m, off)
        outs.append(s)
        off += _align(s.total + GUARD_BYTES)
    return ins, outs, off


def _shift(slot: Slot | None, by: int) -> Slot | None:
    return None if slot is None else Slot(slot.offset + by, slot.span, slot.shape, slot.stride, slot.dtype)


def layout(task, k: int) -> tuple[list[tuple[list, list]], int]:
    """Slots of k sets in one arena, and the arena's size."""
    ins, outs, per = set_layout(task)

    def at(s, i):
        return _shift(s, i * per + ALIGN * _layout_rng.randrange(GUARD_BYTES // ALIGN))

    sets = [([at(s, i) for s in ins], [at(s, i) for s in outs]) for i in range(k)]
    return sets, per * k


def views(arena: torch.Tensor, slots: list[tuple[list, list]], names: list[str] | None = None) -> list[InputSet]:
    """InputSets over an arena (no expected values: what a runner sees)."""
    out = []
    for i, (ins, outs) in enumerate(slots):
        out.append(InputSet(names[i] if names else f"set[{i}]",
                            [Guarded(arena, s) if s is not None else None for s in ins],
                            [Guarded(arena, s) for s in outs], []))
    return out


def _captured_inputs(task, call: dict) -> list:
    vals = list(call.get("inputs") or [])
    return [(vals[i] if i < len(vals) else None) for i in range(len(task.inputs))]


def _captured_stats(task, calls: list[dict]) -> list:
    if not calls:
        return [None] * len(task.inputs)
    st = list(calls[0].get("stats") or [])
    out = [(_stats_of(st[i]) if i < len(st) else None) for i in range(len(task.inputs))]
    # stats missing but a tensor present: derive them
    for i, (m, s) in enumerate(zip(task.inputs, out)):
        if s is None and m.present:
            v = _captured_inputs(task, calls[0])[i]
            if isinstance(v, torch.Tensor) and v.numel():
                out[i] = TensorStats.of(v)
    return out


def check_outputs(task, outs) -> list:
    """The reference's outputs as a list matching the task's outputs (raises when they don't)."""
    if isinstance(outs, torch.Tensor):
        outs = [outs]
    outs = list(outs)
    if len(outs) != len(task.outputs):
        raise ValueError(f"the region returned {len(outs)} outputs, the task declares {len(task.outputs)}")
    fixed = []
    for o, m in zip(outs, task.outputs):
        if tuple(o.shape) != tuple(m.shape):
            if o.numel() != m.numel:
                raise ValueError(f"output shape {tuple(o.shape)} differs from the task's {m.shape}")
            o = o.reshape(m.shape)
        fixed.append(o)
    return fixed


def build_sets(task, calls: list[dict], n_random: int, device, seed: int,
               reference: Callable[[list], list], *, min_sets: int = 0, max_sets: int | None = None,
               alloc: Callable[[int], torch.Tensor] | None = None,
               account: Callable[[int], None] | None = None,
               host_saved: bool = False) -> tuple[list[InputSet], str, torch.Tensor]:
    """Captured calls plus `n_random` fresh draws (more if fewer than `min_sets` in all), at most
    `max_sets` in all (random draws dropped first, then the last captured calls).

    All buffers live in one arena from `alloc(nbytes)` (shared with the runner in the worker).
    `account(nbytes)` is told about each private allocation first (memory budget; may raise an
    out-of-memory error). Returns the sets, a one-line note of where the inputs came from, and
    the arena.
    """
    gen = generator(device, seed)
    n_cap = len(calls)
    n_random = max(n_random, min_sets - n_cap, 0)
    if max_sets is not None:
        n_cap_used = min(n_cap, max(max_sets, 1))
        n_random = max(0, min(n_random, max_sets - n_cap_used))
    else:
        n_cap_used = n_cap
    if n_cap_used + n_random == 0:
        n_random = 1
    k = n_cap_used + n_random
    slots, nbytes = layout(task, k)
    if account is not None:
        account(nbytes)
    arena = alloc(nbytes) if alloc is not None else new_arena(nbytes, device)
    stats = _captured_stats(task, calls)
    names = [f"captured[{i}]" for i in range(n_cap_used)] + [f"random[{i}]" for i in range(n_random)]
    sets = views(arena, slots, names)
    sum_seed = int.from_bytes(os.urandom(8), "little") >> 2
    for i, s in enumerate(sets):
        s.kind = "captured" if i < n_cap_used else "random"
        s.host_saved = host_saved
        s.sum_seed = sum_seed
        for g in s.inputs + s.outputs:
            if g is not None:
                fill_bytes(g.head, gen)  # guards and gaps: random bytes
                fill_bytes(g.tail, gen)
                if g.has_gaps:
                    fill_bytes(g.data, gen)
        vals = _captured_inputs(task, calls[i]) if s.kind == "captured" else None
        for j, (g, m) in enumerate(zip(s.inputs, task.inputs)):
            if g is None:
                continue
            v = vals[j] if vals is not None else None
            if v is None:
                draw_into(g.tensor, m, stats[j], gen)
            else:
                g.tensor.copy_(v.to(device=device).reshape(m.shape).to(torch_dtype(m.dtype)))
        if account is not None:
            account((0 if host_saved else sum(g.base.numel() for g in s.inputs if g is not None))
                    + sum(m.nbytes for m in task.outputs))
        s.save_inputs()
        s.expected = fresh_outputs(task, reference(s.tensors()), s.tensors())
        if not host_saved and not all(g is None or torch.equal(g.base, c) for g, c in zip(s.inputs, s.saved)):
            raise ValueError("the region's reference modified its inputs")
    dropped = []
    if n_cap_used < n_cap:
        dropped.append(f"{n_cap - n_cap_used} captured calls left out (memory)")
    note = (f"{n_cap_used} captured calls + {n_random} random draws matched to captured value statistics"
            if n_cap else f"no captured calls: {n_random} random draws (floats N(0,1) clipped to [-6, 6], "
                          f"integers 0..1, bool random)")
    if dropped:
        note += "; " + "; ".join(dropped)
    return sets, note, arena


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of a device buffer, pinned when possible (restores are then fast)."""
    if t.device.type == "cpu":
        return t.clone()
    try:
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    except Exception:
        out = torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


def fresh_outputs(task, outs, inputs: list) -> list:
    """The reference's outputs kept as expected values: not copied unless one shares memory
    with an input (a copy of a multi-GiB output is memory the sets need)."""
    outs = check_outputs(task, outs)
    ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    return [o.detach().clone() if o.untyped_storage().data_ptr() in ptrs else o.detach() for o in outs]


# ------------------------------------------------------------------------ comparison

def _label(input_set: str, j: int, n_out: int) -> str:
    return input_set if n_out <= 1 else f"{input_set} output {j}"


def _flat_chunks(t: torch.Tensor):
    """(offset, piece) of t's logical row-major flattening, about CHUNK elements per piece.
    The pieces depend on the shape only, so tensors of one shape chunk alike (zip them)."""
    if t.numel() <= CHUNK or t.dim() == 0:
        yield 0, t.reshape(-1)
        return
    yield from _blocks(t, 0)


def _blocks(t: torch.Tensor, base: int):
    if t.numel() <= CHUNK:
        yield base, t.reshape(-1)
        return
    if t.dim() == 1:
        for a in range(0, t.shape[0], CHUNK):
            yield base + a, t[a:a + CHUNK]
        return
    per = t[0].numel()
    if per <= CHUNK:
        step = max(1, CHUNK // max(per, 1))
        for a in range(0, t.shape[0], step):
            yield base + a * per, t[a:a + step].reshape(-1)
    else:
        for a in range(t.shape[0]):
            yield from _blocks(t[a], base + a * per)


def compare(expected: torch.Tensor, got: torch.Tensor, dtype: str, input_set: str,
            poison: torch.Tensor | None = None) -> Mismatch | None:
    """None when `got` matches; else a Mismatch naming the first reason in priority order.

    `poison` (same logical shape) is what the output held before the call: mismatching elements
    that still hold it are reported as unwritten ("poison survived")."""
    total = expected.numel()
    if got.numel() != total:
        return Mismatch(input_set, float("inf"), float("inf"), total, total, [],
                        f"output has {got.numel()} elements, expected {total}")
    if total == 0:
        return None
    exact = dtype in EXACT_DTYPES
    rtol, atol = tolerance(dtype)
    # pass 1: the scale (max |finite reference|)
    scale = 0.0
    if not exact:
        for _, e in _flat_chunks(expected):
            scale = max(scale, float(e.float().abs().nan_to_num_(0.0, 0.0, 0.0).max()))
        scale = scale or 1.0
        # fast path (the common, passing case): one fused closeness test in the output's own
        # precision (f32 for 16-bit outputs); the float64 analysis runs only when it fails
        if poison is None and _all_close(expected, got, rtol, atol * scale):
            return None
    elif poison is None and torch.equal(expected, got.reshape(expected.shape) if got.shape != expected.shape
                                        else got):
        return None
    n_bad = survived = nan_new = nan_lost = 0
    max_abs = max_rel = 0.0
    nonfinite_bad = False
    first: list[dict] = []
    pchunks = _flat_chunks(poison) if poison is not None and poison.numel() == total else None
    for (a, e), (_, g) in zip(_flat_chunks(expected), _flat_chunks(got)):
        p = next(pchunks)[1] if pchunks is not None else None
        # a snapshot: the buffer itself may still be changing (work left running elsewhere)
        if exact:
            gn = g.clone()
            bad = gn != e
            if p is not None:
                survived += int((bad & (p == gn)).sum())
                p = None
            g, e = gn.to(torch.float64), e.to(torch.float64)
        else:
            g = g.to(torch.float64, copy=True)
            e = e.to(torch.float64)
            e_nan, g_nan = torch.isnan(e), torch.isnan(g)
            diff = (g - e).abs()
            close = (g == e) | (diff <= atol * scale + rtol * e.abs())
            bad = ~(close | (e_nan & g_nan))
        nb = int(bad.sum())
        if not nb:
            continue
        n_bad += nb
        if p is not None:
            p = p.to(torch.float64)
            survived += int((bad & (p == g)).sum())
        if not exact:
            nan_new += int((g_nan & ~e_nan).sum())
            nan_lost += int((e_nan & ~g_nan).sum())
            fin = torch.isfinite(e) & torch.isfinite(g)
            both = bad & fin
            if bool(both.any()):
                # torch.where, not boolean indexing: masked selection is ~1000x slower on cpu
                d = torch.where(both, diff, 0.0)
                max_abs = max(max_abs, float(d.max()))
                max_rel = max(max_rel, float((d / e.abs().clamp_min(1e-30)).max()))
            if bool((bad & ~fin).any()):
                nonfinite_bad = True
        else:
            d = torch.where(bad, (g - e).abs(), 0.0)
            max_abs = max(max_abs, float(d.max()))
            max_rel = max(max_rel, float((d / e.abs().clamp_min(1)).max()))
        if len(first) < FIRST_N:
            idx = torch.nonzero(bad).reshape(-1)[:FIRST_N - len(first)].tolist()
            for flat in idx:
                first.append({"index": list(_unravel(a + flat, tuple(expected.shape))),
                              "expected": _num(e[flat]), "got": _num(g[flat])})
    if n_bad == 0:
        return None
    if survived:
        reason = f"unwritten elements (poison survived in {survived})"
    elif nan_new:
        reason = "NaN where the reference is finite (unwritten or computed NaN)"
    elif nan_lost:
        reason = "finite where the reference is NaN"
    else:
        reason = "values differ beyond tolerance"
    if nonfinite_bad and not max_abs:
        max_abs = max_rel = float("inf")
    tol = "exact match required" if exact else f"rtol {rtol:g}, atol {atol:g} x max|ref| {scale:.3g}"
    return Mismatch(input_set, max_abs, max_rel, n_bad, total, first, f"{reason} ({tol})")


def _all_close(expected: torch.Tensor, got: torch.Tensor, rtol: float, atol: float) -> bool:
    for (_, e), (_, g) in zip(_flat_chunks(expected), _flat_chunks(got)):
        if e.dtype in (torch.float16, torch.bfloat16):
            e, g = e.float(), g.float()
        elif g.dtype != e.dtype:
            g = g.to(e.dtype)
        if not bool(torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True).all()):
            return False
    return True


def _num(t: torch.Tensor) -> float | str:
    v = float(t)
    return v if v == v and abs(v) != float("inf") else str(v)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape or (1,)):
        out.append(flat % max(s, 1))
        flat //= max(s, 1)
    return tuple(reversed(out))


def _unravel_many(flat: torch.Tensor, shape: tuple) -> tuple:
    """Index tensors (one per dim) of logical flat positions."""
    out = []
    rest = flat.clone()
    for s in reversed(shape or (1,)):
        out.append(rest % max(s, 1))
        rest = rest // max(s, 1)
    return tuple(reversed(out)) if shape else (flat,)


def special_mismatch(input_set: str, total: int, reason: str) -> Mismatch:
    """A failure that is not about values (inputs changed, writes outside the output, state)."""
    return Mismatch(input_set, float("nan"), float("nan"), total, total, [], reason)


def ulp(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Spacing of `dtype` numbers at |x| (x float64), never below the smallest denormal."""
    m = MANTISSA[dtype]
    tiny = TINY[dtype]
    ax = x.abs().clamp_min(tiny)
    e = torch.floor(torch.log2(ax))
    return torch.exp2(e - m).clamp_min(tiny * 2.0 ** -m)


def judge_f64(ref64: torch.Tensor, torch_out: torch.Tensor, got: torch.Tensor, dtype: str,
              label: str, pert: torch.Tensor | None = None) -> Mismatch | None:
    """Edge-case judge of one float output against the float64 run (see ULPS, EDGE_FACTOR).

    `pert` is PyTorch's output on the same inputs changed by about one ulp each: where the
    region is ill-conditioned (a layer_norm of a row of equal values divides rounding noise by
    sqrt(eps); a softmax of scores near 1e5 is one-hot), an honest kernel's rounding moves the
    result that far too, so EDGE_FACTOR x that sensitivity is allowed as well. PyTorch's own
    error can be zero there by luck of its summation order; the sensitivity cannot."""
    total = ref64.numel()
    if total == 0 or dtype not in ULPS or dtype == "float64":
        return None
    rchunks = list(_flat_chunks(ref64))
    chunks = list(zip(rchunks, _flat_chunks(torch_out), _flat_chunks(got),
                      _flat_chunks(pert) if pert is not None else [(None, None)] * len(rchunks)))
    # fast path: every element within the ulp bound of the float64 result (or equal to it)
    eps = 2.0 ** -MANTISSA[dtype]
    if all(bool((((g.to(torch.float64) - r).abs() <= (ULPS[dtype] * eps) * r.abs()) | (g.to(torch.float64) == r)).all())
           for (_, r), _, (_, g), _ in chunks):
        return None
    # pass 1: PyTorch's own worst relative error on this output (finite elements), and its
    # worst relative sensitivity to one-ulp input changes
    rel_t = rel_p = 0.0
    for (_, r), (_, t), _, (_, p) in chunks:
        r = r.to(torch.float64)
        for x, which in ((t, "t"), (p, "p")):
            if x is None:
                continue
            x = x.to(torch.float64)
            ok = torch.isfinite(r) & torch.isfinite(x) & (r.abs() > TINY[dtype])
            if bool(ok.any()):
                v = float(torch.where(ok, (x - r).abs() / r.abs().clamp_min(TINY[dtype]), 0.0).max())
                if which == "t":
                    rel_t = max(rel_t, v)
                else:
                    rel_p = max(rel_p, v)
    scale = 0.0
    for (_, r), _, _, _ in chunks:
        fin = torch.isfinite(r)
        if bool(fin.any()):
            scale = max(scale, float(r[fin].abs().max()))
    n_bad, worst_ulps, max_abs, first = 0, 0.0, 0.0, []
    for (a, r), (_, t), (_, g), (_, p) in chunks:
        r = r.to(torch.float64)
        t = t.to(torch.float64)
        g = g.to(torch.float64, copy=True)
        # an ulp of |x| is between eps/2 and eps times |x| (normal numbers): eps * |x| is the
        # unit here, floored at the smallest normal (denormal flushing is tolerated)
        u = (eps * r.abs()).clamp_min(TINY[dtype] * eps)
        err = (g - r).abs()
        err_t = (t - r).abs()
        if p is not None:
            err_p = (p.to(torch.float64) - r).abs()
            err_t = torch.maximum(err_t, torch.where(torch.isfinite(err_p), err_p, 0.0))
        bound = torch.maximum(ULPS[dtype] * u,
                              EDGE_FACTOR * torch.maximum(err_t, max(rel_t, rel_p) * r.abs()))
        bound = bound.clamp_min(SCALE_ULPS * eps * scale)
        bound = bound.clamp_min(TINY[dtype])
        close = (err <= bound) | (g == t) | ((g - t).abs() <= ULPS[dtype] * eps * t.abs())
        # non-finite: must agree with PyTorch or with the float64 run
        nf = ~(torch.isfinite(g) & torch.isfinite(r))
        same_nf = (torch.isnan(g) & (torch.isnan(t) | torch.isnan(r))) | \
                  (torch.isinf(g) & ((g == t) | (g == r)))
        close = torch.where(nf, same_nf | (g == t), close)
        bad = ~close
        nb = int(bad.sum())
        if not nb:
            continue
        n_bad += nb
        fin = bad & torch.isfinite(g) & torch.isfinite(r)
        if bool(fin.any()):
            worst_ulps = max(worst_ulps, float(torch.where(fin, err / u, 0.0).max()))
            max_abs = max(max_abs, float(torch.where(fin, err, 0.0).max()))
        else:
            worst_ulps = max_abs = float("inf")
        if len(first) < FIRST_N:
            for flat in torch.nonzero(bad).reshape(-1)[:FIRST_N - len(first)].tolist():
                first.append({"index": list(_unravel(a + flat, tuple(ref64.shape))),
                              "expected": _num(r[flat]), "got": _num(g[flat]),
                              "pytorch": _num(t[flat])})
    if not n_bad:
        return None
    return Mismatch(label, max_abs, worst_ulps, n_bad, total, first,
                    f"edge-case inputs: error up to {worst_ulps:.3g} ulps of {dtype} against the float64 "
                    f"reference (allowed {ULPS[dtype]} ulps, {SCALE_ULPS:g} ulps of the output's "
                    f"largest value, or {EDGE_FACTOR:g}x PyTorch's own error or its change under "
                    f"one-ulp input changes)")


# ------------------------------------------------------------------------ edge cases

def softmax_like(task) -> bool:
    from kforge_tui.regions.graph import ops_of

    return bool(SOFTMAX_LIKE_OPS & set(ops_of(task.graph)))


def edge_kinds(task) -> list[str]:
    if not any(m.present and m.dtype in FLOAT_DTYPES for m in task.inputs):
        return []
    return [k for k in EDGE_KINDS if k != "masked" or softmax_like(task)]


def edge_into(kind: str, task, targets: list, stats: list, gen: torch.Generator) -> None:
    """Write one edge case into the input tensors `targets` (None for absent), in place. Only
    floating inputs get the edge values; integer and bool inputs are drawn as usual (indices
    must stay valid)."""
    present = [(t, m) for t, m in zip(targets, task.inputs) if t is not None and m.present]
    main = max((m for _, m in present if m.dtype in FLOAT_DTYPES), key=lambda m: m.numel, default=None)
    for t, m, st in zip(targets, task.inputs, stats):
        if t is None or not m.present or t.numel() == 0:
            continue
        if m.dtype not in FLOAT_DTYPES:
            draw_into(t, m, st, gen)
            continue
        if kind in ("large", "masked"):
            t.uniform_(-100.0, 100.0, generator=gen)
            if kind == "masked" and m is main:
                for _, piece in _flat_views(t):
                    mask = torch.rand(piece.shape, generator=gen, device=t.device) < 0.15
                    if piece.dim() >= 1 and piece.shape[-1] > 1:
                        mask[..., 0] = False  # never a whole row: every row keeps a finite element
                    piece.masked_fill_(mask, float("-inf"))
        elif kind == "tiny":
            t.normal_(0.0, 2.0 * TINY[m.dtype], generator=gen)
        elif kind == "zeros":
            t.zero_()
        elif kind == "equal_rows":
            # small integers and halves: sums of a row are exact, so an honest kernel is exact too
            shape = tuple(m.shape)
            rows = shape[:-1] + (1,) if shape else ()
            v = torch.randint(-8, 9, rows, generator=gen, device=t.device).to(t.dtype) / 2
            t.copy_(v.expand(shape))
        else:
            raise ValueError(kind)


def edge_values(kind: str, task, stats: list, gen: torch.Generator, device) -> list:
    """One edge case as new contiguous tensors (tests; the verifier writes in place)."""
    out = [torch.empty(m.shape, dtype=torch_dtype(m.dtype), device=device) if m.present else None
           for m in task.inputs]
    edge_into(kind, task, out, stats, gen)
    return out


def graph64(graph: dict) -> dict:
    """The same graph computing in float64: every floating dtype argument becomes float64."""
    def walk(a):
        if isinstance(a, list):
            return [walk(x) for x in a]
        if isinstance(a, dict):
            if "dtype" in a and len(a) == 1 and a["dtype"] in FLOAT_DTYPES:
                return {"dtype": "float64"}
            return {k: walk(v) for k, v in a.items()}
        return a

    return {"inputs": list(graph["inputs"]),
            "nodes": [{**n, "args": walk(n["args"]), "kwargs": walk(n["kwargs"])} for n in graph["nodes"]],
            "outputs": walk(graph["outputs"])}


def reference64(task, device) -> Callable[[list], list] | None:
    """A callable running the region in float64 (floating inputs cast), or None if it can't."""
    from kforge_tui.regions.graph import to_graph_module

    try:
        gm = to_graph_module(graph64(task.graph), device)
    except Exception:
        return None

    def run(inputs: list) -> list:
        cast = [(t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
                for t in inputs]
        with torch.no_grad():
            out = gm(*cast)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return run


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
                 edge: bool = True, log: list | None = None):
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
        self.log = log if log is not None else []
        self.checks = {"calls": 0, "sets": len(sets), "edge_cases": [], "replay_checks": 0,
                       "timed_checks": 0, "fresh_timed": 0}
        self._poison_seed: dict[int, int] = {}
        self._guard_snap: dict[int, list] = {}
        self.pool: dict | None = None  # the runner's garbage pool: {"seed", "offsets"[set][output]}
        self.sum_seed = self.rng.getrandbits(62)  # this candidate's key for input hashes
        self._sums: dict[int, list] = {}

    def _restore(self, s: InputSet) -> None:
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
        if isinstance(seed, tuple) and seed[0] == "pool":
            try:
                _, si, picks = seed
                pools = garbage_pools(self.task.outputs, self.device, self.pool["seed"])
                return [p[self.pool["offsets"][si][j][k]:][:o.numel].view(o.tensor.shape)
                        for j, (p, o, k) in enumerate(zip(pools, s.outputs, picks))]
            except Exception as e:
                if is_oom(e):
                    return None
                raise
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

    def check(self, s: InputSet, label: str, report: CallReport | None = None,
              values: bool = True) -> Mismatch | None:
        """After a call on `s`: runner problems, guards, gaps, inputs (bitwise), then values.
        With `values=False` (edge cases judged against float64 instead) a value mismatch counts
        only where the poison survived: the output was not written."""
        total = sum(e.numel() for e in s.expected) or 1
        if report is not None and report.problem:
            return special_mismatch(label, total, report.problem)
        for j, (o, snap) in enumerate(zip(s.outputs, self._guard_snap.get(id(s), []))):
            head, tail, data = snap
            if not (torch.equal(o.head, head) and torch.equal(o.tail, tail)):
                return special_mismatch(label, total, f"wrote outside the output buffer (guard zone of "
                                                      f"output {j} changed)")
            if data is not None:
                cov = o.covered()
                if not torch.equal(torch.where(cov, 0, o.data), torch.where(cov, 0, data)):
                    return special_mismatch(label, total, f"wrote outside the output (into the gaps "
                                                          f"of strided output {j})")
        for i, (g, saved) in enumerate(zip(s.inputs, s.saved)):
            if g is None or saved is None:
                continue
            if s.host_saved:
                changed = checksum(g.base, self.sum_seed) != self._sums.get(id(s), [None] * (i + 1))[i]
            else:
                changed = not torch.equal(g.base, saved)
            if changed:
                return special_mismatch(label, total, f"inputs modified (input {i} changed by the kernel)")
        pois = None
        for j, (exp, o, m) in enumerate(zip(s.expected, s.outputs, self.task.outputs)):
            mm = compare(exp, o.tensor, m.dtype, _label(label, j, len(s.outputs)))
            if mm is not None:
                if "values differ" in mm.reason or "NaN" in mm.reason or "finite" in mm.reason:
                    pois = pois if pois is not None else self.poison_values(s)
                    if pois is not None:
                        mm = compare(exp, o.tensor, m.dtype, _label(label, j, len(s.outputs)), pois[j]) or mm
                if values or "poison survived" in mm.reason or m.dtype not in FLOAT_DTYPES:
                    return mm
        return None

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
    def write_values(self, s: InputSet, values=None) -> None:
        """New input values into s's own buffers (a list of tensors, or a function writing them
        in place), then a new private copy and a new reference."""
        if callable(values):
            values(s.tensors())
        elif values is not None:
            for g, v in zip(s.inputs, values):
                if g is not None and v is not None:
                    g.tensor.copy_(v)
        s.expected = []  # release the old reference first: a big region has room for one
        s.save_inputs()
        s.expected = fresh_outputs(self.task, self.reference(s.tensors()), s.tensors())
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
        (`judge_f64`). None when it does not fit in memory."""
        try:
            ins = []
            for t, m in zip(s.tensors(), self.task.inputs):
                if t is None or m.dtype not in FLOAT_DTYPES:
                    ins.append(t)
                    continue
                eps = 2.0 ** -MANTISSA[m.dtype]
                sign = torch.randint(0, 2, tuple(t.shape), generator=self.gen,
                                     device=t.device).to(torch.float32) * 2 - 1
                work = torch.float64 if m.dtype == "float64" else torch.float32
                ins.append((t.to(work) * (1 + eps * sign)).to(t.dtype))
            return [o.detach() for o in self.reference(ins)]
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
        cand = [i for i, (g, m) in enumerate(zip(s.inputs, self.task.inputs)) if g is not None and m.numel]
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
                pert = self._perturbed_reference(s) if ref64 is not None else None
                label = f"edge-case inputs ({EDGE_TEXT[kind]}) in {s.name}"
                # values are judged against float64 below when that run exists: an edge case
                # can be too ill-conditioned for PyTorch's own rounding to be the yardstick
                mm = self.run_checked(s, label, values=ref64 is None)
                self.checks["edge_cases"].append(kind)
                if mm is not None:
                    if not mm.reason.startswith("edge-case inputs"):
                        mm.reason = f"edge-case inputs ({EDGE_TEXT[kind]}): {mm.reason}"
                    return mm
                if ref64 is not None:
                    mm = self._judge_f64(s, ref64, pert, label, f"edge-case inputs ({EDGE_TEXT[kind]}):")
                    if mm is not None:
                        return mm
                    del ref64
            finally:
                if s.host_saved:  # the canonical values come back from the host copy
                    s.dirty = True
                    self._restore(s)
                else:
                    s.expected = []
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
        steps = [self.edge_cases, lambda: self.replay_few("before timing"), self.ordinary_f64]
        self.rng.shuffle(steps)
        for step in [self.verification] + steps:
            mm = step()
            if mm is not None:
                return mm
        return None

    def after_timing(self) -> Mismatch | None:
        steps = [lambda: self.replay_fresh("after timing"), lambda: self.replay_few("after timing")]
        self.rng.shuffle(steps)
        for step in steps:
            mm = step()
            if mm is not None:
                return mm
        return None

    # -- timed calls (the runner's checkpoints)
    def timed_before(self, s: InputSet, refresh: bool, set_index: int | None = None) -> list | None:
        """Before a checked timed call. A checked call must look like the unchecked ones around
        it, or a kernel with somewhere to keep a note (a stack or heap ghost, slack in some
        writable page) works only when it is watched: with a garbage pool (`self.pool`, the
        runner's) the outputs get one of the windows unchecked calls get (returned: the
        runner copies it) and the guard bytes are left as they are (they are still checked
        against the last snapshot); fresh guard bytes or fresh poison only on checked calls
        would be the tell."""
        if refresh:
            self.write_values(s, self.fresh_values())
            self.checks["fresh_timed"] += 1
        if self.pool is not None and set_index is not None and id(s) in self._guard_snap:
            picks = [self.rng.randrange(len(offs)) for offs in self.pool["offsets"][set_index]]
            self._poison_seed[id(s)] = ("pool", set_index, picks)
            self.sync()
            return picks
        self.prepare(s)
        return None

    def timed_after(self, s: InputSet, report: CallReport | None = None) -> Mismatch | None:
        self.sync()
        self.checks["timed_checks"] += 1
        return self.check(s, f"timed-run output ({s.name})", report)


def verify_candidate(call, sets: list[InputSet], task, reference, *, sync=None, device="cpu",
                     stats=None, reference64=None, seed=None, edge: bool = True) -> Mismatch | None:
    """Everything before and after timing, in process (tests; the worker drives a Verifier)."""
    v = Verifier(task, sets, call, reference, device=device, sync=sync, stats=stats,
                 reference64=reference64, seed=seed, edge=edge)
    return v.before_timing() or v.after_timing()
