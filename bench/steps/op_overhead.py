"""op-overhead: what a kforge region op costs around an empty kernel, against an Inductor Triton
kernel launch, in calls per second (issue 26: the host time per op call decides host-bound models
such as ResNet-50 compiled).

Not yet written: the lead writes this step for issue 26; this module is its place in the
registry (bench/steps/__init__.py).
"""
from __future__ import annotations

from bench.report import StepError

HELP = "calls/s of a kforge region op around an empty kernel vs an Inductor Triton launch (issue 26)"


def run(ctx):
    raise StepError("not yet written (issue 26 writes bench/steps/op_overhead.py)", 2)
