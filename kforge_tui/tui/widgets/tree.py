"""The search tree of the selected task, updated incrementally (never rebuilt per event).

Each model node maps to one TreeNode; a batch of events adds the new ones under their parents
and relabels the changed ones, so a 2,000-node tree costs per batch what changed in it. A full
rebuild happens only when the task or the filter changes.
"""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from kforge_tui.summary import fmt_us
from kforge_tui.tui.model import NodeState, RunModel

ICONS = {"queued": ("·", "dim"), "pending": ("·", "dim"), "proposing": ("…", "cyan"),
         "static": ("⚙", "yellow"), "compile": ("⚙", "yellow"), "load": ("⇡", "yellow"),
         "verify": ("≟", "yellow"), "time": ("⏱", "yellow"), "ok": ("✔", "green"),
         "lost": ("○", "dim")}


def node_label(n: NodeState, best: bool) -> Text:
    """`✔ ★ #25 set:vec=8 460.1µs 13.87x`: the time and the task's reference over it (the same
    reference for every node of the task, so a slower node never shows the larger speedup);
    `noisy` when its own spread is too high to be the best until it is re-timed."""
    icon, style = ICONS.get(n.status, ("✘", "red"))
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(icon + " ", style=style)
    if best:
        t.append("★ ", style="bold green")  # first, so narrow panes never cut it off
    elif n.noisy and n.status == "ok":
        t.append("noisy ", style="yellow")  # the fastest may be noisy: said before it is cut off
    t.append(f"#{n.node_id} ", style="bold")
    t.append(n.action)
    if n.failed or n.status == "lost":
        t.append(f" {n.status}", style="red" if n.failed else "dim")
    elif n.in_flight:
        t.append(f" {n.status}", style="yellow")
    if n.time_us is not None:
        t.append(f" {fmt_us(n.time_us, compact=True)}")
    if n.speedup is not None:
        t.append(f" {n.speedup:.2f}x", style="green" if n.speedup > 1 else "")
    return t


def label_key(n: NodeState, best: bool) -> tuple:
    """What a label shows, cheaply: a label is rebuilt only when this changes (a moved reference
    changes few speedups at two decimals; rebuilding 2,000 labels a second stalled keys)."""
    return (n.status, n.action, best, n.noisy, None if n.time_us is None else fmt_us(n.time_us, compact=True),
            None if n.speedup is None else f"{n.speedup:.2f}")


def matches(n: NodeState, needle: str) -> bool:
    hay = f"#{n.node_id} {n.action} {n.status} {n.message} {'failed' if n.failed else ''}".lower()
    return needle.lower() in hay


class SearchTree(Tree):
    def __init__(self, **kw) -> None:
        super().__init__("search", **kw)
        self.show_root = False
        self.auto_expand = False  # enter opens a node (the hint says so); space folds it
        self.guide_depth = 2  # deep trees need the width for labels
        self.task_id: str | None = None
        self.filter = ""
        self._tn: dict[int, TreeNode] = {}
        self._keys: dict[int, tuple] = {}  # node id -> label_key of the label it shows
        self._model: RunModel | None = None

    # ------------------------------------------------------------------ building
    def show_task(self, model: RunModel, task_id: str | None, filter: str | None = None) -> None:
        """Full rebuild: only on task or filter change."""
        self._model = model
        self.task_id = task_id
        if filter is not None:
            self.filter = filter
        self.clear()
        self._tn = {}
        self._keys = {}
        t = model.tasks.get(task_id) if task_id else None
        if t is None:
            return
        keep = self._kept(model, t.node_ids) if self.filter else None
        for nid in t.node_ids:
            if keep is None or nid in keep:
                self._add(model, model.nodes[nid])

    def _kept(self, model: RunModel, ids: list[int]) -> set[int]:
        keep: set[int] = set()
        for nid in ids:
            n = model.nodes[nid]
            if matches(n, self.filter):
                while n is not None and n.node_id not in keep:
                    keep.add(n.node_id)
                    n = model.nodes.get(n.parent_id) if n.parent_id is not None else None
        return keep

    def _add(self, model: RunModel, n: NodeState) -> None:
        parent = self._tn.get(n.parent_id) if n.parent_id is not None else None
        under = parent if parent is not None else self.root
        best = model.tasks[n.task_id].best_node == n.node_id
        self._keys[n.node_id] = label_key(n, best)
        tn = under.add(node_label(n, best), data=n.node_id, expand=True, allow_expand=False)
        if parent is not None and not parent.allow_expand:
            parent.allow_expand = True
        self._tn[n.node_id] = tn

    def relabel_all(self, model: RunModel) -> None:
        """Every label of the shown task again (its reference moved, so did every speedup)."""
        task = model.tasks.get(self.task_id) if self.task_id else None
        if task is None:
            return
        for nid, tn in self._tn.items():
            n = model.nodes.get(nid)
            if n is not None:
                self._relabel(tn, n, task.best_node == nid)

    def _relabel(self, tn: TreeNode, n: NodeState, best: bool) -> None:
        key = label_key(n, best)
        if self._keys.get(n.node_id) != key:
            self._keys[n.node_id] = key
            tn.set_label(node_label(n, best))

    def apply(self, model: RunModel, node_ids: set[int]) -> None:
        """Add new nodes of the shown task and relabel changed ones."""
        if self.task_id is None:
            return
        task = model.tasks.get(self.task_id)
        for nid in sorted(node_ids):
            n = model.nodes.get(nid)
            if n is None or n.task_id != self.task_id:
                continue
            tn = self._tn.get(nid)
            if tn is None:
                if not self.filter or matches(n, self.filter):
                    if n.parent_id is not None and n.parent_id not in self._tn and self.filter:
                        continue  # keep filtered views simple: ancestors appear on the next rebuild
                    self._add(model, n)
            else:
                self._relabel(tn, n, task is not None and task.best_node == nid)

    # ------------------------------------------------------------------ navigation
    @property
    def current_node_id(self) -> int | None:
        node = self.cursor_node
        return node.data if node is not None and node.data is not None else None

    def select_node_id(self, node_id: int) -> bool:
        tn = self._tn.get(node_id)
        if tn is None:
            return False
        p = tn.parent
        while p is not None:
            p.expand()
            p = p.parent
        self.move_cursor(tn)
        self.scroll_to_node(tn, animate=False)
        return True

    def next_failure(self, model: RunModel) -> int | None:
        """The first failed node after the cursor in creation order (wrapping)."""
        t = model.tasks.get(self.task_id) if self.task_id else None
        if t is None:
            return None
        ids = [i for i in t.node_ids if i in self._tn]
        cur = self.current_node_id
        start = ids.index(cur) + 1 if cur in ids else 0
        for nid in ids[start:] + ids[:start]:
            if model.nodes[nid].failed:
                return nid
        return None

    def toggle_collapse(self) -> None:
        tops = list(self.root.children)
        if any(c.is_expanded and c.children for c in tops):
            for c in tops:
                c.collapse_all()
        else:
            for c in tops:
                c.expand_all()
