"""Command palette (ctrl+p): every key action of the main screen, plus live theme switching."""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


class KforgeCommands(Provider):
    def _commands(self):
        app = self.app
        for b in app.ACTION_BINDINGS:
            yield (f"{b.description} ({b.key_display or b.key})", partial(app.run_action, b.action), b.description)
        for name in app.THEME_NAMES:
            yield (f"Theme: {name}", partial(setattr, app, "theme", name), f"switch the colours to {name}")

    async def discover(self) -> Hits:
        for title, cb, help_text in self._commands():
            yield DiscoveryHit(title, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, cb, help_text in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), cb, help=help_text)
