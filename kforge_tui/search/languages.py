"""Which kernel languages a run searches, and which language a candidate source is in.

A region task has one ABI language (`Task.backend`: what integration builds and what the C
header describes). A search may propose candidates in several (`languages`):

  device cuda, --backend auto (the default)  task cuda, languages triton + cuda: Inductor's own
                                             Triton kernel is node zero, then moves from it,
                                             CUDA families and generated kernels, LLM proposals
  device cuda, --backend cuda                task cuda, languages cuda
  --backend triton                           task triton, languages triton (on the CPU under
                                             Triton's interpreter: CI)
  device cpu (default, or auto)              task cpu, languages cpu

A candidate's language is read off its source (`language_of`), so a hand-edited node or an LLM
answer is routed and labelled by what it is, not by what was asked for.
"""
from __future__ import annotations

import re

from kforge_tui.errors import UsageError

LANGUAGES = ("cuda", "cpu", "triton")
_PY_ENTRY = re.compile(r"^\s*def\s+kforge_launch\s*\(", re.M)
_CUDA = re.compile(r"__global__|cudaStream_t|#\s*include\s*[<\"]cuda|cudaLaunch|<<<")


def search_plan(device: str, requested: str | None) -> tuple[str, list[str]]:
    """(the tasks' backend, the languages searched) for a device and a `--backend` value; a
    combination that cannot run is a UsageError (exit 2) with a one-line reason."""
    if device == "cuda":
        if requested in (None, "", "auto"):
            return "cuda", ["triton", "cuda"]
        if requested in ("cuda", "triton"):
            return requested, [requested]
        if requested == "cpu":
            return "cpu", ["cpu"]
    else:
        if requested in (None, "", "auto", device):
            return device, [device]
        if requested == "triton":
            return "triton", ["triton"]
        if requested == "cuda":
            raise UsageError("--backend cuda needs --device cuda (a CUDA GPU)")
    raise UsageError(f"--backend must be cuda, triton, auto or cpu, not {requested!r}")


def language_of(source: str | None, default: str) -> str:
    """"triton" for a Python source defining `def kforge_launch(...)`, "cuda" for CUDA C++,
    else `default` (a C++ source on a cpu task is "cpu"); `default` when there is no source."""
    if not source:
        return default
    if _PY_ENTRY.search(source):
        return "triton"
    if default == "cpu":
        return "cpu"
    if default == "cuda" or _CUDA.search(source):
        return "cuda"
    return "cpu"


def route(task, source: str | None, languages):
    """The task as the evaluator of this candidate's language sees it: a Triton seed in an
    `auto` run goes to the Triton workers, a CUDA family to the CUDA ones."""
    lang = language_of(source, task.backend)
    return task.with_backend(lang) if lang != task.backend and lang in languages else task


__all__ = ["LANGUAGES", "search_plan", "language_of", "route"]
