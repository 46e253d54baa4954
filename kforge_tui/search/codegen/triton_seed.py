"""Triton designs seeded from Inductor: torch.compile's own kernel for the region, and moves over it.

For a task on the `triton` backend, each design is one Inductor variant of the region's code
(search/inductor_seed.py), rewritten to the candidate ABI:

  inductor          what torch.compile generates by default (its default point is the seed
                    node: Inductor's kernel with the config its autotuner picked, when the seed
                    came from the worker's compile of the region, else its first heuristic config)
  inductor_looped   reductions as a loop over R0_BLOCK chunks (`persistent_reductions=False`)
                    where Inductor's default keeps the whole row in registers: persistent vs looped
  inductor_nosplit  without Inductor's split reductions (its two-kernel split of a long reduction
                    into partials + a tiny combining kernel is the default where it applies)
  inductor_coop     the reduction split over RSPLIT programs per row that combine through a
                    workspace at a grid barrier (cooperative launch; GPU only): long rows, few rows

A variant identical to an earlier one is not offered. Parameters (of the main kernel: the
reduction, else the largest launch; the others keep Inductor's config):
  XBLOCK / YBLOCK   rows (tile) per program            R0_BLOCK   chunk of a looped reduction
  num_warps         1..32                              num_stages 1..4 (software pipelining)
  evict             inductor (Inductor's eviction_policy hints) | none | stream (evict_first on
                    every load: one-pass streaming)
Moves between designs (the proposer's "family:" moves) are persistent <-> looped, split or not,
cooperative or not.

Family kernels (search/families) and the other generated designs are CUDA/C++ sources. An `auto`
run (the default on a GPU, search/languages.py) searches one tree per region in both languages:
the `inductor` design's default point is node zero (search/node_zero.py), and the built-in
proposer's `family:` moves switch between these Triton variants and the CUDA designs
(search/designs.designs_in). On the CPU (no GPU: CI) the default point is, of Inductor's own
candidate configs, the one with the fewest programs: the interpreter runs each in numpy.

`generate` is listed in search/codegen/__init__.py.
"""
from __future__ import annotations

import threading

from kforge_tui.regions.task import Task
from kforge_tui.search import inductor_seed
from kforge_tui.search.seed_model import np2

POW2 = tuple(1 << i for i in range(0, 13))  # 1..4096
RBLOCKS = tuple(1 << i for i in range(4, 15))  # 16..16384
WARPS = (1, 2, 4, 8, 16, 32)
STAGES = (1, 2, 3, 4)
EVICT = ("inductor", "none", "stream")
MAX_BLOCK_ELEMS = 1 << 16  # elements one program holds per tile (registers)
NAMES = {"default": "inductor", "looped": "inductor_looped", "nosplit": "inductor_nosplit",
         "coop": "inductor_coop"}


class TritonSeedDesign:
    """One Inductor variant of a region as a searchable Triton design."""

    backend = "triton"

    def __init__(self, task: Task, seed: inductor_seed.Seed, variant: str):
        self.seed = seed
        self.variant = variant
        self.name = NAMES.get(variant, f"inductor_{variant}")
        self.op = task.pattern or task.kind or "pointwise"
        k = seed.main
        if k is None:  # library calls only (a bare GEMM): Inductor's call, nothing to tune
            self.kernel, self.numels, self.space, self._fixed, self._default = None, {}, {}, {}, {}
            return
        self.kernel = k.name
        ln = seed.launch_of(k.name)
        self.numels = dict(ln.numels)
        cfg = k.default_config
        if not k.chosen and not _gpu():
            # interpreted on the CPU (no GPU: CI), where every program runs in numpy: of
            # Inductor's own candidate configs, the one with the fewest programs
            cfg = min(k.configs or [cfg], key=lambda c: _programs(k, self.numels, c))
        sp: dict = {}
        fixed = ("RSPLIT",) if k.cooperative else ()
        if "XBLOCK" in k.constexprs and not k.cooperative:
            sp["XBLOCK"] = POW2
        if "YBLOCK" in k.constexprs:
            sp["YBLOCK"] = POW2
        if "R0_BLOCK" in k.constexprs:
            sp["R0_BLOCK"] = RBLOCKS
        sp["num_warps"] = WARPS
        sp["num_stages"] = STAGES
        sp["evict"] = EVICT
        self.space = sp
        self._fixed = {c: cfg["kwargs"][c] for c in cfg.get("kwargs", {})
                       if c not in sp and c in k.constexprs}
        self._fixed.update({c: cfg["kwargs"][c] for c in fixed if c in cfg.get("kwargs", {})})
        d = {c: cfg["kwargs"][c] for c in ("XBLOCK", "YBLOCK", "R0_BLOCK") if c in sp
             and c in cfg.get("kwargs", {})}
        for c in ("XBLOCK", "YBLOCK", "R0_BLOCK"):
            if c in sp and c not in d:
                d[c] = sp[c][0] if c != "R0_BLOCK" else min(2048, np2(self._r()))
        d["num_warps"] = int(cfg.get("num_warps", 4))
        d["num_stages"] = int(cfg.get("num_stages", 1))
        d["evict"] = "inductor"
        # snap Inductor's values onto the axes (they always are powers of two; be safe)
        for c, vals in sp.items():
            if d[c] not in vals:
                d[c] = min(vals, key=lambda v: abs(v - d[c]) if isinstance(v, int) else 0)
        self._default = d

    # --------------------------------------------------------------- Design protocol
    def _r(self) -> int:
        return int(self.numels.get("r0_numel", 1))

    def default(self, task: Task) -> dict:
        return dict(self._default)

    def valid(self, task: Task, p: dict) -> bool:
        if self.kernel is None:
            return p == {}
        try:
            for c, vals in self.space.items():
                if p.get(c) not in vals:
                    return False
            k = self.seed.kernels[self.kernel]
            x = int(self.numels.get("xnumel", 1))
            y = int(self.numels.get("ynumel", 1))
            r = self._r()
            xb = p.get("XBLOCK", self._fixed.get("XBLOCK", 1))
            yb = p.get("YBLOCK", 1)
            rb = p.get("R0_BLOCK", k.rblock_fixed or 1)
            if "XBLOCK" in self.space and xb > max(1, np2(x)) and xb != self._default.get("XBLOCK"):
                return False  # a tile taller than the problem
            if "YBLOCK" in self.space and yb > max(1, np2(y)) and yb != self._default.get("YBLOCK"):
                return False
            if "R0_BLOCK" in self.space and rb > max(16, np2(r)) \
                    and rb != self._default.get("R0_BLOCK"):
                return False
            elems = xb * yb * rb
            if elems > MAX_BLOCK_ELEMS and p != self._default:
                return False
            if p["num_warps"] * 32 > max(32, elems) * 4 and p["num_warps"] > self._default["num_warps"]:
                return False  # far more threads than elements in a tile
            if k.cooperative and (p["num_warps"] > self._default["num_warps"]
                                  or p["num_stages"] > self._default["num_stages"]):
                # every program of a grid barrier must be resident at once: Inductor sized RSPLIT
                # for its config's occupancy, and more warps or stages a program lower it ("too
                # many blocks in cooperative launch" on the H200, KernelBench 35 GroupNorm)
                return False
            meta = {**self._fixed, **{c: p[c] for c in ("XBLOCK", "YBLOCK", "R0_BLOCK") if c in p}}
            gx, gy, gz = inductor_seed.compute_grid(k, self.numels, meta)
            return 0 < gx < 2**31 and 0 <= gy <= 65535 and 0 <= gz <= 65535
        except Exception:
            return False

    def config(self, p: dict) -> dict:
        if self.kernel is None:
            return {}
        kw = dict(self._fixed)
        kw.update({c: p[c] for c in ("XBLOCK", "YBLOCK", "R0_BLOCK") if c in p})
        return {"kwargs": kw, "num_warps": int(p["num_warps"]), "num_stages": int(p["num_stages"])}

    def render(self, task: Task, p: dict) -> str:
        moved = {c: v for c, v in p.items() if self._default.get(c) != v}
        what = ("Inductor's kernel as torch.compile generates it" if not moved else
                "Inductor's kernel, " + ", ".join(f"{c}={v}" for c, v in sorted(moved.items())))
        header = (f'"""{what} (variant {self.variant}, generated on {self.seed.device}); '
                  'kforge ABI."""')
        return self.seed.render({self.kernel: self.config(p)} if self.kernel else {},
                                evict=p.get("evict", "inductor"), header=header)

    def extent(self, task: Task) -> tuple[int, int]:
        rows = int(self.numels.get("xnumel", 1)) * int(self.numels.get("ynumel", 1))
        return max(1, rows), max(1, self._r())


def _gpu() -> bool:
    from kforge_tui.device import cuda_available

    return cuda_available()


def _programs(k, numels: dict, cfg: dict) -> int:
    try:
        meta = {**k.constants, **cfg.get("kwargs", {})}
        gx, gy, gz = inductor_seed.compute_grid(k, numels, meta)
        return max(1, gx) * max(1, gy) * max(1, gz)
    except Exception:
        return 1 << 62


_CACHE: dict[str, list] = {}
_LOCK = threading.Lock()


def generate(task: Task) -> list:
    """The Inductor-seeded designs of a triton task (none for another backend, or when
    Inductor's code for the region cannot be rewritten)."""
    if task.backend != "triton":
        return []
    with _LOCK:
        got = _CACHE.get(task.key)
    if got is not None:
        return got
    out, seen = [], set()
    for variant in inductor_seed.VARIANTS:
        seed = inductor_seed.seed_for(task, variant)
        if seed is None:
            continue
        try:
            d = TritonSeedDesign(task, seed, variant)
            text = d.render(task, d.default(task))
        except Exception:
            continue
        body = text.split('"""', 2)[-1]
        if body in seen:
            continue  # Inductor produced the same code for this variant
        seen.add(body)
        out.append(d)
    with _LOCK:
        _CACHE[task.key] = out
    return out

