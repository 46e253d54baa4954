"""A region's own graph as plain JSON data, and back to a runnable `torch.fx.GraphModule`.

A region is a piece of the aten-level graph that torch.compile builds (see partition.py). To
cross process boundaries (sandbox workers), live in the run store and be rebuilt on `resume`
or in an exported package, it is stored as data:

    {"inputs": ["arg0_1", "arg1_1"],                    # placeholder names, in ABI order
     "nodes": [{"name": "mul", "target": "aten.mul.Tensor", "args": [{"ref": "arg0_1"}, 0.5],
                "kwargs": {}}, ...],
     "outputs": [{"ref": "mul"}, ...]}                   # in ABI order

Arguments are JSON values, with tagged objects for what JSON lacks: {"ref": name} (a value of
the graph), {"dtype": "float32"}, {"device": null} (the device the region runs on: regions are
device-independent), {"layout": ...}, {"memory_format": ...}, {"float": "inf"|"-inf"|"nan"},
{"tuple": [...]}. Targets are `ns.op.overload` strings resolved through `torch.ops`, or
`getitem`. Nothing else is accepted: a graph that needs something else is not a region.

This module imports only torch and the standard library: exported packages carry a copy.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import math
import operator

import torch
import torch.fx as fx

GETITEM = "getitem"


class UnsupportedRegion(ValueError):
    """A graph piece that cannot become a region (the message says why, for the profile)."""


# ---------------------------------------------------------------------- targets

def target_name(target) -> str:
    if target is operator.getitem:
        return GETITEM
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::', 1)[-1]}.{target._overloadname}"
    raise UnsupportedRegion(f"call to {getattr(target, '__name__', target)!r} is not an aten op")


def resolve_target(name: str):
    if name == GETITEM:
        return operator.getitem
    ns, op, overload = name.split(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except AttributeError:
        # Inductor's own prims (`prims._low_memory_max_pool_with_offsets`, ...) are registered
        # only once its module is imported: a fresh worker rebuilding a region may not have it.
        importlib.import_module("torch._inductor.inductor_prims")
        return getattr(getattr(getattr(torch.ops, ns), op), overload)


def short_name(target) -> str:
    """`aten.mul.Tensor` -> `mul`, for labels."""
    n = target if isinstance(target, str) else target_name(target)
    return n.split(".")[1] if n.count(".") == 2 else n


# ---------------------------------------------------------------------- arguments

def encode_arg(a, names: dict):
    """One fx argument as JSON; `names` maps fx nodes to their region-local names."""
    if isinstance(a, fx.Node):
        if a not in names:
            raise UnsupportedRegion(f"argument {a.name} is outside the region")
        return {"ref": names[a]}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        return a if math.isfinite(a) else {"float": repr(a)}
    if isinstance(a, (list, tuple)):
        items = [encode_arg(x, names) for x in a]
        return items if isinstance(a, list) else {"tuple": items}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device):
        return {"device": None}
    if isinstance(a, torch.layout):
        return {"layout": str(a).replace("torch.", "")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).replace("torch.", "")}
    if isinstance(a, torch.SymInt) or isinstance(a, torch.SymFloat):
        raise UnsupportedRegion("symbolic (data-dependent or dynamic) size")
    raise UnsupportedRegion(f"argument of type {type(a).__name__} cannot be stored")


def decode_arg(a, env: dict, device):
    if isinstance(a, list):
        return [decode_arg(x, env, device) for x in a]
    if isinstance(a, dict):
        if "ref" in a:
            return env[a["ref"]]
        if "tuple" in a:
            return tuple(decode_arg(x, env, device) for x in a["tuple"])
        if "dtype" in a:
            return getattr(torch, a["dtype"])
        if "device" in a:
            return torch.device(device)
        if "layout" in a:
            return getattr(torch, a["layout"])
        if "memory_format" in a:
            return getattr(torch, a["memory_format"])
        if "float" in a:
            return float(a["float"])
        raise ValueError(f"unknown tagged argument {a}")
    return a


# ---------------------------------------------------------------------- the graph

def graph_json(inputs, nodes, outputs) -> dict:
    """graph.py JSON of fx nodes: `inputs` become in0.. (ABI order), `nodes` keep their names,
    `outputs` refer to either. The one encoder: a partition's regions and the eager graphs
    traced from the model's calls are stored alike."""
    names: dict[fx.Node, str] = {n: f"in{k}" for k, n in enumerate(inputs)}
    body = []
    for n in nodes:
        names[n] = n.name
        body.append({"name": n.name, "target": target_name(n.target),
                     "args": encode_arg(list(n.args), names),
                     "kwargs": {k: encode_arg(v, names) for k, v in n.kwargs.items()}})
    return {"inputs": [names[n] for n in inputs], "nodes": body,
            "outputs": [encode_arg(o, names) for o in outputs]}


def canonical(graph: dict) -> dict:
    """The same graph with value names replaced by position ("i0", "v3"): two regions that
    compute the same thing from the same kind of inputs get the same canonical form."""
    rename = {n: f"i{k}" for k, n in enumerate(graph["inputs"])}
    for k, node in enumerate(graph["nodes"]):
        rename[node["name"]] = f"v{k}"

    def walk(a):
        if isinstance(a, list):
            return [walk(x) for x in a]
        if isinstance(a, dict):
            if "ref" in a:
                return {"ref": rename[a["ref"]]}
            return {k: walk(v) for k, v in a.items()}
        return a

    return {"inputs": [rename[n] for n in graph["inputs"]],
            "nodes": [{"name": rename[n["name"]], "target": n["target"], "args": walk(n["args"]),
                       "kwargs": walk(n["kwargs"])} for n in graph["nodes"]],
            "outputs": [walk(o) for o in graph["outputs"]]}


def graph_key(graph: dict) -> str:
    """A short stable hash of the canonical graph (input metas are hashed by the task)."""
    blob = json.dumps(canonical(graph), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def region_key(graph: dict, inputs: list[dict], outputs: list[dict], backend: str) -> str:
    """What identifies a kernel: the canonical graph, every input and output meta (shape,
    dtype, strides; names left out) and the backend. Task.key and the integration's graph
    rewrite both call this, so a region found at apply time matches its task exactly."""
    def meta(m: dict) -> dict:
        return {"name": "", "shape": m.get("shape"), "dtype": m.get("dtype"), "stride": m.get("stride")}

    blob = json.dumps({"graph": canonical(graph), "inputs": [meta(m) for m in inputs],
                       "outputs": [meta(m) for m in outputs], "backend": backend},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()


def ops_of(graph: dict) -> list[str]:
    """The aten op names of the graph in order, getitems left out (labels and prompts)."""
    return [short_name(n["target"]) for n in graph["nodes"] if n["target"] != GETITEM]


def to_graph_module(graph: dict, device="cpu") -> fx.GraphModule:
    """A GraphModule computing the region: forward(*inputs) -> tuple of outputs."""
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    for name in graph["inputs"]:
        env[name] = g.placeholder(name)
    for n in graph["nodes"]:
        args = decode_arg(n["args"], env, device)
        kwargs = {k: decode_arg(v, env, device) for k, v in n["kwargs"].items()}
        env[n["name"]] = g.call_function(resolve_target(n["target"]), tuple(args), dict(kwargs))
        env[n["name"]].name = n["name"]
    outs = [decode_arg(o, env, device) for o in graph["outputs"]]
    g.output(tuple(outs))
    g.lint()
    return fx.GraphModule(torch.nn.Module(), g, class_name="Region")


def python_code(graph: dict) -> str:
    """The region as PyTorch code (`GraphModule.code`): what the LLM sees as the reference."""
    return to_graph_module(graph).code.strip() + "\n"


def run(graph: dict, inputs: list, device=None) -> list:
    """Run the region eagerly on real tensors; returns the list of outputs (PyTorch semantics)."""
    if device is None:
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), "cpu")
    gm = to_graph_module(graph, device)
    with torch.no_grad():
        return list(gm(*inputs))
