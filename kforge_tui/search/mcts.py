"""Monte Carlo Tree Search over kernel candidates of one task: pure data, no I/O, no asyncio.

The engine owns proposing, evaluating and storing; this module only decides *which node to
expand next* and keeps the statistics. One tree per task; node ids are the run store's ids.

Driving protocol (after each `select()` the engine calls exactly one of `add_child`,
`fail_expansion` or `mark_exhausted` on the returned leaf):

    leaf = tree.select()                 # None: nothing can be expanded now (all in flight / done)
    child = tree.add_child(leaf, node_id=..., action=..., params=..., mode=leaf.mode)
    tree.complete(child, ok=..., time_us=..., speedup=...)

Reward (log scale, so constants do not depend on how many microseconds a kernel takes)
    reward(s) = clip(ln s, REWARD_MIN, REWARD_MAX) = clip(ln s, -ln 8, +ln 64)
    A verified kernel 8x slower than eager is as bad as a failure; FAIL_REWARD = REWARD_MIN is
    given to every failed candidate (static, compile, verify, timing, proposal), which stays in
    the tree with its error. The root (the PyTorch reference) has speedup 1, reward 0.

Backup: every node keeps visits n, reward sum W (mean Q = W/n) and the best reward M in its
subtree. A completed child adds its reward to itself and each ancestor (n+1, W+r, M=max(M, r)).

Selection: walk from the root. At node v,
  * if v is expandable and len(children)+reservations < ceil(K * n_eff(v) ** ALPHA)
    (progressive widening, K=1, ALPHA=0.5 by default), expand v;
  * else descend to the child u maximising
        score(u) = (1-BETA) * Q_eff(u) + BETA * M(u) + C * sqrt(ln n_eff(v) / n_eff(u))
    with BETA=0.5 (mean/max mix), C=0.7 (about "a 2x speedup" of optimism on the log scale),
    n_eff = n + vl and Q_eff = (W + vl * FAIL_REWARD) / n_eff, vl being the expansions in flight
    through that node (virtual loss). Pending children (still being evaluated) are never entered;
    a child whose subtree has nothing expandable is skipped (try the next best);
  * if no child leads anywhere but v itself is expandable, v is widened past the limit rather
    than leaving a worker idle (only happens with several expansions in flight).
  Ties are broken by a `random.Random(seed)`, so a tree is deterministic given its seed and the
  sequence of calls.

Expandable: a verified node not marked exhausted; a failed node (repair) while it has fewer
than MAX_REPAIRS children; never a pending node.

Stop rules (`done()`, `stop_reason`): "stopped" (asked), "target" (a verified speedup reached
`target_speedup`), "budget" (evaluated >= budget; evaluations exclude the root and proposals
that produced nothing), "time" (wall time since creation >= `time_limit_s`, measured with the
injectable `clock`), "exhausted" (nothing expandable and nothing in flight). `select()` also
returns None while evaluated + in flight would exceed the budget.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

REWARD_MIN = -math.log(8.0)
REWARD_MAX = math.log(64.0)
FAIL_REWARD = REWARD_MIN
C_EXPLORE = 0.7
BETA_MAX = 0.5
WIDEN_K = 1.0
WIDEN_ALPHA = 0.5
MAX_REPAIRS = 2
DEFAULT_BUDGET = 50


def reward(speedup: float | None) -> float:
    """Log speedup over eager, clipped to [REWARD_MIN, REWARD_MAX]; None or <= 0 is a failure."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return FAIL_REWARD
    return min(REWARD_MAX, max(REWARD_MIN, math.log(speedup)))


_reward_of = reward  # `Tree.complete` has a parameter named `reward`


@dataclass(eq=False)
class SearchNode:
    node_id: int
    parent: "SearchNode | None"
    action: str = "root"
    params: dict = field(default_factory=dict)
    mode_created: str = "root"  # how it was made: root | improve | repair | hand
    status: str = "pending"  # pending | ok | failed
    message: str = ""
    time_us: float | None = None
    speedup: float | None = None
    reward: float | None = None
    children: list["SearchNode"] = field(default_factory=list)
    visits: int = 0
    total: float = 0.0
    best: float = -math.inf
    vl: int = 0  # expansions in flight through this node (virtual loss)
    reserved: int = 0  # select() reservations on this node not yet turned into children
    exhausted: bool = False

    @property
    def mean(self) -> float:
        return self.total / self.visits if self.visits else 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def mode(self) -> str:
        """What a proposer should do from here: "root" (first kernel), "repair" or "improve"."""
        if self.is_root:
            return "root"
        return "repair" if self.failed else "improve"

    @property
    def depth(self) -> int:
        d, p = 0, self.parent
        while p is not None:
            d, p = d + 1, p.parent
        return d

    def path(self) -> list["SearchNode"]:
        """Root first, this node last."""
        out, n = [], self
        while n is not None:
            out.append(n)
            n = n.parent
        return out[::-1]

    def __repr__(self) -> str:  # short, for test failures
        return f"<node {self.node_id} {self.action} {self.status} n={self.visits} vl={self.vl}>"


class Tree:
    """The search tree of one task (see the module docstring for the rules and constants)."""

    def __init__(self, task_id: str, budget: int = DEFAULT_BUDGET, *, c: float = C_EXPLORE,
                 widening: tuple[float, float] = (WIDEN_K, WIDEN_ALPHA), beta: float = BETA_MAX,
                 max_repairs: int = MAX_REPAIRS, seed: int = 0, root_id: int = 0,
                 target_speedup: float | None = None, time_limit_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if budget < 0:
            raise ValueError("budget must be >= 0")
        self.task_id = task_id
        self.budget = int(budget)
        self.c = float(c)
        self.widen_k, self.widen_alpha = float(widening[0]), float(widening[1])
        self.beta = float(beta)
        self.max_repairs = int(max_repairs)
        self.target_speedup = target_speedup
        self.time_limit_s = time_limit_s
        self.clock = clock
        self.started = clock()
        self.rng = random.Random(seed)
        self.root = SearchNode(root_id, None, "root", status="ok", speedup=1.0, reward=0.0,
                               visits=1, total=0.0, best=0.0)
        self.nodes: dict[int, SearchNode] = {root_id: self.root}
        self.evaluated = 0
        self._stopped = False
        self._target_hit = False

    # ----------------------------------------------------------------------- queries

    def get(self, node_id: int) -> SearchNode:
        return self.nodes[node_id]

    @property
    def in_flight(self) -> int:
        """Expansions started and not finished (reservations plus pending children)."""
        return self.root.vl

    def best(self) -> SearchNode | None:
        """The fastest verified candidate (never the root), lowest id on ties; None if none."""
        best = None
        for n in self.nodes.values():
            if n.is_root or not n.ok or n.speedup is None:
                continue
            if best is None or n.speedup > best.speedup:
                best = n
        return best

    def expandable(self, n: SearchNode) -> bool:
        if n.pending or n.exhausted:
            return False
        if n.failed:
            return len(n.children) + n.reserved < self.max_repairs
        return True

    def widening_limit(self, n: SearchNode) -> int:
        return max(1, math.ceil(self.widen_k * (n.visits + n.vl) ** self.widen_alpha - 1e-9))

    def _open(self, n: SearchNode) -> bool:
        """Something in this subtree could be expanded (ignoring budget and in-flight limits)."""
        return self.expandable(n) or any(self._open(ch) for ch in n.children)

    @property
    def stop_reason(self) -> str | None:
        if self._stopped:
            return "stopped"
        if self._target_hit:
            return "target"
        if self.evaluated >= self.budget:
            return "budget"
        if self.time_limit_s is not None and self.clock() - self.started >= self.time_limit_s:
            return "time"
        if self.in_flight == 0 and not self._open(self.root):
            return "exhausted"
        return None

    def done(self) -> bool:
        """No new expansion should start (in-flight ones may still be finishing)."""
        return self.stop_reason is not None

    @property
    def finished(self) -> bool:
        return self.done() and self.in_flight == 0

    # ---------------------------------------------------------------------- selection

    def _score(self, u: SearchNode, parent_n: int) -> float:
        n = u.visits + u.vl
        q = (u.total + u.vl * FAIL_REWARD) / n
        m = u.best if u.best > -math.inf else FAIL_REWARD
        return ((1 - self.beta) * q + self.beta * m
                + self.c * math.sqrt(math.log(max(parent_n, 1)) / n))

    def _select_from(self, v: SearchNode) -> SearchNode | None:
        if self.expandable(v) and len(v.children) + v.reserved < self.widening_limit(v):
            return v
        parent_n = v.visits + v.vl
        cands = [(self._score(u, parent_n), self.rng.random(), u) for u in v.children
                 if not u.pending]
        cands.sort(key=lambda t: (-t[0], t[1]))
        for _, _, u in cands:
            got = self._select_from(u)
            if got is not None:
                return got
        return v if self.expandable(v) else None

    def select(self) -> SearchNode | None:
        """The node to expand next, reserved (virtual loss on its path); None if none now."""
        if self.done() or self.evaluated + self.in_flight >= self.budget:
            return None
        leaf = self._select_from(self.root)
        if leaf is not None:
            self.claim(leaf)
        return leaf

    def claim(self, node: SearchNode | int) -> SearchNode:
        """Reserve `node` for one expansion without selection (e.g. a repair asked from the UI)."""
        node = self._node(node)
        if node.pending:
            raise ValueError(f"node {node.node_id} is still being evaluated")
        node.reserved += 1
        for p in node.path():
            p.vl += 1
        return node

    # ------------------------------------------------------------------ expansion/backup

    def add_child(self, leaf: SearchNode | int, *, node_id: int, action: str,
                  params: dict | None = None, mode: str = "improve") -> SearchNode:
        """Attach a new candidate (in flight until `complete`). Uses the leaf's reservation from
        select()/claim() if it has one, else reserves now (hand-written submissions)."""
        leaf = self._node(leaf)
        if node_id in self.nodes:
            raise ValueError(f"node id {node_id} already in the tree")
        if leaf.reserved == 0:
            self.claim(leaf)
        leaf.reserved -= 1
        child = SearchNode(node_id, leaf, action, dict(params or {}), mode)
        child.vl = 1
        leaf.children.append(child)
        self.nodes[node_id] = child
        return child

    def complete(self, child: SearchNode | int, *, ok: bool, reward: float | None = None,
                 time_us: float | None = None, speedup: float | None = None,
                 message: str = "") -> SearchNode:
        """Record an evaluation and back it up. Failures always get FAIL_REWARD; a verified
        result's reward is `reward` (clipped) or, when not given, reward(speedup)."""
        child = self._node(child)
        if not child.pending:
            raise ValueError(f"node {child.node_id} already completed")
        if not ok:
            r = FAIL_REWARD
        elif reward is not None:
            r = min(REWARD_MAX, max(REWARD_MIN, float(reward)))
        else:
            r = _reward_of(speedup)
        child.status = "ok" if ok else "failed"
        child.message, child.time_us, child.speedup, child.reward = message, time_us, speedup, r
        self.evaluated += 1
        for p in child.path():
            p.vl -= 1
            p.visits += 1
            p.total += r
            p.best = max(p.best, r)
        if (ok and self.target_speedup is not None and speedup is not None
                and speedup >= self.target_speedup):
            self._target_hit = True
        return child

    def fail_expansion(self, leaf: SearchNode | int, *, exhausted: bool = True) -> None:
        """The proposer had nothing: release the reservation; by default the leaf is then
        exhausted (no further expansion asked from it)."""
        leaf = self._node(leaf)
        self._release(leaf)
        if exhausted:
            leaf.exhausted = True

    def mark_exhausted(self, node: SearchNode | int) -> None:
        """The proposer cannot expand this node any more; releases a select() reservation."""
        node = self._node(node)
        node.exhausted = True
        if node.reserved > 0:
            self._release(node)

    def cancel(self, child: SearchNode | int) -> None:
        """Drop a pending child that will never be evaluated (e.g. the run is shutting down)."""
        child = self._node(child)
        if not child.pending:
            raise ValueError(f"node {child.node_id} is not pending")
        for p in child.path():
            p.vl -= 1
        child.parent.children.remove(child)
        del self.nodes[child.node_id]

    def _release(self, leaf: SearchNode) -> None:
        if leaf.reserved <= 0:
            raise ValueError(f"node {leaf.node_id} holds no reservation")
        leaf.reserved -= 1
        for p in leaf.path():
            p.vl -= 1

    # --------------------------------------------------------------------- control

    def add_budget(self, n: int) -> None:
        self.budget = max(0, self.budget + int(n))

    def stop(self) -> None:
        self._stopped = True

    def _node(self, n: SearchNode | int) -> SearchNode:
        return n if isinstance(n, SearchNode) else self.nodes[n]

    # ---------------------------------------------------------------------- resume

    @classmethod
    def rebuild(cls, task_id: str, rows: Iterable[dict], budget: int = DEFAULT_BUDGET,
                **kwargs) -> "Tree":
        """Rebuild from run-store node rows (store.nodes(task_id)). Finished nodes count toward
        the budget; pending ones (in flight when the run died) and anything under them are
        dropped — the engine re-queues them. Statistics are replayed, so they equal the tree's
        before the crash (sums and maxima do not depend on order)."""
        rows = sorted((r for r in rows if r.get("task_id", task_id) == task_id),
                      key=lambda r: r["id"])
        roots = [r for r in rows if r.get("action") == "root" or r.get("parent_id") is None]
        if not roots:
            raise ValueError(f"no root node stored for task {task_id}")
        tree = cls(task_id, budget, root_id=roots[0]["id"], **kwargs)
        for r in rows:
            if r["id"] == tree.root.node_id or r.get("status") == "pending":
                continue
            parent = tree.nodes.get(r.get("parent_id"))
            if parent is None or parent.pending:
                continue
            params = r.get("params") or {}
            mode = "repair" if parent.failed else ("hand" if r.get("hand_written") else "improve")
            child = tree.add_child(parent, node_id=r["id"], action=r.get("action") or "",
                                   params=params, mode=mode)
            ok = r.get("status") == "ok"
            tree.complete(child, ok=ok, reward=r.get("reward") if ok else None,
                          time_us=r.get("time_us"), speedup=r.get("speedup"),
                          message=r.get("message") or "")
        return tree
