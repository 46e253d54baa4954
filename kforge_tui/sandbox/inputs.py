"""Input sets: guarded buffers in one arena, the values written into them, and edge cases.

Every input set's inputs and outputs live in one arena (shared with the runner in the worker,
sandbox/backends/arena.py) inside guard zones; the supervisor writes inputs, poison and guards
and keeps a private copy of every input buffer. Nothing the harness writes is predictable: fills
are fresh random values of the dtype (no constant sentinel), guard bytes are random, and every
tensor starts at a random 64-byte offset in its page. Fresh inputs are drawn like the captured
ones (floats Normal(mean, std) clipped to the captured range, integers uniform in it).
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from kforge_tui.regions.meta import DTYPE_BYTES, FLOAT_DTYPES, TensorMeta, TensorStats, storage_span
from kforge_tui.sandbox.judge import CHUNK, TINY, torch_dtype
from kforge_tui.sandbox.references import fresh_outputs

GUARD_BYTES = 4096  # guard zone either side of every tensor (tensors start ALIGN-aligned)
SOFTMAX_LIKE_OPS = {"exp", "exp2", "expm1", "amax", "_softmax", "softmax", "_log_softmax", "log_softmax",
                    "logsumexp", "_safe_softmax", "sigmoid"}
EDGE_KINDS = ("large", "masked", "tiny", "zeros", "equal_rows")
EDGE_TEXT = {"large": "large magnitudes +-100", "masked": "large magnitudes with -inf masks",
             "tiny": "tiny and denormal values", "zeros": "all zeros",
             "equal_rows": "rows of equal values"}


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
    if isinstance(d, (TensorStats, RealValues)):
        return d
    try:
        return TensorStats(**d)
    except TypeError:
        return None


DEFAULT_X = TensorStats(0.0, 1.0, -6.0, 6.0)


@dataclass(frozen=True)
class RealValues:
    """An integer or bool input held at a real call's values, in place of its statistics.

    Such inputs carry structure a uniform draw in [min, max] breaks: sorted, 16-aligned group
    offsets (grouped_mm), permutations, causal masks. An invalid one is at best a wrong
    reference and at worst a device-side assert that ends the worker's CUDA context. Fresh
    sets vary the float inputs and keep these (only in regions that have float inputs: a
    region of integers alone is drawn fresh, or every set would be the same call)."""

    values: torch.Tensor  # on the host
    stats: TensorStats | None = None


def holds_structure(meta: TensorMeta) -> bool:
    return meta.present and meta.dtype not in FLOAT_DTYPES


def held(task, i: int, value, stats: TensorStats | None):
    """stats[i] for input i: RealValues when input i is integer/bool, a real value is known and
    the region has float inputs to vary; else the statistics."""
    m = task.inputs[i]
    if (isinstance(value, torch.Tensor) and holds_structure(m) and value.numel() == m.numel
            and any(x.present and x.dtype in FLOAT_DTYPES for x in task.inputs)):
        return RealValues(value.detach().to("cpu").reshape(tuple(m.shape)), stats)
    return stats


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
    if isinstance(stats, RealValues):
        return stats.values.to(device=device, dtype=dt).reshape(shape).clone()
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
    if isinstance(stats, RealValues):
        t.copy_(stats.values.to(device=t.device, dtype=t.dtype).reshape(t.shape))
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
    """A keyed hash of a byte buffer computed where it lives (no copy of it): every 64-bit word
    is mixed with its position and keys drawn from `seed` (xor, multiply, xor-shift: not linear,
    so no pair of changes cancels without the keys), and the mixed words are summed, wrapping in
    64 bits. With a seed the kernel never sees, a change it makes cannot be made to keep the
    sum. Used where a region is too big for a bitwise copy (inputs in host mode, big arenas):
    the same bytes at the same place hash alike (words are cut on 8-byte addresses).
    On a GPU the mixing and the sum are one compiled kernel (a pass at memory speed; eager
    torch made ~10 passes of int64 temporaries over every chunk)."""
    return int(checksum_tensor(buf, seed)) & _U64


def checksum_tensor(buf: torch.Tensor, seed: int) -> torch.Tensor:
    """`checksum` as a 0-dim int64 tensor on the buffer's device, its value congruent modulo
    2**64, computed without waiting for the device: a caller hashing many pieces (ArenaWatch's
    blocks) reads them all in one transfer instead of one synchronised read per chunk."""
    rng = random.Random(seed)
    k1, k2, k3 = (rng.getrandbits(63) | 1 for _ in range(3))
    n = buf.numel()
    lead = min(n, (-buf.storage_offset()) % 8) if buf.is_contiguous() else n
    body = (n - lead) // 8 * 8
    acc = torch.zeros((), dtype=torch.int64, device=buf.device)
    if body:
        words = buf[lead:lead + body].view(torch.int64)
        for lo in range(0, words.numel(), CHUNK):
            acc = acc + _mixed_sum(words[lo:lo + CHUNK], lo, k1, k2, k3)
    rest = torch.cat([buf[:lead], buf[lead + body:]]) if lead or lead + body < n else None
    if rest is not None and rest.numel():  # the unaligned bytes, each a word of its own
        acc = acc + _mixed_sum(rest.to(torch.int64), (1 << 62) + lead, k1, k2, k3)
    return acc


_U64 = (1 << 64) - 1


def _mix(w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    idx = torch.arange(w.numel(), device=w.device, dtype=torch.int64) + keys[0]
    h = (w ^ (idx * keys[1])) * keys[2]
    h = (h ^ (h >> 31)) * keys[3]
    return (h ^ (h >> 29)).sum()


_MIX_COMPILED: dict = {}
# Words from which a cpu hash is worth Inductor's compile (4.5 s with its disk cache warm, 13 s
# cold, once per process): a compiled pass ran 0.52 s/GiB against eager's 6.8 on the 2-core CI
# box (2026-12-07, same sums), and a big arena's checks hash every byte on every checked call.
CPU_COMPILE_MIN_WORDS = 1 << 20


def _mix_fn(device_type: str):
    """`_mix` compiled for this device type, once per process; eager `_mix` where Inductor is
    unavailable (no compiler). The two give the same sums (int64 arithmetic wraps alike), so
    a digest taken before a fallback still compares with one taken after."""
    fn = _MIX_COMPILED.get(device_type)
    if fn is None:
        fn = _MIX_COMPILED[device_type] = torch.compile(_mix, dynamic=True, fullgraph=True)
    return fn


def warm_checksum(device) -> bool:
    """Compile the hash for `device` now (a task's prepare, outside any candidate's deadline);
    True when checks will use the compiled pass, False when they fall back to eager passes
    (the pool then gives a hashed arena's candidates the eager rate's deadline)."""
    kind = torch.device(device).type
    _mixed_sum(torch.zeros(CPU_COMPILE_MIN_WORDS, dtype=torch.int64, device=device), 0, 1, 1, 1)
    return _MIX_COMPILED.get(kind) not in (None, _mix)


def _mixed_sum(w: torch.Tensor, base: int, k1: int, k2: int, k3: int) -> torch.Tensor:
    """The mixed words' sum, a 0-dim int64 tensor on w's device (int64 sums wrap: the value is
    the hash modulo 2**64). The position base and the keys go over in one asynchronous copy:
    four `torch.tensor(..., device=)` made four synchronised copies for every 64 MiB chunk.
    On a GPU, and on the cpu for a piece of CPU_COMPILE_MIN_WORDS or more, the mix and the sum
    are one compiled pass (eager torch makes ~10 passes of int64 temporaries)."""
    keys = torch.tensor([_signed(v) for v in (base, k1, k2, k3)], dtype=torch.int64)
    if w.device.type != "cpu":
        keys = keys.to(w.device, non_blocking=True)  # pageable source: safe to reuse on return
    kind = w.device.type
    if kind == "cuda" or (kind == "cpu" and w.numel() >= CPU_COMPILE_MIN_WORDS):
        try:
            return _mix_fn(kind)(w, keys)
        except Exception:  # noqa: BLE001 - Inductor unavailable: the same sum, eagerly, from now on
            _MIX_COMPILED[kind] = _mix
    return _mix(w, keys)


def _signed(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


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
    """Random bytes over t (uint8), drawn 8 at a time where t allows (5x faster than a byte at
    a time on the cpu: a whole-arena scrub of 8 MiB took 26 ms)."""
    n = t.numel()
    if not n:
        return
    lead = (-t.storage_offset()) % 8 if t.is_contiguous() else n
    lead = min(lead, n)
    body = (n - lead) // 8 * 8
    if body:
        t[lead:lead + body].view(torch.int64).random_(-2**63, 2**63 - 1, generator=gen)
    for a, b in ((0, lead), (lead + body, n)):
        if b > a:
            t[a:b].random_(0, 256, generator=gen)


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


def scrub(arena: torch.Tensor, gen: torch.Generator) -> None:
    """Random bytes over the whole arena, in pieces (no temporary of its size)."""
    for a in range(0, arena.numel(), CHUNK):
        fill_bytes(arena[a:a + CHUNK], gen)


def place(s: "InputSet", arena_bytes: int, rng: random.Random) -> tuple[list, list]:
    """New slots for one call's tensors anywhere in the arena: a random order, random gaps
    (multiples of ALIGN, like blocks of a caching allocator), no overlap. A kernel that tells the
    harness from a real forward by the distance between its buffers finds a new one every call."""
    items = [("i", j, g.slot) for j, g in enumerate(s.inputs) if g is not None] + \
            [("o", j, g.slot) for j, g in enumerate(s.outputs)]
    sizes = [_align(x[2].total, ALIGN) for x in items]
    free = (arena_bytes - sum(sizes)) // ALIGN
    if free < 0:
        raise ValueError("the arena cannot hold one call's tensors")
    rng.shuffle(order := list(range(len(items))))
    cuts = sorted(rng.randint(0, free) for _ in items)
    gaps = [b - a for a, b in zip([0] + cuts[:-1], cuts)]
    ins: list = [None] * len(s.inputs)
    outs: list = [None] * len(s.outputs)
    at = 0
    for gap, k in zip(gaps, order):
        kind, j, slot = items[k]
        at += gap * ALIGN
        new = Slot(at, slot.span, slot.shape, slot.stride, slot.dtype)
        (ins if kind == "i" else outs)[j] = new
        at += sizes[k]
    return ins, outs


def relocate(s: "InputSet", arena: torch.Tensor, ins: list, outs: list) -> None:
    """Point s's tensors at new slots of the arena (both processes do this with the same slots)."""
    s.inputs = [Guarded(arena, x) if x is not None else None for x in ins]
    s.outputs = [Guarded(arena, x) for x in outs]


class FreshBank:
    """Fresh input values for timed calls with their references, made once per task and reused
    by every candidate of it (issue 20): a timed call then costs a copy instead of a draw and a
    PyTorch run of the region.

    Why this keeps "every timed call gets inputs it has not seen": each candidate is a fresh
    process that takes the entries in its own random order and each at most once (past the
    last one it gets values drawn on the spot, kept for the next candidates while there is
    room); the entries live in the supervisor's memory, never in the arena outside the one
    call that uses them, and a runner keeps nothing from one candidate to the next (fresh
    process, system-call filter, the arena scrubbed after every timing loop). What one
    candidate saw, no later one can know."""

    def __init__(self, capacity: int):
        self.capacity = max(0, int(capacity))
        self.entries: list[tuple[list, list]] = []  # (input values, expected outputs)

    def add(self, values: list, expected: list) -> None:
        if len(self.entries) < self.capacity:
            self.entries.append((values, expected))

    def clear(self) -> None:
        self.entries = []


class ArenaWatch:
    """The whole arena, not only the guard zones, must be as the harness left it after a call,
    except the call's output data: a value kept in the slack between one tensor's tail guard
    and the next one's head guard (issue 21) is a change here.

    Arenas up to COPY_LIMIT bytes are compared bitwise, as 64-bit words, with an image of what
    the harness left there. The image is kept up to date, not copied whole before every call:
    the harness says which ranges it wrote (`touch`, `touch_all`), those are copied into the
    image before the call, and after the call the call's output data is copied in before one
    compare of the whole arena (so the outputs are the only bytes the call may change, and
    the image then holds them). A write the harness forgot to `touch` can only make an honest
    call fail, never let a dishonest one through: the compare is always of every byte.

    Larger arenas are compared with a keyed hash (`checksum`) of every byte outside the
    outputs, kept per block of HASH_BLOCK bytes: before a call only the blocks the harness
    wrote or the outputs (old or new) overlap are hashed again, after it every block is."""

    COPY_LIMIT = 256 << 20
    HASH_BLOCK = 64 << 20

    def __init__(self, arena: torch.Tensor, seed: int, image: torch.Tensor | None = None):
        self.arena = arena
        self.seed = seed
        self.copy = arena.numel() <= self.COPY_LIMIT
        n = arena.numel()
        self.image: torch.Tensor | None = None
        if self.copy and image is not None and image.numel() == n and image.device == arena.device:
            self.image = image  # a buffer kept by the caller across candidates (contents unused)
        self.skip: list = []
        self._dirty: list | None = None  # None: everything (the image holds nothing yet)
        self._blocks: dict[int, int] = {}  # hash mode: block index -> digest under `skip`
        self._hash_skip: list = []
        self.armed = False
        self.spent: dict = {}  # "arena_watch": seconds in snapshot and changed (the Verifier's checks)

    # -- what the harness wrote
    def touch(self, *guarded) -> None:
        """The harness wrote these guarded buffers (a whole base: guards and data)."""
        if self._dirty is None:
            return
        for g in guarded:
            if g is not None:
                self._dirty.append((g.slot.offset, g.slot.offset + g.slot.total))

    def touch_set(self, s) -> None:
        self.touch(*s.inputs, *s.outputs)

    def touch_all(self) -> None:
        self._dirty = None

    # -- around one call
    def snapshot(self, outputs: list) -> None:
        """Before a call whose outputs are `outputs`: the image (or the block digests) brought
        up to date with what the harness wrote."""
        t0 = time.perf_counter()
        try:
            self._snapshot(outputs)
        finally:
            self.spent["arena_watch"] = self.spent.get("arena_watch", 0.0) + time.perf_counter() - t0

    def _snapshot(self, outputs: list) -> None:
        skip = _merge([(o.slot.offset + GUARD_BYTES, o.slot.offset + GUARD_BYTES + o.slot.span)
                       for o in outputs])
        if self.copy:
            if self.image is None:
                self.image = torch.empty_like(self.arena)
                self._dirty = None
            if self._dirty is None:
                self.image.copy_(self.arena)
            else:
                for a, b in _merge(self._dirty):
                    self.image[a:b].copy_(self.arena[a:b])
        else:
            stale = None if self._dirty is None else _merge(self._dirty + self.skip + skip)
            self.skip = skip
            self._rehash(stale)
        self.skip = skip
        self._dirty = []
        self.armed = True

    def changed(self) -> bool:
        """After the call: did any byte outside its output data change?"""
        t0 = time.perf_counter()
        try:
            return self._changed()
        finally:
            self.spent["arena_watch"] = self.spent.get("arena_watch", 0.0) + time.perf_counter() - t0

    def _changed(self) -> bool:
        if not self.armed:
            raise RuntimeError("ArenaWatch.changed() without a snapshot before the call")
        self.armed = False
        if self.copy:
            for a, b in self.skip:  # the call's to write; the image holds them from now on
                self.image[a:b].copy_(self.arena[a:b])
            return not _equal_words(self.arena, self.image)
        before = dict(self._blocks)
        self._rehash(None)
        return self._blocks != before

    # -- hash mode
    def _rehash(self, stale: list | None) -> None:
        n = self.arena.numel()
        nb = (n + self.HASH_BLOCK - 1) // self.HASH_BLOCK
        pending: dict[int, torch.Tensor] = {}
        for k in range(nb):
            lo, hi = k * self.HASH_BLOCK, min(n, (k + 1) * self.HASH_BLOCK)
            if stale is not None and k in self._blocks and not any(a < hi and b > lo for a, b in stale):
                continue
            acc = torch.zeros((), dtype=torch.int64, device=self.arena.device)
            at = lo
            for a, b in self.skip:
                if b <= at or a >= hi:
                    continue
                if a > at:
                    acc = acc + checksum_tensor(self.arena[at:a], self.seed + at)
                at = max(at, b)
            if at < hi:
                acc = acc + checksum_tensor(self.arena[at:hi], self.seed + at)
            pending[k] = acc
        if pending:  # one read of every block's digest (a 14 GiB arena has 224 blocks)
            for k, v in zip(pending, torch.stack(list(pending.values())).tolist()):
                self._blocks[k] = v & _U64


def _merge(ranges: list) -> list:
    """Sorted, disjoint byte ranges covering `ranges`."""
    out: list = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def _equal_words(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two byte buffers, compared as 64-bit words (a uint8 compare is ~6x
    slower on the cpu) with the tail bytes apart."""
    n = a.numel()
    if a.storage_offset() % 8 or b.storage_offset() % 8 or not (a.is_contiguous() and b.is_contiguous()):
        return torch.equal(a, b)
    n8 = n // 8 * 8
    if n8 and not torch.equal(a[:n8].view(torch.int64), b[:n8].view(torch.int64)):
        return False
    return n8 == n or torch.equal(a[n8:], b[n8:])


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


def summarised_stats(task, run_dir, task_id: str) -> list | None:
    """Value statistics of the real calls the capture kept only as statistics (over its cap:
    workload/capture.py writes them to summarised.json), for a task with no captured call."""
    import json

    from kforge_tui.regions.task import capture_dir

    try:
        first = json.loads((capture_dir(run_dir, task_id) / "summarised.json").read_text())[0]
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None
    st = list(first.get("stats") or [])
    vals = list(first.get("values") or [])
    out = []
    for i, m in enumerate(task.inputs):
        v = vals[i] if i < len(vals) else None
        if v is not None and holds_structure(m):
            v = torch.tensor(v, dtype=torch_dtype(m.dtype))
        out.append(held(task, i, v, _stats_of(st[i]) if i < len(st) else None))
    return out


def _captured_stats(task, calls: list[dict]) -> list:
    if not calls:
        return [None] * len(task.inputs)
    st = list(calls[0].get("stats") or [])
    out = [(_stats_of(st[i]) if i < len(st) else None) for i in range(len(task.inputs))]
    real = _captured_inputs(task, calls[0])
    # stats missing but a tensor present: derive them
    for i, (m, s) in enumerate(zip(task.inputs, out)):
        if s is None and m.present:
            v = real[i]
            if isinstance(v, torch.Tensor) and v.numel():
                out[i] = TensorStats.of(v)
    return [held(task, i, real[i], s) for i, s in enumerate(out)]


def build_sets(task, calls: list[dict], n_random: int, device, seed: int,
               reference: Callable[[list], list], *, min_sets: int = 0, max_sets: int | None = None,
               alloc: Callable[[int], torch.Tensor] | None = None,
               account: Callable[[int], None] | None = None,
               host_saved: bool = False, stats: list | None = None) -> tuple[list[InputSet], str, torch.Tensor]:
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
    scrub(arena, gen)  # every byte random, the slack between slots too: nothing there to read
    summarised = not calls and stats is not None and any(x is not None for x in stats)
    stats = stats if stats is not None else _captured_stats(task, calls)
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
            if n_cap else f"no captured calls (over the capture cap): {n_random} random draws matched to the "
                          f"real calls' value statistics" if summarised else
            f"no captured calls: {n_random} random draws (floats N(0,1) clipped to [-6, 6], "
            f"integers 0..1, bool random)")
    if n_random and any(isinstance(x, RealValues) for x in stats):
        note += "; integer inputs held at a real call's values (offsets and indices keep their structure)"
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
    floating inputs get the edge values; integer and bool inputs are drawn as usual (held at a
    real call's values where known: indices and offsets must stay valid)."""
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


