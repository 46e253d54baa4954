"""End-to-end timing: a noisy measurement is extended, and a measurement that stays noisy says so."""
from __future__ import annotations

import itertools
import time

import torch.nn as nn

from kforge_tui.integrate import e2e
from kforge_tui.summary import format_end_to_end


class _Sleeper(nn.Module):
    """A forward that takes the next duration (ms) from `pattern`, whatever the patch does."""

    def __init__(self, pattern):
        super().__init__()
        self.durations = itertools.cycle(pattern)

    def forward(self, x):
        time.sleep(next(self.durations) / 1e3)
        return x


def test_steady_forwards_are_timed_once():
    m = _Sleeper([25.0])
    t = e2e._time_alternated({"eager": m, "kforge": m}, (None,), "cpu", iters=6, warmup=1)
    eager, patched = t["eager"], t["kforge"]
    assert len(eager) == len(patched) == 6
    assert max(e2e._spread(eager), e2e._spread(patched)) <= e2e.NOISY_SPREAD


def test_noisy_forwards_are_timed_again_up_to_the_limit():
    # eager and patched alternate, so a pattern of three durations lands on both sides unevenly
    m = _Sleeper([2.0, 2.0, 12.0])
    t = e2e._time_alternated({"eager": m, "kforge": m}, (None,), "cpu", iters=6, warmup=1)
    eager, patched = t["eager"], t["kforge"]
    assert len(eager) == len(patched) > 6  # timed again ...
    assert len(eager) == 6 * e2e.NOISY_ROUNDS  # ... but not without end
    assert max(e2e._spread(eager), e2e._spread(patched)) > e2e.NOISY_SPREAD


def test_the_report_flags_a_noisy_result_and_not_a_steady_one():
    r = {"eager_ms": 8.65, "patched_ms": 6.87, "speedup": 1.26, "eager_spread": 0.47, "patched_spread": 0.60,
         "max_abs_err": 2.7e-5, "within_tolerance": True, "noisy": True, "iters": 60}
    text = format_end_to_end(r)
    assert "noisy timing even after 60 pairs" in text and "kforge apply" in text
    assert "noisy" not in format_end_to_end(dict(r, noisy=False, eager_spread=0.01, patched_spread=0.01))
