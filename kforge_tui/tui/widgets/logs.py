"""Logs of the open node in tabs: compiler/static output, mismatch report, timing, LLM exchange."""
from __future__ import annotations

import json
import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static, TabbedContent, TabPane

from kforge_tui.summary import fmt_pct, fmt_us, spread_of

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
             f"mismatched {m.get('mismatched', 0)}/{total} ({share:.2%})", ""]
    rows = [("index", "expected", "got")] + [(str(f.get("index")), _num(f.get("expected")), _num(f.get("got")))
                                             for f in m.get("first") or []]
    w = [max(len(r[i]) for r in rows) for i in range(3)]  # columns as wide as their values, apart
    for r in rows:
        lines.append(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}")
    return "\n".join(lines)


def _num(v) -> str:
    return f"{v:.9g}" if isinstance(v, float) else str(v)


def _timing(name: str, t: dict | None) -> str:
    if not t:
        return f"{name:<9} -"
    clock = f" [{t['clock']} clock]" if t.get("clock") else ""
    return (f"{name:<9} median {fmt_us(t.get('median_us'))}  p10 {fmt_us(t.get('p10_us'))}  "
            f"p90 {fmt_us(t.get('p90_us'))}  spread {fmt_pct(spread_of(t))}  n={t.get('n', 0)}{clock}  "
            f"{t.get('method', '')}").rstrip()


def _ref(name: str, ref) -> str:
    clock = f" [{ref.clock} clock]" if ref.clock else ""
    return (f"{name:<9} {fmt_us(ref.median_us)} (the task's reference: median of {ref.n} side-by-side "
            f"timings, spread {fmt_pct(ref.spread)}){clock}")


def timing_text(node: dict, task=None) -> str:
    """The node's time, the task's pooled references and the speedup as exactly their ratio;
    then what was timed next to this node (one sample of the reference)."""
    r = result_of(node)
    lines = []
    t = r.get("timing") or {}
    me = t.get("median_us") or node.get("time_us")
    if task is not None and node.get("status") == "ok" and me and node.get("parent_id") is not None:
        ref = task.eager
        x = ref.over(me)
        if x:  # first: the logs pane is a few lines tall and the timing lines wrap
            lines.append(f"speedup   {x:.2f}x vs eager = {fmt_us(ref.median_us)} / {fmt_us(me)}")
        comp = task.compiled.over(me)
        if comp:
            lines.append(f"          {comp:.2f}x vs torch.compile = {fmt_us(task.compiled.median_us)} / {fmt_us(me)}")
        sp, limit = spread_of(t), task.figures.threshold()
        if sp is not None and sp > limit:
            lines.append(f"noisy     its spread {fmt_pct(sp)} is above this op's {limit:.0%}: not the best "
                         "(★) until re-timed to a low spread")
    lines.append(_timing("candidate", t or None))
    if node.get("worker"):  # where both were timed (a Ray cluster's node, or this machine)
        lines.append(f"worker    {node['worker']}")
    if task is not None:
        lines.append(_ref("eager", task.eager) + (f", {task.eager_of}" if getattr(task, "eager_of", "") else ""))
        if task.compiled.median_us:
            lines.append(_ref("compile", task.compiled))
    # what was timed next to this node: one sample of the reference, not the figure shown
    lines.append(_timing("eager timed with it", r.get("baseline")))
    if r.get("compiled"):
        lines.append(_timing("compile timed with it", r["compiled"]))
    lines.append(f"floor     {fmt_us(r['floor_us'])} (memory roofline)" if r.get("floor_us") else "floor     -")
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

    def show_node(self, node: dict | None, task=None) -> None:
        if node is None:
            for tab_id, _ in TABS[:-1]:
                self._set(tab_id, "(no node open)")
            return
        self._set("log-compile", compile_text(node))
        self._set("log-mismatch", mismatch_text(node))
        self._set("log-timing", timing_text(node, task))
        self._set("log-llm", llm_text(node))

    def show_timing(self, node: dict | None, task) -> None:
        """The timing tab again (the task's reference moved: its speedup line with it)."""
        if node is not None:
            self._set("log-timing", timing_text(node, task))

    def show_run_log(self, lines) -> None:
        """Every phase and log line with its time; the view stays at the tail unless scrolled up."""
        t = Text()
        for e in list(lines)[-300:]:
            style = {"error": "red", "warning": "yellow", "phase": "bold"}.get(e.level, "")
            level = "" if e.level in ("info", "phase") else f"{e.level}: "
            t.append(f"{time.strftime('%H:%M:%S', time.localtime(e.ts))} {level}{e.message}\n", style=style)
        scroll = self.query_one("#log-run", TabPane).query_one(VerticalScroll)
        at_end = scroll.scroll_y >= scroll.max_scroll_y - 1
        self._set("log-run", t)
        if at_end:
            scroll.call_after_refresh(scroll.scroll_end, animate=False)
