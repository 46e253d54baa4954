"""Edit a node's kernel in place; ctrl+s submits it as a hand-written child of that node."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, TextArea

from kforge_tui.tui.ts_cuda import register_cuda


class EditorScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("ctrl+s", "submit", "Submit for evaluation", id="editor.submit", priority=True),
                Binding("escape", "cancel", "Cancel", id="editor.cancel")]

    def __init__(self, source: str, title: str, backend: str | None) -> None:
        super().__init__()
        self.source, self.title_text, self.backend = source, title, backend

    def compose(self) -> ComposeResult:
        with Vertical(id="editor"):
            yield Label(self.title_text, id="editor-title")
            area = TextArea.code_editor(self.source, id="editor-area", soft_wrap=False)
            lang = register_cuda(area)
            if lang:
                area.language = lang
            yield area
            yield Footer()

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def action_submit(self) -> None:
        text = self.query_one(TextArea).text
        self.dismiss(text if text.strip() else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
