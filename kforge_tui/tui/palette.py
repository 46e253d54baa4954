"""Command palette (ctrl+p): kforge's own commands only (the app leaves out Textual's system
commands): every key action of the main screen that applies now, each log tab, and the themes.
Each entry's help says what it does, not its name again."""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from kforge_tui.tui.screens.help import HELP
from kforge_tui.tui.widgets.logs import TABS


class KforgeCommands(Provider):
    def _commands(self):
        app = self.app
        for b in app.ACTION_BINDINGS:
            if app.check_action(b.action.split("(")[0], ()) is False:
                continue  # not in this state (Resume while nothing is paused, ...)
            key = app.keymap.get(b.id) or b.key_display or b.key
            yield (f"{b.description} ({key})", partial(app.run_action, b.action), HELP.get(b.id, ""))
        for tab_id, title in TABS:
            yield (f"Logs: {title}", partial(app.show_log_tab, tab_id), f"show the {title.lower()} tab")
        for name in app.THEME_NAMES:
            yield (f"Theme: {name}", partial(setattr, app, "theme", name), "switch the colours")

    async def discover(self) -> Hits:
        for title, cb, help_text in self._commands():
            yield DiscoveryHit(title, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, cb, help_text in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), cb, help=help_text)
