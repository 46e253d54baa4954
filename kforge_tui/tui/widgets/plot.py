"""Progress plot: best speedup of the selected task after each evaluated candidate."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Sparkline


class ProgressPlot(Horizontal):
    def compose(self) -> ComposeResult:
        yield Label("best x", id="plot-label")
        yield Sparkline([], id="plot-spark")

    def show(self, history: list[float], best: float | None) -> None:
        self.query_one("#plot-label", Label).update(
            f"best {best:.2f}x " if best else "best -    ")
        self.query_one("#plot-spark", Sparkline).data = list(history) or [0.0]
