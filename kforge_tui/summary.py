"""The run summary and the figures every screen shows: what `kforge show` prints, the engine returns
at the end of a run and the TUI prints when it closes. Read from the store only, so every consumer
tells the same story.

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

Its own module (not report.py) because the engine and the store need it and report.py runs the engine.
"""
from __future__ import annotations

import os
import shutil
import time
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


# ----------------------------------------------------------------------------- phases

PHASE_LABELS = {"load": "load", "capture": "capture", "profile": "profile", "baseline": "baselines",
                "search": "search", "integrate": "end-to-end check"}
ENDS = ("done", "failed", "interrupted")


def phase_times(phases: list[tuple[str, float]], end: float | None) -> list[tuple[str, float]]:
    """How long each phase took, from the phase events' times: a phase lasts until the next one
    starts (or `end`); repeats (a resume, more budget after the search) add up; the idle time
    after the search ("done") counts for nothing."""
    totals: dict[str, float] = {}
    for (name, ts), nxt in zip(phases, [*phases[1:], (None, end)]):
        if name in ENDS or nxt[1] is None:
            continue
        totals[name] = totals.get(name, 0.0) + max(0.0, nxt[1] - ts)
    order = [p for p in PHASE_LABELS if p in totals] + [p for p in totals if p not in PHASE_LABELS]
    return [(p, totals[p]) for p in order]


def format_phases(rows: list[dict]) -> str:
    return "phases: " + ", ".join(f"{PHASE_LABELS.get(r['phase'], r['phase'])} {fmt_s(r['seconds'])}"
                                  for r in rows) if rows else ""


def _stored_phases(store, live: bool) -> list[dict]:
    ph = [(e.get("name", ""), float(e.get("ts") or 0)) for e in store.events() if e.get("type") == "Phase"]
    if not ph:
        return []
    info = store.run_info()
    end = time.time() if live else max(info.get("updated") or 0, (store.heartbeat() or {}).get("beat") or 0,
                                       ph[-1][1])
    return [{"phase": p, "seconds": round(s, 2)} for p, s in phase_times(ph, end)]


# ----------------------------------------------------------------------------- show --json

def show_json(run_dir: str, store=None) -> dict:
    """DESIGN.md `show --json`: {"tasks": [{op, shape, dtype, baseline_us, best_us, speedup, verified,
    best_node, evaluated, budget, ...}], ...}. `baseline_us` and `compiled_us` are the pooled
    references, `speedup` is `baseline_us / best_us` (and `speedup_vs_compile` `compiled_us /
    best_us`), exactly."""
    from kforge_tui.store import RunStore, owner_pid

    own = store is None
    store = store or RunStore.open(run_dir, readonly=True)
    try:
        info = store.run_info()
        tasks = []
        for t in store.tasks():
            ref, comp = t["reference"]["eager"], t["reference"]["compiled"]
            best_us = t.get("best_us")
            tasks.append({
                "task_id": t["task_id"], "op": t["op"], "shape": t["shape"], "dtype": t["dtype"],
                "baseline_us": ref["median_us"], "baseline_spread": ref["spread"], "baseline_n": ref["n"],
                "baseline_clock": ref["clock"], "compiled_us": comp["median_us"],
                "compiled_spread": comp["spread"], "compiled_clock": comp["clock"],
                "floor_us": t.get("floor_us"), "best_us": best_us, "best_spread": t.get("best_spread"),
                "speedup": t.get("speedup"), "speedup_vs_compile": t.get("speedup_vs_compile"),
                "verified": bool(t.get("verified")), "best_node": t.get("best_node"),
                "leader_node": t.get("leader_node"), "noisy_leader": t.get("noisy_leader"),
                "evaluated": t.get("evaluated", 0), "budget": t.get("budget"), "status": t.get("status"),
                "control": t.get("control") or {},
            })
        live = info.get("status") == "running" and owner_pid(store.run_dir) is not None
        status = info.get("status")
        if status == "running" and not live:
            status = "interrupted"  # nobody runs it any more (killed): `kforge resume` continues it
        return {"run_dir": str(run_dir), "model": info.get("model"), "status": status,
                "owner_pid": owner_pid(store.run_dir) if live else None,
                "device": info.get("device"), "proposer": info.get("proposer"),
                "llm": store.llm_totals(), "tasks": tasks, "phases": _stored_phases(store, live),
                "end_to_end": info.get("end_to_end")}
    finally:
        if own:
            store.close()


# ----------------------------------------------------------------------------- text

def terminal_width(default: int = 100) -> int:
    """$COLUMNS, else the terminal's width, else `default` (pipes, CI)."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
        if cols > 0:
            return cols
    except ValueError:
        pass
    try:
        return os.get_terminal_size(1).columns
    except OSError:
        return shutil.get_terminal_size((default, 24)).columns


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else (s[:max(n - 1, 0)] + "…" if n > 0 else "")


def format_table(cols: list[tuple[str, str, list[str]]], width: int, squeeze: str,
                 drop: tuple[str, ...] = ()) -> list[str]:
    """Columns (key, header, cells) laid out in `width`: drop the columns named in `drop` (in
    that order) while it does not fit, then shorten the `squeeze` column (ending it with …).
    Headers and cells right-aligned except the first column and the last."""
    cols = list(cols)
    widths = {k: max([len(h), *map(len, cells)]) for k, h, cells in cols}

    def total():
        return sum(widths[k] for k, _, _ in cols) + 2 * (len(cols) - 1)

    for k in drop:
        if total() <= width:
            break
        cols = [c for c in cols if c[0] != k]
    if total() > width and squeeze in widths:
        widths[squeeze] = max(8, widths[squeeze] - (total() - width))
    rows = []
    n = max((len(c[2]) for c in cols), default=0)
    for i in range(-1, n):
        parts = []
        for j, (k, h, cells) in enumerate(cols):
            text = _clip(h if i < 0 else cells[i], widths[k])
            left = j == 0 or j == len(cols) - 1 or k == squeeze
            parts.append(text.ljust(widths[k]) if left else text.rjust(widths[k]))
        rows.append("  ".join(parts).rstrip())
    return rows


def _shape(t: dict) -> str:
    return "x".join(str(s) for s in (t.get("shape") or []))


def format_show(data: dict, width: int | None = None) -> str:
    """The per-op table, fitted to `width` (default: the terminal's): columns that do not fit
    go (floor first), then long op names are shortened; shapes are never cut."""
    width = width or terminal_width()
    ts = data["tasks"]
    cols = [("op", "op", [t["op"] for t in ts]), ("shape", "shape", [_shape(t) for t in ts]),
            ("dtype", "dtype", [t["dtype"] for t in ts]),
            ("eager", "eager", [fmt_us(t["baseline_us"]) for t in ts]),
            ("spread", "±", [fmt_pct(t.get("baseline_spread")) for t in ts]),
            ("compile", "compile", [fmt_us(t.get("compiled_us")) for t in ts]),
            ("best", "best", [fmt_us(t["best_us"]) for t in ts]),
            ("x", "vs eager", [fmt_x(t["speedup"]) for t in ts]),
            ("xc", "vs comp.", [fmt_x(t.get("speedup_vs_compile")) for t in ts]),
            ("floor", "floor", [fmt_us(t.get("floor_us")) for t in ts]),
            ("evals", "evals", [f"{t['evaluated']}/{t['budget']}" for t in ts]),
            ("status", "status", [("✓ " if t["verified"] else "✗ ") + (t.get("status") or "")
                                  + (" (noisy leader)" if t.get("noisy_leader") else "") for t in ts])]
    if not any(t.get("compiled_us") for t in ts):
        cols = [c for c in cols if c[0] not in ("compile", "xc")]
    head = _clip(f"[{data.get('status')}] run {data['run_dir']}  model {data.get('model')}", width)
    table = format_table(cols, width, "op", drop=("floor", "spread", "dtype", "xc", "compile"))
    lines = [head, table[0], "─" * min(width, max(len(r) for r in table)), *table[1:]]
    clocks = {c for t in ts for c in (t.get("baseline_clock"), t.get("compiled_clock")) if c}
    if clocks:
        lines.append("clocks: " + ", ".join(sorted(clocks)) + " (each reference as its row labels it)")
    refs = "eager, compile: the pooled references" if any(c[0] == "compile" for c in cols) else \
        "eager: the pooled reference"
    lines.append(_clip(f"{refs} (median of every side-by-side timing); vs eager = eager / best", width))
    if data.get("phases"):
        lines.append(format_phases(data["phases"]))
    e2e = data.get("end_to_end")
    if e2e:
        lines.append("")
        lines.append(format_end_to_end(e2e))
    llm = data.get("llm") or {}
    if llm.get("calls"):
        lines.append(f"LLM: {llm['calls']} calls, {llm.get('prompt_tokens', 0)}+{llm.get('completion_tokens', 0)} "
                     f"tokens, ${llm.get('cost_usd', 0):.4f}")
    return "\n".join(lines)


def format_end_to_end(r: dict) -> str:
    used = r.get("kernels_used") or {}
    ok = "within tolerance" if r.get("within_tolerance") else "MISMATCH"
    if r.get("eager_ms") is None:
        lines = [f"end to end: {r.get('message') or 'no kernel applied'}"]
    else:
        spread = ""
        if r.get("eager_spread") is not None and r.get("patched_spread") is not None:
            spread = f", spread {r['eager_spread']:.0%} / {r['patched_spread']:.0%}"
        comp = ""
        if r.get("compile_ms") is not None:
            comp = (f", torch.compile {fmt_ms(r['compile_ms'])} "
                    f"({fmt_x(r.get('speedup_vs_compile'))} vs compile)")
        lines = [f"end to end: eager {fmt_ms(r['eager_ms'])}{comp} → kforge {fmt_ms(r['patched_ms'])} "
                 f"({fmt_x(r.get('speedup'))} vs eager{spread}); max abs err "
                 f"{r.get('max_abs_err', float('nan')):.3g} ({ok})"]
        if r.get("mode"):
            lines.append(f"  mode: {r['mode']}" + (f" ({r['mode_reason']})" if r.get("mode_reason") else "")
                         + (f", Inductor mode {r['inductor_mode']}" if r.get("inductor_mode") not in
                            (None, "default") else ""))
        if r.get("noisy"):
            lines.append(f"  noisy timing even after {r.get('iters')} pairs: read the speedup as rough; "
                         "re-run `kforge apply RUN_DIR MODEL` on a quiet machine")
    clocks = []
    for clock in ("throughput", "latency"):
        c = r.get(clock) or {}
        if c.get("kforge") and c.get("compile"):
            clocks.append(f"{clock} {c['compile']['median_ms']:.3f} → {c['kforge']['median_ms']:.3f} ms "
                          f"({c['compile']['median_ms'] / c['kforge']['median_ms']:.2f}×)")
    db = r.get("do_bench_ms") or {}
    if db.get("compile") and db.get("kforge"):
        clocks.append(f"do_bench {db['compile']:.3f} → {db['kforge']:.3f} ms ({db['compile'] / db['kforge']:.2f}×)")
    if clocks:
        lines.append("  torch.compile → kforge: " + "; ".join(clocks)
                     + (f" (decided on {r['clock']})" if r.get("clock") else ""))
    for t in (r.get("decision") or {}).get("trials", []):
        lines.append(f"  {'kept' if t.get('kept') else 'dropped'} {t.get('op') or t['task_id']}: {t.get('why', '')}")
    for tid, n in used.items():
        lines.append(f"  kernel {tid}: {n} calls")
    falls = sorted((r.get("fallbacks") or {}).items(), key=lambda kv: -kv[1])
    for what, n in falls[:3]:
        lines.append(f"  fell back to PyTorch ({n} calls): {what}")
    if len(falls) > 3:
        lines.append(f"  … and {len(falls) - 3} more call sites fell back ({sum(n for _, n in falls[3:])} calls; "
                     "`kforge apply --json` lists them)")
    tried = {t["task_id"] for t in (r.get("decision") or {}).get("trials", [])}
    for tid, why in (r.get("skipped") or {}).items():
        if tid not in tried:
            lines.append(f"  left to PyTorch / Inductor {tid}: {why}")
    return "\n".join(lines)


def _arg(s: str | None) -> str:
    import shlex

    return shlex.quote(str(s)) if s else "MODEL"


def format_next_steps(data: dict) -> str:
    """What to do after this run, with the run's own directory and model (no placeholders)."""
    run, model = _arg(data["run_dir"]), _arg(data.get("model"))
    if data.get("status") == "interrupted":
        return f"kforge: the run was interrupted (its process is gone); `kforge resume {run}` continues it"
    if not any(t["verified"] for t in data["tasks"]):
        return "kforge: no verified kernel was found for any op"
    if data.get("status") not in ("finished",) and any(
            (t.get("evaluated") or 0) < (t.get("budget") or 0) and t.get("status") not in ("done", "stopped")
            for t in data["tasks"]):
        return f"kforge: the search was stopped early; `kforge resume {run}` continues it to the budget"
    if not data.get("end_to_end"):
        return (f"kforge: the end-to-end check did not run; `kforge apply {run} {model}` checks and times "
                f"the patched model, `kforge export {run} OUT_DIR` packages the kernels")
    return f"kforge: `kforge export {run} OUT_DIR` packages the kernels (torch only)"


def format_attached_close(data: dict, pid: int | None) -> str:
    """Closing `kforge tui` on a run another process still runs: it goes on; how to come back."""
    run = _arg(data["run_dir"])
    done = sum(t.get("evaluated") or 0 for t in data["tasks"])
    return (f"kforge: the run goes on in process {pid} ({len(data['tasks'])} ops, {done} candidates so far); "
            f"`kforge tui {run}` reattaches, `kforge show {run}` prints its results")


__all__ = ["NOISY_SPREAD", "NodeFigure", "Reference", "TaskFigures", "figure_fields", "fmt_us", "fmt_x",
           "format_show", "format_next_steps", "phase_times", "show_json"]
