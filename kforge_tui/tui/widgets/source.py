"""Kernel source of the open node (highlighted, line numbers, failing line marked) or its diff."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from kforge_tui.tui.highlight import lexer_for, render_diff, render_source


def no_source_text(node: dict) -> Text:
    """A node without a kernel: the root (the reference), one still being proposed, or a proposal
    that produced no code, for which its own error and the proposer's answer are what there is to read."""
    if node.get("action") == "root" or node.get("parent_id") is None:
        return Text("The root is the PyTorch reference: it has no kernel source.", style="dim")
    status = node.get("status") or "pending"
    if status == "pending":
        return Text(f"#{node.get('id')} is still being proposed: no source yet.", style="dim")
    t = Text()
    t.append(f"#{node.get('id')} {status}: no kernel source\n", style="bold red")
    t.append(f"{node.get('message') or '(no message)'}\n")
    if node.get("response"):
        t.append("\nThe proposer answered:\n", style="bold")
        t.append(node["response"])
    return t


class SourceView(VerticalScroll, can_focus=True):
    def compose(self) -> ComposeResult:
        yield Static(Text("Pick a node in the search tree (arrows, enter).", style="dim"), id="source-body")

    def show(self, node: dict | None, parent: dict | None, *, diff: bool, backend: str | None,
             error_line: int | None, dark: bool) -> None:
        body = self.query_one("#source-body", Static)
        if node is None:
            body.update(Text("No details for this node (the store is not readable yet).", style="dim"))
            return
        src = node.get("source")
        if not src:
            self.border_subtitle = f"#{node.get('id')} no source"
            body.update(no_source_text(node))
            self.call_after_refresh(self.scroll_to, y=0, animate=False)
            return
        self.border_subtitle = f"#{node.get('id')} {'diff vs parent' if diff else lexer_for(backend, src)}"
        if diff:
            psrc = (parent or {}).get("source") or ""
            body.update(render_diff(psrc, src, parent_label=f"#{(parent or {}).get('id', '?')}",
                                    child_label=f"#{node.get('id')}", dark=dark))
        else:
            body.update(render_source(src, lexer=lexer_for(backend, src), dark=dark, error_line=error_line))
        # a new node opens at its top, a failed one at its failing line (with a little context
        # above): the pane is a few lines tall and compilers report errors deep in the file
        top = max(0, error_line - 3) if error_line and not diff else 0
        self.call_after_refresh(self.scroll_to, y=top, animate=False)
