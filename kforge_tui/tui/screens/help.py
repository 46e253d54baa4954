"""`?` help: every binding of the main screen with its key and id, generated so it cannot go stale.

The id is what the `[keymap]` table of the config file rebinds (Textual's keymap by binding id).
"""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

EXTRA = (("ctrl+p", "command palette (every action, themes, log tabs)", ""),
         ("tab / shift+tab", "next / previous pane", ""),
         ("enter / space", "tree: open the node / fold its children", ""),
         ("ctrl+s / ctrl+g / f7", "editor: submit / go to line / select all", "editor-submit, editor-goto-line"))


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", id="help-close")]

    def __init__(self, bindings: list[Binding], keys: dict[str, str] | None = None) -> None:
        super().__init__()
        self.bindings = bindings
        self.keys = keys or {}  # binding id -> the key(s) in effect (after the user's keymap)

    def compose(self) -> ComposeResult:
        table = Table(title="kforge keys", expand=True, show_edge=False)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("action")
        table.add_column("id (config [keymap])", style="dim", no_wrap=True)
        for b in self.bindings:
            table.add_row(self.keys.get(b.id) or b.key_display or b.key, b.description, b.id or "")
        for row in EXTRA:
            table.add_row(*row)
        with VerticalScroll(classes="dialog", id="help"):
            yield Static(table)
            yield Static("esc closes this help.")
