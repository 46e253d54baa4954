"""Timing: small, explicit, KernelBench-like code that is hard to fool.

One loop for both backends (the backend object supplies the clock, the cache flush and the
synchronisation):

    for each call: poison the output -> flush the cache -> start -> call -> end marker
                   (on selected calls) wait for the end marker and verify the output

  * only the checked calls wait: the others leave their markers to be read at the end, so the
    host runs ahead of the device as it does in a real forward and a callable's Python launch
    cost (ctypes, a Triton launcher, dynamo guards) overlaps the previous call instead of
    showing up as idle device time inside the timed region (what do_bench measures too);
  * inputs rotate among >= 4 input sets with distinct buffers, so no call finds its inputs or
    its output cache-hot from the previous call;
  * the output of timed calls is checked (first and last rotation, plus random calls chosen
    by the harness's own RNG), so work moved to another stream or thread - an empty timed
    region - is caught as unfinished output rather than celebrated;
  * the eager reference is timed by the same loop in the same worker;
  * a median below the memory-roofline floor (bytes moved / measured bandwidth) is impossible.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Callable

from kforge_tui.sandbox.result import Mismatch, Timing
from kforge_tui.sandbox.verify import SENTINEL, CandidateError, InputSet, check_run, prepare_run

# 2% slack below the floor before calling a time impossible: bandwidth is measured once (a
# run-to-run spread of ~1% on a quiet GPU) and event timing has ~0.5 us of resolution noise.
FLOOR_SLACK = 0.02

DEFAULT_TIMING = {
    "warmup": 3,  # calls not counted (first-touch, lazy loading, clocks)
    "min_iters": 10,
    "max_iters": 100,
    "budget_s": 0.4,  # target seconds of timed calls per callable (flushes not counted)
    "random_checks": 0.1,  # share of timed calls whose output is verified besides the fixed ones
}


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarise(samples: list[float], method: str) -> Timing:
    return Timing(median_us=statistics.median(samples), p10_us=_percentile(samples, 0.1),
                  p90_us=_percentile(samples, 0.9), min_us=min(samples), n=len(samples), method=method)


def time_calls(backend, call: Callable[[InputSet], object], sets: list[InputSet], cfg: dict | None = None,
               *, check_dtype: str | None = None, seed: int | None = None) -> tuple[Timing, Mismatch | None]:
    """Time `call` rotating over `sets`; verify chosen outputs when `check_dtype` is given.

    `call(s)` for a candidate writes s.out and returns its int return code (non-zero raises
    CandidateError); for the eager reference it returns the new tensor (not checked here).
    Returns the timing and the first mismatch found in a checked timed output (or None).
    """
    cfg = {**DEFAULT_TIMING, **(cfg or {})}
    rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
    k = len(sets)
    checked = check_dtype is not None

    def one(i: int, check: bool, wait: bool = False) -> tuple[object, Mismatch | None]:
        """One call; returns its end token (read with backend.elapsed) and a checked mismatch."""
        s = sets[i % k]
        if checked:
            prepare_run(s, SENTINEL)
        backend.flush()
        tok = backend.start()
        rc = call(s)
        tok = backend.end(tok)
        if checked and isinstance(rc, int) and rc != 0:
            raise CandidateError(f"kforge_launch returned {rc} during timing on {s.name}")
        if check or wait:
            # elapsed() waits for the end marker on the harness stream only: unfinished work
            # elsewhere shows as surviving poison here.
            backend.elapsed(tok)
            if check:
                return tok, check_run(s, check_dtype, SENTINEL, f"timed-run output ({s.name})")
        return tok, None

    t0 = time.perf_counter()
    for i in range(cfg["warmup"]):
        _, mm = one(i, checked, wait=True)
        if mm:
            return summarise([1.0], "aborted"), mm
    per_call = (time.perf_counter() - t0) / max(cfg["warmup"], 1)
    kernel_s = max(per_call, 1e-6)
    n = int(min(cfg["max_iters"], max(cfg["min_iters"], cfg["budget_s"] / kernel_s)))
    n = max(n, 2 * k)
    marks: list = []  # end tokens, read once the loop is done (only checked calls waited)
    for i in range(n):
        check = checked and (i < k or i >= n - k or rng.random() < cfg["random_checks"])
        tok, mm = one(i, check)
        marks.append(tok)
        if mm:
            return summarise([backend.elapsed(m) for m in marks], backend.timing_method(k)), mm
    return summarise([backend.elapsed(m) for m in marks], backend.timing_method(k)), None


# ------------------------------------------------------------------------ roofline floor

def load_bandwidth(cache_dir: str | Path, key: str) -> dict | None:
    p = Path(cache_dir) / "bandwidth.json"
    try:
        return json.loads(p.read_text()).get(key)
    except (OSError, ValueError):
        return None


def store_bandwidth(cache_dir: str | Path, key: str, entry: dict) -> None:
    """Merge one device's figure into cache_dir/bandwidth.json (atomic rename: workers race)."""
    p = Path(cache_dir) / "bandwidth.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = entry
    tmp = p.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, p)


def bandwidth(backend, cache_dir: str | Path) -> dict:
    """{"gbs": float, "note": str}: measured once per device, then read from the cache."""
    key = backend.bandwidth_key()
    got = load_bandwidth(cache_dir, key)
    if got and got.get("gbs", 0) > 0:
        return got
    gbs, note = backend.measure_bandwidth()
    entry = {"gbs": gbs, "note": note, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    store_bandwidth(cache_dir, key, entry)
    return entry


def floor_us(bytes_moved: int, gbs: float) -> float:
    return bytes_moved / (gbs * 1e9) * 1e6 if gbs > 0 else 0.0


def below_floor(median_us: float, floor: float | None) -> bool:
    return bool(floor) and median_us < floor * (1.0 - FLOOR_SLACK)
