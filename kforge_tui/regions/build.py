"""Tasks from graphs: the region specs of a partition become `Task`s (plain data).

`tasks_of(fn, args)` runs any callable (a model, a lambda) once through the torch.compile
front end and returns the tasks of its regions: what tests, benchmarks and the profile use to
get tasks without a model file.
"""
from __future__ import annotations

import dataclasses

import torch

from kforge_tui.regions import partition as P
from kforge_tui.regions import trace
from kforge_tui.regions.eager import eager_graphs
from kforge_tui.regions.meta import TensorMeta
from kforge_tui.regions.task import Task


def metas_of(nodes, prefix: str) -> tuple[TensorMeta, ...] | None:
    """TensorMetas of region inputs or outputs from their fake tensors (None: not all tensors)."""
    out = []
    for k, n in enumerate(nodes):
        tm = P.tensor_meta(n)
        if tm is None:
            return None
        shape, stride, dt = tm
        out.append(TensorMeta(f"{prefix}{k}", shape, str(dt).replace("torch.", ""), stride))
    return tuple(out)


def task_from_spec(spec: P.RegionSpec, backend: str) -> Task | None:
    """The task of a supported region (None for an unsupported one, or one with no tensors),
    its `eager_graphs` empty: the callers keep one task per key and trace them
    (`with_eager_graphs`) for the first region of each key only."""
    if spec.unsupported:
        return None
    ins, outs = metas_of(spec.inputs, "in"), metas_of(spec.outputs, "out")
    if ins is None or outs is None or not outs:
        return None
    graph = spec.graph if spec.graph is not None else P.extract(spec)
    spec.graph = graph
    main = trace.source_node(spec.nodes)
    return Task(op=spec.label, kind=spec.kind, graph=graph, inputs=ins, outputs=outs,
                backend=backend, source=trace.source_line(main), module=trace.module_path(main),
                aten=" ".join(spec.ops[:12]) + (" …" if len(spec.ops) > 12 else ""),
                parts=" ".join(P.semantic_names(spec)), called=" ".join(P.called_names(spec)))


def with_eager_graphs(task: Task, spec: P.RegionSpec) -> Task:
    """`task` with the model's calls of `spec` traced as eager runs them (regions/eager.py)."""
    return dataclasses.replace(task, eager_graphs=eager_graphs(spec))


def tasks_of(fn, args, backend: str = "cpu", kwargs: dict | None = None) -> list[Task]:
    """Every distinct supported region task of `fn(*args, **kwargs)`, in graph order."""
    found: dict[str, Task] = {}

    def hook(gm, example_inputs, is_inference, inner_kwargs):
        for spec in P.partition(gm).regions:
            t = task_from_spec(spec, backend)
            if t is not None and t.key not in found:
                found[t.key] = with_eager_graphs(t, spec)
        return trace.eager_runner(gm)

    # Each call compiles `fn` with a new backend, which adds a dynamo cache entry to its code
    # object; past dynamo's per-code limit (8) it silently runs eagerly and no hook is called.
    # Tests and benchmarks call this many times for the same lambda: start from a clean cache.
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=trace.make_backend(hook), dynamic=False)
    with torch.no_grad():
        compiled(*args, **(kwargs or {}))
    return list(found.values())


def task_of(fn, args, backend: str = "cpu") -> Task:
    """The one task of a callable made of a single region (tests and benchmarks)."""
    tasks = tasks_of(fn, args, backend)
    if len(tasks) != 1:
        raise ValueError(f"expected one region, found {len(tasks)}: {[t.op for t in tasks]}")
    return tasks[0]
