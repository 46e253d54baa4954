"""`?` help: every binding of the main screen with its key, generated so it cannot go stale."""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", id="help.close")]

    def __init__(self, bindings: list[Binding]) -> None:
        super().__init__()
        self.bindings = bindings

    def compose(self) -> ComposeResult:
        table = Table(title="kforge keys", expand=True, show_edge=False)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("action")
        for b in self.bindings:
            table.add_row(b.key_display or b.key, b.description)
        table.add_row("ctrl+p", "command palette (every action, themes)")
        table.add_row("tab / shift+tab", "next / previous pane")
        with VerticalScroll(classes="dialog", id="help"):
            yield Static(table)
            yield Static("esc closes this help.")
