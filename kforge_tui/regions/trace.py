"""See the model's graph exactly as torch.compile does, and decide what runs in its place.

`torch.compile` hands each captured FX graph (graph breaks give several) to Inductor's
`compile_fx`, which runs AOT autograd with Inductor's decompositions and its joint-graph passes
and then calls `inner_compile(gm, example_inputs, **kwargs)` with the aten-level inference
graph it is about to generate code for. kforge replaces only that last step:

  * capture (workload): the hook partitions the graph and runs it eagerly, recording the real
    tensors each region sees;
  * integration, compile mode: the hook swaps regions with verified winners for custom ops and
    hands the graph to Inductor's own `compile_fx_inner` (everything else is Inductor's);
  * integration, eager mode: the same swap, then the graph runs eagerly.

Because all three go through the same `compile_fx` up to the same point, they see the same
graph, and the deterministic partitioner finds the same regions in it.

This module imports only torch and the standard library: exported packages carry a copy.
"""
from __future__ import annotations

import operator
import weakref
from typing import Callable

import torch
import torch.fx as fx

# hook(gm, example_inputs, is_inference, inner_kwargs) -> callable(list of args) -> outputs
GraphHook = Callable[[fx.GraphModule, list, bool, dict], Callable]


def boxed(fn: Callable) -> Callable:
    """Inductor calls compiled graphs with one list of arguments, which the callee clears."""
    def run(args):
        a = list(args)
        args.clear()
        return fn(*a)

    run._boxed_call = True
    return run


def eager_runner(gm: fx.GraphModule) -> Callable:
    """Run an aten graph eagerly, as a compiled graph (boxed calling convention)."""
    return boxed(gm.forward)


# dynamo's graphs by id(graph), as decomposed nodes' `meta["from_node"]` name them, while their
# compile lives: regions/eager.py finds a region's calls there. Kept here, not in eager.py,
# because exported packages carry a copy of this module and import nothing of kforge_tui.
DYNAMO_GRAPHS: "weakref.WeakValueDictionary[int, fx.GraphModule]" = weakref.WeakValueDictionary()


def make_backend(hook: GraphHook, config_patches: dict | None = None) -> Callable:
    """A torch.compile backend: Inductor's front half, then `hook` instead of code generation."""
    from torch._inductor.compile_fx import compile_fx

    def inner_compile(gm, example_inputs, **kwargs):
        return hook(gm, list(example_inputs), bool(kwargs.get("is_inference", False)), kwargs)

    def backend(gm, example_inputs):
        DYNAMO_GRAPHS[id(gm.graph)] = gm  # the model's own calls: what eager runs (regions/eager.py)
        # AOT autograd's cache would return an earlier compile's output without calling
        # `inner_compile`: no capture, or another run's kernels. Its key cannot see the hook.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs, inner_compile=inner_compile,
                              config_patches=config_patches)

    backend.__name__ = "kforge"
    return backend


def inductor_inner(gm: fx.GraphModule, example_inputs: list, kwargs: dict):
    """Inductor's own code generation for a (rewritten) graph: the rest of torch.compile."""
    from torch._inductor.compile_fx import compile_fx_inner

    return compile_fx_inner(gm, example_inputs, **kwargs)


class quiet_dynamo:
    """Dynamo's graph-break warnings (a dozen lines each, with hints) off for a while: kforge
    reports each break in one line itself (workload/capture.py)."""

    NAMES = ("torch._dynamo", "torch._inductor")

    def __enter__(self):
        import logging
        import os

        self._saved = []
        if os.environ.get("TORCH_LOGS"):  # the user asked for torch's own logs: keep them
            return self
        for name in self.NAMES:
            lg = logging.getLogger(name)
            self._saved.append((lg, lg.level))
            if lg.getEffectiveLevel() < logging.ERROR:
                lg.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        for lg, level in self._saved:
            lg.setLevel(level)
        return False


def source_line(node: fx.Node) -> str:
    """`file.py:123 code` of the innermost frame outside torch, from dynamo's stack trace."""
    import os

    trace = node.meta.get("stack_trace") or ""
    torch_dir = os.path.dirname(torch.__file__)
    frames = []
    lines = trace.splitlines()
    for i, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith('File "') and ", line " in s:
            path = s[6:s.index('"', 6)]
            try:
                line_no = int(s.split(", line ")[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            frames.append((path, line_no, code))
    for path, line_no, code in reversed(frames):
        if not path.startswith(torch_dir):
            return f"{os.path.basename(path)}:{line_no} {code}".strip()
    if frames:
        path, line_no, code = frames[-1]
        return f"{os.path.basename(path)}:{line_no} {code}".strip()
    return ""


def source_node(nodes) -> fx.Node:
    """The region's first real op (not a view or a getitem: a leading `x.view(...)` names the
    line that reshaped its input, GPT-2's attention, GELU and LayerNorm all read as one
    `x.view(size_out)`) that carries a model source line; else the first node with one (nodes
    made by AOT autograd's functionalization or Inductor's passes may have none); else the first."""
    traced = [n for n in nodes if n.meta.get("stack_trace")]
    real = (n for n in traced if n.target is not operator.getitem and not getattr(n.target, "is_view", False))
    return next(real, traced[0] if traced else nodes[0])


def module_path(node: fx.Node) -> str:
    """The innermost nn.Module the node came from (`layers.0.mlp`), from nn_module_stack."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    name = getattr(cls, "__name__", str(cls).split(".")[-1].rstrip("'>"))
    path = path.replace("L['self'].", "").replace("L['self']", "").replace("L['", "").replace("']", "")
    return f"{path} ({name})" if path else name
