"""The Inductor seed as data: kernels, launches, scratch and how a config becomes a launch.

A `Seed` is Inductor's code for one region on the Triton candidate ABI (search/seed_rewrite.py
makes one from Inductor's wrapper; search/inductor_seed.py gets the wrapper). `render(configs)`
is the candidate source: the kernels, then `def kforge_launch(inputs, outputs)` with declared
scratch and one `kernel[grid](...)` per launch, its grid computed from the kernel's grid type and
config as Inductor's launcher computes it. Plain data (JSON round trip): a worker sends the
seed it compiled to the engine.
"""
from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field

SUPPORTED_KINDS = ("pointwise", "reduction", "persistent_reduction", "cooperative_reduction")
SUPPORTED_GRIDS = ("Grid1D", "Grid2D", "Grid3D", "Grid2DWithYZOverflow", "CooperativeReductionGrid")
MAX_Y_GRID = 65535
# What Inductor's heuristics see for a CUDA target when the seed is generated on the CPU (H200).
TARGET_CUDA = {"type": "cuda", "index": 0, "multi_processor_count": 132, "cc": 90, "major": 9,
               "regs_per_multiprocessor": 65536, "max_threads_per_multi_processor": 2048,
               "max_threads_per_block": 1024, "warp_size": 32}


class SeedUnsupported(Exception):
    """Inductor's code for this region cannot become a Triton candidate (the message says why)."""


@dataclass
class SeedKernel:
    name: str
    kind: str  # pointwise | reduction | persistent_reduction
    source: str  # the @triton.jit function, rewritten
    params: list[str]
    constexprs: list[str]
    grid_type: str
    configs: list[dict]  # Inductor's candidate configs: {"kwargs", "num_warps", "num_stages"}
    chosen: dict | None = None  # the config Inductor's autotuner picked (GPU run), if known
    constants: dict = field(default_factory=dict)  # constexprs fixed by triton_meta
    size_hints: dict = field(default_factory=dict)
    reduction_hint: str = ""
    rblock_fixed: int = 0  # persistent reductions: R0_BLOCK written in the body
    derived: dict = field(default_factory=dict)  # constexpr param -> ["np2", other constexpr]
    cooperative: bool = False  # needs launch_cooperative_grid=True (grid barrier)
    generated: bool = False  # written by the rewrite (an output copy), not Inductor's

    @property
    def default_config(self) -> dict:
        if self.chosen:
            return self.chosen
        if self.configs:
            return self.configs[0]
        return fallback_config(self)


@dataclass
class SeedLaunch:
    kernel: str  # a kernel of `Seed.kernels`, or the library function of a "library" launch
    args: list  # python expressions (str) for the non-constexpr params, or ints
    numels: dict  # {"xnumel": 64, "r0_numel": 256, ...}
    extra: dict = field(default_factory=dict)  # constexprs of this launch (pointer offsets)
    # "kernel" (a Triton launch) | "library" (a vendor GEMM Inductor calls: torch.mm(..., out=))
    kind: str = "kernel"
    kwargs: dict = field(default_factory=dict)  # a library call's keyword arguments (expressions)


@dataclass
class Seed:
    """Inductor's code for one region on the candidate ABI; `render()` is the candidate."""

    kernels: dict[str, SeedKernel]
    launches: list[SeedLaunch]
    scratch: list[tuple]  # (name, shape, stride, dtype)
    helpers: str  # inlined triton_helpers functions
    uses_libdevice: bool
    zeroed: list = field(default_factory=list)  # scratch (or outputs) zeroed before the launches
    variant: str = "default"
    device: str = "cpu"  # where Inductor generated it ("cuda": the worker's real compile)
    wrapper: str = ""  # Inductor's original output code (provenance, prompts)

    # ---------------------------------------------------------------- the main kernel
    @property
    def main(self) -> SeedKernel:
        """The kernel the search tunes first: the reduction if any, else the largest launch
        (a copy kernel the rewrite generated only when there is nothing else)."""
        best, score = None, -1
        for ln in self.launches:
            if ln.kind != "kernel":
                continue
            k = self.kernels[ln.kernel]
            s = (0 if k.generated else 1) * 10**15 + (2 if "reduction" in k.kind else 1) * 10**12 \
                + _numel(ln.numels)
            if s > score:
                best, score = k, s
        return best

    @property
    def libraries(self) -> list[str]:
        """The library functions the seed calls (a GEMM region's cuBLAS call)."""
        return [ln.kernel for ln in self.launches if ln.kind == "library"]

    def launch_of(self, name: str) -> SeedLaunch:
        return next(ln for ln in self.launches if ln.kernel == name and ln.kind == "kernel")

    # ---------------------------------------------------------------- rendering
    def render(self, configs: dict[str, dict] | None = None, evict: str = "inductor",
               header: str = "") -> str:
        """The candidate source. `configs[kernel]` overrides that kernel's launch config
        ({"kwargs": {...}, "num_warps": n, "num_stages": s}); `evict` is "inductor" (keep
        Inductor's eviction hints), "none" (drop them) or "stream" (evict_first on every load
        without one: one-pass streaming)."""
        configs = configs or {}
        out = ['"""Inductor\'s Triton code for this region (torch.compile\'s own kernel), on the '
               'kforge ABI."""'] if not header else [header]
        out += ["import triton", "import triton.language as tl"]
        if self.uses_libdevice:
            out.append("from triton.language.extra import libdevice")
        out.append("")
        if self.helpers:
            out += [self.helpers.rstrip(), ""]
        for name, k in self.kernels.items():
            src = k.source if evict == "inductor" else _set_eviction(k.source, evict)
            out += ["", src.rstrip(), ""]
        out += ["", "def kforge_launch(inputs, outputs):"]
        for name, shape, stride, dtype in self.scratch:
            out.append(f"    {name} = torch.empty_strided({_tup(shape)}, {_tup(stride)}, "
                       f"dtype=torch.{dtype}, device=outputs[0].device)")
        for name in self.zeroed:
            out.append(f"    {name}.zero_()")
        for ln in self.launches:
            if ln.kind == "library":
                args = [str(a) for a in ln.args] + [f"{k}={v}" for k, v in ln.kwargs.items()]
                out.append(f"    torch.{ln.kernel}({', '.join(args)})")
                continue
            k = self.kernels[ln.kernel]
            cfg = configs.get(ln.kernel) or k.default_config
            meta = dict(k.constants)
            meta.update({c: v for c, v in cfg.get("kwargs", {}).items() if c in k.constexprs})
            meta.update(ln.extra)
            for c, (how, expr) in k.derived.items():
                if how == "np2":
                    meta[c] = np2(_eval_int(expr, meta))
            grid = compute_grid(k, ln.numels, meta)
            args = ", ".join(str(a) for a in ln.args)
            kw = [f"{c}={meta[c]!r}" for c in k.constexprs if c in meta]
            kw += [f"num_warps={int(cfg.get('num_warps', 4))}",
                   f"num_stages={int(cfg.get('num_stages', 1))}"]
            if k.cooperative:
                kw.append("launch_cooperative_grid=True")
            out.append(f"    {ln.kernel}[{_tup(grid)}]({args}, {', '.join(kw)})")
        out.append("    return 0")
        src = "\n".join(out) + "\n"
        if self.scratch or self.libraries:
            src = src.replace("import triton\n", "import torch\nimport triton\n", 1)
        return src

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Seed":
        d = dict(d)
        d["kernels"] = {k: SeedKernel(**v) for k, v in d["kernels"].items()}
        d["launches"] = [SeedLaunch(**v) for v in d["launches"]]
        d["scratch"] = [tuple(x) for x in d["scratch"]]
        return cls(**d)


def _numel(numels: dict) -> int:
    n = 1
    for v in numels.values():
        n *= max(1, int(v))
    return n


def _tup(xs) -> str:
    xs = [int(x) for x in xs]
    return "(" + ", ".join(map(str, xs)) + ("," if len(xs) == 1 else "") + ")"


def _cdiv(a: int, b) -> int:
    if b is None or b == 1:
        return int(a)
    return -(-int(a) // int(b))


def compute_grid(k: SeedKernel, numels: dict, meta: dict) -> tuple[int, int, int]:
    """The launch grid as Inductor's launcher computes it (runtime/triton_heuristics.py)."""
    x = numels.get("xnumel", 1)
    y = numels.get("ynumel", 1)
    z = numels.get("znumel", 1)
    if k.grid_type == "Grid1D":
        return (_cdiv(x, meta.get("XBLOCK")), 1, 1)
    if k.grid_type == "Grid2D":
        return (_cdiv(x, meta.get("XBLOCK")), _cdiv(y, meta.get("YBLOCK")), 1)
    if k.grid_type == "Grid3D":
        return (_cdiv(x, meta.get("XBLOCK")), _cdiv(y, meta.get("YBLOCK")),
                _cdiv(z, meta.get("ZBLOCK")))
    if k.grid_type == "CooperativeReductionGrid":
        return (int(meta.get("RSPLIT", 1)), _cdiv(x, meta.get("XBLOCK")), 1)
    if k.grid_type == "Grid2DWithYZOverflow":
        raw = _cdiv(y, meta.get("YBLOCK"))
        div = _cdiv(raw, MAX_Y_GRID)
        return (_cdiv(x, meta.get("XBLOCK")), 0 if div == 0 else _cdiv(raw, div), div)
    raise SeedUnsupported(f"grid type {k.grid_type} is not supported")


def _eval_int(expr: str, env: dict) -> int:
    """An integer expression over constexpr names (+ - * // %, parentheses)."""
    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            return int(env[n.id])
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
            return ops[type(n.op)]()
        raise SeedUnsupported(f"cannot evaluate {ast.unparse(n)}")
    return ev(ast.parse(expr, mode="eval").body)


def np2(n: int) -> int:
    """The next power of two >= n (1 for n <= 1): Triton's block sizes."""
    return 1 << max(0, int(n) - 1).bit_length()


def fallback_config(k: SeedKernel, numels: dict | None = None) -> dict:
    """A sane config when Inductor's heuristics could not be evaluated here."""
    sh = k.size_hints or {}
    x = int(sh.get("x", 1024))
    r = int(sh.get("r0_", 1))
    kw: dict = {}
    if "XBLOCK" in k.constexprs:
        kw["XBLOCK"] = 1 if "reduction" in k.kind and r >= 256 else min(1024, np2(x))
    if "YBLOCK" in k.constexprs:
        kw["YBLOCK"] = min(32, np2(sh.get("y", 32)))
        kw["XBLOCK"] = min(32, kw.get("XBLOCK", 32))
    if "R0_BLOCK" in k.constexprs:
        kw["R0_BLOCK"] = min(2048, np2(r))
    block = kw.get("XBLOCK", 1) * kw.get("YBLOCK", 1) * kw.get("R0_BLOCK", k.rblock_fixed or 1)
    warps = max(1, min(16, block // 256))
    return {"kwargs": kw, "num_warps": np2(warps), "num_stages": 1}


# ------------------------------------------------------------------------------ eviction hints

class _Evict(ast.NodeTransformer):
    def __init__(self, mode: str):
        self.mode = mode

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "load":
            kws = [k for k in node.keywords if k.arg != "eviction_policy"]
            if self.mode == "stream":
                kws.append(ast.keyword("eviction_policy", ast.Constant("evict_first")))
            node.keywords = kws
        return node


def _set_eviction(src: str, mode: str) -> str:
    if mode not in ("none", "stream"):
        return src
    tree = ast.parse(src)
    return ast.unparse(_Evict(mode).visit(tree))


def _config_dict(cfg) -> dict:
    return {"kwargs": {k: int(v) if isinstance(v, (int, bool)) else v
                       for k, v in dict(getattr(cfg, "kwargs", {}) or {}).items()},
            "num_warps": int(getattr(cfg, "num_warps", 4) or 4),
            "num_stages": int(getattr(cfg, "num_stages", 1) or 1)}
