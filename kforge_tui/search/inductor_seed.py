"""Inductor's own Triton code for a region, rewritten to the Triton candidate ABI: the seed.

torch.compile already writes a correct Triton kernel for every fusible region. That kernel,
launched through `def kforge_launch(inputs, outputs)`, is a free, verified starting point: a
search that starts from it starts at torch.compile's speed.

Getting the code (`generate`, `compile_region`):
  * the region's GraphModule (regions/graph.py, placeholders in ABI order) is compiled with
    `torch.compile(..., backend=<Inductor's compile_fx behind a recorder>)`. The recorder
    sees the example inputs dynamo hands to the backend, so the order of Inductor's
    `call(args)` (`arg0_1, arg1_1, ...`) is mapped to ABI inputs by tensor identity (dynamo
    orders graph inputs by first use and drops unused ones: position is not enough);
  * the wrapper source is captured through `GraphLowering.save_output_code` (what
    `torch._inductor.utils.run_and_get_code` uses);
  * on a CUDA device (`compile_region`, in the worker) the compiled region is run once, so its
    autotuner picks a config per kernel, which is read back from the loaded module; the same
    compiled callable is the torch.compile baseline the worker times, so the seed *is* the
    kernel the baseline measured;
  * on the CPU (`generate(task, "cpu")`: CI, or an engine with no seed from a worker) there is
    no GPU: Inductor is asked for Triton on the CPU (`cpu_backend="triton"`), the backend hash
    (which needs an active Triton driver) is stubbed and compilation stops right after code
    generation, before any kernel is compiled or run. The kernel bodies are Inductor's
    (device-independent); launch configs come from Inductor's own heuristics, evaluated from
    the decorator's arguments with a CUDA device description (`TARGET_CUDA`), not autotuned.

The rewrite (`rewrite`):
  * kernels: `@triton_heuristics.*` decorators dropped (Triton's `@triton.jit` kept), Inductor
    imports replaced: `tl_math.f` -> `tl.math.f`, `libdevice` from
    `triton.language.extra`, and every `triton_helpers.f` used is inlined (its source, and the
    helpers it calls, copied from torch._inductor.runtime.triton_helpers);
  * the launcher comes from Inductor's `call(args)`: inputs by the mapping above, returned
    buffers become `outputs[k]` (their allocation must have exactly the output's storage
    bytes), every other buffer becomes declared scratch (`torch.empty_strided` with literal
    sizes), `reinterpret_tensor(buf, ..., 0)` is buf itself, `a = b  # reuse` is an alias;
    each `kernel.run(...)` becomes `kernel[grid](..., XBLOCK=.., num_warps=.., num_stages=..)`
    with the grid computed from the kernel's grid type (Grid1D/2D/3D and 2D-with-YZ-overflow)
    and its config, as Inductor's launcher does.
  * not handled (SeedUnsupported with the reason): library calls (`extern_kernels.mm`,
    convolutions), aten fallbacks, template/foreach/combo/cooperative/split-scan kernels,
    outputs that alias inputs or each other, views at a non-zero offset, dynamic shapes.
"""
from __future__ import annotations

import ast
import inspect
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from kforge_tui.regions.task import Task

SUPPORTED_KINDS = ("pointwise", "reduction", "persistent_reduction", "cooperative_reduction")
SUPPORTED_GRIDS = ("Grid1D", "Grid2D", "Grid3D", "Grid2DWithYZOverflow", "CooperativeReductionGrid")
MAX_Y_GRID = 65535
# What Inductor's heuristics see for a CUDA target when the seed is generated on the CPU (H200).
TARGET_CUDA = {"type": "cuda", "index": 0, "multi_processor_count": 132, "cc": 90, "major": 9,
               "regs_per_multiprocessor": 65536, "max_threads_per_multi_processor": 2048,
               "max_threads_per_block": 1024, "warp_size": 32}

# Inductor config patches that give the variants a search can start from.
VARIANTS = {
    "default": {},
    "looped": {"triton.persistent_reductions": False},
    "nosplit": {"split_reductions": False},
    # one reduction split over RSPLIT programs per row that meet at a grid barrier (GPU only:
    # the interpreter runs programs one after another, so a barrier never opens there)
    "coop": {"triton.cooperative_reductions": True, "triton.force_cooperative_reductions": True},
}
GPU_ONLY_VARIANTS = ("coop",)


class SeedUnsupported(Exception):
    """Inductor's code for this region cannot become a Triton candidate (the message says why)."""


# ------------------------------------------------------------------------------ data

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

    @property
    def default_config(self) -> dict:
        if self.chosen:
            return self.chosen
        if self.configs:
            return self.configs[0]
        return fallback_config(self)


@dataclass
class SeedLaunch:
    kernel: str
    args: list  # python expressions (str) for the non-constexpr params, or ints
    numels: dict  # {"xnumel": 64, "r0_numel": 256, ...}


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
        """The kernel the search tunes first: the reduction if any, else the largest launch."""
        best, score = None, -1
        for ln in self.launches:
            k = self.kernels[ln.kernel]
            s = (2 if "reduction" in k.kind else 1) * 10**12 + _numel(ln.numels)
            if s > score:
                best, score = k, s
        return best

    def launch_of(self, name: str) -> SeedLaunch:
        return next(ln for ln in self.launches if ln.kernel == name)

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
            k = self.kernels[ln.kernel]
            cfg = configs.get(ln.kernel) or k.default_config
            meta = dict(k.constants)
            meta.update({c: v for c, v in cfg.get("kwargs", {}).items() if c in k.constexprs})
            for c, (how, expr) in k.derived.items():
                if how == "np2":
                    meta[c] = _np2(_eval_int(expr, meta))
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
        if self.scratch:
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


def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def fallback_config(k: SeedKernel, numels: dict | None = None) -> dict:
    """A sane config when Inductor's heuristics could not be evaluated here."""
    sh = k.size_hints or {}
    x = int(sh.get("x", 1024))
    r = int(sh.get("r0_", 1))
    kw: dict = {}
    if "XBLOCK" in k.constexprs:
        kw["XBLOCK"] = 1 if "reduction" in k.kind and r >= 256 else min(1024, _np2(x))
    if "YBLOCK" in k.constexprs:
        kw["YBLOCK"] = min(32, _np2(sh.get("y", 32)))
        kw["XBLOCK"] = min(32, kw.get("XBLOCK", 32))
    if "R0_BLOCK" in k.constexprs:
        kw["R0_BLOCK"] = min(2048, _np2(r))
    block = kw.get("XBLOCK", 1) * kw.get("YBLOCK", 1) * kw.get("R0_BLOCK", k.rblock_fixed or 1)
    warps = max(1, min(16, block // 256))
    return {"kwargs": kw, "num_warps": _np2(warps), "num_stages": 1}


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


# ------------------------------------------------------------------------------ capture

_CAPTURE_LOCK = threading.Lock()


class _Stop(Exception):
    """Raised after code generation when no kernel may be compiled (CPU generation)."""


@dataclass
class Capture:
    codes: list[str] = field(default_factory=list)
    modules: list = field(default_factory=list)
    input_order: list[int] | None = None

    def chosen_configs(self) -> dict[str, dict]:
        """After a real run: the config each kernel's autotuner settled on."""
        out = {}
        for mod in self.modules:
            for name, obj in vars(mod).items():
                launchers = getattr(obj, "launchers", None)
                if not launchers or not name.startswith("triton_"):
                    continue
                cfg = getattr(launchers[0], "config", None)
                if cfg is None:
                    continue
                out[name] = _config_dict(cfg)
        return out


def _config_dict(cfg) -> dict:
    return {"kwargs": {k: int(v) if isinstance(v, (int, bool)) else v
                       for k, v in dict(getattr(cfg, "kwargs", {}) or {}).items()},
            "num_warps": int(getattr(cfg, "num_warps", 4) or 4),
            "num_stages": int(getattr(cfg, "num_stages", 1) or 1)}


@contextmanager
def capture(stop_after_codegen: bool = False):
    """Record Inductor's output code (and loaded modules) of compiles inside the block."""
    from unittest import mock

    from torch._inductor import codecache
    from torch._inductor.graph import GraphLowering

    cap = Capture()
    prev = GraphLowering.save_output_code
    orig_load = codecache.PyCodeCache.load_by_key_path

    def save(code: str) -> None:
        cap.codes.append(code)
        if prev is not None:
            prev(code)
        if stop_after_codegen:
            raise _Stop()

    def load_by_key_path(*a, **kw):
        mod = orig_load(*a, **kw)
        cap.modules.append(mod)
        return mod

    with _CAPTURE_LOCK, mock.patch.object(GraphLowering, "save_output_code", save), \
            mock.patch.object(codecache.PyCodeCache, "load_by_key_path",
                              staticmethod(load_by_key_path)):
        yield cap


def _backend(cap: Capture, inputs: list):
    """Inductor (compile_fx), recording how dynamo ordered the region's inputs."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        order = []
        for t in example_inputs:
            idx = next((i for i, x in enumerate(inputs) if x is t), None)
            order.append(idx)
        cap.input_order = order
        return compile_fx(gm, example_inputs)

    return backend


def example_inputs(task: Task, device: str, seed: int = 0) -> list:
    import torch

    from kforge_tui.regions.meta import torch_dtype

    g = torch.Generator().manual_seed(seed)
    out = []
    for m in task.inputs:
        if not m.present:
            out.append(None)
            continue
        dt = torch_dtype(m.dtype)
        t = torch.empty_strided(tuple(m.shape), tuple(m.strides), dtype=dt, device=device)
        if dt.is_floating_point:
            t.copy_(torch.randn(tuple(m.shape), generator=g).to(dt))
        elif dt == torch.bool:
            t.copy_(torch.rand(tuple(m.shape), generator=g) > 0.5)
        else:
            t.copy_(torch.randint(0, 8, tuple(m.shape), generator=g).to(dt))
        out.append(t)
    return out


def _inductor_patches(variant: str, cpu: bool) -> dict:
    p = {"fx_graph_cache": False, "fx_graph_remote_cache": False,
         "triton.autotune_at_compile_time": False, "triton.cudagraphs": False,
         "cpp_wrapper": False, "max_autotune": False, "max_autotune_pointwise": False,
         "coordinate_descent_tuning": False}
    if cpu:
        p["cpu_backend"] = "triton"
    p.update(VARIANTS.get(variant, {}))
    return p


def compile_region(task: Task, inputs: list, device: str = "cuda", variant: str = "default"):
    """Compile the region with Inductor on `device`, run it once (autotuning) and return
    (compiled callable taking a list of inputs, Seed or None, note). The worker times the
    callable as the torch.compile baseline, so the seed is the kernel the baseline ran."""
    import torch
    import torch._inductor.config as icfg

    from kforge_tui.regions.graph import to_graph_module

    gm = to_graph_module(task.graph, device)
    with icfg.patch(_inductor_patches(variant, cpu=False)), capture() as cap:
        fn = torch.compile(gm, backend=_backend(cap, inputs), dynamic=False, fullgraph=True)
        with torch.no_grad():
            fn(*inputs)
    note = ""
    seed = None
    try:
        seed = rewrite(cap.codes[-1] if cap.codes else "", task, cap.input_order,
                       cap.chosen_configs(), device=device, variant=variant)
    except SeedUnsupported as e:
        note = f"no Triton seed: {e}"
    except Exception as e:  # an Inductor version the rewrite does not know: no seed, no crash
        note = f"no Triton seed: rewrite failed ({type(e).__name__}: {str(e)[:200]})"

    def call(xs):
        with torch.no_grad():
            return fn(*xs)

    # Inductor's own module (its `call(args)`: the kernels plus its thin Python wrapper, no
    # dynamo guards): the like-for-like baseline for a seed's launcher
    call.inductor_module = cap.modules[-1] if cap.modules else None
    return call, seed, note


def generate(task: Task, device: str = "cpu", variant: str = "default") -> Seed:
    """Inductor's Triton code for the region, generated without running any kernel on the CPU
    (cpu_backend="triton", stopped after code generation) or run once on CUDA."""
    if device != "cpu":
        _, seed, note = compile_region(task, example_inputs(task, device), device, variant)
        if seed is None:
            raise SeedUnsupported(note.replace("no Triton seed: ", ""))
        return seed
    import torch
    import torch._inductor.config as icfg
    import torch.utils._triton as ut
    from unittest import mock

    from kforge_tui.regions.graph import to_graph_module

    inputs = example_inputs(task, "cpu")
    gm = to_graph_module(task.graph, "cpu")
    with icfg.patch(_inductor_patches(variant, cpu=True)), \
            mock.patch.object(ut, "triton_hash_with_backend", lambda: "0" * 64), \
            capture(stop_after_codegen=True) as cap:
        try:
            fn = torch.compile(gm, backend=_backend(cap, inputs), dynamic=False, fullgraph=True)
            with torch.no_grad():
                fn(*inputs)
        except Exception as e:
            if not cap.codes:
                raise SeedUnsupported(f"Inductor did not generate code: {type(e).__name__}: "
                                      f"{str(e).splitlines()[0][:200] if str(e) else ''}") from None
    if not cap.codes:
        raise SeedUnsupported("Inductor generated no code for this region")
    return rewrite(cap.codes[-1], task, cap.input_order, None, device="cpu", variant=variant,
                   target=TARGET_CUDA)


# ------------------------------------------------------------------------------ rewrite

def _literal(node):
    """Evaluate a decorator argument: literals, dict/list/set/tuple, enum members, DeviceProperties."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_literal(e) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {(_literal(k) if not isinstance(k, ast.Tuple) else tuple(_literal(k))): _literal(v)
                for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and call_name(node) in ("set",):
        return set()
    if isinstance(node, ast.Name) and node.id == "__file__":
        return ""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        from torch._inductor.runtime import hints

        cls = getattr(hints, node.value.id, None)
        if cls is not None:
            return getattr(cls, node.attr)
    if isinstance(node, ast.Call) and call_name(node) == "DeviceProperties":
        from torch._inductor.runtime.hints import DeviceProperties

        kw = {k.arg: _literal(k.value) for k in node.keywords}
        fields = getattr(DeviceProperties, "_fields", ())
        return DeviceProperties(**{k: v for k, v in kw.items() if k in fields})
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    raise ValueError(f"cannot read {ast.unparse(node)[:80]}")


def call_name(node) -> str:
    f = node.func if isinstance(node, ast.Call) else node
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        base = call_name(f.value) if isinstance(f.value, (ast.Name, ast.Attribute)) else "?"
        return f"{base}.{f.attr}"
    return "?"


def _heuristic_configs(kind: str, kwargs: dict, target: dict | None) -> list[dict]:
    """Inductor's candidate configs for a kernel, from its decorator's own arguments."""
    from unittest import mock

    from torch._inductor.runtime import triton_heuristics as th

    kwargs = dict(kwargs)
    tm = dict(kwargs.get("triton_meta") or {})
    dev = tm.get("device")
    if target is not None and dev is not None and hasattr(dev, "_replace"):
        tm["device"] = dev._replace(**{k: v for k, v in target.items() if k in dev._fields})
    kwargs["triton_meta"] = tm
    kwargs["inductor_meta"] = dict(kwargs.get("inductor_meta") or {})
    kwargs["size_hints"] = dict(kwargs.get("size_hints") or {})
    got: list = []

    def fake_cached_autotune(size_hints, configs, *a, **kw):
        enforce = getattr(th, "_enforce_reduction_config_block_minimums", None)
        heuristic = kw.get("heuristic_type")
        if enforce is not None and size_hints is not None and heuristic is not None and \
                getattr(heuristic, "name", "") in ("REDUCTION", "PERSISTENT_REDUCTION"):
            try:
                configs = enforce(configs, size_hints, kw.get("inductor_meta") or {})
            except Exception:
                pass
        got.extend(configs)
        return lambda fn: fn

    with mock.patch.object(th, "cached_autotune", fake_cached_autotune):
        fn = getattr(th, kind)
        params = inspect.signature(fn).parameters
        fn(**{k: v for k, v in kwargs.items() if k in params})
    return [_config_dict(c) for c in got]


_HELPERS_CACHE: dict[str, tuple[str, set[str]]] = {}


def _helper_source(name: str) -> tuple[str, set[str]]:
    """(source of triton_helpers.<name> rewritten for a candidate, helper names it calls)."""
    if name in _HELPERS_CACHE:
        return _HELPERS_CACHE[name]
    from torch._inductor.runtime import triton_helpers as th

    obj = getattr(th, name, None)
    fn = getattr(obj, "fn", None)
    if fn is None:
        raise SeedUnsupported(f"Inductor helper triton_helpers.{name} is not a Triton function")
    src = inspect.getsource(fn)
    import textwrap

    tree = ast.parse(textwrap.dedent(src))
    fdef = tree.body[0]
    deps: set[str] = set()
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            v = getattr(th, node.id, None)
            if getattr(v, "fn", None) is not None and node.id != name:
                deps.add(node.id)
            elif node.id in ("pymath", "_log2", "_LOG_2_E", "builtins_use_semantic_kwarg"):
                raise SeedUnsupported(f"Inductor helper triton_helpers.{name} uses {node.id}")
    fdef = _Rewriter(helpers=set()).visit(fdef)
    fdef.decorator_list = [ast.parse("triton.jit", mode="eval").body]
    out = ast.unparse(fdef)
    _HELPERS_CACHE[name] = (out, deps)
    return out, deps


class _Rewriter(ast.NodeTransformer):
    """Inductor spellings -> plain Triton: tl_math/math -> tl.math, triton_helpers.f -> f."""

    def __init__(self, helpers: set[str]):
        self.helpers = helpers
        self.libdevice = False
        self.derived: dict = {}

    def visit_Call(self, node):
        name = call_name(node)
        if name == "triton_helpers.if_mask" and len(node.args) == 2:
            # if_mask(mask, v) is v when a mask exists (it always does where Inductor emits it)
            return self.visit(node.args[1])
        if name == "triton_helpers.constexpr_next_power_of_2" and len(node.args) == 1:
            # a constexpr computed from other constexprs: the launcher passes its value
            a = node.args[0]
            p = f"{a.id}_NP2" if isinstance(a, ast.Name) else f"KF_NP2_{len(self.derived)}"
            self.derived[p] = ["np2", ast.unparse(a)]
            return ast.copy_location(ast.Name(p, ast.Load()), node)
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name):
            base = node.value.id
            if base in ("tl_math", "math"):
                return ast.copy_location(ast.Attribute(
                    ast.Attribute(ast.Name("tl", ast.Load()), "math", ast.Load()), node.attr,
                    node.ctx), node)
            if base == "triton_helpers":
                self.helpers.add(node.attr)
                return ast.copy_location(ast.Name(node.attr, node.ctx), node)
            if base == "libdevice":
                self.libdevice = True
        return node


def _kernel_from_source(name: str, src: str, target: dict | None, chosen: dict | None):
    tree = ast.parse(src)
    fdef = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
    if fdef is None:
        raise SeedUnsupported(f"kernel {name}: no function in its source")
    kind, dkw = None, {}
    for d in fdef.decorator_list:
        cn = call_name(d)
        if cn.startswith("triton_heuristics."):
            kind = cn.split(".", 1)[1]
            dkw = {k.arg: _literal(k.value) for k in d.keywords if k.arg is not None}
            for i, a in enumerate(d.args):
                if i == 0:
                    dkw["size_hints"] = _literal(a)
    if kind not in SUPPORTED_KINDS:
        raise SeedUnsupported(f"kernel {name} is an Inductor `{kind}` kernel; only pointwise and "
                              "reduction kernels are rewritten")
    im = dkw.get("inductor_meta") or {}
    tm = dkw.get("triton_meta") or {}
    grid_type = im.get("grid_type", "Grid1D")
    if grid_type not in SUPPORTED_GRIDS:
        raise SeedUnsupported(f"kernel {name} uses grid type {grid_type}")
    if im.get("RSPLIT_SIZE"):
        raise SeedUnsupported(f"kernel {name} is a mix-order reduction")
    params = [a.arg for a in fdef.args.args]
    constexprs = [a.arg for a in fdef.args.args
                  if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)]
    rw = _Rewriter(set())
    fdef = rw.visit(fdef)
    fdef.decorator_list = [ast.parse("triton.jit", mode="eval").body]
    for p in rw.derived:  # derived constexprs become parameters the launcher fills in
        fdef.args.args.append(ast.arg(p, ast.parse("tl.constexpr", mode="eval").body))
        params.append(p)
        constexprs.append(p)
    rblock = 0
    for st in fdef.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                and st.target.id == "R0_BLOCK" and isinstance(st.value, ast.Constant):
            rblock = int(st.value.value)
    constants = {k: v for k, v in (tm.get("constants") or {}).items()
                 if isinstance(k, str) and k in constexprs and isinstance(v, (int, float, bool))}
    try:
        configs = _heuristic_configs(kind, dkw, target)
    except Exception:
        configs = []
    k = SeedKernel(name=name, kind=kind, source=ast.unparse(fdef), params=params,
                   constexprs=constexprs, grid_type=grid_type, configs=configs,
                   chosen=chosen, constants=constants,
                   size_hints={str(a): int(b) for a, b in (dkw.get("size_hints") or {}).items()},
                   reduction_hint=str(dkw.get("reduction_hint", "")), rblock_fixed=rblock,
                   derived=dict(rw.derived), cooperative=bool(tm.get("launch_cooperative_grid")))
    if not k.configs and not k.chosen:
        k.configs = [fallback_config(k)]
    # a config may carry keys the kernel has no parameter for (e.g. R0_BLOCK of a persistent one)
    for c in k.configs + ([k.chosen] if k.chosen else []):
        c["kwargs"] = {a: v for a, v in c.get("kwargs", {}).items() if a in constexprs}
    return k, rw.helpers, rw.libdevice


def _find_call(tree: ast.Module) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            return node
    raise SeedUnsupported("Inductor's output has no call() wrapper")


def _flatten(body):
    for st in body:
        if isinstance(st, ast.With):
            yield from _flatten(st.body)
        else:
            yield st


def rewrite(wrapper: str, task: Task, input_order: list | None, chosen: dict | None = None,
            device: str = "cpu", variant: str = "default", target: dict | None = None) -> Seed:
    """Inductor's output code for the region -> a Seed on the candidate ABI."""
    from kforge_tui.regions.meta import DTYPE_BYTES, storage_span

    if not wrapper:
        raise SeedUnsupported("no Inductor output code")
    if "extern_kernels." in wrapper:
        raise SeedUnsupported("Inductor calls a library kernel (extern_kernels) for this region")
    tree = ast.parse(wrapper)
    chosen = chosen or {}
    # kernels
    kernels: dict[str, SeedKernel] = {}
    helpers: set[str] = set()
    libdev = False
    for st in tree.body:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) \
                and call_name(st.value).endswith("async_compile.triton") and len(st.targets) == 1:
            name = st.targets[0].id
            src = _literal(st.value.args[1])
            k, hs, ld = _kernel_from_source(name, src, target, chosen.get(name))
            kernels[name] = k
            helpers |= hs
            libdev = libdev or ld
        elif isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) \
                and call_name(st.value).startswith("async_compile.") \
                and not call_name(st.value).endswith(("wait", "triton")):
            raise SeedUnsupported(f"Inductor compiles a non-Triton kernel "
                                  f"({call_name(st.value)}) for this region")
    if not kernels:
        raise SeedUnsupported("Inductor generated no Triton kernel for this region")
    # helpers, transitively
    todo, seen, hsrc = list(helpers), set(), []
    while todo:
        h = todo.pop()
        if h in seen:
            continue
        seen.add(h)
        src, deps = _helper_source(h)
        hsrc.append((h, src))
        if "libdevice." in src:
            libdev = True
        todo.extend(deps - seen)
    hsrc.sort()
    # the call wrapper
    fn = _find_call(tree)
    arg_names: list[str] = []
    allocs: dict[str, tuple] = {}
    alias: dict[str, str] = {}
    launches: list[tuple[str, list]] = []
    returned: list = []
    zeroed: list[str] = []

    def root(n: str) -> str:
        while n in alias:
            n = alias[n]
        return n

    def value_name(node) -> str:
        """A buffer-valued expression -> root name (a view at offset 0 is its base)."""
        if isinstance(node, ast.Name):
            return root(node.id)
        if isinstance(node, ast.Call) and call_name(node) == "reinterpret_tensor":
            base = value_name(node.args[0])
            off = _literal(node.args[3]) if len(node.args) > 3 else 0
            if off != 0:
                raise SeedUnsupported("a view at a non-zero offset (reinterpret_tensor)")
            return base
        raise SeedUnsupported(f"unsupported buffer expression {ast.unparse(node)[:80]}")

    for st in _flatten(fn.body):
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            tgt, v = st.targets[0], st.value
            if isinstance(tgt, ast.Tuple) and isinstance(v, ast.Name) and v.id == "args":
                arg_names = [e.id for e in tgt.elts]
                continue
            if isinstance(tgt, ast.Name) and isinstance(v, ast.Name) and v.id == "args":
                arg_names = [tgt.id]  # `arg0_1, = args` unparses as a tuple; be lenient
                continue
            if not isinstance(tgt, ast.Name):
                raise SeedUnsupported(f"unsupported statement: {ast.unparse(st)[:80]}")
            cn = call_name(v) if isinstance(v, ast.Call) else ""
            if cn.startswith("empty_strided"):
                shape, stride = _literal(v.args[0]), _literal(v.args[1])
                dt = v.args[2] if len(v.args) > 2 else next(k.value for k in v.keywords
                                                            if k.arg == "dtype")
                allocs[tgt.id] = (tuple(shape), tuple(stride), dt.attr)
            elif cn == "get_raw_stream":
                continue
            elif isinstance(v, ast.Name) or cn == "reinterpret_tensor":
                alias[tgt.id] = value_name(v)
            else:
                raise SeedUnsupported(f"Inductor's wrapper does `{ast.unparse(st)[:80]}` (a library "
                                      "call or a PyTorch fallback), which a Triton seed cannot do")
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            cn = call_name(st.value)
            if cn.endswith(".run") and cn.split(".")[0] in kernels:
                launches.append((cn.split(".")[0], list(st.value.args)))
            elif cn.endswith(".zero_") and isinstance(st.value.func.value, ast.Name) \
                    and not st.value.args:
                zeroed.append(root(st.value.func.value.id))
            elif cn in ("assert_size_stride", "assert_alignment", "args.clear",
                        "torch.cuda.set_device") or cn.endswith("synchronize"):
                continue
            else:
                raise SeedUnsupported(f"Inductor's wrapper calls `{ast.unparse(st.value)[:80]}`, "
                                      "which a Triton seed cannot do")
        elif isinstance(st, ast.Delete) or isinstance(st, ast.Pass):
            continue
        elif isinstance(st, ast.Return):
            v = st.value
            returned = list(v.elts) if isinstance(v, (ast.Tuple, ast.List)) else [v]
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue
        else:
            raise SeedUnsupported(f"unsupported statement in Inductor's wrapper: "
                                  f"{ast.unparse(st)[:80]}")
    if len(returned) != len(task.outputs):
        raise SeedUnsupported(f"Inductor's call returns {len(returned)} values, the region has "
                              f"{len(task.outputs)} outputs")
    # inputs
    order = input_order if input_order is not None else list(range(len(arg_names)))
    if len(order) != len(arg_names):
        raise SeedUnsupported("cannot map Inductor's inputs to the region's")
    env: dict[str, str] = {}
    for i, name in enumerate(arg_names):
        if order[i] is None:
            raise SeedUnsupported(f"Inductor input {name} is not one of the region's inputs")
        env[name] = f"inputs[{order[i]}]"
    # outputs
    for k, node in enumerate(returned):
        r = value_name(node)
        if r in env and r in arg_names:
            raise SeedUnsupported(f"output {k} is an input returned unchanged")
        if r in env:
            raise SeedUnsupported(f"output {k} is the same buffer as another output")
        if r not in allocs:
            raise SeedUnsupported(f"output {k} is not a buffer Inductor allocates")
        shape, stride, dt = allocs[r]
        m = task.outputs[k]
        if dt != m.dtype or storage_span(shape, stride) * DTYPE_BYTES[dt] != \
                storage_span(m.shape, m.strides) * DTYPE_BYTES[m.dtype]:
            raise SeedUnsupported(f"output {k}: Inductor's buffer {list(shape)}/{list(stride)} "
                                  f"{dt} differs from the region's {list(m.shape)} {m.dtype}")
        if (tuple(shape), tuple(stride)) != (tuple(m.shape), tuple(m.strides)) and \
                not _same_layout(shape, stride, m.shape, m.strides):
            raise SeedUnsupported(f"output {k}: Inductor writes a different layout "
                                  f"({list(stride)} vs {list(m.strides)})")
        env[r] = f"outputs[{k}]"
    scratch = []
    for name, (shape, stride, dt) in allocs.items():
        if name not in env:
            env[name] = name
            scratch.append((name, list(shape), list(stride), dt))
    # launches
    seed_launches = []
    for kname, args in launches:
        k = kernels[kname]
        plain = [p for p in k.params if p not in k.constexprs]
        if len(args) != len(plain):
            raise SeedUnsupported(f"kernel {kname}: {len(args)} launch arguments for "
                                  f"{len(plain)} parameters")
        out_args, numels = [], {}
        for p, a in zip(plain, args):
            if isinstance(a, ast.Constant) and isinstance(a.value, (int, float)):
                out_args.append(a.value)
                if p.endswith("numel"):
                    numels[p] = int(a.value)
            else:
                r = value_name(a)
                if r not in env:
                    raise SeedUnsupported(f"kernel {kname}: argument {ast.unparse(a)[:40]} is unknown")
                out_args.append(env[r])
        for p in k.constexprs:  # numels passed as constexpr (e.g. xnumel == 1)
            if p.endswith("numel") and p in k.constants:
                numels[p] = int(k.constants[p])
        seed_launches.append(SeedLaunch(kname, out_args, numels))
    used = {ln.kernel for ln in seed_launches}
    kernels = {n: k for n, k in kernels.items() if n in used}
    for z in zeroed:
        if z not in env:
            raise SeedUnsupported(f"zeroes an unknown buffer {z}")
    return Seed(kernels=kernels, launches=seed_launches, scratch=scratch,
                zeroed=[env[z] for z in zeroed],
                helpers="\n\n\n".join(s for _, s in hsrc), uses_libdevice=libdev,
                variant=variant, device=device, wrapper=wrapper)


def _same_layout(shape, stride, shape2, stride2) -> bool:
    """Two (shape, stride) pairs that address the same elements in the same order."""
    def dense(sh, st):
        return [(s, t) for s, t in zip(sh, st) if s != 1]
    return dense(shape, stride) == dense(shape2, stride2)


# ------------------------------------------------------------------------------ per-task cache

_SEEDS: dict[tuple[str, str], Seed | str] = {}
_SEEDS_LOCK = threading.Lock()


def remember(task: Task, seed: Seed | dict | None, variant: str = "default",
             note: str = "") -> None:
    """Record a seed produced elsewhere (the worker's compile of the region) for this task."""
    if isinstance(seed, dict):
        seed = Seed.from_json(seed)
    with _SEEDS_LOCK:
        _SEEDS[(task.key, variant)] = seed if seed is not None else (note or "no seed")


def seed_for(task: Task, variant: str = "default", generate_on_cpu: bool = True) -> Seed | None:
    """The task's seed: one the worker sent (`remember`), else generated here on the CPU
    (no kernel runs; cached per task). None when Inductor's code cannot be a Triton seed."""
    k = (task.key, variant)
    with _SEEDS_LOCK:
        got = _SEEDS.get(k)
    if isinstance(got, Seed):
        return got
    if got is not None or not generate_on_cpu:
        return None
    try:
        seed = generate(task, "cpu", variant)
    except SeedUnsupported as e:
        seed, note = None, str(e)
    except Exception as e:  # Inductor internals moved: no seed rather than a crash
        seed, note = None, f"{type(e).__name__}: {str(e)[:200]}"
    with _SEEDS_LOCK:
        _SEEDS[k] = seed if seed is not None else note
    return seed


def why_no_seed(task: Task, variant: str = "default") -> str:
    got = _SEEDS.get((task.key, variant))
    return got if isinstance(got, str) else ""


def seed_source(task: Task) -> str | None:
    """Inductor's kernel for the region on the ABI (for the LLM prompt), or None."""
    s = seed_for(task)
    return s.render() if s is not None else None


__all__ = ["Seed", "SeedKernel", "SeedLaunch", "SeedUnsupported", "capture", "compile_region",
           "generate", "rewrite", "remember", "seed_for", "seed_source", "compute_grid",
           "example_inputs", "VARIANTS"]
