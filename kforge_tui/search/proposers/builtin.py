"""The built-in, offline proposer: MCTS moves through the parameter spaces of the kernel families.

Moves (the action label is what the tree shows):
  root     "family:<name>"       start a family at its default point (one child per family);
                                 once a default is taken, its nearest untried neighbour.
  improve  "set:<param>=<value>"  change one parameter of the parent to a neighbouring value
           "family:<name>"       switch family, carrying over the parameters both share
  repair   "repair:<param>=<v>"  a smaller threads / vec / warps / ... (the usual causes of
                                 register spills, launch failures and misaligned packs)
           "repair:default"      back to the family's default point
Never a parameter point already in ctx.tried, nor one whose kernel renders exactly like one the
task has tried (ctx.sources: a `math` knob the region's ops ignore, two labels for one kernel),
nor one whose render raised (passed over for the next move, so the budget slot still gets a
candidate; kept in `unrenderable` and named in the proposal's `response`); `can_expand` is
False when none is left.

Which move is taken is a weighted random draw seeded from ctx.seed and the node, so the search
explores; the weights are priors from GPU reasoning that look only at the task's sizes (wider
loads when a pack is under 16 bytes, more blocks when the grid underfills the SMs, warp per row
for short rows, split rows when rows are few and long). No benchmark shape is special-cased:
what wins is decided by the measurements MCTS backs up.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

from kforge_tui.regions.task import Task
from kforge_tui.search.designs import Design, designs_for, designs_in
from kforge_tui.search.families._common import ELEM_BYTES
from kforge_tui.search.proposers.base import Proposal, ProposalContext
from kforge_tui.search.seed_rewrite import unseedable

SHRINK = ("threads", "vec", "warps", "lanes", "channels", "unroll", "chunks", "splits", "cluster", "keep",
          "rows")
# Families whose kernels use sm_90 thread-block clusters (refused for an older known GPU);
# coop_row and chan_block name cluster types in their sources too.
CLUSTER_FAMILIES = ("cluster_row", "cluster_group", "coop_row", "chan_block")


@dataclass(frozen=True)
class Move:
    action: str
    family: Design
    params: dict
    prior: float

    @property
    def full(self) -> dict:
        return {"family": self.family.name, **self.params}


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


class BuiltinProposer:
    """Implements the `Proposer` protocol of search/proposers/base.py with no network."""

    name = "builtin"

    def __init__(self, families=designs_for):
        self._families = families
        # task id -> points whose kernel renders like one already tried (passed over for good)
        self._alike: dict[str, set[str]] = {}
        # task id -> {point: why its render raised}: passed over for good, kept to be read
        self.unrenderable: dict[str, dict[str, str]] = {}

    # ------------------------------------------------------------------ protocol
    async def propose(self, ctx: ProposalContext) -> Proposal:
        try:
            task = Task.from_json(ctx.task)
            moves = self.moves(ctx, task)
        except Exception as e:  # a malformed context is a failed proposal, not a crash
            return Proposal(None, "builtin:error", self.name, error=f"builtin proposer: {e}")
        if not moves:
            return Proposal(None, "exhausted", self.name, exhausted=True,
                            error="no untried parameter point is reachable from this node")
        rng = random.Random(f"{ctx.seed}:{ctx.parent.node_id}:{len(ctx.siblings)}:{len(ctx.tried)}")
        dropped: list[str] = []
        while moves:  # drawn by prior; a point that renders a kernel tried already is passed over
            mv = rng.choices(moves, weights=[m.prior for m in moves], k=1)[0]
            moves.remove(mv)
            try:
                src = mv.family.render(task, mv.params)
            except Exception as e:
                # a point valid() admits but render refuses is a bug of its design, not a
                # candidate: the budget slot goes to the next move, and the point is noted
                why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                self.unrenderable.setdefault(task.task_id, {})[_key(mv.full)] = why
                dropped.append(f"passed over {mv.action} {_key(mv.full)}: render failed: {why}")
                if not moves:  # with it out of the way a root offers the default's next neighbour
                    moves = self.moves(ctx, task)
                continue
            if src not in ctx.sources:
                return Proposal(src, mv.action, self.name, params=mv.full, exhausted=not moves,
                                response="\n".join(dropped) or None)
            self._alike.setdefault(task.task_id, set()).add(_key(mv.full))
        if dropped:
            return Proposal(None, "exhausted", self.name, exhausted=True, response="\n".join(dropped),
                            error="no untried parameter point reachable from this node renders a new "
                                  f"kernel ({len(dropped)} failed to render; the last: {dropped[-1]})")
        return Proposal(None, "exhausted", self.name, exhausted=True,
                        error="every untried parameter point reachable from this node renders a kernel "
                              "already tried")

    def serves(self, task: Task, languages=()) -> bool:
        """Whether any design can write a kernel for this region (else a search of it would end
        at once with 0 candidates: selection passes it over, workload/select.py). A search in
        Triton starts from Inductor's own kernel, which the worker compiles later: it serves,
        and no seed is generated here to find out (that would cache a seed that is not the
        worker's autotuned one), unless the region's graph alone rules a seed out (a
        convolution: seed_rewrite.unseedable)."""
        if "triton" in (languages or ()) and unseedable(task) is None:
            return True
        try:
            return bool(self._families(task))
        except Exception:
            return False

    def can_expand(self, ctx: ProposalContext) -> bool:
        try:
            return bool(self.moves(ctx, Task.from_json(ctx.task)))
        except Exception:
            return False

    # ------------------------------------------------------------------ moves
    def _designs(self, task: Task, ctx: ProposalContext) -> list:
        """The task's designs in every language the search proposes in (an `auto` run: the
        Triton seed's variants and the CUDA families and generated kernels, so `family:` moves
        switch between them); an injected design list is used as given."""
        if self._families is designs_for and any(lang != task.backend for lang in ctx.languages or ()):
            return designs_in(task, ctx.languages)
        return self._families(task)

    def moves(self, ctx: ProposalContext, task: Task) -> list[Move]:
        fams = [f for f in self._designs(task, ctx) if self._usable(f, ctx)]
        if not fams:
            return []
        seen = {_key(p) for p in ctx.tried if p} | self._alike.get(task.task_id, set())
        seen |= set(self.unrenderable.get(task.task_id, {}))
        seen |= {_key(n.params) for n in ctx.siblings if n.params}
        pp = dict(ctx.parent.params or {})
        parent_fam = next((f for f in fams if f.name == pp.get("family")), None)
        if parent_fam is not None:
            seen.add(_key(pp))
        if ctx.mode == "root" or parent_fam is None:
            out = self._root_moves(task, fams, seen, ctx)
        elif ctx.mode == "repair":
            out = self._repair_moves(task, fams, parent_fam, pp, seen, ctx)
        else:
            out = self._improve_moves(task, fams, parent_fam, pp, seen, ctx)
        # one move per distinct parameter point (two labels may reach the same point)
        uniq: dict[str, Move] = {}
        for m in out:
            k = _key(m.full)
            if k not in seen and (k not in uniq or uniq[k].prior < m.prior):
                uniq[k] = m
        return list(uniq.values())

    def _root_moves(self, task, fams, seen, ctx) -> list[Move]:
        out = []
        for f in fams:
            d = f.default(task)
            if _key({"family": f.name, **d}) not in seen:
                out.append(Move(f"family:{f.name}", f, d, self._family_prior(task, f, ctx)))
                continue
            for k, v, q in self._neighbours(task, f, d, self.unrenderable.get(task.task_id, {})):
                if _key({"family": f.name, **q}) not in seen:
                    out.append(Move(f"family:{f.name}", f, q, 0.5 * self._family_prior(task, f, ctx)))
                    break
        return out

    def _improve_moves(self, task, fams, fam, pp, seen, ctx) -> list[Move]:
        cur = {k: pp[k] for k in fam.space if k in pp}
        if not fam.valid(task, cur):
            cur = fam.default(task)
        out = [Move(f"set:{k}={v}", fam, q, self._set_prior(task, fam, cur, k, v, ctx))
               for k, v, q in self._neighbours(task, fam, cur, self.unrenderable.get(task.task_id, {}))]
        for other in fams:
            if other.name == fam.name:
                continue
            q = other.default(task)
            for k in other.space:
                if k in cur and cur[k] != q[k]:
                    trial = {**q, k: cur[k]}
                    if other.valid(task, trial):
                        q = trial
            out.append(Move(f"family:{other.name}", other, q, self._family_prior(task, other, ctx)))
        return out

    def _repair_moves(self, task, fams, fam, pp, seen, ctx) -> list[Move]:
        cur = {k: pp[k] for k in fam.space if k in pp}
        out, broken = [], self.unrenderable.get(task.task_id, {})
        if fam.valid(task, cur):
            for k in SHRINK:
                if k not in fam.space or cur[k] not in fam.space[k]:
                    continue
                i = fam.space[k].index(cur[k])
                for j in range(i - 1, -1, -1):
                    q = {**cur, k: fam.space[k][j]}
                    if fam.valid(task, q) and _key({"family": fam.name, **q}) not in broken:
                        out.append(Move(f"repair:{k}={q[k]}", fam, q, 2.0))
                        break
        out.append(Move("repair:default", fam, fam.default(task), 3.0))
        for other in fams:
            if other.name != fam.name:
                out.append(Move(f"family:{other.name}", other, other.default(task), 0.5))
        return out

    @staticmethod
    def _neighbours(task, fam: Design, cur: dict, broken=()):
        """(param, value, params) one step up or down each axis; skips over invalid values once,
        and over points whose render raised (`broken`: keys of full points), which would else
        hide the values past them."""
        for k, vals in fam.space.items():
            if cur.get(k) not in vals:
                continue
            i = vals.index(cur[k])
            for step in (1, -1):
                for j in (i + step, i + 2 * step):
                    if 0 <= j < len(vals):
                        q = {**cur, k: vals[j]}
                        if fam.valid(task, q) and _key({"family": fam.name, **q}) not in broken:
                            yield k, vals[j], q
                            break

    @staticmethod
    def _usable(fam: Design, ctx) -> bool:
        """Cluster kernels need compute capability 9.0+; an unknown device is given the benefit."""
        if fam.name not in CLUSTER_FAMILIES:
            return True
        cc = str((ctx.device or {}).get("compute_capability") or "")
        try:
            return not cc or float(cc) >= 9.0
        except ValueError:
            return True

    # ------------------------------------------------------------------ priors
    @staticmethod
    def _sms(task: Task, ctx) -> int:
        sms = int((ctx.device or {}).get("sms") or 0)
        return sms or (132 if task.backend == "cuda" else 2)

    def _family_prior(self, task: Task, fam: Design, ctx) -> float:
        """Root weight of a family from the shape alone: rows = independent rows (groups,
        channels), n = elements per row, its bytes, the dtype and the device's SM count; never a
        benchmark shape. One rule per family (S = SMs, B = row bytes = n x element size):

          warp_row       B <= 4 KB: a row in one warp's registers, no barriers          3.0
          block_row/_group  rows >= S and B > 4 KB: a block per row fills the GPU       2.5
          coop_row       rows < S and n >= 8192: every SM on few long rows (groups),
                         chunks kept on chip                                           4.0
          cluster_row    rows >= S and B >= 256 KB: a row over 16 CTAs whose chunks
                         stay in shared memory (one DRAM read)                          3.5
                         rows < S and n >= 16384                                        2.5
          split_row      rows < S and n >= 16384 (two launches and a scratch alloc)     1.5
          cluster_group  rows < 2S: 4.0 when x fits in 70 % of L2, else                  2.5
          two_phase      rows < 2S                                                       3.0
          global_tile    window <= 1024 elements (channels tiled through smem)          3.0
          global_warp    window <= 256: 3.5 when a channel is whole 16-byte packs, else 1.5
          chan_block     window >= 1024: a block per channel, 4.0 when channels < S     3.5
          flat_vec       silu*b rows shorter than 1024: whole blocks busy               3.0
          rows_vec       silu*b rows of 1024 and more                                   2.5
        Anything else 1.0; a family outside its rule 0.3-0.5 (still reachable)."""
        rows, n = fam.extent(task)
        sms = self._sms(task, ctx)
        eb = ELEM_BYTES.get(task.dtype, 4)
        row_bytes = n * eb
        name, op = fam.name, getattr(fam, "op", "")
        if task.backend != "cuda":
            return 1.0
        if name == "warp_row":
            return 3.0 if row_bytes <= 4096 else 0.5
        if name in ("block_row", "block_group"):
            if rows >= sms:
                return 2.5 if row_bytes > 4096 else 1.0
            return 0.5 if n >= 8192 else 1.0
        if name == "coop_row":
            if rows < sms and n >= 8192:
                return 4.0
            return 2.0 if rows < 2 * sms and n >= 8192 else 0.3
        if name == "cluster_row":
            if rows >= sms and row_bytes >= 256 * 1024:
                return 3.5
            return 2.5 if rows < sms and n >= 16384 else 0.5
        if name == "split_row":
            return 1.5 if rows < sms and n >= 16384 else 0.3
        if name == "cluster_group":
            if rows < 2 * sms:
                # on-chip combine + an L2-resident re-read: best when the tensor fits in L2
                l2 = int((ctx.device or {}).get("l2_bytes") or 50 * 2**20)
                return 4.0 if rows * row_bytes <= 0.7 * l2 else 2.5
            return 0.5
        if name == "two_phase":
            return 3.0 if rows < 2 * sms else 0.5
        if name == "global_tile":
            return 3.0 if n <= 1024 else 1.0
        if name == "global_warp":
            # whole 16-byte packs per channel (H200: [10^6 ch, 4x4] bf16 15.1 us vs the tile's 33.7)
            return (3.5 if row_bytes % 16 == 0 else 1.5) if n <= 256 else 1.0
        if name == "chan_block":
            if n >= 1024:
                return 4.0 if rows < sms else 3.5
            return 0.5
        if name == "flat_vec":
            return 3.0 if n < 1024 else 1.0
        if name == "rows_vec":
            return 2.5 if n >= 1024 else 0.5
        return 1.0

    def _set_prior(self, task: Task, fam: Design, cur: dict, k: str, v, ctx) -> float:
        rows, n = fam.extent(task)
        sms = self._sms(task, ctx)
        up = fam.space[k].index(v) > fam.space[k].index(cur[k])
        eb = ELEM_BYTES.get(task.dtype, 4)
        if k == "vec":
            return 3.0 if up and cur[k] * eb < 16 else (0.4 if up else 0.7)
        if k == "cluster":
            ctas = rows * cur[k]
            if ctas < sms:
                return 2.5 if up else 0.4
            return 0.5 if up else 1.2
        if k == "unroll":
            return 1.5 if up and cur[k] < 4 else 1.0
        if k == "threads" and fam.name == "block_row" and fam.op in ("layer_norm", "rms_norm", "softmax",
                                                                      "log_softmax"):
            # fewer threads per row = more rows (blocks) in flight and cheaper barriers
            return 1.5 if not up else 0.8
        if k in ("chunks", "splits"):
            blocks = rows * cur[k]
            if blocks < 2 * sms:
                return 2.5 if up else 0.4
            return 0.6 if up else 1.5 if blocks > 16 * sms else 1.0
        if k == "warps":
            per_block = cur[k] * 32 // max(1, cur.get("lanes", 32))
            if rows / per_block < 2 * sms:
                return 0.4 if up else 2.5
            return 1.0
        if k == "rows":  # rows per lane group: more loads in flight when the grid has blocks to spare
            per_block = cur.get("warps", 4) * 32 // max(1, cur.get("lanes", 32)) * cur[k]
            return (2.0 if rows / per_block >= 8 * sms else 0.5) if up else 1.0
        if k == "channels":  # tiny windows: more channels per block while >= 4 blocks per SM remain
            return (1.5 if rows / cur[k] >= 8 * sms else 0.5) if up else 1.0
        if k == "grid":  # a persistent grid pays for itself on tensors of many waves
            return 1.5 if (v == "persist") == (rows * n >= 2**27) else 0.5
        if k == "cache":
            return 2.0 if v == "regs" else 0.5
        if k == "keep":
            # split rows: holding the chunk on chip saves its re-read; while the whole tensor fits
            # on chip (about 200 KB a SM) more keep is the move, beyond it both ways are live
            if rows * n * eb <= sms * 200 * 1024:
                return 2.0 if up else 0.7
            return 1.5
        # Round 3 on the H200 (bench/NOTES.md): `minb` gave layer_norm's best point; `pipe` was
        # level (±5 %); `wpre` (+41 %, register pressure) and both load hints (+13 %) were worse
        # on the cases measured, so they stay in the space at a low prior.
        if k == "minb":
            return 1.3
        if k == "pipe":
            return 1.0
        if k in ("hint", "wpre"):
            return 0.5 if v not in ("none", 0) else 1.0
        if k == "math":
            return 1.5 if v == "fast" else 1.0
        if k == "mode":
            return 1.5 if v == "online" else 0.7
        return 1.0
