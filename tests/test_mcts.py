"""MCTS (search/mcts.py) with a deterministic fake evaluator: selection, widening, backup,
parallel expansions, budget and stop rules, repairs, rebuild from stored rows."""
from __future__ import annotations

import itertools
import math

import pytest

from kforge_tui.search.mcts import (FAIL_REWARD, REWARD_MAX, REWARD_MIN, SearchNode, Tree,
                                    reward)


def fake_eval(node: SearchNode) -> tuple[bool, float | None]:
    """Deterministic landscape: ids divisible by 5 fail; deeper nodes tend to be faster."""
    if node.node_id % 5 == 0:
        return False, None
    return True, 1.0 + 0.3 * node.depth + 0.05 * (node.node_id % 7)


def check_invariants(tree: Tree) -> None:
    """Statistics equal a recount from scratch (backup is exact, virtual loss balanced)."""
    for n in tree.nodes.values():
        sub = [m for m in tree.nodes.values() if n in m.path() and not m.pending]
        own = [] if n.is_root else [n]
        rewards = [m.reward for m in sub if m is not n] + [m.reward for m in own if not m.pending]
        if n.is_root:
            rewards.append(0.0)
        assert n.visits == len(rewards), n
        assert n.total == pytest.approx(sum(rewards)), n
        assert n.best == pytest.approx(max(rewards)) if rewards else n.best == -math.inf
        inflight = sum(1 for m in tree.nodes.values() if m.pending and n in m.path())
        inflight += sum(m.reserved for m in tree.nodes.values() if n in m.path())
        assert n.vl == inflight, n


def run(tree: Tree, ids=None, evaluate=fake_eval, steps: int = 1000) -> list[int]:
    """Sequential engine loop; returns the ids of the selected leaves in order."""
    ids = ids or itertools.count(max(tree.nodes) + 1)
    picked = []
    for _ in range(steps):
        leaf = tree.select()
        if leaf is None:
            break
        picked.append(leaf.node_id)
        child = tree.add_child(leaf, node_id=next(ids), action=f"a{leaf.node_id}", mode=leaf.mode)
        ok, s = evaluate(child)
        tree.complete(child, ok=ok, speedup=s, time_us=10.0 / s if s else None)
        # widening holds at every step: no node has more children than visits justify
        for n in tree.nodes.values():
            if n.ok:
                assert len(n.children) <= tree.widening_limit(n), n
    return picked


# --------------------------------------------------------------------------- reward

def test_reward_log_scale_and_clipping():
    assert reward(1.0) == 0.0
    assert reward(2.0) == pytest.approx(math.log(2))
    assert reward(0.5) == pytest.approx(-math.log(2))
    assert reward(1e6) == REWARD_MAX == pytest.approx(math.log(64))
    assert reward(1e-6) == REWARD_MIN == FAIL_REWARD
    for bad in (None, 0.0, -1.0, float("nan"), float("inf")):
        assert reward(bad) == FAIL_REWARD


def test_failure_always_gets_worst_reward():
    t = Tree("t", budget=5)
    c = t.add_child(t.select(), node_id=1, action="x")
    t.complete(c, ok=False, reward=3.0, speedup=10.0, message="compile error")
    assert c.reward == FAIL_REWARD and c.failed and c.message == "compile error"


# --------------------------------------------------------------------------- backup

def test_backup_mean_and_max():
    t = Tree("t", budget=10, widening=(3, 0.5))
    a = t.add_child(t.select(), node_id=1, action="a")
    t.complete(a, ok=True, speedup=2.0)
    b = t.add_child(t.root, node_id=2, action="b")  # hand-written child of root
    t.complete(b, ok=True, speedup=0.5)
    aa = t.add_child(a, node_id=3, action="aa")
    t.complete(aa, ok=True, speedup=8.0)
    af = t.add_child(a, node_id=4, action="af")
    t.complete(af, ok=False)
    l2, l8 = math.log(2), math.log(8)
    assert (a.visits, a.best) == (3, pytest.approx(l8))
    assert a.mean == pytest.approx((l2 + l8 + FAIL_REWARD) / 3)
    assert t.root.visits == 5 and t.root.best == pytest.approx(l8)
    assert t.root.mean == pytest.approx((0 + l2 - l2 + l8 + FAIL_REWARD) / 5)
    assert t.evaluated == 4 and t.in_flight == 0
    assert t.best() is aa
    check_invariants(t)


# -------------------------------------------------------------------- selection

def test_uct_prefers_better_child_and_score_formula():
    t = Tree("t", budget=50, c=0.7, beta=0.5)
    good = t.add_child(t.root, node_id=1, action="good")
    t.complete(good, ok=True, speedup=4.0)
    bad = t.add_child(t.root, node_id=2, action="bad")
    t.complete(bad, ok=True, speedup=0.5)
    t.root.exhausted = True  # force a descent
    n_parent = t.root.visits
    expect = 0.5 * math.log(4) + 0.5 * math.log(4) + 0.7 * math.sqrt(math.log(n_parent) / 1)
    assert t._score(good, n_parent) == pytest.approx(expect)
    assert t.select() is good


def test_exploration_eventually_visits_weaker_child():
    """With C > 0 a weak but barely visited branch is tried again once the strong one is
    visited often enough (UCT is not pure greed)."""
    t = Tree("t", budget=200, widening=(2, 0.0))  # at most 2 children per node
    ids = itertools.count(1)
    strong = t.add_child(t.select(), node_id=next(ids), action="s")
    t.complete(strong, ok=True, speedup=1.5)
    weak = t.add_child(t.select(), node_id=next(ids), action="w")
    t.complete(weak, ok=True, speedup=1.2)
    picked_weak_subtree = False
    for _ in range(60):
        leaf = t.select()
        if weak in leaf.path():
            picked_weak_subtree = True
            break
        c = t.add_child(leaf, node_id=next(ids), action="x")
        t.complete(c, ok=True, speedup=1.5)
    assert picked_weak_subtree


def test_progressive_widening_goes_deep_before_wide():
    t = Tree("t", budget=30, widening=(1.0, 0.5), seed=3)
    run(t)
    assert t.evaluated == 30
    # root visits 31 -> at most ceil(sqrt(31)) = 6 children; the tree must have depth
    assert len(t.root.children) <= math.ceil(math.sqrt(t.root.visits))
    assert max(n.depth for n in t.nodes.values()) >= 3
    check_invariants(t)


def test_widening_constant_changes_shape():
    wide = Tree("t", budget=20, widening=(4.0, 0.5))
    narrow = Tree("t", budget=20, widening=(1.0, 0.3))
    run(wide)
    run(narrow)
    assert len(wide.root.children) > len(narrow.root.children)


def test_deterministic_given_seed():
    seqs = []
    flat = lambda n: (True, 1.5)  # noqa: E731  every candidate equal: only ties decide
    for seed in (7, 7, 8, 9, 10):
        t = Tree("t", budget=25, seed=seed)
        seqs.append(run(t, evaluate=flat))
    assert seqs[0] == seqs[1]
    assert any(s != seqs[0] for s in seqs[2:])  # ties are broken by the seed


# -------------------------------------------------------------------- parallel

def test_concurrent_selects_take_distinct_paths():
    t = Tree("t", budget=50, widening=(1.0, 0.5))
    kids = []
    for i in (1, 2, 3):
        c = t.add_child(t.root, node_id=i, action=f"c{i}")
        t.complete(c, ok=True, speedup=2.0)  # equal values: only virtual loss separates them
        kids.append(c)
    leaves = [t.select() for _ in range(3)]
    assert sorted(x.node_id for x in leaves) == [1, 2, 3]
    assert t.in_flight == 3 and t.root.vl == 3 and all(k.vl == 1 for k in kids)
    check_invariants(t)


def test_pending_children_are_never_entered():
    t = Tree("t", budget=50)
    leaf = t.select()
    c = t.add_child(leaf, node_id=1, action="x")
    for _ in range(5):  # c is in flight: nobody may select it or below it
        nxt = t.select()
        assert nxt is not c and c not in nxt.path()
        t.add_child(nxt, node_id=max(t.nodes) + 1, action="y")
    check_invariants(t)


def test_none_when_everything_is_in_flight_or_exhausted():
    t = Tree("t", budget=50)
    c = t.add_child(t.select(), node_id=1, action="x")
    t.mark_exhausted(t.root)
    assert t.select() is None and not t.done()  # c still in flight
    t.complete(c, ok=True, speedup=1.1)
    assert t.select() is c


@pytest.mark.parametrize("parallel", [2, 4])
def test_parallel_run_reaches_budget_with_balanced_virtual_loss(parallel):
    """K workers; evaluations finish out of order; the budget is met exactly."""
    t = Tree("t", budget=40, seed=1)
    ids = itertools.count(1)
    in_flight: list[SearchNode] = []
    tick = 0
    while not t.finished:
        while len(in_flight) < parallel:
            leaf = t.select()
            if leaf is None:
                break
            if tick % 11 == 3:  # now and then the proposer has nothing
                t.fail_expansion(leaf, exhausted=False)
                tick += 1
                continue
            in_flight.append(t.add_child(leaf, node_id=next(ids), action="x", mode=leaf.mode))
            tick += 1
        assert t.in_flight == len(in_flight) <= parallel
        check_invariants(t)
        # finish the one whose id is "slowest" first: out of order completion
        done = max(in_flight, key=lambda n: (n.node_id * 7919) % 13)
        in_flight.remove(done)
        ok, s = fake_eval(done)
        t.complete(done, ok=ok, speedup=s)
    assert t.evaluated == 40 and t.stop_reason == "budget"
    assert t.root.visits == 41 and all(n.vl == 0 and n.reserved == 0 for n in t.nodes.values())


# -------------------------------------------------------------------- budget and stops

def test_budget_counts_in_flight_and_add_budget():
    t = Tree("t", budget=2)
    a = t.add_child(t.select(), node_id=1, action="a")
    b = t.add_child(t.select(), node_id=2, action="b")
    assert t.select() is None and not t.done()  # 0 evaluated + 2 in flight = budget
    t.complete(a, ok=True, speedup=1.2)
    t.complete(b, ok=False)
    assert t.done() and t.stop_reason == "budget" and t.finished
    t.add_budget(3)
    assert not t.done()
    run(t)
    assert t.evaluated == 5


def test_failed_proposal_releases_and_does_not_count():
    t = Tree("t", budget=3)
    leaf = t.select()
    assert t.in_flight == 1
    t.fail_expansion(leaf, exhausted=False)
    assert t.in_flight == 0 and t.evaluated == 0 and not leaf.exhausted
    leaf = t.select()
    t.fail_expansion(leaf)
    assert leaf.exhausted and t.done() and t.stop_reason == "exhausted"
    with pytest.raises(ValueError):
        t.fail_expansion(leaf)  # no reservation left: an engine bug, said loudly


def test_mark_exhausted_after_select_releases():
    t = Tree("t", budget=3)
    leaf = t.select()
    t.mark_exhausted(leaf)
    assert t.in_flight == 0 and t.stop_reason == "exhausted"


def test_stop_target_and_time():
    t = Tree("t", budget=50)
    t.stop()
    assert t.select() is None and t.stop_reason == "stopped"

    t = Tree("t", budget=50, target_speedup=2.0)
    c = t.add_child(t.select(), node_id=1, action="x")
    t.complete(c, ok=True, speedup=1.9)
    assert not t.done()
    c = t.add_child(t.select(), node_id=2, action="x")
    t.complete(c, ok=True, speedup=2.1)
    assert t.stop_reason == "target" and t.select() is None

    now = [100.0]
    t = Tree("t", budget=50, time_limit_s=30, clock=lambda: now[0])
    assert t.select() is not None
    now[0] = 131.0
    assert t.stop_reason == "time" and t.select() is None


# -------------------------------------------------------------------- repair

def test_failed_node_gets_limited_repairs():
    t = Tree("t", budget=50, max_repairs=2)
    f = t.add_child(t.select(), node_id=1, action="x")
    t.complete(f, ok=False, message="compile error")
    t.mark_exhausted(t.root)
    modes = []
    for i in (2, 3):
        leaf = t.select()
        assert leaf is f
        modes.append(leaf.mode)
        r = t.add_child(leaf, node_id=i, action="llm:repair", mode=leaf.mode)
        t.complete(r, ok=False)
        t.mark_exhausted(r)
    assert modes == ["repair", "repair"]
    assert t.select() is None and t.stop_reason == "exhausted"
    assert [c.mode_created for c in f.children] == ["repair", "repair"]


def test_repair_that_works_is_expandable():
    t = Tree("t", budget=50, max_repairs=1)
    f = t.add_child(t.select(), node_id=1, action="x")
    t.complete(f, ok=False)
    t.mark_exhausted(t.root)
    r = t.add_child(t.select(), node_id=2, action="repair", mode="repair")
    t.complete(r, ok=True, speedup=3.0)
    leaf = t.select()
    assert leaf is r and leaf.mode == "improve"  # f used its one repair


# -------------------------------------------------------------------- rebuild

def _rows(tree: Tree, extra_pending: list[tuple[int, int]] = ()) -> list[dict]:
    rows = []
    for n in tree.nodes.values():
        rows.append({"id": n.node_id, "parent_id": n.parent.node_id if n.parent else None,
                     "action": n.action, "params": n.params, "hand_written": False,
                     "status": {"ok": "ok", "failed": "compile_error"}.get(n.status, "pending"),
                     "reward": n.reward, "speedup": n.speedup, "time_us": n.time_us,
                     "message": n.message})
    for nid, pid in extra_pending:
        rows.append({"id": nid, "parent_id": pid, "action": "x", "status": "pending",
                     "params": {}, "reward": None, "speedup": None, "time_us": None})
    return rows


def test_rebuild_equals_original_and_drops_pending():
    t = Tree("t", budget=20, seed=5, root_id=100)
    run(t, ids=itertools.count(101), steps=12)
    rows = _rows(t, extra_pending=[(200, 103), (201, 200)])  # 201 under a pending node
    r = Tree.rebuild("t", reversed(rows), budget=20, seed=5)
    assert r.root.node_id == 100 and r.evaluated == 12 == t.evaluated
    assert 200 not in r.nodes and 201 not in r.nodes and r.in_flight == 0
    for nid, n in t.nodes.items():
        m = r.nodes[nid]
        assert (m.visits, m.status, m.parent and m.parent.node_id) == \
               (n.visits, n.status, n.parent and n.parent.node_id)
        assert m.total == pytest.approx(n.total) and m.best == pytest.approx(n.best)
    assert r.best().node_id == t.best().node_id
    check_invariants(r)
    run(r, ids=itertools.count(300))
    assert r.evaluated == 20 and r.stop_reason == "budget"


def test_rebuild_without_root_is_an_error():
    with pytest.raises(ValueError, match="no root"):
        Tree.rebuild("t", [], budget=5)
