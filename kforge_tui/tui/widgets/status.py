"""Header / status line: what runs where, which phase and for how long, how fast, and what the LLM
has cost so far. When the run's process is gone it says so, and how to continue."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kforge_tui.cluster import workers_text
from kforge_tui.tui.model import RunModel


def fmt_elapsed(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class StatusBar(Static):
    """Two lines; re-rendered from the model (cheap) once per batch and once a second."""

    def show(self, m: RunModel, now: float | None = None) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("kforge ", style="bold")
        t.append(m.model or "(waiting for the run)", style="bold")
        # the proposer before the device: a long CPU name is what gets cut at 100 columns
        t.append("  proposer ")
        # the built-in proposer calls itself "builtin" in the store; the header says it in words
        t.append({"builtin": "built-in"}.get(m.proposer, m.proposer) or "?", style="bold")
        t.append("  on ")
        t.append(f"[{m.device}] " if m.device else "")
        t.append(m.device_name or m.device or "?")
        t.append("\n")
        state = run_state(m)
        t.append(state, style=STATE_STYLE.get(state, "bold" if m.running else ""))
        if state in ("interrupted", "stopped"):  # the process is gone: what continues it, first
            t.append(f" — kforge resume {m.run_dir or 'RUN_DIR'}", style="bold")
            t.append(f"  (ran {fmt_elapsed(m.elapsed(now))}, {m.evaluated_here} candidates)")
            self.update(t)
            return
        if m.running and m.phase and state not in ("done",):
            t.append(f" {fmt_elapsed(m.phase_elapsed(now))}")  # how long this phase has taken
        t.append(f"  elapsed {fmt_elapsed(m.elapsed(now))}")
        t.append(f"  {m.per_minute(now):5.1f} cand/min")
        if m.workers:  # a Ray cluster run
            t.append(f"  {workers_text(m.workers)}")
        t.append(f"  in flight {len(m.in_flight)}")
        t.append(f"  LLM {m.prompt_tokens + m.completion_tokens:,} tok ${m.cost_usd:.4f}")
        if m.llm_failures:  # 429s and 5xx after retries: the user should see the provider struggle
            t.append(f"  {m.llm_failures} failed: {m.llm_last_error}", style="bold red")
        self.update(t)


STATE_STYLE = {"paused": "bold magenta", "done": "bold green", "finished": "bold green", "failed": "bold red",
               "interrupted": "bold red", "stopped": "bold red"}


def run_state(m: RunModel) -> str:
    """One word for the run: its phase, or paused / done (search over) / how it ended."""
    if m.finished:
        return m.end_status or "finished"
    if m.phase == "search" and m.paused:
        return "paused"
    return m.phase or "starting"
