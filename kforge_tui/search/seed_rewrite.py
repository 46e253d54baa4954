"""Inductor's output code for a region -> a `Seed` on the Triton candidate ABI (`rewrite`).

  * kernels: `@triton_heuristics.*` decorators dropped (Triton's `@triton.jit` kept), Inductor
    imports replaced: `tl_math.f` -> `tl.math.f`, `libdevice` from
    `triton.language.extra`, and every `triton_helpers.f` used is inlined (its source, and the
    helpers it calls, copied from torch._inductor.runtime.triton_helpers); the kernel's own
    `@triton.jit` helpers (a scan's combine function) are kept beside it, renamed per kernel;
  * the launcher comes from Inductor's `call(args)`: inputs by the mapping the capture recorded,
    returned buffers become `outputs[k]` when their allocation is exactly the output's storage
    in its layout (a view at offset 0 of it included), every other buffer becomes declared
    scratch (`torch.empty_strided` with literal sizes), `a = b  # reuse` is an alias and
    `reinterpret_tensor(buf, size, stride, off)` a view of buf at `off` elements: a kernel
    handed a view at a non-zero offset gets that offset as a constexpr added to its pointer;
    each `kernel.run(...)` becomes `kernel[grid](..., XBLOCK=.., num_warps=.., num_stages=..)`
    with the grid computed from the kernel's grid type (Grid1D/2D/3D and 2D-with-YZ-overflow)
    and its config, as Inductor's launcher does;
  * an output Inductor returns as a view of an input, of another output or of a larger buffer
    (a multi-output region whose outputs share one buffer: QK-norm's normed value and its
    rotate-half slice) is written by a generated strided copy kernel after the launches, so
    every output of the ABI is its own buffer as the region's contract says;
  * library calls (`extern_kernels.mm/addmm/bmm/baddbmm` into a buffer): the same call on the
    candidate's buffers (`torch.mm(a, b, out=o)`), what sandbox/triton_check.py admits as a
    vendor-library call; a GEMM with its epilogue is then the library GEMM plus Inductor's
    Triton epilogue, as torch.compile runs it;
  * a PyTorch op Inductor falls back to whose results the region returns as they are
    (`aten.topk`: MoE routing) is the same call into the outputs (`out=`): node zero is then
    exactly what torch.compile runs for the region;
  * not handled (SeedUnsupported with the reason): other library calls (convolutions), other
    aten fallbacks (`aten.histc`), template/foreach/combo/split-scan kernels, dynamic shapes.
"""
from __future__ import annotations

import ast
import inspect

from kforge_tui.regions.task import Task
from kforge_tui.search.seed_model import (SUPPORTED_GRIDS, SUPPORTED_KINDS, Seed, SeedKernel,
                                          SeedLaunch, SeedUnsupported, _config_dict,
                                          fallback_config)

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
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    fdef = next((f for f in fns if any(call_name(d).startswith("triton_heuristics.")
                                       for d in f.decorator_list)), fns[-1] if fns else None)
    if fdef is None:
        raise SeedUnsupported(f"kernel {name}: no function in its source")
    # the kernel's own @triton.jit helpers (a scan's combine function), renamed per kernel
    own = {f.name: f"kf_{f.name.strip('_')}_{name}" for f in fns if f is not fdef}
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
    own_src = []
    for f in fns:
        if f is fdef or f.name not in own:
            continue
        f = rw.visit(f)
        f.decorator_list = [ast.parse("triton.jit", mode="eval").body]
        own_src.append(f)
    for f in [fdef, *own_src]:
        for node in ast.walk(f):
            if isinstance(node, ast.Name) and node.id in own:
                node.id = own[node.id]
        if f is not fdef:
            f.name = own[f.name]
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
    source = "\n\n\n".join([ast.unparse(f) for f in own_src] + [ast.unparse(fdef)])
    k = SeedKernel(name=name, kind=kind, source=source, params=params,
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


LIBRARY_CALLS = {"mm", "addmm", "bmm", "baddbmm"}  # extern_kernels.f(..., out=buf) -> torch.f
# PyTorch ops Inductor falls back to whose results the region returns as they are: the seed
# calls the same op into the outputs (`torch.topk(x, k, ..., out=(values, indices))`), what
# torch.compile runs for it (MoE routing's top-k). Their number of results:
FALLBACK_OUT = {"topk": 2, "sort": 2}


def _constant_keyword(k: ast.keyword) -> bool:
    """A fallback's keyword the seed may pass on as written: a plain constant (`sort.stable`'s
    `stable=False, dim=0, descending=False`), never a tensor or `out=`."""
    v = k.value
    if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub):
        v = v.operand
    return k.arg not in (None, "out") and isinstance(v, ast.Constant) \
        and isinstance(v.value, (bool, int, float))


# Library calls Inductor makes that return a new tensor it keeps (not into a buffer): no seed
# can be written for a region holding one, whatever Inductor's kernels around it are (qwen_moe's
# expert GEMMs: `extern_kernels._grouped_mm`, seen on the H100 on 2026-12-05).
KEPT_RESULT_CALLS = {"aten.convolution.default": "convolution (cuDNN)",
                     "aten._grouped_mm.default": "grouped GEMM (_grouped_mm)"}


def unseedable(task: Task) -> str | None:
    """Why no seed can come from Inductor's code for this region, when its graph alone says so
    (None: try). Selection asks before any compile: a Triton search of such a region would end
    with 0 candidates."""
    for n in task.graph.get("nodes", ()):
        if n.get("target") in KEPT_RESULT_CALLS:
            return (f"Inductor calls the library {KEPT_RESULT_CALLS[n['target']]} through extern_kernels "
                    "and keeps its result, which a Triton seed cannot rewrite")
    return None


def _kernels_of(tree: ast.Module, target, chosen: dict):
    """(kernels, helper sources, uses libdevice) of Inductor's `async_compile.triton` blocks."""
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
    todo, seen, hsrc = list(helpers), set(), []
    while todo:  # triton_helpers functions, transitively
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
    return kernels, "\n\n\n".join(s for _, s in hsrc), libdev


class _Ref:
    """A buffer-valued expression of the wrapper: `root` (an input, an allocation) seen at
    `off` elements into it, as `size`/`stride` when a view says so (else the root's own)."""

    __slots__ = ("root", "off", "size", "stride")

    def __init__(self, root, off=0, size=None, stride=None):
        self.root, self.off, self.size, self.stride = root, int(off), size, stride


class _Wrapper:
    """Inductor's `call(args)` read statement by statement (see the module docstring)."""

    def __init__(self, fn: ast.FunctionDef, kernels: dict):
        self.kernels = kernels
        self.arg_names: list[str] = []
        self.allocs: dict[str, tuple] = {}  # name -> (shape, stride, dtype)
        self.names: dict[str, _Ref] = {}  # aliases and views bound to names
        self.steps: list[tuple] = []  # ("kernel", name, args) | ("library", fn, args, kwargs)
        self.returned: list[_Ref] = []
        self.zeroed: list[str] = []
        self.fallback_parts: dict[str, tuple] = {}  # "buf0#1" -> (buf0, 1)
        for st in _flatten(fn.body):
            self.statement(st)

    def ref(self, node) -> _Ref:
        if isinstance(node, ast.Name):
            got = self.names.get(node.id)
            return _Ref(got.root, got.off, got.size, got.stride) if got else _Ref(node.id)
        if isinstance(node, ast.Call) and call_name(node) == "reinterpret_tensor":
            base = self.ref(node.args[0])
            size, stride = tuple(_literal(node.args[1])), tuple(_literal(node.args[2]))
            off = _literal(node.args[3]) if len(node.args) > 3 else 0
            return _Ref(base.root, base.off + int(off), size, stride)
        raise SeedUnsupported(f"unsupported buffer expression {ast.unparse(node)[:80]}")

    def statement(self, st) -> None:
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            tgt, v = st.targets[0], st.value
            if isinstance(v, ast.Name) and v.id == "args":
                self.arg_names = [e.id for e in tgt.elts] if isinstance(tgt, ast.Tuple) else [tgt.id]
                return
            if not isinstance(tgt, ast.Name):
                raise SeedUnsupported(f"unsupported statement: {ast.unparse(st)[:80]}")
            cn = call_name(v) if isinstance(v, ast.Call) else ""
            if cn.startswith("empty_strided"):
                shape, stride = _literal(v.args[0]), _literal(v.args[1])
                dt = v.args[2] if len(v.args) > 2 else next(k.value for k in v.keywords
                                                            if k.arg == "dtype")
                self.allocs[tgt.id] = (tuple(shape), tuple(stride), dt.attr)
            elif cn == "get_raw_stream":
                return
            elif isinstance(v, ast.Name) or cn == "reinterpret_tensor":
                self.names[tgt.id] = self.ref(v)
            elif cn.startswith(("torch.ops.aten.", "aten.")):
                op = cn.split("aten.", 1)[1].split(".")[0]
                if op not in FALLBACK_OUT or not all(_constant_keyword(k) for k in v.keywords):
                    raise SeedUnsupported(f"Inductor runs PyTorch's own aten.{op} here (a fallback "
                                          "whose result a seed cannot write into its outputs)")
                self.steps.append(("fallback", op, list(v.args), tgt.id,
                                   {k.arg: k.value for k in v.keywords}))
                for i in range(FALLBACK_OUT[op]):
                    self.fallback_parts[f"{tgt.id}#{i}"] = (tgt.id, i)
            elif isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name) \
                    and isinstance(v.slice, ast.Constant) and f"{v.value.id}#{v.slice.value}" \
                    in self.fallback_parts:
                self.names[tgt.id] = _Ref(f"{v.value.id}#{v.slice.value}")
            elif cn.startswith("extern_kernels."):
                raise SeedUnsupported(f"Inductor calls the library kernel {cn} and keeps its "
                                      "result: only calls into a buffer are rewritten")
            else:
                raise SeedUnsupported(f"Inductor's wrapper does `{ast.unparse(st)[:80]}`, which a "
                                      "Triton seed cannot do")
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            call = st.value
            cn = call_name(call)
            if cn.endswith(".run") and cn.split(".")[0] in self.kernels:
                self.steps.append(("kernel", cn.split(".")[0], list(call.args)))
            elif cn.startswith("extern_kernels."):
                lib = cn.split(".", 1)[1]
                kw = {k.arg: k.value for k in call.keywords}
                if lib not in LIBRARY_CALLS or "out" not in kw:
                    raise SeedUnsupported(f"Inductor calls the library kernel {cn}: only "
                                          f"{', '.join(sorted(LIBRARY_CALLS))} into a buffer are "
                                          "rewritten")
                self.steps.append(("library", lib, list(call.args), kw))
            elif cn.endswith(".zero_") and isinstance(call.func.value, ast.Name) and not call.args:
                self.zeroed.append(self.ref(call.func.value).root)
            elif cn in ("assert_size_stride", "assert_alignment", "args.clear",
                        "torch.cuda.set_device") or cn.endswith("synchronize"):
                return
            else:
                raise SeedUnsupported(f"Inductor's wrapper calls `{ast.unparse(call)[:80]}`, "
                                      "which a Triton seed cannot do")
        elif isinstance(st, (ast.Delete, ast.Pass)):
            return
        elif isinstance(st, ast.Return):
            v = st.value
            self.returned = [self.ref(e) for e in
                             (v.elts if isinstance(v, (ast.Tuple, ast.List)) else [v])]
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            return
        else:
            raise SeedUnsupported(f"unsupported statement in Inductor's wrapper: "
                                  f"{ast.unparse(st)[:80]}")


def rewrite(wrapper: str, task: Task, input_order: list | None, chosen: dict | None = None,
            device: str = "cpu", variant: str = "default", target: dict | None = None) -> Seed:
    """Inductor's output code for the region -> a Seed on the candidate ABI."""
    from kforge_tui.regions.meta import DTYPE_BYTES, storage_span

    if not wrapper:
        raise SeedUnsupported("no Inductor output code")
    tree = ast.parse(wrapper)
    kernels, helpers, libdev = _kernels_of(tree, target, chosen or {})
    w = _Wrapper(_find_call(tree), kernels)
    if not kernels and not any(s[0] in ("library", "fallback") for s in w.steps):
        raise SeedUnsupported("Inductor generated no Triton kernel for this region")
    if len(w.returned) != len(task.outputs):
        raise SeedUnsupported(f"Inductor's call returns {len(w.returned)} values, the region has "
                              f"{len(task.outputs)} outputs")
    # inputs
    order = input_order if input_order is not None else list(range(len(w.arg_names)))
    if len(order) != len(w.arg_names):
        raise SeedUnsupported("cannot map Inductor's inputs to the region's")
    env: dict[str, str] = {}
    layout: dict[str, tuple] = {}  # root -> (shape, stride, dtype)
    for i, name in enumerate(w.arg_names):
        if order[i] is None:
            raise SeedUnsupported(f"Inductor input {name} is not one of the region's inputs")
        env[name] = f"inputs[{order[i]}]"
        m = task.inputs[order[i]]
        layout[name] = (tuple(m.shape), tuple(m.strides), m.dtype)
    layout.update(w.allocs)
    # outputs: a buffer Inductor allocates with exactly an output's storage and layout is that
    # output; every other returned value (a view of an input, of another output, a slice of a
    # larger buffer) is copied into its output after the launches
    owner: dict[str, int] = {}
    for k, r in enumerate(w.returned):
        if r.root not in w.allocs or r.root in owner or r.off:
            continue
        shape, stride, dt = w.allocs[r.root]
        m = task.outputs[k]
        vs, vt = (r.size, r.stride) if r.size is not None else (shape, stride)
        if dt == m.dtype and storage_span(shape, stride) * DTYPE_BYTES[dt] == \
                storage_span(m.shape, m.strides) * DTYPE_BYTES[m.dtype] and \
                _same_layout(vs, vt, m.shape, m.strides):
            owner[r.root] = k
            env[r.root] = f"outputs[{k}]"
    # what each tensor the seed names really is: a buffer that became output k is that output,
    # at the output's shape and strides, not at the ones Inductor allocated it with
    named = dict(layout)
    for root, k in owner.items():
        m = task.outputs[k]
        named[root] = (tuple(m.shape), tuple(m.strides), m.dtype)
    for k, r in enumerate(w.returned):
        if r.root in w.fallback_parts and r.root not in owner and not r.off:
            m = task.outputs[k]
            owner[r.root] = k
            env[r.root] = f"outputs[{k}]"
            layout[r.root] = (tuple(m.shape), tuple(m.strides), m.dtype)
    copies = []
    for k, r in enumerate(w.returned):
        if owner.get(r.root) == k:
            continue
        if r.root not in layout:
            raise SeedUnsupported(f"output {k} is not a buffer the wrapper knows")
        shape, stride, dt = layout[r.root]
        m = task.outputs[k]
        if dt != m.dtype:
            raise SeedUnsupported(f"output {k}: Inductor returns {dt}, the region's output is {m.dtype}")
        size, st = (r.size, r.stride) if r.size is not None else (shape, stride)
        if tuple(int(x) for x in size) != tuple(m.shape):
            raise SeedUnsupported(f"output {k}: Inductor returns shape {list(size)}, the region's "
                                  f"output is {list(m.shape)}")
        copies.append((k, r.root, r.off, st))
    scratch = []
    for name, (shape, stride, dt) in w.allocs.items():
        if name not in env:
            env[name] = name
            scratch.append((name, list(shape), list(stride), dt))
    launches: list[SeedLaunch] = []
    offsets: dict[str, set] = {}  # kernel -> pointer params handed a view at an offset
    aliases: dict[str, dict] = {}  # kernel -> {param: the earlier param handed the same buffer}
    for step in w.steps:
        if step[0] == "library":
            launches.append(_library_launch(step[1], step[2], step[3], w, env, layout, named))
            continue
        if step[0] == "fallback":
            _, op, args, name, kwargs = step
            outs = [env.get(f"{name}#{i}") for i in range(FALLBACK_OUT[op])]
            if not all(o and o.startswith("outputs[") for o in outs):
                raise SeedUnsupported(f"Inductor's fallback aten.{op} feeds more of the region: only "
                                      "a result returned as it is becomes the seed's call")
            ln = _library_launch(op, args, kwargs, w, env, layout, named)
            ln.kwargs["out"] = "(" + ", ".join(outs) + ")"
            launches.append(ln)
            continue
        _, kname, args = step
        k = kernels[kname]
        plain = [p for p in k.params if p not in k.constexprs]
        if len(args) != len(plain):
            raise SeedUnsupported(f"kernel {kname}: {len(args)} launch arguments for "
                                  f"{len(plain)} parameters")
        out_args, numels, extra, first, same = [], {}, {}, {}, {}
        for p, a in zip(plain, args):
            if isinstance(a, ast.Constant) and isinstance(a.value, (int, float)):
                out_args.append(a.value)
                if p.endswith("numel"):
                    numels[p] = int(a.value)
                continue
            r = w.ref(a)
            if r.root not in env:
                raise SeedUnsupported(f"kernel {kname}: argument {ast.unparse(a)[:40]} is unknown")
            if r.root in first:
                # one buffer as two pointers (a cat's halves): one argument, the second an
                # offset from it. Traced into the model, each pointer argument a kernel writes
                # is a functional copy of its own, and the writes through one of the two would
                # be lost (qwen_moe's QK-norm + RoPE, H100 2026-12-06: 93 % of the logits off)
                same[p] = first[r.root]
                extra[f"{p}_KFOFF"] = r.off
                continue
            first[r.root] = p
            out_args.append(env[r.root])
            if r.off:
                extra[f"{p}_KFOFF"] = r.off
                offsets.setdefault(kname, set()).add(p)
        if aliases.setdefault(kname, same) != same:
            raise SeedUnsupported(f"kernel {kname}: its launches pass one buffer as different arguments")
        for p in k.constexprs:  # numels passed as constexpr (e.g. xnumel == 1)
            if p.endswith("numel") and p in k.constants:
                numels[p] = int(k.constants[p])
        launches.append(SeedLaunch(kname, out_args, numels, extra))
    for kname in set(offsets) | {k for k, v in aliases.items() if v}:
        params = sorted(offsets.get(kname, ()))
        _offset_pointers(kernels[kname], params, aliases.get(kname))
        for ln in launches:
            if ln.kernel == kname and ln.kind == "kernel":
                for p in params:
                    ln.extra.setdefault(f"{p}_KFOFF", 0)
    used = {ln.kernel for ln in launches if ln.kind == "kernel"}
    kernels = {n: k for n, k in kernels.items() if n in used}
    for i, (k, root, off, st) in enumerate(copies):
        m = task.outputs[k]
        ck, ln = copy_kernel(f"kf_copy_{i}", env[root], f"outputs[{k}]", tuple(m.shape), tuple(st),
                             int(off), tuple(m.strides))
        kernels[ck.name] = ck
        launches.append(ln)
    for z in w.zeroed:
        if z not in env:
            raise SeedUnsupported(f"zeroes an unknown buffer {z}")
    return Seed(kernels=kernels, launches=launches, scratch=scratch,
                zeroed=[env[z] for z in w.zeroed], helpers=helpers, uses_libdevice=libdev,
                variant=variant, device=device, wrapper=wrapper)


def _library_launch(lib: str, args: list, kwargs: dict, w: _Wrapper, env: dict,
                    layout: dict, named: dict) -> SeedLaunch:
    """`extern_kernels.mm(a, reinterpret_tensor(w, (k, n), (1, k), 0), out=buf)` -> the same
    call on the candidate's tensors, a view written as `.as_strided(size, stride)`.

    `layout` is each buffer as Inductor allocated it, `named` the tensor the seed hands over
    for it (an output owns a buffer of its storage at its own shape). Where they differ the
    call gets a view: `mm(out=outputs[0])` with outputs[0] [8, 512, 6912] would resize the
    output tensor to [4096, 6912], harmless in memory but, traced into the model's graph, an
    output of the wrong shape (gemma's linear+gelu, H100 2026-12-06)."""
    def expr(node) -> str:
        if isinstance(node, ast.Constant):
            return repr(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
                and isinstance(node.operand, ast.Constant):
            return repr(-node.operand.value)
        r = w.ref(node)
        if r.root not in env:
            raise SeedUnsupported(f"library call {lib}: argument {ast.unparse(node)[:40]} is unknown")
        if r.off:
            raise SeedUnsupported(f"library call {lib}: a view at an offset")
        base = env[r.root]
        shape, stride, _ = layout[r.root]
        want = (tuple(r.size), tuple(r.stride)) if r.size is not None else (tuple(shape), tuple(stride))
        have = named.get(r.root, layout[r.root])[:2]
        if _ints(want[0]) == _ints(have[0]) and _ints(want[1]) == _ints(have[1]):
            return base
        return f"{base}.as_strided({_ints(want[0])}, {_ints(want[1])})"

    return SeedLaunch(lib, [expr(a) for a in args], {}, kind="library",
                      kwargs={k: expr(v) for k, v in kwargs.items()})


def _ints(xs) -> str:
    """A tuple literal of ints: `(8, 24)`, `(8,)`."""
    return repr(tuple(int(x) for x in xs))


class _AddOffset(ast.NodeTransformer):
    def __init__(self, params, aliases):
        self.base = {p: p for p in params} | dict(aliases)  # param -> the pointer it offsets

    def visit_Name(self, node):
        if node.id in self.base and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.BinOp(ast.Name(self.base[node.id], ast.Load()), ast.Add(),
                                               ast.Name(f"{node.id}_KFOFF", ast.Load())), node)
        return node


def _offset_pointers(k: SeedKernel, params: list[str], aliases: dict | None = None) -> None:
    """Pointer params handed a view at an offset (a `cat` writing the second half of its
    output) get a constexpr `<param>_KFOFF` added wherever the kernel uses them. A param in
    `aliases` was handed the same buffer as an earlier one: it goes, and its uses become that
    param plus its own offset."""
    aliases = aliases or {}
    tree = ast.parse(k.source)
    for fdef in tree.body:
        if isinstance(fdef, ast.FunctionDef) and fdef.name == k.name:
            _AddOffset(params, aliases).visit(fdef)
            fdef.args.args = [a for a in fdef.args.args if a.arg not in aliases]
            k.params = [p for p in k.params if p not in aliases]
            for p in list(params) + sorted(aliases):
                fdef.args.args.append(ast.arg(f"{p}_KFOFF", ast.parse("tl.constexpr", mode="eval").body))
                k.params.append(f"{p}_KFOFF")
                k.constexprs.append(f"{p}_KFOFF")
    k.source = ast.unparse(ast.fix_missing_locations(tree))


def copy_kernel(name: str, src: str, dst: str, shape: tuple, src_stride: tuple, src_off: int,
                dst_stride: tuple) -> tuple[SeedKernel, SeedLaunch]:
    """A strided copy `dst[i] = src[off + i . src_stride]` over `shape`, every size and stride a
    literal: an output Inductor returns as a view of another buffer gets its own elements."""
    dims = [(int(n), int(s), int(d)) for n, s, d in zip(shape, src_stride, dst_stride) if int(n) != 1]
    numel = 1
    for n, _, _ in dims:
        numel *= n
    span = max([src_off + sum((n - 1) * s for n, s, _ in dims),
                sum((n - 1) * d for n, _, d in dims), numel])
    wide = span >= 2**31 - 1
    body = [f"def {name}(src_ptr, dst_ptr, XBLOCK: tl.constexpr):",
            "    x = tl.program_id(0)" + (".to(tl.int64)" if wide else "") + " * XBLOCK + tl.arange(0, XBLOCK)",
            f"    mask = x < {numel}"]
    src_terms, dst_terms = ([str(src_off)] if src_off else []), []
    inner = 1
    for j in range(len(dims) - 1, -1, -1):
        n, s, d = dims[j]
        idx = f"i{j}"
        body.append(f"    {idx} = x // {inner} % {n}" if inner > 1 else f"    {idx} = x % {n}")
        inner *= n
        if s:
            src_terms.append(f"{idx} * {s}" if s != 1 else idx)
        if d:
            dst_terms.append(f"{idx} * {d}" if d != 1 else idx)
    body.append(f"    v = tl.load(src_ptr + ({' + '.join(src_terms) or '0'}), mask)")
    body.append(f"    tl.store(dst_ptr + ({' + '.join(dst_terms) or '0'}), v, mask)")
    source = "@triton.jit\n" + "\n".join(body)
    xb = min(1024, 1 << max(0, numel - 1).bit_length())
    k = SeedKernel(name=name, kind="pointwise", source=source, params=["src_ptr", "dst_ptr", "XBLOCK"],
                   constexprs=["XBLOCK"], grid_type="Grid1D",
                   configs=[{"kwargs": {"XBLOCK": xb}, "num_warps": 4 if xb >= 512 else 1,
                             "num_stages": 1}],
                   size_hints={"x": xb}, generated=True)
    return k, SeedLaunch(name, [src, dst], {"xnumel": numel})


def _same_layout(shape, stride, shape2, stride2) -> bool:
    """Two (shape, stride) pairs that address the same elements in the same order."""
    def dense(sh, st):
        return [(s, t) for s, t in zip(sh, st) if s != 1]
    return dense(shape, stride) == dense(shape2, stride2)
