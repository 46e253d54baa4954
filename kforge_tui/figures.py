"""The figures every screen shows, and their units.

Figures (`TaskFigures`) are the one implementation of two rules that the store (`tasks()`), the
TUI's live model and the headless reporter all apply, so no two screens disagree:

- **One reference per task.** The eager reference (and the torch.compile one) is the median of
  every side-by-side measurement of the task: the task's baseline plus the eager time measured
  next to each verified candidate, with its spread. A single noisy draw moves it little, and every
  speedup is that reference over the candidate's own time, so ratios divide and a slower node
  never shows the larger speedup.
- **The winner (★).** Each verified candidate counts with its side-by-side re-timing when it has
  one (a child `confirm:#<id>`; a failed re-timing puts it out), else with its own figure; the
  fastest figure wins, but a figure whose own spread is above the task's threshold is *noisy* and
  cannot win until a re-timing brings its spread down. The threshold is `NOISY_SPREAD`, or twice
  the task's typical spread when that is higher: on a machine where every timing is rough (a
  loaded 2-core CPU: 100-300 %), the outliers are marked and the ★ is the fastest of the others,
  rather than no ★ at all. The fastest figure, noisy or not, is the *leader*: what the engine
  re-times next.

Below the store and the summary (both use it; it imports neither) and free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass

NOISY_SPREAD = 0.5  # (p90 - p10) / median above this: the figure is noisy and cannot be best
IN_FLIGHT = ("pending", "queued", "proposing", "static", "compile", "load", "verify", "time")


# ----------------------------------------------------------------------------- units

def fmt_us(v, compact: bool = False) -> str:
    """One unit rule everywhere: µs under 10 ms, then ms."""
    if v is None:
        return "—" if not compact else "-"
    sep = "" if compact else " "
    return f"{v / 1000:.2f}{sep}ms" if v >= 10000 else f"{v:.1f}{sep}µs"


def fmt_ms(v) -> str:
    """A whole-model time kept in milliseconds, written by the same unit rule."""
    return fmt_us(None if v is None else v * 1000.0)


def fmt_x(v) -> str:
    return "—" if not v else f"{v:.2f}×"


def fmt_pct(v) -> str:
    return "—" if v is None else f"{v:.0%}"


def fmt_s(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


# ----------------------------------------------------------------------------- figures

def spread_of(t: dict | None) -> float | None:
    """(p90 - p10) / median of one timing dict, None when it does not say."""
    if not isinstance(t, dict):
        return None
    med, p10, p90 = t.get("median_us"), t.get("p10_us"), t.get("p90_us")
    if not med or p10 is None or p90 is None:
        return None
    return max(0.0, (p90 - p10) / med)


def figure_fields(result: dict | None) -> dict:
    """What a node's stored result adds to its figure: its own spread and the eager and
    torch.compile times measured side by side with it (with their clocks, when labelled)."""
    r = result if isinstance(result, dict) else {}
    base, comp = r.get("baseline"), r.get("compiled")
    med = lambda t: t.get("median_us") if isinstance(t, dict) else None  # noqa: E731
    clk = lambda t: (t.get("clock") or "") if isinstance(t, dict) else ""  # noqa: E731
    return {"spread": spread_of(r.get("timing")), "eager_us": med(base), "compiled_us": med(comp),
            "eager_clock": clk(base), "compiled_clock": clk(comp)}


@dataclass
class NodeFigure:
    """The part of a node that figures are made of (a store row, or the TUI's events)."""

    node_id: int
    parent_id: int | None
    action: str
    status: str
    time_us: float | None = None
    spread: float | None = None  # the node's own timing spread
    eager_us: float | None = None  # eager, timed side by side with this node
    compiled_us: float | None = None
    eager_clock: str = ""
    compiled_clock: str = ""

    @property
    def is_retiming(self) -> bool:
        return self.action.startswith("confirm:")

    @property
    def is_candidate(self) -> bool:
        return self.parent_id is not None and not self.is_retiming and self.action != "root"


def retiming_action(node_id: int) -> str:
    """The action of a node that re-times candidate `node_id` (the engine's `confirm:#N`)."""
    return f"confirm:#{node_id}"


def retimed_node(action: str) -> int | None:
    """The kernel a re-timing node (`confirm:#N`) re-timed: N, which is the node the search tree
    holds (an edit of the re-timing is N's child); None for any other node."""
    return int(action.split("#", 1)[1]) if action.startswith("confirm:#") else None


@dataclass(frozen=True)
class Reference:
    """A pooled reference time: the median of `n` side-by-side measurements and their spread."""

    median_us: float | None
    spread: float | None = None
    n: int = 0
    clock: str = ""  # "device", "wall", ... when the measurements say; "" when they do not

    def over(self, time_us: float | None) -> float | None:
        """This reference over a candidate's time: the only speedup kforge shows."""
        if not self.median_us or not time_us:
            return None
        return self.median_us / time_us


def _quantile(xs: list[float], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def pool(samples: list[float], own_spread: float | None = None, clock: str = "") -> Reference:
    """The robust estimate of many measurements of one thing: their median, and (p90 - p10) /
    median as the spread (one measurement: its own spread)."""
    xs = sorted(x for x in samples if x)
    if not xs:
        return Reference(None, None, 0, clock)
    med = _quantile(xs, 0.5)
    spread = own_spread if len(xs) == 1 else (_quantile(xs, 0.9) - _quantile(xs, 0.1)) / med
    return Reference(med, spread, len(xs), clock)


class TaskFigures:
    """One task's reference times and winner, from its baseline and its nodes' figures.

    Cheap to update one node at a time (the TUI folds events into it); the reference and the
    winner are computed on demand and cached until the next update.
    """

    def __init__(self, baseline: dict | None = None) -> None:
        self.baseline: dict = baseline or {}
        self.nodes: dict[int, NodeFigure] = {}
        self._cache: dict = {}

    def set_baseline(self, baseline: dict | None) -> None:
        self.baseline = baseline or {}
        self._cache.clear()

    def update(self, fig: NodeFigure) -> None:
        self.nodes[fig.node_id] = fig
        self._cache.clear()

    def reference(self, key: str = "eager") -> Reference:
        """The pooled `eager` or `compiled` reference of the task."""
        if key not in self._cache:
            base = self.baseline.get(key) if isinstance(self.baseline.get(key), dict) else None
            samples = [base["median_us"]] if base and base.get("median_us") else []
            clocks = {(base or {}).get("clock") or self.baseline.get("clock") or ""} if base else set()
            for n in self.nodes.values():
                if n.status == "ok" and n.parent_id is not None:
                    v = n.eager_us if key == "eager" else n.compiled_us
                    if v:
                        samples.append(v)
                        clocks.add(n.eager_clock if key == "eager" else n.compiled_clock)
            clocks.discard("")
            clock = clocks.pop() if len(clocks) == 1 else ("mixed" if clocks else "")
            self._cache[key] = pool(samples, spread_of(base), clock)
        return self._cache[key]

    def speedup(self, time_us: float | None, key: str = "eager") -> float | None:
        return self.reference(key).over(time_us)

    def threshold(self) -> float:
        """The spread above which a figure of this task is noisy (see the module docstring)."""
        if "threshold" not in self._cache:
            spreads = sorted(n.spread for n in self.nodes.values()
                             if n.status == "ok" and n.parent_id is not None and n.spread is not None)
            typical = _quantile(spreads, 0.5) if spreads else 0.0
            self._cache["threshold"] = max(NOISY_SPREAD, 2.0 * typical)
        return self._cache["threshold"]

    def noisy(self, fig: NodeFigure | None) -> bool:
        return fig is not None and fig.spread is not None and fig.spread > self.threshold()

    def _rank(self) -> tuple[NodeFigure | None, NodeFigure | None, dict[int, NodeFigure]]:
        """(best, leader, the figure each verified candidate counts with)."""
        if "rank" in self._cache:
            return self._cache["rank"]
        retimes: dict[int, list[NodeFigure]] = {}
        for n in self.nodes.values():
            if n.is_retiming and n.status not in IN_FLIGHT and n.status != "lost":
                retimes.setdefault(n.parent_id, []).append(n)
        best = leader = None
        counts: dict[int, NodeFigure] = {}
        for nid in sorted(self.nodes):
            n = self.nodes[nid]
            if not n.is_candidate or n.status != "ok" or not n.time_us:
                continue
            conf = retimes.get(nid, [])
            if any(c.status != "ok" for c in conf):
                continue  # its re-timing failed: out
            figs = [c for c in conf if c.time_us] or [n]
            quiet = [f for f in figs if not self.noisy(f)]
            fig = min(quiet or figs, key=lambda f: f.time_us)
            counts[nid] = fig
            if leader is None or fig.time_us < leader.time_us:
                leader = fig
            if not self.noisy(fig) and (best is None or fig.time_us < best.time_us):
                best = fig
        self._cache["rank"] = (best, leader, counts)
        return self._cache["rank"]

    def best(self) -> NodeFigure | None:
        """The winner (★): the fastest quiet figure; the re-timing row when there is one."""
        return self._rank()[0]

    def leader(self) -> NodeFigure | None:
        """The fastest figure, noisy or not: the engine re-times it when it is noisy."""
        return self._rank()[1]

    def history(self, order: list[int]) -> list[float]:
        """Best speedup after each finished candidate, in `order` (node creation order), by the
        figures as they stand now (one pass)."""
        counts = self._rank()[2]
        ref = self.reference()
        out, best = [], None
        for nid in order:
            n = self.nodes.get(nid)
            if n is None or not n.is_candidate or n.status in IN_FLIGHT or n.status == "lost":
                continue
            fig = counts.get(nid)
            if fig is not None and not self.noisy(fig) and (best is None or fig.time_us < best):
                best = fig.time_us
            out.append(ref.over(best) or 0.0)
        return out
