"""Logs of the open node in tabs: compiler/static output, mismatch report, timing, LLM exchange."""
from __future__ import annotations

import json

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static, TabbedContent, TabPane

TABS = (("log-compile", "Compiler"), ("log-mismatch", "Mismatch"), ("log-timing", "Timing"),
        ("log-llm", "LLM"), ("log-run", "Run log"))


def result_of(node: dict) -> dict:
    r = node.get("result")
    if isinstance(r, str):
        try:
            r = json.loads(r)
        except ValueError:
            r = None
    return r or {}


def compile_text(node: dict) -> str:
    r = result_of(node)
    head = f"#{node.get('id')} {node.get('status', '?')} at stage {r.get('stage', '?')}: {node.get('message') or r.get('message') or ''}"
    if r.get("error_line"):
        head += f"\nfirst error at source line {r['error_line']} (highlighted in the Source pane)"
    return head + "\n\n" + (r.get("log") or "(no static-check or compiler output)")


def mismatch_text(node: dict) -> str:
    m = result_of(node).get("mismatch")
    if not m:
        return "(no numerical mismatch recorded for this node)"
    total = m.get("total") or 0
    share = (m.get("mismatched", 0) / total) if total else 0.0
    lines = [f"{m.get('reason') or 'values differ'} on input set {m.get('input_set')}",
             f"max abs err {m.get('max_abs_err', 0):.4g}   max rel err {m.get('max_rel_err', 0):.4g}",
             f"mismatched {m.get('mismatched', 0)}/{total} ({share:.2%})", "",
             f"{'index':<24}{'expected':>16}{'got':>16}"]
    for f in m.get("first") or []:
        lines.append(f"{str(f.get('index')):<24}{f.get('expected')!s:>16}{f.get('got')!s:>16}")
    return "\n".join(lines)


def _timing(name: str, t: dict | None) -> str:
    if not t:
        return f"{name:<9} -"
    med = t.get("median_us") or 0.0
    spread = (t.get("p90_us", 0) - t.get("p10_us", 0)) / med if med else 0.0
    return (f"{name:<9} median {med:.2f} µs  p10 {t.get('p10_us', 0):.2f}  p90 {t.get('p90_us', 0):.2f}  "
            f"min {t.get('min_us', 0):.2f}  spread {spread:.1%}  n={t.get('n', 0)}  {t.get('method', '')}")


def timing_text(node: dict) -> str:
    r = result_of(node)
    lines = []
    if r.get("speedup"):  # first: the logs pane is a few lines tall and the timing lines wrap
        lines.append(f"speedup   {r['speedup']:.3f}x vs eager")
    lines += [_timing("candidate", r.get("timing")), _timing("eager", r.get("baseline"))]
    if node.get("worker"):  # where both were timed (a Ray cluster's node, or this machine)
        lines.append(f"worker    {node['worker']}")
    lines.append(f"floor     {r['floor_us']:.2f} µs (memory roofline)" if r.get("floor_us") else "floor     -")
    res = r.get("resources") or {}
    if res:
        lines.append("resources " + "  ".join(f"{k} {v}" for k, v in res.items()))
    if r.get("compile_s") is not None:
        lines.append(f"compile   {r['compile_s']:.2f} s{' (cached)' if r.get('cached') else ''}")
    if r.get("stage_s"):
        lines.append("stages    " + "  ".join(f"{k} {v:.2f}s" for k, v in r["stage_s"].items()))
    return "\n".join(lines)


def llm_text(node: dict) -> str:
    prompt, response = node.get("prompt"), node.get("response")
    if not prompt and not response:
        return f"(no LLM exchange: proposer {node.get('proposer') or '?'}, action {node.get('action')})"
    return f"── prompt ──\n{prompt or ''}\n\n── response ──\n{response or ''}"


class LogTabs(Vertical):
    def compose(self) -> ComposeResult:
        with TabbedContent(id="logs-tabs"):
            for tab_id, title in TABS:
                with TabPane(title, id=tab_id):
                    with VerticalScroll():
                        yield Static("", id=f"{tab_id}-body", markup=False)

    @property
    def active(self) -> str:
        return self.query_one(TabbedContent).active

    @active.setter
    def active(self, tab_id: str) -> None:
        self.query_one(TabbedContent).active = tab_id

    def cycle(self, step: int) -> str:
        """Show the next (step 1) or previous (-1) tab; returns its title."""
        ids = [tab_id for tab_id, _ in TABS]
        i = ids.index(self.active) if self.active in ids else 0
        self.active = ids[(i + step) % len(ids)]
        return dict(TABS)[self.active]

    def focus_active(self) -> None:
        """Focus the visible tab's text, so the arrows and page keys scroll it."""
        self.query_one(f"#{self.active}", TabPane).query_one(VerticalScroll).focus()

    def _set(self, tab_id: str, text) -> None:
        self.query_one(f"#{tab_id}-body", Static).update(text if isinstance(text, Text) else Text(text))

    def show_node(self, node: dict | None) -> None:
        if node is None:
            for tab_id, _ in TABS[:-1]:
                self._set(tab_id, "(no node open)")
            return
        self._set("log-compile", compile_text(node))
        self._set("log-mismatch", mismatch_text(node))
        self._set("log-timing", timing_text(node))
        self._set("log-llm", llm_text(node))

    def show_run_log(self, lines) -> None:
        t = Text()
        for e in list(lines)[-200:]:
            style = {"error": "red", "warning": "yellow"}.get(e.level, "")
            t.append(f"{e.level:<7} {e.message}\n", style=style)
        self._set("log-run", t)
