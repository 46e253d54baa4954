"""`?` help: every binding of the main screen with its key and id, generated so it cannot go stale.

The id is what the `[keymap]` table of the config file rebinds (Textual's keymap by binding id).
"""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

EXTRA = (("ctrl+p", "command palette: every action, log tab and theme", ""),
         ("tab, shift+tab", "next / previous pane", ""),
         ("enter, space", "tree: open the node / fold it", ""),
         ("^s ^g f7", "editor: submit / go to line / select all", "editor-submit"))

# What each key does, in a few words (the footer and palette titles are shorter still)
HELP = {"help": "every key, with the id that rebinds it", "zoom": "the focused pane fills the screen",
        "focus-profile": "the operator table (arrows pick an op)", "focus-tree": "the MCTS tree of the op",
        "focus-source": "the kernel source of the open node", "focus-logs": "compiler, mismatch, timing, LLM, run log",
        "next-log": "cycle the logs pane's tabs", "prev-log": "cycle them backwards", "next-task": "the op below",
        "prev-task": "the op above", "open-node": "show its source and logs", "diff": "the source against its parent",
        "edit": "edit, then ctrl+s: a hand-written child", "repair": "the proposer fixes a failed node",
        "jump-best": "the op's best node (★)", "next-failure": "the next failed node of the tree",
        "filter": "show the nodes matching a word", "collapse": "fold or unfold the tree",
        "pause-all": "no new candidates anywhere", "resume-all": "candidates again everywhere",
        "pause-task": "pause or resume the selected op", "add-budget": "more candidates for this op",
        "stop-task": "end this op (stays stopped on resume)", "export": "a package of the winners",
        "next-theme": "dark, light, ansi", "quit": "asks first during a search"}


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", id="help-close")]

    def __init__(self, bindings: list[Binding], keys: dict[str, str] | None = None) -> None:
        super().__init__()
        self.bindings = bindings
        self.keys = keys or {}  # binding id -> the key(s) in effect (after the user's keymap)

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="help"):
            yield Static(self.table())
            yield Static("esc closes this help.")

    def table(self) -> Table:
        table = Table(title="kforge keys", show_edge=False)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("action")
        # a column header is markup: `[keymap]` unescaped would vanish as an unknown tag
        table.add_column(escape("id (config [keymap])"), style="dim", no_wrap=True)
        for b in self.bindings:
            text = HELP.get(b.id, b.description)
            table.add_row(escape(self.keys.get(b.id) or b.key_display or b.key), escape(text), b.id or "")
        for key, text, ids in EXTRA:
            table.add_row(escape(key), escape(text), ids)
        return table
