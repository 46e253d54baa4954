"""Pieces every generated kernel shares: the design object, pointer declarations, the load and
store hooks (16-byte packs on CUDA where an access is contiguous along the pack lane), the
source head and the entry point."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kforge_tui.regions.abi import INCLUDE_LINE, cuda_16bit_includes
from kforge_tui.search.codegen import cbase
from kforge_tui.search.codegen.cexpr import COMPUTE_C, ELEM_BYTES, STORE_C
from kforge_tui.search.codegen.ir import Emitter, Scope
from kforge_tui.search.codegen.sym import Form, Unsupported, var


@dataclass(frozen=True)
class GenDesign:
    """A generated design (the search.designs.Design protocol), shared by every generator.

    `finish` is a last textual step on a render (compute/base.py spells its device-function marker
    there); `default` falls back to the first valid point of the space when the generator's own
    default does not fit the task; a validity rule that raises means "not valid"."""

    name: str
    backend: str
    space: dict
    op: str
    _default: Callable = field(repr=False, compare=False)
    _valid: Callable = field(repr=False, compare=False)
    _render: Callable = field(repr=False, compare=False)
    _extent: Callable = field(repr=False, compare=False)
    doc: str = ""
    finish: Callable | None = field(default=None, repr=False, compare=False)

    def default(self, task) -> dict:
        d = dict(self._default(task))
        if self.valid(task, d):
            return d
        for p in points(self.space):  # the first valid point, smallest first
            if self.valid(task, p):
                return p
        return d

    def valid(self, task, params: dict) -> bool:
        if set(params) != set(self.space):
            return False
        if any(params[k] not in vals for k, vals in self.space.items()):
            return False
        try:
            return bool(self._valid(task, params))
        except Exception:  # noqa: BLE001 - a rule that cannot judge this task rules it out
            return False

    def render(self, task, params: dict) -> str:
        if not self.valid(task, params):
            raise ValueError(f"{self.name}: invalid parameters {params} for {task.task_id}")
        src = self._render(task, params)
        src = self.finish(src, self.backend) if self.finish is not None else src
        if self.backend == "cuda":  # the 16-bit headers the region's ABI header does not bring
            extra = cuda_16bit_includes(value_dtypes(task))
            if extra and INCLUDE_LINE in src:
                src = src.replace(INCLUDE_LINE, "\n".join([INCLUDE_LINE, *extra]), 1)
        return src

    def extent(self, task) -> tuple[int, int]:
        try:
            return tuple(self._extent(task))
        except Exception:  # noqa: BLE001 - priors fall back to "one row"
            return (1, 1)


def points(space: dict, limit: int = 4096):
    """The space's points in order (smallest values first), at most `limit` of them."""
    import itertools

    keys = list(space)
    for i, combo in enumerate(itertools.product(*[space[k] for k in keys])):
        if i >= limit:
            return
        yield dict(zip(keys, combo))


def value_dtypes(task) -> set[str]:
    """Every dtype a value of the region has: its tensors', and each dtype its graph names
    (casts to a type the inputs and outputs do not have)."""
    out = {m.dtype for m in (*task.inputs, *task.outputs) if m.present}

    def walk(v):
        if isinstance(v, dict):
            if isinstance(v.get("dtype"), str):
                out.add(v["dtype"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(task.graph)
    return out


def head(backend: str) -> str:
    pre = cbase.CUDA_PRELUDE if backend == "cuda" else cbase.CPU_PRELUDE
    out = INCLUDE_LINE + "\n" + pre + cbase.COMMON.replace(
        "KF_DEV", "__device__ __forceinline__" if backend == "cuda" else "inline")
    if backend == "cpu":
        out += cbase.CPU_POLY
    return out


def ptr_params(task, backend: str) -> str:
    """Kernel parameter list: every input and output as a typed restrict pointer."""
    st = STORE_C[backend]
    ps = [f"const {st[m.dtype]}* __restrict__ in{k}" for k, m in enumerate(task.inputs)]
    ps += [f"{st[m.dtype]}* __restrict__ out{k}" for k, m in enumerate(task.outputs)]
    return ", ".join(ps)


def ptr_args(task) -> str:
    return ", ".join([f"in{k}" for k in range(len(task.inputs))] + [f"out{k}" for k in range(len(task.outputs))])


def ptr_decls(task, backend: str) -> str:
    """Entry-point locals: typed pointers from the ABI's pointer arrays."""
    st = STORE_C[backend]
    lines = [f"  const {st[m.dtype]}* __restrict__ in{k} = (const {st[m.dtype]}*)inputs[{k}];"
             for k, m in enumerate(task.inputs)]
    lines += [f"  {st[m.dtype]}* __restrict__ out{k} = ({st[m.dtype]}*)outputs[{k}];"
              for k, m in enumerate(task.outputs)]
    lines += ["  (void)inputs; (void)outputs;"]
    return "\n".join(lines)


def entry(backend: str, body: str) -> str:
    if backend == "cuda":
        sig = 'extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream)'
    else:
        sig = 'extern "C" int kforge_launch(const void* const* inputs, void* const* outputs)'
    return f"\n{sig} {{\n{body}\n}}\n"


def lane_of(em: Emitter) -> tuple[str, int] | None:
    for s in reversed(em.chain):
        if s.lane:
            return s.lane, s.lane_n
    return None


def contig_base(off: Form, lane: str, n: int) -> Form | None:
    """off == base + lane with base a multiple of n and free of the lane: the base, else None."""
    if lane not in off.free:
        return None
    d = off - var(lane, n)
    if lane in d.free:
        return None
    if d.const % n or any(c % n for c in d.terms.values()):
        return None
    return d


class Access:
    """What the load/store hooks saw: which tensors were accessed as packs (alignment checks)."""

    def __init__(self):
        self.packed_in: set[int] = set()
        self.packed_out: set[int] = set()


def cuda_loader(access: Access, cache=None):
    """Load hook for CUDA kernels: a pack load when the access is contiguous along the lane."""

    def load(em: Emitter, v, off: Form) -> str:
        st = STORE_C["cuda"][v.dtype]
        ln = lane_of(em)
        if ln is not None:
            lane, n = ln
            base = contig_base(off, lane, n)
            if base is not None:
                access.packed_in.add(v.pos)
                if cache is not None:
                    hit = cache(em, v, base, n)
                    if hit is not None:
                        return em.conv_in(v.dtype, f"{hit}.v[{lane}]")
                scope = em.target(base.free)
                key = ("pack", v.name, base.key)
                if key not in scope.memo:
                    name = em.fresh("pk")
                    stmt = f"const kf_pack<{st}, {n}> {name} = kf_ldp<{st}, {n}>(in{v.pos} + {base.c()});"
                    (scope.loads if scope.loads is not None else scope.lines).append(stmt)
                    scope.memo[key] = name
                return em.conv_in(v.dtype, f"{scope.memo[key]}.v[{lane}]")
        scope = em.target(off.free)
        key = ("ld", v.name, off.key)
        if key not in scope.memo:
            name = em.fresh("ld")
            em.emit(scope, f"const {COMPUTE_C[v.dtype]} {name} = {em.conv_in(v.dtype, f'in{v.pos}[{off.c()}]')};")
            scope.memo[key] = name
        return scope.memo[key]

    return load


def cpu_loader():
    """Load hook for cpu kernels: plain loads (g++ vectorises contiguous ones), hoisted when
    they do not depend on the inner loop."""

    def load(em: Emitter, v, off: Form) -> str:
        scope = em.target(off.free)
        key = ("ld", v.name, off.key)
        if key not in scope.memo:
            name = em.fresh("ld")
            em.emit(scope, f"const {COMPUTE_C[v.dtype]} {name} = {em.conv_in(v.dtype, f'in{v.pos}[{off.c()}]')};")
            scope.memo[key] = name
        return scope.memo[key]

    return load


def out_offset(meta, idx) -> Form:
    off = Form({}, 0)
    for i, s, st in zip(idx, meta.shape, meta.strides):
        if s != 1:
            off = off + i * st
    return off


def store(em: Emitter, task, k: int, off: Form, val: str, access: Access, guard: str = "",
          pack_scope: Scope | None = None, post: list | None = None) -> None:
    """Write compute value `val` to output k at `off` (inside the current, innermost scope).

    On CUDA inside a lane loop, a contiguous unguarded store goes to an output pack declared in
    `pack_scope` and written after the lane loop (`post`)."""
    meta = task.outputs[k]
    conv = em.conv_out(meta.dtype, val)
    ln = lane_of(em) if em.backend == "cuda" else None
    if ln is not None and not guard and pack_scope is not None and post is not None:
        lane, n = ln
        base = contig_base(off, lane, n)
        if base is not None:
            st = STORE_C["cuda"][meta.dtype]
            name = em.fresh("po")
            pack_scope.lines.append(f"kf_pack<{st}, {n}> {name};")
            em.emit(em.cur, f"{name}.v[{lane}] = {conv};")
            post.append(f"kf_stp<{st}, {n}>(out{k} + {base.c()}, {name});")
            access.packed_out.add(k)
            return
    line = f"out{k}[{off.c()}] = {conv};"
    em.emit(em.cur, f"if ({guard}) {line}" if guard else line)


def align_check(task, access: Access, vec: int) -> str:
    """C condition: every pointer accessed as a pack is aligned to its pack size."""
    conds = []
    for k in sorted(access.packed_in):
        conds.append(f"((uintptr_t)inputs[{k}] % {vec * ELEM_BYTES[task.inputs[k].dtype]} == 0)")
    for k in sorted(access.packed_out):
        conds.append(f"((uintptr_t)outputs[{k}] % {vec * ELEM_BYTES[task.outputs[k].dtype]} == 0)")
    return " && ".join(conds) if conds else "true"


def indent(lines, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + ln for ln in lines)


def has_math_param(region) -> bool:
    return region.transcendental() and not region.uses_f64()
