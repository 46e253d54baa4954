"""Split an aten-level inference graph into regions: the units kforge writes kernels for.

Rules (docs/ARCHITECTURE.md "Regions" states them for users):
  1. Every call of the graph belongs to exactly one region; placeholders and constants
     (get_attr) are region inputs.
  2. A *compute* op (anything that is not pointwise, a view or a reduction: convolution,
     mm/addmm/bmm, attention, pooling, embedding, index and scatter ops, ...) is a region of its
     own, together with the pure views that only feed it (the `permute` of a Linear weight).
     A GEMM or convolution also takes its elementwise epilogue: the pointwise ops and reshapes
     on its output that keep its element count and order (bias, activation, residual add,
     scale, a folded inference batch_norm) and the small side chains of parameters they read
     (the batch_norm's rsqrt(var + eps)), so `linear+gelu` or `conv+batch_norm+relu` is one
     region, written once; a transpose ends the epilogue (RoPE on the heads of q stays its own
     region), and ops that only feed a reduction chain go back to it (an RMSNorm's pow(2)).
     On a GPU only (`epilogues_for`): on the cpu the vendor GEMM is far ahead of a generated one;
     a convolution only when asked (KFORGE_EPILOGUES=1): no design writes conv+epilogue yet.
  3. Pointwise ops, views, factories of constants and reductions fuse into *chains*, the kind
     of group a fusing compiler turns into one kernel. A chain holds at most one *reduction
     domain* (reductions over the same input shape and dims, like softmax's amax and sum or
     layer_norm's var_mean); what follows the reduction in the chain (its epilogue) stays on
     the same rows: its size is that of the reduction's input or output. On a GPU a `cat` of
     up to 8 inputs is pointwise here, as Inductor fuses it (`fuses_cat`: RoPE's rotate-half).
  4. Fusing never creates a cycle between regions (checked on each group's ancestors).
  5. A chain of views alone does no work: it joins its only consumer region, else it is
     listed as skipped. So is a region whose every output is empty (zero elements: any kernel
     or pattern "matches" it) and a fused chain with no input at all (iota/arange arithmetic
     such as F.interpolate's indices: a constant).
     A chain's trailing view that keeps every element (no slice, no expand) and feeds one other
     region moves into that region, so a value three Linears read through three `view`s is one
     output, and a view of an input is never an output.
  6. What cannot become a kernel is a region all the same, marked unsupported with the reason
     (random ops, in-place mutation of an input, complex or quantized dtypes, symbolic sizes,
     an input that overlaps itself in memory such as an expanded model input), so the profile
     lists it and nothing is dropped silently.

The partitioner is pure (fx graph in, region specs out) and deterministic, so that capture
(workload) and integration (torch.compile backend) find the same regions in the same graph.
This module imports only torch and the standard library: exported packages carry a copy.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .graph import GETITEM, UnsupportedRegion, graph_json, short_name

KERNEL_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                 torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
_aten = torch.ops.aten
# Ops that copy or convert values elementwise but carry no `pointwise` tag.
_POINTWISE_EXTRA = {_aten._to_copy.default, _aten.clone.default, _aten.copy.default,
                    _aten.alias.default, _aten.lift_fresh_copy.default, _aten.fill.Scalar,
                    _aten.full_like.default, _aten.zeros_like.default, _aten.ones_like.default}
# Ops that reshape without moving data in a fused kernel but are not schema aliases.
_VIEW_EXTRA = {_aten._unsafe_view.default, _aten.reshape.default, _aten.view_copy.default,
               _aten.expand_copy.default, _aten.permute_copy.default, _aten.squeeze_copy.dim,
               _aten.unsqueeze_copy.default, _aten.slice_copy.Tensor, _aten.select_copy.int}
# Factories with no tensor input: constants a chain computes in place.
_SOURCES = {_aten.full.default, _aten.scalar_tensor.default, _aten.arange.default,
            _aten.arange.start, _aten.arange.start_step, _aten.zeros.default, _aten.ones.default,
            torch.ops.prims.iota.default}
# Compute-op names shown to users, where the aten name is not what they would call it.
FRIENDLY = {"convolution": "conv", "addmm": "linear", "mm": "matmul", "bmm": "matmul",
            "_scaled_dot_product_flash_attention": "sdpa",
            "_scaled_dot_product_efficient_attention": "sdpa",
            "_scaled_dot_product_cudnn_attention": "sdpa",
            "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
            "max_pool2d_with_indices": "max_pool2d", "_adaptive_avg_pool2d": "adaptive_avg_pool2d",
            "_low_memory_max_pool_with_offsets": "max_pool2d",
            "_low_memory_max_pool_offsets_to_indices": "max_pool2d_indices",
            "_native_batch_norm_legit_no_training": "batch_norm"}


@dataclass
class RegionSpec:
    """One region of a graph: its nodes (topological order), inputs and outputs (ABI order)."""

    nodes: list
    inputs: list
    outputs: list
    kind: str  # "compute" | "pointwise" | "reduction"
    label: str
    unsupported: str = ""  # why it cannot become a kernel ("" when it can)
    graph: dict | None = None  # graph.py JSON form, filled by `extract`
    index: int = 0  # position in the partition (source order)

    @property
    def ops(self) -> list[str]:
        return [short_name(n.target) for n in self.nodes if n.target is not operator.getitem]


@dataclass
class Partition:
    regions: list[RegionSpec]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (what, why)


# ---------------------------------------------------------------------- classification

def _is_view(target) -> bool:
    if target in _VIEW_EXTRA:
        return True
    try:
        rets = target._schema.returns
    except AttributeError:
        return False
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _no_dropout(node: fx.Node) -> bool:
    """Attention ops are tagged random for their dropout; with dropout_p == 0 they are not."""
    names = [a.name for a in node.target._schema.arguments]
    if "dropout_p" not in names:
        return False
    i = names.index("dropout_p")
    p = node.args[i] if len(node.args) > i else node.kwargs.get("dropout_p", 0.0)
    return isinstance(p, (int, float)) and p == 0


def classify(node: fx.Node) -> str:
    """"getitem" | "view" | "pointwise" | "source" | "reduction" | "compute" | "mutation" | "random"."""
    t = node.target
    if t is operator.getitem:
        return "getitem"
    if not isinstance(t, torch._ops.OpOverload):
        return "compute"
    tags = set(getattr(t, "tags", ()))
    if torch.Tag.nondeterministic_seeded in tags and not _no_dropout(node):
        return "random"
    if t._schema.is_mutable:
        return "mutation"
    if t in _SOURCES:
        return "source"
    if _is_view(t):
        return "view"
    if torch.Tag.pointwise in tags or t in _POINTWISE_EXTRA:
        return "pointwise"
    if torch.Tag.reduction in tags:
        return "reduction"
    return "compute"


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _numel(node) -> int | None:
    v = _val(node)
    if isinstance(v, (tuple, list)):
        v = v[0] if v else None
    if isinstance(v, torch.Tensor):
        try:
            return int(v.numel())
        except Exception:  # symbolic
            return None
    return None


def reduction_domain(node: fx.Node):
    """(input shape, reduced dims) of a reduction; equal domains reduce the same rows."""
    src = node.args[0] if node.args else None
    v = _val(src)
    if not isinstance(v, torch.Tensor):
        return ("?", node.name)
    shape = tuple(int(s) for s in v.shape)
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        dims = list(range(len(shape)))
    if isinstance(dims, int):
        dims = [dims]
    nd = max(1, len(shape))
    return shape, tuple(sorted(int(d) % nd for d in dims))


def _domain_numels(dom) -> tuple[int, int]:
    shape, dims = dom
    n_in = 1
    for s in shape:
        n_in *= s
    n_red = 1
    for d in dims:
        n_red *= shape[d]
    return n_in, n_in // max(1, n_red)


_UNINITIALISED = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
                  _aten.new_empty.default, _aten.new_empty_strided.default}


def _unsupported_reason(node: fx.Node, cat: str) -> str:
    if node.target in _UNINITIALISED:
        return "an uninitialised tensor (torch.empty): its values are undefined"
    if cat == "random":
        return "random op (a kernel cannot reproduce its values)"
    if cat == "mutation":
        return "mutates its input in place"
    vals = []
    for x in [node] + [a for a in node.all_input_nodes]:
        v = _val(x)
        if x is node and isinstance(v, (list, tuple)):  # unused results (SymInts) do not count
            used = {u.args[1] for u in node.users if u.target is operator.getitem}
            v = [e for i, e in enumerate(v) if i in used]
        vals.extend(v if isinstance(v, (list, tuple)) else [v])
    for v in vals:
        if isinstance(v, torch.Tensor):
            if v.dtype not in KERNEL_DTYPES:
                return f"dtype {str(v.dtype).replace('torch.', '')} has no kernel type"
            if v.layout != torch.strided:
                return f"{str(v.layout).replace('torch.', '')} tensors are not supported"
            if any(not isinstance(s, int) for s in v.shape):
                return "symbolic (data-dependent or dynamic) size"
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return "symbolic (data-dependent or dynamic) value"
    if node.target is not operator.getitem and isinstance(node.target, torch._ops.OpOverload):
        rets = node.target._schema.returns
        used = {u.args[1] for u in node.users if u.target is operator.getitem} if len(rets) > 1 \
            else set(range(len(rets)))
        for i, r in enumerate(rets):  # only results the graph uses (flash attention's max_q ...)
            if i in used and str(r.type) not in ("Tensor", "Tensor[]", "List[Tensor]"):
                return f"returns {r.type}, not tensors"
    return ""


# ---------------------------------------------------------------------- grouping

class _Group:
    __slots__ = ("id", "members", "fusible", "domain", "mask", "anc", "reduction_done", "epilogue")

    def __init__(self, gid: int, fusible: bool):
        self.id = gid
        self.members: list[fx.Node] = []
        self.fusible = fusible
        self.domain = None
        self.mask = 0  # bit set of member indices
        # bit set of every node this group depends on, members included, through other *groups*:
        # a group runs as one kernel, so reaching any member reaches all of them
        self.anc = 0
        self.epilogue = 0  # a GEMM/conv group: its output's numel, which its epilogue keeps


def epilogues_for(node: fx.Node) -> bool:
    """Whether a GEMM/conv takes its epilogue into its region (rule 2): on a GPU, a GEMM, where
    one kernel writing the activated tile beats the library GEMM plus a pass over its output.
    On the cpu the library (oneDNN/MKL) is far ahead of a generated GEMM, so the epilogue stays a
    region of its own that a cpu kernel can win on. A convolution keeps its epilogue apart on the
    GPU too (GPU_EPILOGUE_HOSTS says why). KFORGE_EPILOGUES=1 folds both kinds, =0 neither
    (tests of the GPU partition on a cpu; trying a conv+epilogue design)."""
    force = _forced("KFORGE_EPILOGUES")
    if force is not None:
        return force
    return _on_gpu(node) and node.target in GPU_EPILOGUE_HOSTS


def _forced(name: str) -> bool | None:
    """A partition rule's override from the environment (1 or 0), None when unset."""
    import os

    force = os.environ.get(name, "")
    return force == "1" if force in ("0", "1") else None


def _on_gpu(node: fx.Node) -> bool:
    v = _val(node)
    return isinstance(v, torch.Tensor) and v.device.type == "cuda"


# Inductor lowers a `cat` of at most this many inputs as a pointwise kernel that reads each
# input where the index falls (torch._inductor.config.max_pointwise_cat_inputs), fused with the
# ops around it; a larger cat is a ConcatKernel whose producers write into their slices.
POINTWISE_CAT_INPUTS = 8


def fuses_cat(node: fx.Node) -> bool:
    """Whether a `cat` fuses into the chains around it (rule 3) instead of being a region of its
    own: on a GPU, as Inductor fuses it. RoPE's rotate-half is `cat(-x2, x1)`: a region of its own
    split QK-norm + RoPE into three regions whose edges torch.compile never writes (the first one
    returned a slice of its normed heads, which the ABI then copied: qwen_moe's rms_norm+mul+neg
    seed read 66.6 against Inductor's 51.5 us, H100 2026-12-05). On the cpu the generated C kernels
    (codegen/ir.py) have no form for a cat, so it stays a region there. KFORGE_FUSE_CAT=1/0 forces
    either (tests of the GPU partition on a cpu)."""
    if node.target is not _aten.cat.default:
        return False
    tensors = node.args[0] if node.args else []
    if not isinstance(tensors, (list, tuple)) or not 1 <= len(tensors) <= POINTWISE_CAT_INPUTS:
        return False
    force = _forced("KFORGE_FUSE_CAT")
    return _on_gpu(node) if force is None else force


def partition(gm: fx.GraphModule) -> Partition:
    """Regions of `gm` in source order; deterministic for a given graph."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    idx = {n: i for i, n in enumerate(nodes)}
    group_of: dict[fx.Node, _Group] = {}
    groups: list[_Group] = []
    cats = {n: classify(n) for n in nodes}
    cats.update({n: "pointwise" for n in nodes if cats[n] == "compute" and fuses_cat(n)})
    reasons = {n: _unsupported_reason(n, cats[n]) for n in nodes}

    def new_group(n, fusible):
        g = _Group(len(groups), fusible)
        groups.append(g)
        add(g, n)
        return g

    def add(g, n):
        g.members.append(n)
        g.mask |= 1 << idx[n]
        g.anc |= 1 << idx[n]
        for i in n.all_input_nodes:  # every call before n is in a group: theirs hold its ancestors
            p = group_of.get(i)
            if p is not None and p is not g:
                g.anc |= p.anc
        group_of[n] = g

    def creates_cycle(a: _Group, b: _Group) -> bool:
        """Would one group of a and b depend on itself? Through a third group C that depends on
        one and feeds the other. Checked on groups, not nodes: QK-norm's chain held cos's
        unsqueeze next to its own heads, so k's chain, reading that unsqueeze while the q chain
        read k's heads, was a cycle that no path between single nodes shows."""
        both = a.mask | b.mask
        ext = (a.anc | b.anc) & ~both
        return bool(ext) and any(c is not a and c is not b and c.members and c.mask & ext
                                 and c.anc & both for c in groups)

    def merge(into: _Group, other: _Group) -> None:
        for m in other.members:
            group_of[m] = into
        into.members.extend(other.members)
        into.mask |= other.mask
        into.anc |= other.anc
        into.domain = into.domain or other.domain
        other.members = []
        for d in groups:  # whatever depended on either now depends on all the merged group does
            if d is not into and d.members and d.anc & into.mask:
                d.anc |= into.anc

    def compatible(g: _Group, n: fx.Node, dom) -> bool:
        """Can node n (with reduction domain `dom`, or None) join fusible group g?"""
        if not g.fusible:
            return False
        if dom is not None and g.domain is not None and dom != g.domain:
            return False
        d = dom or g.domain
        if d is not None:
            # on the rows of the reduction: an epilogue (or a prologue joining after it) may
            # not range over more elements than the reduction reads
            n_in, _ = _domain_numels(d)
            sizes = [_numel(n)] + ([_numel(m) for m in g.members] if dom is not None else [])
            if any(s is not None and s > n_in for s in sizes):
                return False
        return True

    for n in nodes:
        cat = cats[n]
        if cat == "getitem":
            src = n.args[0]
            if src in group_of:
                add(group_of[src], n)
            else:
                new_group(n, False)
            continue
        if reasons[n] or cat in ("compute", "random", "mutation"):
            g = new_group(n, False)
            if not reasons[n] and n.target in EPILOGUE_HOSTS and epilogues_for(n):
                g.epilogue = _numel(n) or 0
            continue
        dom = reduction_domain(n) if cat == "reduction" else None
        g = new_group(n, True)
        g.domain = dom
        producers = []
        for i in n.all_input_nodes:
            p = group_of.get(i)
            if p is not None and p is not g and p not in producers:
                producers.append(p)
        producers.sort(key=lambda p: -max(idx[m] for m in p.members))
        host = next((p for p in producers if p.epilogue and p.members
                     and (cat == "pointwise" or n.target in _RESHAPES)
                     and _numel(n) == p.epilogue and not creates_cycle(p, g)), None)
        if host is not None:  # rule 2: a GEMM/conv's elementwise epilogue joins it
            merge(host, g)
            for p in producers:  # and the side chains it reads (a folded batch_norm's rsqrt(var + eps))
                if p is not host and p.members and p.fusible and p.domain is None \
                        and all(cats[m] in ("pointwise", "view") for m in p.members) \
                        and all((_numel(m) or 0) <= host.epilogue for m in p.members) \
                        and not creates_cycle(host, p):
                    merge(host, p)
            host.members.sort(key=lambda m: idx[m])
            continue
        for p in producers:
            if not p.members or not compatible(p, n, g.domain):
                continue
            if dom is None and g.domain is None and p.domain is not None:
                # joining a chain after its reduction: stay on its rows
                n_in, _ = _domain_numels(p.domain)
                if (_numel(n) or 0) > n_in:
                    continue
            if creates_cycle(p, g):
                continue
            merge(p, g)
            g = p

    # rule 5: chains of views only join their single consumer region
    for g in list(groups):
        if not g.members or not g.fusible:
            continue
        if all(cats[m] in ("view", "getitem") for m in g.members):
            consumers = {group_of[u] for m in g.members for u in m.users if u in group_of} - {g}
            if len(consumers) == 1:
                c = consumers.pop()
                if not creates_cycle(c, g):
                    merge(c, g)
                    c.members.sort(key=lambda m: idx[m])

    _move_edge_views(groups, group_of, cats, idx)
    _return_prologues(groups, group_of, cats, idx)

    out = Partition([])
    for g in sorted((g for g in groups if g.members), key=lambda g: min(idx[m] for m in g.members)):
        g.members.sort(key=lambda m: idx[m])
        spec = _spec(g, cats, reasons, idx)
        if spec is None:
            continue
        if all(cats[m] in ("view", "getitem") for m in g.members):
            out.skipped.append((spec.label, "views only: no data moves"))
            continue
        if not spec.unsupported and spec.outputs and all(_numel(o) == 0 for o in spec.outputs):
            # every output is empty: a kernel would do nothing, and any pattern "matches" it
            out.skipped.append((spec.label, "zero elements: nothing to compute"))
            continue
        if not spec.unsupported and g.fusible and not spec.inputs:
            # iota/arange/full arithmetic (interpolate's indices, masks): the same values on
            # every call, which torch.compile computes as it likes; not worth a search
            # named as a part: the op the user wrote (interpolate) still runs, as its own region
            out.skipped.append((f"{spec.label} (its part that depends on no input)", "the same values every call"))
            continue
        spec.index = len(out.regions)
        out.regions.append(spec)
    return out


_EXPANDS = {_aten.expand.default, _aten.expand_copy.default}
# Views that keep the row-major order of the elements (an epilogue stays on the GEMM's own
# element order through them; a transpose, slice or expand ends the epilogue).
_RESHAPES = {_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default,
             _aten.unsqueeze.default, _aten.squeeze.dim, _aten.squeeze.dims, _aten.squeeze.default,
             _aten.alias.default}
# Compute ops whose elementwise epilogue (bias, activation, residual, scale, a folded inference
# batch_norm) belongs in their region: a GEMM or convolution kernel applies it to its output
# tile before the one write (cuBLASLt epilogues, cuDNN fused conv, a generated kernel).
EPILOGUE_HOSTS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
                  _aten.convolution.default}
# Those that take it by default on a GPU: the GEMMs, whose fused region has kernels (the
# epilogue-fused GEMM designs, and node zero: cuBLAS into a buffer plus Inductor's epilogue).
# Not the convolution: no design writes conv+epilogue yet (the epilogue designs are built on the
# GEMM core, and Inductor keeps cuDNN's result from `extern_kernels.convolution`, which a Triton
# seed cannot rewrite), so a folded region could only end with 0 candidates, and it took the
# epilogue that Inductor's own kernel (the seed) and the pointwise designs can search: on the
# H200 (2026-12-04) ResNet-50's top regions were conv+batch_norm+relu chains, both searched with
# 0 candidates. Kept apart, the batch_norm+relu chain is a region in Inductor's layout.
GPU_EPILOGUE_HOSTS = EPILOGUE_HOSTS - {_aten.convolution.default}


def _move_edge_views(groups, group_of, cats, idx) -> None:
    """A chain's trailing view that only feeds one other region moves into that region.

    Views fuse into the chain that produces their input, so a value the chain hands to three
    Linears as three `view`s would leave as three outputs holding the same elements (each one
    written by the kernel), and a permuted model input seen only by the next region would be an
    output that is a copy of an input. A view that keeps every element (no slice, no expand)
    costs nothing on either side of the edge: it goes to its consumer, and the chain's output
    is the value itself, once."""
    moved = set()
    changed = True
    while changed:
        changed = False
        for g in groups:
            if not (g.fusible or g.epilogue) or not g.members \
                    or all(cats[m] in ("view", "getitem") for m in g.members):
                continue  # chains and GEMM/conv epilogues hand their trailing views on
            for m in sorted(g.members, key=lambda m: -idx[m]):
                if cats[m] != "view" or m.target in _EXPANDS or not m.users:
                    continue
                src = m.args[0] if m.args else None
                if _numel(m) is None or _numel(m) != _numel(src):
                    continue
                c = _sole_consumer(m, group_of)
                if c is None or c is g:
                    continue
                _hand_over(m, g, c, group_of, moved)
                changed = True
    for c in moved:
        c.members.sort(key=lambda m: idx[m])


def _sole_consumer(m: fx.Node, group_of) -> _Group | None:
    """The one group every use of `m` is in (None: a graph output, no use, or several groups)."""
    if not m.users or any(u not in group_of for u in m.users):
        return None
    dest = {group_of[u] for u in m.users}
    return dest.pop() if len(dest) == 1 else None


def _hand_over(m: fx.Node, g: _Group, c: _Group, group_of, moved: set) -> None:
    """`m` leaves `g` for `c`; the caller re-sorts the groups in `moved` once its pass is over."""
    g.members.remove(m)
    c.members.append(m)
    group_of[m] = c
    moved.add(c)


def _return_prologues(groups, group_of, cats, idx) -> None:
    """An epilogue's trailing ops that only feed one reduction chain go back to that chain: the
    `pow(2)` of an RMSNorm right after a residual add would otherwise end the GEMM's epilogue
    and leave the norm without its prologue (and its pattern)."""
    moved = set()
    for g in groups:
        if not g.epilogue or not g.members:
            continue
        changed = True
        while changed:
            changed = False
            for m in sorted(g.members, key=lambda m: -idx[m]):
                if cats[m] not in ("pointwise", "view"):
                    continue
                c = _sole_consumer(m, group_of)
                if c is None or c is g or not c.fusible or c.domain is None:
                    continue
                if (_numel(m) or 0) > _domain_numels(c.domain)[0]:
                    continue
                _hand_over(m, g, c, group_of, moved)
                changed = True
    for c in moved:
        c.members.sort(key=lambda m: idx[m])


def _spec(g: _Group, cats, reasons, idx) -> RegionSpec | None:
    members = set(g.members)
    inputs: list[fx.Node] = []
    for m in g.members:
        for a in m.all_input_nodes:
            if a not in members and a not in inputs:
                inputs.append(a)
    outputs = [m for m in g.members
               if cats[m] != "getitem" and not _is_multi(m) and any(u not in members for u in m.users)]
    outputs += [m for m in g.members if cats[m] == "getitem" and any(u not in members for u in m.users)]
    outputs.sort(key=lambda m: idx[m])
    ops = [short_name(m.target) for m in g.members if cats[m] != "getitem"]
    has_red = any(cats[m] == "reduction" for m in g.members)
    if not g.fusible:
        kind = "compute"
        main = next((m for m in g.members if cats[m] == "compute"),
                    next((m for m in g.members if cats[m] not in ("view", "getitem")), g.members[0]))
        label = FRIENDLY.get(short_name(main.target), short_name(main.target))
        if label == "matmul" and _semantic_name(main) == "linear":
            label = "linear"  # a Linear without bias is an mm (with it, addmm)
        epi = list(dict.fromkeys(_semantic_name(m) for m in g.members if m is not main
                                 and cats[m] in ("pointwise", "source")
                                 and short_name(m.target) not in _LABEL_SKIP))
        epi = [e for e in epi if e != label]
        if epi:  # a GEMM/conv with its epilogue: `linear+gelu`, `conv+batch_norm+relu`
            label += "+" + "+".join(epi[:2]) + ("+…" if len(epi) > 2 else "")
    else:
        kind = "reduction" if has_red else "pointwise"
        uniq = list(dict.fromkeys(_semantic_name(m) for m in g.members
                                  if cats[m] != "getitem" and short_name(m.target) not in _LABEL_SKIP))
        uniq = uniq or list(dict.fromkeys(ops))
        label = "+".join(uniq[:3]) + ("+…" if len(uniq) > 3 else "")
    why = next((reasons[m] for m in g.members if reasons[m]), "")
    if not why:
        why = next((f"an input {list(_val(a).shape)} with strides {list(_val(a).stride())} "
                    "overlaps itself in memory (an expanded tensor): test values cannot be "
                    "written into it" for a in inputs
                    if isinstance(_val(a), torch.Tensor) and _overlaps(_val(a))), "")
    if not why and not outputs:
        why = "computes nothing the model uses"
    return RegionSpec(list(g.members), inputs, outputs, kind, label, why)


_LABEL_SKIP = {"view", "_unsafe_view", "unsqueeze", "squeeze", "expand", "permute", "reshape",
               "_to_copy", "convert_element_type", "clone", "t", "transpose", "slice", "select",
               "alias", "full", "scalar_tensor"}


# nn.Module classes whose ops users know by the module's name (innermost module of a node).
_MODULE_NAMES = {"BatchNorm1d": "batch_norm", "BatchNorm2d": "batch_norm", "BatchNorm3d": "batch_norm",
                 "SyncBatchNorm": "batch_norm", "LayerNorm": "layer_norm", "GroupNorm": "group_norm",
                 "InstanceNorm1d": "instance_norm", "InstanceNorm2d": "instance_norm",
                 "ReLU": "relu", "ReLU6": "relu6", "GELU": "gelu", "SiLU": "silu", "Sigmoid": "sigmoid",
                 "Tanh": "tanh", "Softmax": "softmax", "LogSoftmax": "log_softmax", "Mish": "mish",
                 "Hardswish": "hardswish", "Hardtanh": "hardtanh", "LeakyReLU": "leaky_relu",
                 "ELU": "elu", "GELUTanh": "gelu", "GELUActivation": "gelu",
                 "PytorchGELUTanh": "gelu", "NewGELUActivation": "gelu", "RMSNorm": "rms_norm",
                 "AdaptiveAvgPool2d": "adaptive_avg_pool2d"}


_PY_OPS = {"truediv": "div", "floordiv": "floor_divide", "iadd": "add", "imul": "mul",
           "isub": "sub", "itruediv": "div", "neg": "neg", "getitem": "slice"}


def _semantic_name(node: fx.Node) -> str:
    """What a user calls the op a node comes from: its module's name for norm and activation
    modules (`batch_norm`, `relu`, any `*RMSNorm` is `rms_norm`), else the torch function the
    model called (dynamo's `source_fn_stack`: `softmax`, `layer_norm`, `gelu`), else the aten
    op's."""
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        _, cls = list(stack.values())[-1]
        name = getattr(cls, "__name__", str(cls).split(".")[-1].rstrip("'>"))
        if name.endswith("RMSNorm"):
            return "rms_norm"
        if name in _MODULE_NAMES:
            return _MODULE_NAMES[name]
    fns = node.meta.get("source_fn_stack") or []
    if fns:
        name = str(fns[-1][0]).rstrip("_0123456789") or str(fns[-1][0])
        return _PY_OPS.get(name, name)
    return short_name(node.target)


def semantic_names(spec: "RegionSpec") -> list[str]:
    """Every distinct user-level name of a region's nodes, in order (labels and --ops)."""
    return list(dict.fromkeys(_semantic_name(m) for m in spec.nodes
                              if m.target is not operator.getitem
                              and short_name(m.target) not in _LABEL_SKIP))


def called_names(spec: "RegionSpec") -> list[str]:
    """The torch functions, tensor methods and torch.nn modules the model's code called for a
    region's nodes (dynamo's `source_fn_stack`: `layer_norm` for nn.LayerNorm or F.layer_norm),
    in order. Unlike `semantic_names`, a module of the model's own is not a call: a hand-written
    GELU inside `NewGELUActivation` calls `mul`, `pow` and `tanh`, and that is what its eager
    runs (patterns.native_eager)."""
    out = []
    for m in spec.nodes:
        fns = m.meta.get("source_fn_stack") or []
        if not fns:
            continue
        fn = fns[-1][1]
        if isinstance(fn, type):
            if not fn.__module__.startswith("torch.nn"):
                continue
            name = _MODULE_NAMES.get(fn.__name__, fn.__name__.lower())
        else:
            name = fn if isinstance(fn, str) else getattr(fn, "__name__", "")
        if name:
            out.append(name)
    return list(dict.fromkeys(out))


def _overlaps(t: torch.Tensor) -> bool:
    """Do two elements of `t` share one memory location (expand, as_strided)?"""
    try:
        dims = sorted((int(st), int(sz)) for sz, st in zip(t.shape, t.stride()) if int(sz) > 1)
    except Exception:  # symbolic sizes: reported elsewhere
        return False
    span = 1  # elements covered by the dims of smaller stride
    for st, sz in dims:
        if st < span:
            return True
        span = st * (sz - 1) + span
    return False


def _is_multi(node: fx.Node) -> bool:
    v = _val(node)
    return isinstance(v, (tuple, list))


def extract(spec: RegionSpec) -> dict:
    """The region as graph.py JSON: its inputs (ABI order), nodes and outputs."""
    return graph_json(spec.inputs, spec.nodes, spec.outputs)


def tensor_meta(node: fx.Node):
    """(shape, stride, dtype) of a node's value from its fake tensor, or None."""
    v = _val(node)
    if isinstance(v, torch.Tensor):
        return tuple(int(s) for s in v.shape), tuple(int(s) for s in v.stride()), v.dtype
    return None


__all__ = ["RegionSpec", "Partition", "partition", "extract", "classify", "tensor_meta",
           "UnsupportedRegion", "GETITEM"]
