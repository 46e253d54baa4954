"""Edit a node's kernel in place; ctrl+s submits it as a hand-written child of that node.

It opens at the line the compiler (or static check) blamed, since that is what gets fixed, and
ctrl+g jumps to any line.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, TextArea

from kforge_tui.tui.screens.dialogs import PromptScreen
from kforge_tui.tui.ts_cuda import register_cuda


class EditorScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("ctrl+s", "submit", "Submit for evaluation", id="editor-submit", priority=True),
                Binding("ctrl+g", "goto_line", "Go to line", id="editor-goto-line", priority=True),
                Binding("escape", "cancel", "Cancel", id="editor-cancel")]

    def __init__(self, source: str, title: str, backend: str | None, line: int | None = None) -> None:
        super().__init__()
        self.source, self.title_text, self.backend, self.line = source, title, backend, line

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
        if self.line:
            self.goto(self.line)

    def goto(self, line: int) -> None:
        """Put the cursor at the start of 1-based `line` (clamped) and scroll it into the middle."""
        area = self.query_one(TextArea)
        row = min(max(line, 1), area.document.line_count) - 1
        area.move_cursor((row, 0), center=True)

    def action_goto_line(self) -> None:
        def done(value: str | None) -> None:
            if value is not None and value.strip().isdigit():
                self.goto(int(value.strip()))
            elif value is not None:
                self.notify(f"not a line number: {value!r}", severity="warning")

        row = self.query_one(TextArea).cursor_location[0] + 1
        self.app.push_screen(PromptScreen("Go to line:", str(row)), done)

    def action_submit(self) -> None:
        text = self.query_one(TextArea).text
        self.dismiss(text if text.strip() else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
