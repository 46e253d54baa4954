"""Typed messages into the UI's queue: engine events (one, or a follower's batch) and the outcome
of a steering command sent from the helper thread."""
from __future__ import annotations

from textual.message import Message

from kforge_tui.events import Event


class EngineEvent(Message):
    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class EngineBatch(Message):
    """What one poll of a followed store found (the first one replays the whole run)."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.events = events


class SteerResult(Message):
    """A command reached the run's owner (ok) or could not (text says why)."""

    def __init__(self, text: str, *, ok: bool, become_owner: bool = False) -> None:
        super().__init__()
        self.text, self.ok, self.become_owner = text, ok, become_owner
