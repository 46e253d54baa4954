"""Whole-model timing: how the end-to-end check and the keep/drop decision measure forwards.

Two clocks, reported side by side (issue 26), both alternating the compared forwards so drift in
clocks or load hits all of them alike:

  * latency: one synchronised forward at a time, wall clock (what a single request waits);
  * throughput: back-to-back forwards in blocks, each bracketed by CUDA events and never
    synchronised inside the block (what a serving loop sees, and what triton's do_bench
    measures): the host runs ahead as far as the model lets it, so a host-bound model reads
    its host time and a device-bound one its device time. On the CPU both are wall clock.

The decision uses throughput (`DECISION_CLOCK`), and a kept kernel must also not lose on a cold
cache (`cold_cache`: the caches flushed before each forward, as triton's do_bench times it;
`faster_in_model`). `do_bench` (triton, when present) of the same forwards is taken in the
report, as a cross-check of the throughput clock.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

DECISION_CLOCK = "throughput"
# Above this spread ((p90 - p10) / median) of any side, a report's forwards are timed again, up
# to NOISY_ROUNDS rounds in all; still above it, the report says the figure is noisy.
NOISY_SPREAD = 0.2
NOISY_ROUNDS = 3


def spread(xs: list[float]) -> float:
    """(p90 - p10) / median, reported next to each median so noise is visible."""
    if len(xs) < 2:
        return 0.0
    s = sorted(xs)
    p = lambda q: s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]  # noqa: E731
    m = statistics.median(s)
    return (p(0.9) - p(0.1)) / m if m else 0.0


@dataclass
class Samples:
    """Per-forward times (ms) of each compared forward, in the order they were taken."""

    clock: str
    times: dict[str, list[float]] = field(default_factory=dict)
    blocks: dict[str, list[float]] = field(default_factory=dict)  # per round: median of its block

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def spread(self, name: str) -> float:
        return spread(self.times[name])

    def summary(self) -> dict:
        return {name: {"median_ms": self.median(name), "spread": self.spread(name),
                       "n": len(self.times[name])} for name in self.times}


def _call(fn, inputs):
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        import torch

        torch.cuda.synchronize()


def _noisy(s: Samples) -> bool:
    return max(spread(v) for v in s.times.values()) > NOISY_SPREAD


def _turn(fns: dict, r: int) -> list:
    """The fns in round r's order: the compared pair (the last two: compile and kforge, current
    and trial) swap places on odd rounds, so each follows the same forwards as often. Whatever
    runs right after a switch pays for it (cold host caches, another graph's allocator pools):
    in a fixed order that cost fell on one side alone, and a forward timed against itself read
    1.07x on the throughput clock (gemma, H100 2026-12-05; do_bench 1.00x)."""
    items = list(fns.items())
    if r % 2 and len(items) >= 2:
        items[-2], items[-1] = items[-1], items[-2]
    return items


def latency(fns: dict, inputs, device_type: str, *, iters: int = 20, warmup: int = 3,
            max_rounds: int = NOISY_ROUNDS) -> Samples:
    """Wall time of one synchronised forward of each fn, alternated one by one; more rounds of
    `iters` while any side's spread is above NOISY_SPREAD (up to `max_rounds` in all)."""
    import torch

    out = Samples("latency", {k: [] for k in fns})
    with torch.inference_mode():
        for rnd in range(max_rounds):
            if rnd and not _noisy(out):
                break
            for i in range((0 if rnd else warmup) + iters):
                for name, fn in _turn(fns, i):
                    _sync(device_type)
                    t0 = time.perf_counter()
                    _call(fn, inputs)
                    _sync(device_type)
                    if rnd or i >= warmup:
                        out.times[name].append((time.perf_counter() - t0) * 1e3)
    return out


BLOCK_MS = 20.0  # a block lasts about this long: a short one measures the switch, not the model


def block_size(fns: dict, inputs, device_type: str, least: int = 2, most: int = 256) -> int:
    """Forwards per block: enough for ~BLOCK_MS of the slowest fn (at least two). After a switch between two
    compiled models the first forwards run with cold host caches (guards, wrapper code); for a
    50 us forward eight of them read twice what triton's do_bench reads (H200, 2026-12-01)."""
    import torch

    slowest = 0.0
    with torch.inference_mode():
        for fn in fns.values():
            _call(fn, inputs)
            _sync(device_type)
            t0 = time.perf_counter()
            for _ in range(3):
                _call(fn, inputs)
            _sync(device_type)
            slowest = max(slowest, (time.perf_counter() - t0) / 3 * 1e3)
    return int(min(most, max(least, math.ceil(BLOCK_MS / max(slowest, 1e-3)))))


def throughput(fns: dict, inputs, device_type: str, *, rounds: int = 12, block: int | None = None,
               warmup: int = 2, max_rounds: int = 1) -> Samples:
    """Per-forward time of each fn in blocks of back-to-back forwards (cuda events around each
    forward, one synchronisation per block), blocks alternated between fns; `block` forwards a
    block (default: block_size). With max_rounds > 1, more rounds while any side is noisy."""
    import torch

    if block is None:
        block = block_size(fns, inputs, device_type)
    out = Samples("throughput", {k: [] for k in fns}, {k: [] for k in fns})
    with torch.inference_mode():
        for r in range(warmup + rounds * max_rounds):
            if r >= warmup + rounds and (r - warmup) % rounds == 0 and not _noisy(out):
                break
            for name, fn in _turn(fns, r):
                _sync(device_type)
                if device_type == "cuda":
                    ev = [torch.cuda.Event(enable_timing=True) for _ in range(block + 1)]
                    ev[0].record()
                    for j in range(block):
                        _call(fn, inputs)
                        ev[j + 1].record()
                    ev[-1].synchronize()
                    ts = [ev[j].elapsed_time(ev[j + 1]) for j in range(block)]
                else:
                    ts, t0 = [], time.perf_counter()
                    for _ in range(block):
                        _call(fn, inputs)
                        t1 = time.perf_counter()
                        ts.append((t1 - t0) * 1e3)
                        t0 = t1
                if r >= warmup:
                    out.times[name].extend(ts)
                    out.blocks[name].append(statistics.median(ts))
    return out


def _cache_bytes(device_type: str) -> int:
    """Bytes to write between forwards so that none of the last forward's data is still cached:
    on the GPU four times its L2, at least triton's 256 MB; on the CPU a fixed 64 MB (its
    last-level cache is not read reliably: Python 3.11 has no sysconf name for it, and a VM's
    sysfs reports the host's whole L3; writing more makes every CPU decision seconds slower)."""
    if device_type != "cuda":
        return 64 << 20
    import torch

    l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or 0)
    return max(256 << 20, 4 * l2)


def flusher(device_type: str):
    """A callable that evicts the caches, as triton's do_bench does before each timed call (it
    zeroes a 256 MB buffer); on the GPU the write is queued on the stream ahead of the forward."""
    import torch

    buf = torch.empty(_cache_bytes(device_type) // 4, dtype=torch.int32,
                      device="cuda" if device_type == "cuda" else "cpu")
    return buf.zero_


def cold_cache(fns: dict, inputs, device_type: str, *, rounds: int = 12, per_round: int = 4,
               warmup: int = 1, flush=None) -> Samples:
    """Per-forward time with the caches flushed before each forward, triton do_bench's method:
    the forward alone is bracketed (CUDA events; wall clock on the CPU), each fn `per_round`
    times a round, fns alternated as in throughput() (pair swapped on odd rounds). A kernel that
    wins only on data the forward before left in L2 wins back to back and loses here: on the
    H100 (2026-12-05) a conv+mean model under CUDA graphs kept a mean kernel at +1.7 % on the
    throughput clock that do_bench read at 0.90x. `flush` replaces the cache eviction (tests)."""
    import torch

    flush = flush or flusher(device_type)
    out = Samples("cold", {k: [] for k in fns}, {k: [] for k in fns})
    with torch.inference_mode():
        for r in range(warmup + rounds):
            for name, fn in _turn(fns, r):
                ts = []
                for _ in range(per_round):
                    _sync(device_type)
                    flush()
                    if device_type == "cuda":
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        _call(fn, inputs)
                        b.record()
                        b.synchronize()
                        ts.append(a.elapsed_time(b))
                    else:
                        t0 = time.perf_counter()
                        _call(fn, inputs)
                        ts.append((time.perf_counter() - t0) * 1e3)
                if r >= warmup:
                    out.times[name].extend(ts)
                    out.blocks[name].append(statistics.median(ts))
    return out


def do_bench(fns: dict, inputs, device_type: str) -> dict | None:
    """triton.testing.do_bench median (ms) of each fn: the reference harness our throughput
    clock is checked against. None without a GPU or triton."""
    if device_type != "cuda":
        return None
    try:
        import torch
        from triton.testing import do_bench as _db
    except Exception:  # noqa: BLE001 - triton missing: no cross-check, said so in the report
        return None
    runs: dict[str, list[float]] = {k: [] for k in fns}
    with torch.inference_mode():  # twice, in opposite orders: drift over the runs hits both ends
        for order in (list(fns), list(reversed(list(fns)))):
            for name in order:
                runs[name].append(float(_db(lambda fn=fns[name]: _call(fn, inputs), warmup=50, rep=200,
                                            return_mode="median")))
    return {k: statistics.median(v) for k, v in runs.items()}


AGREE_WITHIN = 0.05  # the check's result and do_bench's may differ by this much (issue 26)


def agreement(clock: Samples, db: dict | None) -> dict | None:
    """Does the end-to-end check's result hold on triton's do_bench of the same forwards?

    The result is kforge's speedup over what it replaces (torch.compile, else eager): its
    ratio on the decision clock over its ratio on do_bench is `off`; `agrees` when that is
    within AGREE_WITHIN. Each forward's own clock median over its do_bench median is in
    `ratios` ("worst": the largest |ratio - 1|): those may differ by method alone (do_bench
    clears the L2 between forwards and runs each alone, which also gives a host-bound forward's
    launches a head start; a block runs them back to back on a warm cache), for every forward
    alike, so they are reported, not judged. None without do_bench."""
    if not db:
        return None
    ratios = {k: clock.median(k) / db[k] for k in clock.times if db.get(k) and clock.times[k]}
    if not ratios:
        return None
    out = {"ratios": ratios, "worst": max(abs(r - 1.0) for r in ratios.values()), "within": AGREE_WITHIN}
    base = next((b for b in ("compile", "eager") if b in ratios), None)
    if base is None or "kforge" not in ratios:
        return dict(out, agrees=out["worst"] <= AGREE_WITHIN)
    on_clock = clock.median(base) / clock.median("kforge")
    on_db = db[base] / db["kforge"]
    off = on_clock / on_db
    return dict(out, against=base, speedup={"clock": on_clock, "do_bench": on_db}, off=off,
                agrees=abs(off - 1.0) <= AGREE_WITHIN)


@dataclass
class Verdict:
    """Is `trial` faster than `current`, beyond the noise of these measurements?"""

    faster: bool
    ratio: float  # median over rounds of current / trial (> 1: trial is faster)
    wins: int  # rounds in which trial was faster
    rounds: int
    why: str
    cold: float | None = None  # the same ratio with the caches flushed before each forward


MIN_GAIN = 0.005  # below half a percent a kernel is not worth a custom op in the graph
MIN_T = 3.0


def compare_blocks(s: Samples, current: str, trial: str) -> Verdict:
    """Paired rounds (each round times a block of each, back to back): the trial wins when its
    median gain is over MIN_GAIN, a sign test over the rounds says it is not chance (at least
    the count a fair coin reaches with probability under 5 %) and the mean log ratio is
    MIN_T standard errors above zero (a few large wins among many losses do not pass)."""
    a, b = s.blocks.get(current) or s.times[current], s.blocks.get(trial) or s.times[trial]
    n = min(len(a), len(b))
    ratios = [a[i] / b[i] for i in range(n) if b[i] > 0]
    if not ratios:
        return Verdict(False, 1.0, 0, 0, "no paired measurement")
    wins = sum(1 for r in ratios if r > 1.0)
    med = statistics.median(ratios)
    need = _sign_test_threshold(len(ratios))
    if med - 1.0 <= MIN_GAIN:
        return Verdict(False, med, wins, len(ratios),
                       f"{(med - 1) * 100:+.1f} % on the whole forward (needs > {MIN_GAIN * 100:.1f} %)")
    if wins < need:
        return Verdict(False, med, wins, len(ratios),
                       f"{(med - 1) * 100:+.1f} % but faster in only {wins} of {len(ratios)} rounds "
                       f"(noise; needs {need})")
    logs = [math.log(r) for r in ratios]
    se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("inf")
    t = statistics.mean(logs) / se if se > 0 else float("inf")
    if t < MIN_T:
        return Verdict(False, med, wins, len(ratios),
                       f"{(med - 1) * 100:+.1f} % but within the noise of the rounds "
                       f"({t:.1f} standard errors; needs {MIN_T:g})")
    return Verdict(True, med, wins, len(ratios),
                   f"{(med - 1) * 100:+.1f} % on the whole forward, faster in {wins} of {len(ratios)} rounds")


COLD_TOLERANCE = 0.005  # with a cold cache the trial may read this much slower and still stay


def faster_in_model(current, trial, inputs, device_type: str, *, rounds: int = 12,
                    block: int | None = None, trial_first: bool = False, flush=None) -> Verdict:
    """Is the forward `trial` faster than `current`? It must win on the throughput clock
    (compare_blocks: warm caches, back to back) and not lose with the caches flushed before each
    forward (cold_cache, as triton's do_bench times it) by more than COLD_TOLERANCE. Both clocks
    are what a user may measure the model with; a kernel kept on one and slower on the other
    would make kforge slower than torch.compile for that user. A gain only in host time may
    vanish cold (the flush gives the host a head start), so cold need not show a gain."""
    fns = {"trial": trial, "current": current} if trial_first else {"current": current, "trial": trial}
    v = compare_blocks(throughput(fns, inputs, device_type, rounds=rounds, block=block), "current", "trial")
    if not v.faster:
        return v
    per = max(2, min(8, block or 4))
    c = compare_blocks(cold_cache(fns, inputs, device_type, rounds=rounds, per_round=per, flush=flush),
                       "current", "trial")
    v.cold = c.ratio
    if c.ratio < 1.0 - COLD_TOLERANCE:
        v.faster = False
        v.why = (f"{v.why}, but {(c.ratio - 1) * 100:+.1f} % with the caches flushed before each forward "
                 f"(as triton's do_bench times it; faster in {c.wins} of {c.rounds} rounds)")
    else:
        v.why = f"{v.why}; {(c.ratio - 1) * 100:+.1f} % with cold caches"
    return v


def _sign_test_threshold(n: int, alpha: float = 0.05) -> int:
    """Smallest k with P(X >= k) < alpha for X ~ Binomial(n, 1/2)."""
    from math import comb

    total = 2 ** n
    tail = 0
    for k in range(n, -1, -1):
        tail += comb(n, k)
        if tail / total >= alpha:
            return k + 1
    return n + 1
