"""The region graph as something kernels can be generated from.

`Region(task)` reads the region's graph (regions/graph.py JSON), runs it once on meta tensors
(`torch.empty_strided(shape, stride, dtype=..., device="meta")`) to learn every value's shape,
strides and dtype, and classifies each node:

  * input      a region input: element `idx` is at `sum(idx[d] * stride[d])` from its pointer;
  * view       a view of another value (view/reshape, [un]squeeze, expand, permute, transpose,
               t, slice, select, alias, split/unbind items, unfold, as_strided): an *index map*
               from the view's index to its base's index (sym.py forms), so views never move data;
  * const      full / scalar_tensor / zeros / ones / arange / iota / fill: a value computed in place;
  * op         a pointwise op: a C expression of its operands (PyTorch semantics: type promotion,
               16-bit results rounded after every op like eager, NaN-propagating min/max/clamp);
  * red        a component of a reduction (sum, mean, amax/amin, max/min(.dim), argmax/argmin,
               prod, any/all, var/std(_mean)); kernels read it through a hook for the current row;
  * ext        the result of an op the kernel computes itself (`Region(task, external=...)`: a
               GEMM whose epilogue this region is), read through a hook at its element.

`Emitter` turns values at symbolic indices into C statements, hoisting every statement to the
outermost open scope whose loop variables it uses (so per-row values leave the inner loop), with
common subexpressions shared per scope. Loads and reduction values go through hooks the kernel
builders (pointwise.py, rows/) provide: they decide vector packs, caches and which row is which.

Anything this module cannot express raises `sym.Unsupported` with the reason; generators catch it
and offer no design for that task.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch

from kforge_tui.search.codegen import ops as OPS
from kforge_tui.search.codegen.cexpr import COMPUTE_C, FLOATS, HALF, INTS, STORE_C, Ref, broadcast_idx, dname
from kforge_tui.search.codegen.sym import Form, Unsupported, const, ravel, unravel


def decode(a):
    """graph.py JSON argument -> Python value, with Ref(name) for graph values."""
    if isinstance(a, list):
        return [decode(x) for x in a]
    if isinstance(a, dict):
        if "ref" in a:
            return Ref(a["ref"])
        if "tuple" in a:
            return tuple(decode(x) for x in a["tuple"])
        if "dtype" in a:
            return getattr(torch, a["dtype"])
        if "device" in a or "layout" in a or "memory_format" in a:
            return None
        if "float" in a:
            return float(a["float"])
        raise Unsupported(f"argument {a}")
    return a


def bind(target: str, args: list, kwargs: dict) -> dict:
    """Arguments by schema name, defaults filled in."""
    if target == "getitem":
        return {"self": args[0], "index": args[1]}
    ns, op, ov = target.split(".")
    try:
        opov = getattr(getattr(getattr(torch.ops, ns), op), ov)
    except AttributeError as e:
        raise Unsupported(f"unknown op {target}") from e
    out = {}
    for k, arg in enumerate(opov._schema.arguments):
        if k < len(args) and not arg.kwarg_only:
            out[arg.name] = args[k]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


# ------------------------------------------------------------------------------ values

@dataclass
class Reduction:
    name: str
    kind: str  # sum prod max min argmax argmin any all mean var std
    inp: str  # the value reduced
    shape: tuple  # its shape
    dims: tuple  # reduced dims (sorted)
    keepdim: bool
    correction: float = 0.0
    acc_dtype: str = "float32"  # dtype the input is reduced in (before rounding the result)
    in_dtype: str = "float32"  # dtype the input is converted to first (sum(dtype=...))
    stage: int = 0  # first pass it needs (var/std take two: mean, then squared deviations)

    @property
    def passes(self) -> int:
        return 2 if self.kind in ("var", "std") else 1


@dataclass
class Val:
    name: str
    kind: str  # input | view | const | op | red | multi
    shape: tuple
    stride: tuple
    dtype: str
    target: str = ""
    a: dict = field(default_factory=dict)  # bound arguments (Ref for values)
    base: str = ""  # view: the value viewed
    vmap: object = None  # view: idx forms -> base idx forms
    red: Reduction | None = None
    comp: str = ""  # red: value | index | var | mean | std
    pos: int = -1  # input: ABI position
    dep_red: bool = False  # depends on a reduction value

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_VIEW = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
         "aten.view_copy.default", "aten.unsqueeze.default", "aten.unsqueeze_copy.default",
         "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.squeeze_copy.dim",
         "aten.expand.default", "aten.expand_copy.default", "aten.permute.default",
         "aten.permute_copy.default", "aten.transpose.int", "aten.t.default", "aten.slice.Tensor",
         "aten.slice_copy.Tensor", "aten.select.int", "aten.select_copy.int", "aten.alias.default",
         "aten.detach.default", "aten.as_strided.default", "aten.unfold.default",
         "aten.lift_fresh_copy.default", "aten.clone.default", "aten.contiguous.default"}
_MULTI_VIEW = {"aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int",
               "aten.chunk.default"}
_SOURCES = {"aten.full.default", "aten.scalar_tensor.default", "aten.zeros.default",
            "aten.ones.default", "aten.arange.default", "aten.arange.start", "aten.arange.start_step",
            "prims.iota.default", "aten.full_like.default", "aten.zeros_like.default",
            "aten.ones_like.default", "aten.fill.Scalar"}
_RED = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max", "min": "min",
        "argmax": "argmax", "argmin": "argmin", "prod": "prod", "any": "any", "all": "all",
        "var": "var", "std": "std", "var_mean": "var", "std_mean": "std"}


def _norm_dim(d: int, n: int) -> int:
    n = max(n, 1)
    if not -n <= d < n:
        raise Unsupported(f"dim {d} out of range")
    return d % n


class Region:
    """The analysed region graph of one task (see the module docstring)."""

    def __init__(self, task, external: frozenset = frozenset()):
        self.task = task
        self.external = frozenset(external)
        g = task.graph
        if any(not m.present for m in task.inputs):
            raise Unsupported("an absent (None) input")
        for m in list(task.inputs) + list(task.outputs):
            if m.dtype not in COMPUTE_C:
                raise Unsupported(f"dtype {m.dtype}")
        self.vals: dict[str, Val] = {}
        metas = self._meta_run()
        for k, (name, m) in enumerate(zip(g["inputs"], task.inputs)):
            self.vals[name] = Val(name, "input", tuple(m.shape), tuple(m.strides), m.dtype, pos=k)
        self.reductions: list[Reduction] = []
        self.order: list[str] = []
        for n in g["nodes"]:
            self._node(n, metas.get(n["name"]))
        self.outputs = []
        for o, m in zip(g["outputs"], task.outputs):
            ref = decode(o)
            if not isinstance(ref, Ref) or ref.name not in self.vals:
                raise Unsupported("an output that is not a graph value")
            v = self.vals[ref.name]
            if v.kind == "multi":
                raise Unsupported("a tuple output")
            if tuple(v.shape) != tuple(m.shape) or v.dtype != m.dtype:
                raise Unsupported(f"output {m.name} meta mismatch")
            self.outputs.append(ref.name)
        self._dependencies()

    # ------------------------------------------------------------------ meta
    def _meta_run(self) -> dict:
        from kforge_tui.regions.graph import to_graph_module

        try:
            gm = to_graph_module(self.task.graph, "meta")
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"graph does not rebuild: {e}") from e
        vals = {}

        class Rec(torch.fx.Interpreter):
            def run_node(self, n):
                r = super().run_node(n)
                vals[n.name] = r
                return r

        ins = [torch.empty_strided(tuple(m.shape), tuple(m.strides), dtype=getattr(torch, m.dtype),
                                   device="meta") for m in self.task.inputs]
        try:
            with torch.no_grad():
                Rec(gm).run(*ins)
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"graph does not run on meta tensors: {type(e).__name__}: {e}") from e
        return vals

    # ------------------------------------------------------------------ nodes
    def _node(self, n: dict, meta) -> None:
        name, target = n["name"], n["target"]
        args = decode(n["args"])
        kwargs = {k: decode(v) for k, v in n["kwargs"].items()}
        a = bind(target, args, kwargs)
        if isinstance(meta, torch.Tensor):
            shape, stride, dt = (tuple(int(s) for s in meta.shape), tuple(int(s) for s in meta.stride()),
                                 dname(meta.dtype))
            if dt not in COMPUTE_C:
                raise Unsupported(f"dtype {dt}")
        else:
            shape, stride, dt = (), (), ""
        self.order.append(name)
        if target == "getitem":
            self._getitem(name, a, shape, stride, dt)
            return
        packet = ".".join(target.split(".")[:2])
        if target in _VIEW:
            base = a["self"]
            if not isinstance(base, Ref):
                raise Unsupported(f"{target} of a non-value")
            self.vals[name] = Val(name, "view", shape, stride, dt, target, a, base=base.name,
                                  vmap=self._vmap(target, a, self.vals[base.name], shape, meta))
            return
        if target in _MULTI_VIEW:
            self.vals[name] = Val(name, "multi", (), (), "", target, a)
            return
        if target in _SOURCES:
            self.vals[name] = Val(name, "const", shape, stride, dt, target, a)
            return
        op = packet.split(".")[1]
        if packet.startswith("aten.") and op in _RED:
            self._reduction(name, target, op, a, meta, shape, stride, dt)
            return
        if target in self.external and isinstance(meta, torch.Tensor):
            self.vals[name] = Val(name, "ext", shape, stride, dt, target, a)
            return
        if target in ("aten.copy.default", "aten.copy_.default"):
            a = {"self": a["src"], "_shape_of": a["self"]}
            target = "aten._to_copy.default"
        if not OPS.known(target):
            raise Unsupported(f"op {target} has no generated form")
        if not isinstance(meta, torch.Tensor):
            raise Unsupported(f"{target} does not return one tensor")
        self.vals[name] = Val(name, "op", shape, stride, dt, target, a)

    def _getitem(self, name, a, shape, stride, dt):
        src = self.vals.get(a["self"].name) if isinstance(a["self"], Ref) else None
        k = a["index"]
        if src is None or src.kind not in ("multi",):
            raise Unsupported("getitem of a non-tuple")
        if src.red is not None:  # a multi-output reduction
            comps = {"var": ("var", "mean"), "std": ("std", "mean")}.get(src.red.kind, ("value", "index"))
            self.vals[name] = Val(name, "red", shape, stride, dt, red=src.red, comp=comps[k])
            return
        base = self.vals[src.a["self"].name]
        t, sa = src.target, src.a
        dim = _norm_dim(sa.get("dim", 0) or 0, len(base.shape))
        if t == "aten.unbind.int":
            vm = self._vmap("aten.select.int", {"dim": dim, "index": k}, base, shape, None)
        else:
            if t == "aten.split.Tensor":
                size = sa["split_size"]
                start = k * size
            elif t == "aten.chunk.default":
                size = -(-base.shape[dim] // sa["chunks"])
                start = k * size
            else:
                sizes = sa["split_sizes"]
                start = sum(sizes[:k])
            vm = _slice_map(dim, start, 1)
        self.vals[name] = Val(name, "view", shape, stride, dt, "getitem", {}, base=base.name, vmap=vm)

    def _reduction(self, name, target, op, a, meta, shape, stride, dt):
        src = a.get("self")
        if not isinstance(src, Ref):
            raise Unsupported(f"{target} of a non-value")
        x = self.vals[src.name]
        kind = _RED[op]
        if op in ("max", "min") and target.endswith(".dim"):
            kind = "arg" + op  # values and indices
        dims = a.get("dim")
        if dims is None or dims == []:
            dims = list(range(len(x.shape)))
        if isinstance(dims, int):
            dims = [dims]
        dims = tuple(sorted({_norm_dim(int(d), len(x.shape)) for d in dims})) if x.shape else ()
        keepdim = bool(a.get("keepdim") or False)
        in_dtype = dname(a["dtype"]) if a.get("dtype") is not None else x.dtype
        outs = meta if isinstance(meta, (tuple, list)) else (meta,)
        out_dt = dname(outs[0].dtype)
        if kind in ("sum", "prod"):
            acc = "int64" if in_dtype in INTS + ("bool",) else ("float64" if in_dtype == "float64" else "float32")
        elif kind in ("any", "all"):
            acc = "bool"
        elif kind in ("max", "min", "argmax", "argmin"):
            acc = "float64" if in_dtype == "float64" else ("float32" if in_dtype in FLOATS else in_dtype)
        else:
            acc = "float64" if in_dtype == "float64" else "float32"
        corr = a.get("correction")
        if corr is None and kind in ("var", "std"):
            corr = 1.0 if a.get("unbiased", True) else 0.0
        r = Reduction(name, kind, src.name, tuple(x.shape), dims, keepdim, float(corr or 0.0), acc, in_dtype)
        if len(dims) == 0 and x.shape:
            raise Unsupported("reduction over no dims")
        self.reductions.append(r)
        if isinstance(meta, (tuple, list)) or op == "max" and target.endswith(".dim") \
                or op == "min" and target.endswith(".dim") or op in ("var_mean", "std_mean"):
            self.vals[name] = Val(name, "multi", (), (), "", target, a, red=r)
        else:
            comp = {"argmax": "index", "argmin": "index"}.get(kind, "value")
            if kind in ("var", "std"):
                comp = kind
            self.vals[name] = Val(name, "red", shape, stride, out_dt, target, a, red=r, comp=comp)

    # ------------------------------------------------------------------ views
    def _vmap(self, target, a, base: Val, shape, meta):
        bshape = tuple(base.shape)
        n, k = len(shape), len(bshape)
        if target in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                      "aten.view_copy.default"):
            return lambda idx: unravel(ravel(idx, shape), bshape)
        if target in ("aten.alias.default", "aten.detach.default", "aten.lift_fresh_copy.default",
                      "aten.clone.default", "aten.contiguous.default"):
            return lambda idx: list(idx)
        if target in ("aten.unsqueeze.default", "aten.unsqueeze_copy.default"):
            d = _norm_dim(a["dim"], n)
            return lambda idx: [x for i, x in enumerate(idx) if i != d]
        if target.startswith("aten.squeeze"):
            dims = a.get("dim")
            if dims is None:
                sq = [i for i, s in enumerate(bshape) if s == 1]
            else:
                dims = [dims] if isinstance(dims, int) else list(dims)
                sq = sorted({_norm_dim(d, k) for d in dims if bshape and bshape[_norm_dim(d, k)] == 1})

            def m(idx, sq=tuple(sq)):
                it = iter(idx)
                return [const(0) if i in sq else next(it) for i in range(k)]
            return m
        if target in ("aten.expand.default", "aten.expand_copy.default"):
            off = n - k
            return lambda idx: [const(0) if bshape[d] == 1 else idx[d + off] for d in range(k)]
        if target in ("aten.permute.default", "aten.permute_copy.default"):
            dims = [_norm_dim(d, n) for d in a["dims"]]

            def m(idx, dims=tuple(dims)):
                out = [None] * k
                for i, d in enumerate(dims):
                    out[d] = idx[i]
                return out
            return m
        if target in ("aten.transpose.int", "aten.t.default"):
            if target == "aten.t.default":
                d0, d1 = (0, 1) if n == 2 else (0, 0)
            else:
                d0, d1 = _norm_dim(a["dim0"], n), _norm_dim(a["dim1"], n)

            def m(idx, d0=d0, d1=d1):
                out = list(idx)
                out[d0], out[d1] = idx[d1], idx[d0]
                return out
            return m
        if target in ("aten.slice.Tensor", "aten.slice_copy.Tensor"):
            d = _norm_dim(a["dim"], k)
            start = a.get("start") or 0
            size = bshape[d]
            start = start + size if start < 0 else start
            start = min(max(start, 0), size)
            return _slice_map(d, start, int(a.get("step") or 1))
        if target in ("aten.select.int", "aten.select_copy.int"):
            d = _norm_dim(a["dim"], k)
            i = int(a["index"])
            i = i + bshape[d] if i < 0 else i

            def m(idx, d=d, i=i):
                out = list(idx)
                out.insert(d, const(i))
                return out
            return m
        if target == "aten.unfold.default":
            d = _norm_dim(a["dimension"], k)
            step = int(a["step"])

            def m(idx, d=d, step=step):
                out = list(idx[:k])
                out[d] = idx[d] * step + idx[k]
                return out
            return m
        if target == "aten.as_strided.default":
            return self._as_strided_map(a, base, shape)
        raise Unsupported(f"view {target}")

    def _as_strided_map(self, a, base: Val, shape):
        """as_strided reads storage positions: map them back through the base's own layout."""
        root = base
        while root.kind == "view":
            if root.target != "aten.as_strided.default" and root.target not in (
                    "aten.alias.default", "aten.detach.default"):
                raise Unsupported("as_strided of a view")
            root = self.vals[root.base]
        if root is not base:
            raise Unsupported("as_strided of a view")
        size, stride = list(a["size"]), list(a["stride"])
        off = a.get("storage_offset")
        if off is not None and root.kind != "input" and off != 0:
            raise Unsupported("as_strided with a storage offset on a computed value")
        off = int(off or 0)
        if root.kind == "input":
            # storage positions relative to the input's element 0 (what the ABI pointer points at)
            if off:
                raise Unsupported("as_strided with a storage offset on an input")
        # the base's layout must be dense (a permutation of a contiguous layout)
        bs, bst = list(root.shape), list(root.stride)
        order = sorted(range(len(bs)), key=lambda d: -bst[d])
        acc = 1
        for d in reversed(order):
            if bs[d] != 1 and bst[d] != acc:
                raise Unsupported("as_strided of a value that is not dense")
            acc *= bs[d] if bs[d] != 1 else 1

        def m(idx):
            pos = const(off)
            for i, s in zip(idx, stride):
                pos = pos + i * int(s)
            out = [const(0)] * len(bs)
            for d in order:
                if bs[d] == 1:
                    continue
                out[d] = (pos // bst[d]) % bs[d] if bst[d] > 1 else pos % bs[d]
            return out
        return m

    # ------------------------------------------------------------------ analysis
    def _dependencies(self) -> None:
        for name in self.order:
            v = self.vals[name]
            if v.kind == "red":
                v.dep_red = True
            elif v.kind == "view":
                v.dep_red = self.vals[v.base].dep_red
            elif v.kind == "op":
                v.dep_red = any(self.vals[r.name].dep_red for r in _refs(v.a))
        # reduction stages
        done: dict[str, int] = {}

        def last_stage(r: Reduction) -> int:
            if r.name not in done:
                deps = self._reds_under(r.inp)
                r.stage = 1 + max((last_stage(d) for d in deps), default=-1)
                done[r.name] = r.stage + r.passes - 1
            return done[r.name]

        for r in self.reductions:
            last_stage(r)
        if self.reductions:
            doms = {(r.shape, r.dims) for r in self.reductions}
            if len(doms) != 1:
                raise Unsupported("more than one reduction domain")

    def _reds_under(self, name: str) -> list[Reduction]:
        out, seen, stack = [], set(), [name]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            v = self.vals[n]
            if v.kind == "red":
                if v.red not in out:
                    out.append(v.red)
            elif v.kind == "view":
                stack.append(v.base)
            elif v.kind == "op":
                stack.extend(r.name for r in _refs(v.a))
        return out

    @property
    def stages(self) -> int:
        return 1 + max((r.stage + r.passes - 1 for r in self.reductions), default=-1)

    @property
    def domain(self):
        """(input shape S, reduced dims) of the region's reductions, or None."""
        if not self.reductions:
            return None
        r = self.reductions[0]
        return r.shape, r.dims

    def leaves(self, name: str) -> set:
        """Region inputs a value reads (through views and ops, not through reductions)."""
        out, seen, stack = set(), set(), [name]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            v = self.vals[n]
            if v.kind == "input":
                out.add(n)
            elif v.kind == "view":
                stack.append(v.base)
            elif v.kind == "op":
                stack.extend(r.name for r in _refs(v.a))
        return out

    def transcendental(self) -> bool:
        return any(v.kind == "op" and OPS.has_math(v.target) for v in self.vals.values())

    def uses_f64(self) -> bool:
        return any(v.dtype == "float64" for v in self.vals.values())


def _refs(a: dict) -> list[Ref]:
    out = []
    for v in a.values():
        if isinstance(v, Ref):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, Ref))
    return out


def _slice_map(d: int, start: int, step: int):
    def m(idx):
        out = list(idx)
        out[d] = idx[d] * step + start
        return out
    return m


# ------------------------------------------------------------------------------ emission

class Scope:
    """A C block: statements placed there see the loop variables `vars` (and only those)."""

    def __init__(self, vars=(), hoist: bool = True, lane: str | None = None, lane_n: int = 1,
                 red: bool = False, loads: bool = False):
        self.vars = frozenset(vars) | ({"@red"} if red else frozenset())
        self.hoist = hoist
        self.lane = lane  # cuda pack lane variable bound in this scope (values are per lane)
        self.lane_n = lane_n
        self.lines: list[str] = []
        self.loads: list[str] | None = [] if loads else None  # pack loads, issued first
        self.memo: dict = {}


class Emitter:
    """Values at symbolic indices -> C statements (see the module docstring)."""

    def __init__(self, region: Region, backend: str, math_mode: str = "ieee"):
        self.R = region
        self.backend = backend
        self.math = math_mode
        self.chain: list[Scope] = []
        self._n = itertools.count()
        # hooks set by kernel builders
        self.load = None  # (emitter, val: Val, offset: Form) -> C expr (compute type)
        self.red_value = None  # (emitter, val: Val, idx) -> C expr (compute type of val.dtype)
        self.ext_value = None  # (emitter, val: Val, idx) -> C expr: an `ext` value at idx

    def fresh(self, prefix: str = "v") -> str:
        return f"{prefix}{next(self._n)}"

    def push(self, scope: Scope) -> Scope:
        self.chain.append(scope)
        return scope

    def pop(self) -> Scope:
        return self.chain.pop()

    @property
    def cur(self) -> Scope:
        return self.chain[-1]

    def target(self, free: frozenset) -> Scope:
        for s in self.chain:
            if s.hoist and free <= s.vars:
                return s
        return self.chain[-1]

    def emit(self, scope: Scope, line: str) -> None:
        scope.lines.append(line)

    # ------------------------------------------------------------------ values
    def value(self, name: str, idx) -> str:
        """C expression (compute type of the value's dtype) of value `name` at index `idx`."""
        v = self.R.vals[name]
        idx = list(idx)
        if len(idx) != len(v.shape):
            raise Unsupported(f"index rank mismatch at {name}")
        idx = [const(0) if s == 1 else i for i, s in zip(idx, v.shape)]
        if v.kind == "view":
            return self.value(v.base, v.vmap(idx))
        if v.kind == "input":
            off = const(0)
            for i, s, st in zip(idx, v.shape, v.stride):
                if s != 1:
                    off = off + i * st
            return self.load(self, v, off)
        if v.kind == "red":
            return self.red_value(self, v, idx)
        if v.kind == "ext":
            return self.ext_value(self, v, idx)
        if v.kind == "const":
            return OPS.source(self, v, idx)
        if v.kind != "op":
            raise Unsupported(f"value {name} of kind {v.kind}")
        free = frozenset()
        for f in idx:
            free |= f.free
        if v.dep_red:
            free |= {"@red"}
        scope = self.target(free)
        key = (name, tuple(f.key for f in idx))
        if key in scope.memo:
            return scope.memo[key]
        expr, exact = OPS.emit(self, v, idx)
        out = self.fresh()
        if v.dtype in HALF and not exact:
            expr = f"kf_r{'bf' if v.dtype == 'bfloat16' else 'hf'}({expr})"
        self.emit(scope, f"const {COMPUTE_C[v.dtype]} {out} = {expr};")
        scope.memo[key] = out
        return out

    def operand(self, ref, idx, result_shape):
        """(C expr, dtype) of an operand (a Ref at the broadcast index, or a Python scalar)."""
        if isinstance(ref, Ref):
            ov = self.R.vals[ref.name]
            return self.value(ref.name, broadcast_idx(idx, ov.shape)), ov.dtype
        return ref, None

    # ------------------------------------------------------------------ C helpers
    def conv_in(self, dtype: str, expr: str) -> str:
        """Storage element -> compute value."""
        if self.backend == "cuda":
            return f"kf_f({expr})" if dtype in HALF else expr
        if dtype == "bfloat16":
            return f"kf_bf2f({expr})"
        if dtype == "float16":
            return f"kf_h2f({expr})"
        return expr

    def conv_out(self, dtype: str, expr: str) -> str:
        """Compute value -> storage element."""
        if self.backend == "cuda":
            return f"kf_st<{STORE_C['cuda'][dtype]}>({expr})" if dtype in HALF else f"({STORE_C['cuda'][dtype]})({expr})"
        if dtype == "bfloat16":
            return f"kf_f2bf({expr})"
        if dtype == "float16":
            return f"kf_f2h({expr})"
        return f"({STORE_C['cpu'][dtype]})({expr})"


_CACHE: dict = {}


def region_of(task) -> Region:
    """The analysed region of a task (cached by the task's key; raises Unsupported)."""
    k = task.key
    hit = _CACHE.get(k)
    if hit is not None:
        if isinstance(hit, Unsupported):
            raise hit
        return hit
    try:
        r = Region(task)
    except Unsupported as e:
        _CACHE[k] = e
        raise
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[k] = r
    return r
