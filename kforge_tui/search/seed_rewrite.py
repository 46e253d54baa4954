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
  * not handled (SeedUnsupported with the reason): other library calls (convolutions), aten
    fallbacks (`aten.topk`: PyTorch's own kernel, there is no Inductor kernel to start from),
    template/foreach/combo/split-scan kernels, dynamic shapes.
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
