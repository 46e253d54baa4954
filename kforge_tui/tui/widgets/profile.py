"""Operator profile table: one row per task; highlighting a row selects the task everywhere."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from kforge_tui.tui.model import TaskView

COLUMNS = (("op", "op"), ("shape", "shape"), ("dtype", "dtype"), ("calls", "calls"), ("time", "time"),
           ("share", "share"), ("status", "status"), ("eager", "vs eager"), ("compile", "vs compile"),
           ("evals", "evals"))
STATUS_STYLE = {"searching": "yellow", "done": "green", "exhausted": "cyan", "failed": "red",
                "paused": "bold magenta", "stopped": "red", "waiting": "dim"}


def _x(v: float | None) -> Text:
    if v is None:
        return Text("-", justify="right")
    return Text(f"{v:.2f}x", style="green" if v > 1.0 else "red", justify="right")


def task_cells(t: TaskView) -> dict[str, object]:
    shape = "x".join(str(s) for s in t.shape)
    return {
        "op": t.op, "shape": shape, "dtype": t.dtype.replace("float", "f").replace("bf", "bf"),
        "calls": Text(str(t.calls), justify="right"),
        "time": Text(f"{t.total_us / 1000:.2f}ms" if t.total_us else "-", justify="right"),
        "share": Text(f"{t.share:.1%}", justify="right"),
        "status": Text(t.state, style=STATUS_STYLE.get(t.state, "")),
        "eager": _x(t.best_speedup), "compile": _x(t.speedup_vs_compile),
        "evals": Text(f"{t.evaluated}/{t.budget}", justify="right"),
    }


class ProfileTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def upsert(self, t: TaskView) -> None:
        cells = task_cells(t)
        if t.task_id in self.rows:
            for key, value in cells.items():
                self.update_cell(t.task_id, key, value)
        else:
            self.add_row(*(cells[k] for k, _ in COLUMNS), key=t.task_id)

    def task_at_cursor(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
