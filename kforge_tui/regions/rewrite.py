"""Find a graph's regions by key and replace chosen ones by one call each of a custom op.

Both the integration (integrate/runtime.py: verified kernels) and the layout probe (layout.py:
observers that record the strides Inductor hands each region) rewrite the aten graph the same
way, so what the probe sees is what the integration gets.

This module imports only torch and the standard library: exported packages carry a copy.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx

try:  # an exported package: siblings
    from . import graph as _graph, partition as _partition  # type: ignore
except ImportError:
    from kforge_tui.regions import graph as _graph, partition as _partition


def _metas(nodes) -> list[dict] | None:
    out = []
    for n in nodes:
        m = _partition.tensor_meta(n)
        if m is None:
            return None
        shape, stride, dt = m
        out.append({"shape": list(shape), "dtype": str(dt).replace("torch.", ""), "stride": list(stride)})
    return out


@dataclass
class Site:
    """One supported region of a graph, keyed as a task of it would be (at the graph's own
    layouts: what dynamo traced, before Inductor chooses layouts)."""

    spec: object  # partition.RegionSpec
    key: str
    graph: dict
    index: int  # its position among the graph's sites with the same key


def sites(gm: fx.GraphModule, backend: str) -> list[Site]:
    """Every supported region of `gm` with its key, computed on the untouched graph."""
    out, seen = [], {}
    for spec in _partition.partition(gm).regions:
        if spec.unsupported:
            continue
        ins, outs = _metas(spec.inputs), _metas(spec.outputs)
        if ins is None or outs is None or not outs:
            continue
        try:
            graph = _partition.extract(spec)
        except _graph.UnsupportedRegion:
            continue
        key = _graph.region_key(graph, ins, outs, backend)
        out.append(Site(spec, key, graph, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
    return out


def _call(g: fx.Graph, op, key, args, in_vals, out_vals, spec) -> list:
    """One `op(key, inputs)` node and a getitem per output (call it inside an insert point)."""
    call = g.call_function(op, (key, args))
    if out_vals is None:
        out_vals = [o.meta.get("val") for o in spec.outputs]
    call.meta["val"] = list(out_vals)
    vals = in_vals if in_vals is not None else [i.meta.get("val") for i in spec.inputs]
    call.meta["eager_input_vals"] = ((key, vals), {})
    call.meta["stack_trace"] = spec.nodes[0].meta.get("stack_trace")
    outs = []
    for j, o in enumerate(spec.outputs):
        gi = g.call_function(operator.getitem, (call, j))
        gi.meta["val"] = out_vals[j]
        outs.append(gi)
    return outs


def _inline(g: fx.Graph, sub: fx.GraphModule, args, spec) -> list:
    """`sub`'s nodes copied in (call it inside an insert point), its placeholders bound to `args`;
    the copies of its outputs, one per region output."""
    holders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(holders) != len(args):
        raise ValueError(f"a replacement takes {len(holders)} inputs, the region has {len(args)}")
    val_map = dict(zip(holders, args))
    outs = g.graph_copy(sub.graph, val_map)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if len(outs) != len(spec.outputs):
        raise ValueError(f"a replacement returns {len(outs)} values, the region has {len(spec.outputs)}")
    trace = spec.nodes[0].meta.get("stack_trace")
    for n in sub.graph.nodes:
        copy = val_map.get(n)
        if isinstance(copy, fx.Node) and n.op != "placeholder":
            copy.meta.setdefault("stack_trace", trace)
    return outs


def replace(gm: fx.GraphModule, chosen: list[tuple]) -> int:
    """Replace each chosen site by `op(key, inputs)` returning the region's outputs as a list,
    or, where `op` is a GraphModule, by that graph's nodes inlined (a Triton kernel's launches:
    integrate/triton_region.py).

    `chosen` holds (site, op, input_vals, output_vals[, key]): input_vals are the fake values
    whose strides the op requires (`eager_input_vals`, read by Inductor for ops tagged
    needs_exact_strides) and output_vals those it returns (what later nodes are told they get),
    or None for the site's own; key is the op's first argument (default: the site's). Every key was read on the untouched graph first: replacing a region
    rewires its consumers to the op's results, so a later region's spec, read after that,
    would name arguments outside itself (two adjacent winners)."""
    g = gm.graph
    subst: dict = {}  # a replaced region's output node -> the getitem of its op call
    for site, op, in_vals, out_vals, *rest in chosen:
        spec = site.spec
        key = rest[0] if rest else site.key
        members = set(spec.nodes)
        with g.inserting_before(spec.nodes[0]):
            args = [subst.get(i, i) for i in spec.inputs]
            if isinstance(op, fx.GraphModule):
                outs = _inline(g, op, args, spec)
            else:
                outs = _call(g, op, key, args, in_vals, out_vals, spec)
        for o, gi in zip(spec.outputs, outs):
            subst[o] = gi
            for user in list(o.users):
                if user not in members:
                    user.replace_input_with(o, gi)
        for n in reversed(spec.nodes):  # later members first: their users are gone by then
            g.erase_node(n)
    if chosen:
        from torch.fx.passes.tools_common import legalize_graph

        legalize_graph(gm)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return len(chosen)
