"""What PyTorch eager runs for a region: the model's own calls, before Inductor decomposes them.

Why: a region's graph is Inductor's decomposition (group_norm as view, var_mean, rsqrt, mul,
add; silu as neg, exp, add, div). PyTorch eager never runs that: it runs `native_group_norm`
and `silu`, one kernel each. Timed op by op, the decomposition read 5-10x slower than eager on
fused chains (group_norm+silu, add+layer_norm; held-out GPT-2, BERT and a diffusers VAE,
2026-12-07), so "x vs eager" measured the decomposition.

At capture, the torch.compile backend (trace.make_backend) keeps dynamo's graph (trace.DYNAMO_GRAPHS), whose
nodes are the model's calls (`F.group_norm`, `F.silu`, `torch.add`). Every node of the
decomposed graph names the call it came from (`meta["from_node"]`). Where a region's nodes come
from whole calls whose inputs are the region's inputs and whose results are its outputs, those
calls are traced to aten without decompositions (`make_fx`: `native_group_norm`, `silu`, what
eager dispatches) and kept on the task as `Task.eager_graphs`, in the graph.py JSON form. The
worker times that graph as eager once it reproduces the region's outputs on a real input set
(`eager_function`); anywhere else eager stays the region's graph, or the pattern's op
(patterns.native_eager), and the baseline says which ran.
"""
from __future__ import annotations

import itertools
import math
import weakref

import torch
import torch.fx as fx

from kforge_tui.regions.graph import UnsupportedRegion, graph_json, short_name, to_graph_module
from kforge_tui.regions.trace import DYNAMO_GRAPHS

MAX_WAYS = 6  # graphs kept for a region whose calls' inputs could be its inputs several ways
# ops that only view their input (no kernel): left out of labels, and allowed outside a region
# whose calls they come from (a Linear's addmm in the region, its reshape in the next one)
_VIEWS = {"view", "reshape", "_unsafe_view", "expand", "permute", "transpose", "t", "unsqueeze",
          "squeeze", "as_strided", "slice", "select", "alias", "detach", "getitem"}


def _root(node: fx.Node):
    """The dynamo node a decomposed node comes from (its first `from_node` ancestor), or None."""
    src, chain = None, node.meta.get("from_node")
    while chain:
        if len({(s.name, s.graph_id) for s in chain}) > 1:
            return None  # made from several calls: no one call to name
        src, chain = chain[0], chain[0].from_node
    return src


class _Roots:
    """Each node's dynamo call in one decomposed graph, computed once for all of its regions
    (walked per region, a model of thousands of nodes and hundreds of regions was quadratic):
    `of[node]` its root or None; `work[(call, graph_id)]` the kernel nodes (not views) made
    from each call."""

    def __init__(self, graph: fx.Graph):
        self.size = len(graph.nodes)
        self.of = {n: _root(n) for n in graph.nodes}
        self.work: dict[tuple[str, int], list[fx.Node]] = {}
        for n, r in self.of.items():
            if r is not None and n.op == "call_function" and short_name(n.target) not in _VIEWS:
                self.work.setdefault((r.name, r.graph_id), []).append(n)
        self.made = {r.name for r in self.of.values() if r is not None}
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]


class _Order:
    """A dynamo graph's nodes by name and position, and its placeholders (once per graph)."""

    def __init__(self, graph: fx.Graph):
        self.size = len(graph.nodes)
        self.index = {n: i for i, n in enumerate(graph.nodes)}
        self.by_name = {n.name: n for n in graph.nodes}
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]


_CACHE: "weakref.WeakKeyDictionary[fx.Graph, dict]" = weakref.WeakKeyDictionary()


def _cached(graph: fx.Graph, kind):
    """kind(graph), kept while the graph lives and has as many nodes (else walked again)."""
    got = _CACHE.setdefault(graph, {}).get(kind)
    if got is None or got.size != len(graph.nodes):
        got = _CACHE[graph][kind] = kind(graph)
    return got


def _roots(graph: fx.Graph) -> _Roots:
    return _cached(graph, _Roots)


def _order(graph: fx.Graph) -> _Order:
    return _cached(graph, _Order)


def _value(node: fx.Node):
    v = node.meta.get("val", node.meta.get("example_value"))
    return v if isinstance(v, torch.Tensor) else None


def _fits(a, b) -> bool:
    """Whether value `a` can stand for `b`: one dtype, and one shape or, contiguous, as many
    elements (a view of the same bytes). Layouts may differ otherwise: eager lays its results
    out as eager does, and the worker's numeric check decides (`eager_function`)."""
    if a is None or b is None or a.dtype != b.dtype:
        return False
    return tuple(a.shape) == tuple(b.shape) or (a.numel() == b.numel() and a.is_contiguous())


def _view(g: fx.Graph, node: fx.Node, value, shape: tuple) -> fx.Node:
    """`node` viewed at `shape` when its value has another (a view, never a copy)."""
    return node if tuple(value.shape) == shape else g.call_method("view", (node, shape))


def eager_graphs(spec) -> list[dict]:
    """The model's calls that make up region `spec`, traced to aten as eager runs them, as
    graph.py JSON taking the region's inputs (ABI order) and returning its outputs: one graph
    per way the calls' inputs can be the region's (usually one); [] where the region is not
    made of whole calls on its inputs (or no dynamo graph is known)."""
    try:
        return _eager_graphs(spec)[0]
    except Exception:  # noqa: BLE001 - make_fx of arbitrary model code raises anything (NotImplementedError,
        # AssertionError, fake-tensor errors); a capture never fails for this: the graph stays eager
        return []


def _eager_graphs(spec) -> tuple[list[dict], str]:
    """(graphs, "") or ([], why not)."""
    known = _roots(spec.nodes[0].graph)
    roots = {}
    for n in spec.nodes:
        r = known.of[n] if n in known.of else _root(n)
        if r is None:
            return [], f"{n.name} comes from no single call"
        roots[n] = r
    gids = {r.graph_id for r in roots.values()}
    dyn = DYNAMO_GRAPHS.get(gids.pop()) if len(gids) == 1 else None
    if dyn is None:
        return [], "no dynamo graph"
    names = {r.name for r in roots.values()}
    # work of the same calls outside the region: a call whose work is split between regions
    # (layer_norm's statistics in one, its normalisation in the next) would be timed whole in
    # each; one the region only views the result of (a Linear's addmm before it, the region's
    # reshape of it) is an input here
    region = set(spec.nodes)
    gid = id(dyn.graph)
    elsewhere = {x for x in names if any(n not in region for n in known.work.get((x, gid), ()))}
    viewed = {x for x in names if all(short_name(n.target) in _VIEWS for n, r in roots.items() if r.name == x)}
    names -= viewed & elsewhere
    if names & elsewhere:
        x = sorted(names & elsewhere)[0]
        return [], f"{x} is split between regions"
    order = _order(dyn.graph)
    calls = [order.by_name[x] for x in names if x in order.by_name]
    if not calls or len(calls) != len(names) or any(d.op not in ("call_function", "call_method") for d in calls):
        return [], "calls not found, or a module call"
    members = set(calls)
    # calls that left nothing in Inductor's graph (dropout in eval, a `.to` of the same dtype)
    # between the region's calls are the region's too: eager runs them, as no-ops. A node
    # qualifies once all its inputs and one of its users are members: a new member makes its
    # users and its inputs worth another look
    made = known.made
    todo = [x for m in members for x in (*m.users, *m.all_input_nodes)]
    while todo:
        d = todo.pop()
        if (d not in members and d.op in ("call_function", "call_method") and d.name not in made
                and d.all_input_nodes and all(e in members for e in d.all_input_nodes)
                and any(u in members for u in d.users)):
            members.add(d)
            todo.extend((*d.users, *d.all_input_nodes))
    calls = sorted(members, key=order.index.__getitem__)
    dyn_ph, post_ph = order.placeholders, known.placeholders
    # each outside value a call reads must be one of the region's inputs: the one Inductor's
    # graph computes from that value's call (or the same graph input), else the only one of
    # its size and dtype; a region input of another shape (a Linear's [B*L, N] for [B, L, N])
    # is viewed at the call's shape, as the same bytes
    options: dict[fx.Node, list[int]] = {}
    for d in calls:
        for e in d.all_input_nodes:
            if e in members or e in options:
                continue
            want = _value(e)
            if e.op == "placeholder" and len(dyn_ph) == len(post_ph):
                hits = [i for i, p in enumerate(spec.inputs) if p is post_ph[dyn_ph.index(e)]]
            else:
                hits = [i for i, p in enumerate(spec.inputs)
                        if (r := _root(p)) is not None and r.name == e.name and r.graph_id == gid]
            hits = [i for i in hits if _fits(_value(spec.inputs[i]), want)]
            if not hits:
                hits = [i for i, p in enumerate(spec.inputs) if _fits(_value(p), want)]
            if not hits:
                return [], f"{d.name} reads {e.name}, which no region input can be"
            options[e] = hits
    # several inputs alike (an add of two [B, L, N]): every way to feed them, each a graph the
    # worker checks on real values; a few at most (counted before any is built: eight inputs
    # of one shape would be 16 million)
    if math.prod(len(v) for v in options.values()) > MAX_WAYS ** 2:
        return [], "too many ways to feed the calls from the region's inputs"
    ways = [dict(zip(options, pick)) for pick in itertools.product(*options.values())
            if len(set(pick)) == len(pick)]
    if not ways or len(ways) > MAX_WAYS:
        return [], f"{len(ways)} ways to feed the calls from the region's inputs"
    # each region output is what one of the calls returns (viewed at the region's shape)
    outs = []
    for o in spec.outputs:
        r = roots.get(o) or _root(o)
        d = next((c for c in calls if r is not None and c.name == r.name), None)
        if d is None or not _fits(_value(o), _value(d)):
            return [], f"output {o.name} is not what a call returns"
        outs.append((d, tuple(_value(o).shape)))
    from torch.fx.experimental.proxy_tensor import make_fx

    graphs = []
    for where in ways:
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        ph = [g.placeholder(f"in{k}") for k in range(len(spec.inputs))]
        for e, i in where.items():
            env[e] = _view(g, ph[i], _value(spec.inputs[i]), tuple(_value(e).shape))
        for d in calls:
            env[d] = g.node_copy(d, env.__getitem__)
        g.output(tuple(_view(g, env[d], _value(d), shape) for d, shape in outs))
        with torch.no_grad():
            traced = make_fx(fx.GraphModule(dyn, g), tracing_mode="fake")(*[_value(p) for p in spec.inputs])
        graphs.append(_to_json(traced))
    return graphs, ""


def _to_json(gm: fx.GraphModule) -> dict:
    """graph.py JSON of a traced GraphModule (placeholders in ABI order), refused where a node
    writes into its arguments: timed on the harness's input sets, the model's `x.add_(y)`
    would change them."""
    inputs, nodes, outputs = [], [], []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            inputs.append(n)
        elif n.op == "call_function":
            if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
                raise UnsupportedRegion(f"{n.target} writes into its arguments")
            nodes.append(n)
        elif n.op == "output":
            res = n.args[0]
            outputs = list(res) if isinstance(res, (tuple, list)) else [res]
            if not all(isinstance(o, fx.Node) for o in outputs):
                raise UnsupportedRegion("an output that is not a tensor")
        else:
            raise UnsupportedRegion(f"{n.op} node in a traced call")
    return graph_json(inputs, nodes, outputs)


def ops(graph: dict) -> list[str]:
    """The ops an eager graph runs, views and getitems left out (the baseline's label)."""
    return [short_name(n["target"]) for n in graph.get("nodes", [])
            if "." in n["target"] and short_name(n["target"]) not in _VIEWS]


def eager_function(task, values: list, expected: list):
    """(fn, label) timing what PyTorch eager runs for the task: the first of its `eager_graphs`
    that reproduces the region's outputs `expected` on `values`, else the pattern's op
    (patterns.native_eager); None: the region's own graph is eager."""
    from kforge_tui.regions import patterns
    from kforge_tui.regions.closeness import reproduces

    device = next((v.device for v in values if isinstance(v, torch.Tensor)), "cpu")
    for graph in getattr(task, "eager_graphs", None) or []:
        try:
            gm = to_graph_module(graph, device)
            with torch.no_grad():
                got = list(gm(*values))
            if len(got) == len(expected) and all(
                    isinstance(g, torch.Tensor) and g.dtype == w.dtype and reproduces(w, g)
                    for w, g in zip(expected, got)):
                names = [x.removeprefix("native_") for x in dict.fromkeys(ops(graph))]
                return gm, f"{', '.join(names)} as PyTorch runs them"
        except Exception:  # noqa: BLE001 - a graph that does not run here is not eager
            continue
    return patterns.native_eager(task, values, expected)
