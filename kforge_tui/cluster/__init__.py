"""Candidate evaluation past one machine: the Ray executor behind the `Evaluator` interface.

    engine ──evaluate(task, source)──▶ RayEvaluator (executor.py, in the engine's process)
      ├─ build: a Ray CPU task on an accepted node (actor.build_task): static check, compile,
      │         binary check — sandbox.pool.build_candidate, the local pool's own code
      └─ run:   one EvalActor per GPU (cpu: one per node), pinned to its node, hosting a
                one-worker EvaluatorPool: the same supervisor and fresh runner per candidate as
                a local run; neither the engine nor the actor's process loads candidate code

Source and built libraries go out, results come back, through Ray's object store; a task's
captured tensors are put there once and written to each node's private run directory when a
slot first sees the task (no shared filesystem). Every slot's device facts (facts.py) are
checked against the run's before it may time anything, and a candidate with its eager and
torch.compile baselines is always timed by one slot. An actor or node that dies puts its
candidate back in the queue; the engine sees one result per candidate, so nothing is lost or
charged twice. This module imports no Ray: `kforge --help` and local runs never need it.
"""
from __future__ import annotations

import os

from kforge_tui.errors import UsageError

LOCAL = "local"


def parse_cluster(value: str | None) -> str | None:
    """`--cluster` / `cluster =` → None (evaluate here), "ray" (RAY_ADDRESS, else the Ray
    instance `ray start` runs on this machine) or "ray://HOST:PORT" (Ray Client)."""
    v = (value or "").strip()
    if v in ("", LOCAL):
        return None
    if v == "ray":
        return v
    if v.startswith("ray://"):
        host, _, port = v[len("ray://"):].rpartition(":")
        if host and port.isdigit():
            return v
    raise UsageError(f"--cluster must be local, ray or ray://HOST:PORT, not {value!r}")


def connect(spec: str, device: str) -> None:
    """Reach the cluster now (one line and exit 2 when it cannot be: Ray missing, no answer,
    no node with a GPU for --device cuda), before a run directory or a screen exists."""
    from kforge_tui.cluster.executor import connect_ray

    connect_ray(spec, device)


def make_evaluator(spec: str, device: str, **kwargs):
    """A RayEvaluator for a parsed `--cluster` value (see executor.RayEvaluator)."""
    from kforge_tui.cluster.executor import RayEvaluator

    return RayEvaluator(spec, device, **kwargs)


def workers_text(nodes: dict[str, int]) -> str:
    """The header's words for `{node: workers}`: "2 nodes × 4 workers", "5 workers on 2 nodes (4+1)"."""
    if not nodes:
        return "no worker"
    counts = list(nodes.values())
    n = len(counts)
    if len(set(counts)) == 1:
        k = counts[0]
        return f"{n} node{'s' * (n > 1)} × {k} worker{'s' * (k > 1)}"
    return f"{sum(counts)} workers on {n} nodes ({'+'.join(str(c) for c in counts)})"


__all__ = ["LOCAL", "connect", "make_evaluator", "parse_cluster", "ray_address", "workers_text"]
