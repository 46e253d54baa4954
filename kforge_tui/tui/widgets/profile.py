"""Operator profile table: one row per task; highlighting a row selects the task everywhere.

Columns are sized to the pane: the status column is as wide as its longest word (never
`searchi`), shapes are never cut (same-named ops differ by them), and what does not fit goes,
least needed first (the profile's total and calls, then dtype and share; `vs compile` only shows
when an op has a torch.compile reference). `eager` is the task's pooled reference, `best` the ★ node's time,
`vs eager` the one over the other.
"""
from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from kforge_tui.summary import fmt_us
from kforge_tui.tui.model import TaskView

STATES = ("waiting", "searching", "paused", "stopping", "stopped", "done", "exhausted", "failed",
          "interrupted")
# key, header, fixed width (None: the widest cell), dropped in this order when the pane is narrow
# (times are 8 wide by the unit rule: "9999.9µs", "101.06ms"), so a growing figure never re-lays out
COLUMNS = (("op", "op", None), ("shape", "shape", None), ("dtype", "dtype", 5),
           ("calls", "calls", 5), ("total", "total", 8), ("share", "share", 6),
           ("status", "status", max(map(len, STATES))), ("eager", "eager", 8), ("best", "best", 8),
           ("x", "vs eager", 8), ("xc", "vs compile", 10), ("evals", "evals", None))
DROP = ("total", "calls", "dtype", "share", "xc")
STATUS_STYLE = {"searching": "yellow", "done": "green", "exhausted": "cyan", "failed": "red",
                "paused": "bold magenta", "stopped": "red", "stopping": "bold red", "waiting": "dim",
                "interrupted": "bold red"}
OP_MIN = 10


def _x(v: float | None) -> Text:
    if v is None:
        return Text("-", justify="right")
    return Text(f"{v:.2f}x", style="green" if v > 1.0 else "red", justify="right")


def task_cells(t: TaskView) -> dict[str, object]:
    shape = "x".join(str(s) for s in t.shape)
    return {
        "op": t.op, "shape": shape, "dtype": t.dtype.replace("float", "f").replace("bf", "bf"),
        "calls": Text(str(t.calls), justify="right"),
        "total": Text(fmt_us(t.total_us, compact=True) if t.total_us else "-", justify="right"),
        "share": Text(f"{t.share:.1%}", justify="right"),
        "status": Text(t.state, style=STATUS_STYLE.get(t.state, "")),
        "eager": Text(fmt_us(t.eager_us, compact=True), justify="right"),
        "best": Text(fmt_us(t.best_us, compact=True) if t.best_us else "-", justify="right"),
        "x": _x(t.best_speedup), "xc": _x(t.speedup_vs_compile),
        "evals": Text(f"{t.evaluated}/{t.budget}", justify="right"),
    }


def fit_columns(tasks: list[TaskView], width: int) -> tuple[list[str], dict[str, int]]:
    """Which columns show in `width` cells, and how wide each is."""
    cells = [task_cells(t) for t in tasks]
    widths: dict[str, int] = {}
    for key, head, fixed in COLUMNS:
        widths[key] = fixed or max([len(head), *(len(str(c[key])) for c in cells)])
    keys = [k for k, _, _ in COLUMNS]
    if not any(t.compiled_us for t in tasks):
        keys.remove("xc")  # a CPU run has no torch.compile reference: a column of dashes
    pad = 2  # DataTable's cell padding, one on each side

    def total():
        return sum(widths[k] + pad for k in keys)

    for k in DROP:
        if total() <= width:
            break
        if k in keys:
            keys.remove(k)
    if total() > width:
        widths["op"] = max(OP_MIN, widths["op"] - (total() - width))
    return keys, {k: widths[k] for k in keys}


class ProfileTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self._keys: list[str] = []
        self._widths: dict[str, int] = {}
        self._tasks: dict[str, TaskView] = {}
        self.layout_for(100)

    def layout_for(self, width: int | None = None) -> None:
        """Choose the columns for the pane's width; rebuild the table only when they change."""
        width = width or self.size.width or 100
        keys, widths = fit_columns(list(self._tasks.values()), width - 2)
        if keys == self._keys and widths == self._widths:
            return
        cursor = self.cursor_row if self.row_count else 0
        self.clear(columns=True)
        self._keys, self._widths = keys, widths
        head = dict((k, h) for k, h, _ in COLUMNS)
        for k in keys:
            self.add_column(head[k], key=k, width=widths[k])
        for t in self._tasks.values():
            self._add(t)
        if self.row_count:
            self.move_cursor(row=min(cursor, self.row_count - 1))

    def on_resize(self) -> None:
        self.layout_for()

    def _add(self, t: TaskView) -> None:
        cells = task_cells(t)
        self.add_row(*(self._fit(k, cells[k]) for k in self._keys), key=t.task_id)

    def _fit(self, key: str, value):
        w = self._widths.get(key, 0)
        if isinstance(value, str) and len(value) > w:
            return value[:max(w - 1, 0)] + "…"
        return value

    def upsert(self, t: TaskView) -> None:
        self._tasks[t.task_id] = t
        keys, widths = fit_columns(list(self._tasks.values()), (self.size.width or 100) - 2)
        if keys != self._keys or widths != self._widths:
            self.layout_for()
            return
        cells = task_cells(t)
        if t.task_id in self.rows:
            for key in self._keys:
                self.update_cell(t.task_id, key, self._fit(key, cells[key]))
        else:
            self._add(t)

    def task_at_cursor(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
