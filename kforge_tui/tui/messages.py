"""Textual message wrapping one engine event, so events enter the UI through its message queue."""
from __future__ import annotations

from textual.message import Message

from kforge_tui.events import Event


class EngineEvent(Message):
    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event
