"""The strides Inductor hands each region inside the compiled model (issue 26).

A region's tensors in the aten graph carry the layouts dynamo traced (eager's), but Inductor
chooses its own: with convolutions in the graph it runs them channels-last ("layout
optimisation", on the GPU and on the CPU with mkldnn) and lays out the pointwise chains around
them to match. A kernel verified on eager's NCHW strides then gets a copy kernel on each side
inside the compiled model, which costs more than most kernels save.

So the capture asks Inductor: a copy of each graph has its regions replaced by an observer op
(opaque, with a flexible layout: Inductor hands it whatever its producers have, no copy), and
is lowered by Inductor's own `compile_fx_inner`. Lowering an opaque op runs its fake
implementation on the inputs as Inductor has laid them out (`FallbackKernel.process_kernel`
freezes their layouts and re-runs fake propagation), which is where the observer records them;
the outputs it reports are the region's own graph run on those layouts, as the region op will
return them. The integration (integrate/runtime.py) rewrites graphs the same way, so what the
observer saw is what a kernel gets, and the task is verified on exactly that.

Convolution regions are not replaced: how many convolutions a graph has decides whether
Inductor lays it out channels-last at all. Their tasks keep the traced layouts.

This module imports only torch and the standard library.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from kforge_tui.regions import graph as _graph
from kforge_tui.regions import rewrite as _rewrite

NS = "kforge_layout_probe"
_GRAPHS: dict[str, dict] = {}  # key -> region graph (what the observer runs)
_SEEN: dict[str, list] = {}  # key -> [(input strides, output strides)] in lowering order
_OP = None


def _strides(ts) -> list:
    return [list(int(s) for s in t.stride()) if isinstance(t, torch.Tensor) else None for t in ts]


def _observe(key: str, inputs: list) -> list:
    return [t.clone() for t in _graph.run(_GRAPHS[key], list(inputs))]


def _lowering() -> bool:
    """Inside Inductor's GraphLowering (not a fake propagation of the FX graph before it)."""
    try:
        from torch._inductor.graph import GraphLowering
        from torch._inductor.virtualized import V

        return isinstance(V.graph, GraphLowering)
    except Exception:  # noqa: BLE001 - another Inductor: record every call
        return True


def _observe_fake(key: str, inputs: list) -> list:
    # fake tensors in, fake tensors out: the same ops and clones as _observe, so the same strides
    out = [t.clone() for t in _graph.run(_GRAPHS[key], list(inputs))]
    if _lowering():
        _SEEN.setdefault(key, []).append((_strides(inputs), _strides(out)))
    return out


def observer_op():
    global _OP
    if _OP is None:
        lib = torch.library.Library(NS, "FRAGMENT")
        tag = getattr(torch.Tag, "flexible_layout", None)
        lib.define("observe(str key, Tensor[] inputs) -> Tensor[]", tags=(tag,) if tag is not None else ())
        lib.impl("observe", _observe, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NS}::observe", _observe_fake, lib=lib)
        observer_op._lib = lib  # registrations live as long as the Library object
        _OP = getattr(torch.ops, NS).observe.default
    return _OP


def _is_conv(site) -> bool:
    return any(getattr(n.target, "__name__", "").startswith("convolution")
               or "convolution" in str(n.target) for n in site.spec.nodes)


def observe(gm: fx.GraphModule, example_inputs: list, kwargs: dict, backend: str) -> tuple[dict, str]:
    """Lower a copy of `gm` with Inductor, its regions replaced by observers; returns
    ({site key: [(input strides, output strides), ...]}, "" or why the probe failed)."""
    try:
        return _observe_graph(gm, example_inputs, kwargs, backend)
    except Exception as e:  # noqa: BLE001 - the probe must never cost the capture
        return {}, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def _shallow_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A GraphModule with its own graph (nodes copied, their meta dicts copied, the fake values in
    them shared) over the same attributes: deep-copying a graph's constants inside the fake
    mode of a compile fails for some models, and the copy is only rewritten and lowered."""
    g = fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    return fx.GraphModule(gm, g)


def _observe_graph(gm, example_inputs, kwargs, backend):
    from torch._inductor.compile_fx import compile_fx_inner

    work = _shallow_copy(gm)
    op = observer_op()
    chosen = []
    for site in _rewrite.sites(work, backend):
        if _is_conv(site):
            continue
        _GRAPHS[site.key] = site.graph
        chosen.append((site, op, None, None))
    keys = {site.key for site, *_ in chosen}
    for k in keys:
        _SEEN.pop(k, None)
    if not chosen:
        return {}, ""
    _rewrite.replace(work, chosen)
    try:
        # a cached compile would skip the lowering, and with it the observers
        with torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
            compile_fx_inner(work, example_inputs, **kwargs)
    except Exception as e:  # noqa: BLE001 - any Inductor failure: the traced layouts stand
        return {}, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    return {k: list(_SEEN.get(k, [])) for k in keys}, ""


def chosen_layout(seen: list) -> tuple[list, list] | None:
    """The layout a task of this key is verified on: the one Inductor gave most of its sites
    (ties: the first). Sites that got another one get Inductor's copy, and the whole-model
    check (integrate/decide.py) weighs it."""
    if not seen:
        return None
    counts: dict = {}
    for ins, outs in seen:
        k = repr((ins, outs))
        counts.setdefault(k, [0, ins, outs])[0] += 1
    best = max(counts.values(), key=lambda v: v[0])
    return best[1], best[2]
