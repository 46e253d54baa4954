"""Small modal screens: a choice between a few keys, yes/no, and a one-line prompt (budget, filter, ...)."""
from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class ChoiceScreen(ModalScreen[Any]):
    """A question answered by one key; each choice is (key, label, value). Escape dismisses with None."""

    BINDINGS = [Binding("escape", "choose('')", "Cancel", id="choice-cancel")]

    def __init__(self, question: str, choices: list[tuple[str, str, Any]]) -> None:
        super().__init__()
        self.question = question
        self.choices = {key: value for key, _, value in choices}
        self.hint = "   ".join(f"[b]{key}[/b] {label}" for key, label, _ in choices) + "   [b]esc[/b] cancel"

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Label(self.hint)

    def on_key(self, event) -> None:
        if event.key in self.choices:
            event.stop()
            self.dismiss(self.choices[event.key])

    def action_choose(self, key: str) -> None:
        self.dismiss(self.choices.get(key))


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes", id="confirm-yes"),
                Binding("n,escape", "answer(False)", "No", id="confirm-no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Label("[b]y[/b] yes   [b]n[/b] / esc no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PromptScreen(ModalScreen[str | None]):
    """Enter submits the text, escape cancels (returns None)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="prompt-cancel")]

    def __init__(self, question: str, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.question, self.value, self.placeholder = question, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Input(value=self.value, placeholder=self.placeholder, id="prompt-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
