"""A verified Triton region kernel inside torch.compile, launched by Inductor as its own kernel.

A CUDA or C++ kernel joins the graph as one call of the opaque region op (runtime.Kernel). A
Triton kernel needs no op. Its `kforge_launch(inputs, outputs)` is traced once per site
(make_fx, functionalised) on the site's fake inputs, with every Triton kernel it launches seen
through `torch.library.wrap_triton`. The result is what `torch.library.triton_op` gives
Inductor: user-defined Triton kernel nodes (`triton_kernel_wrapper_functional`) and the
allocations around them. That subgraph is inlined in place of the region. Inductor then
compiles the kernel with its own toolchain and launches it from its own wrapper: no dispatcher
op and no Python on the call path, capturable in a CUDA graph, its buffers planned with the
rest. Each kernel node carries `eager_input_vals` with the strides it was verified on: Inductor
hands a user kernel's tensors over in exactly those strides.

What Triton runs is the verified source: the same kernels, constants, grid and launch options
(`num_warps`, `num_stages`: Inductor turns them into the kernel's single config).

This file is copied verbatim into exported packages beside runtime.py (export.py); it imports
only torch, the standard library and, when a Triton kernel is loaded, triton.
"""
from __future__ import annotations

import hashlib
import importlib.util
import types
from pathlib import Path

import torch
import torch.fx as fx

try:  # an exported package: siblings
    from .kernel_spec import KernelSpec  # type: ignore
except ImportError:
    from kforge_tui.integrate.kernel_spec import KernelSpec

ENTRY = "kforge_launch"


class TritonLoadError(RuntimeError):
    """A Triton kernel's source could not be imported or traced into the graph."""


def _load_module(path: Path, task_id: str) -> types.ModuleType:
    """The candidate's source as a fresh module, imported from its file (Triton reads a kernel's
    source from it) and never put in sys.modules."""
    digest = hashlib.sha1(path.read_bytes()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"kforge_triton_{task_id}_{digest}", path)
    if spec is None or spec.loader is None:
        raise TritonLoadError(f"{task_id}: cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - a source that no longer imports here (another triton)
        raise TritonLoadError(f"{task_id}: importing {path.name} failed: {type(e).__name__}: {e}") from None
    if not callable(getattr(mod, ENTRY, None)):
        raise TritonLoadError(f"{task_id}: {path.name} has no {ENTRY}(inputs, outputs)")
    return mod


def _traceable_launch(mod: types.ModuleType):
    """`kforge_launch` with each module-level Triton kernel seen through wrap_triton, so a
    dispatcher-level trace records the launches. Only the launcher's globals change: a kernel
    that calls a @triton.jit helper still finds the helper itself in the module."""
    from torch.library import wrap_triton
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    launch = getattr(mod, ENTRY)
    g = dict(vars(mod))
    for name, obj in vars(mod).items():
        if isinstance(obj, (JITFunction, Autotuner, Heuristics)):
            g[name] = wrap_triton(obj)
    return types.FunctionType(launch.__code__, g, launch.__name__, launch.__defaults__, launch.__closure__)


def _fake(v):
    return v.meta.get("val") if isinstance(v, fx.Node) else v


class TritonKernel(KernelSpec):
    """One verified Triton region kernel (spec: patch.spec_for with `lang` "triton" and
    `source_path`). `subgraph(vals)` is what replaces its region in the graph."""

    lang = "triton"

    def __init__(self, spec: dict):
        super().__init__(spec)
        self.cuda = spec.get("device", "cuda") == "cuda"
        self.path = Path(spec["source_path"])
        self.module = _load_module(self.path, self.task_id)
        self._launch = getattr(self.module, ENTRY)
        self._traced = None  # kforge_launch through wrap_triton, made on first use

    def launch(self, tensors) -> list:
        """One eager call on real tensors (not the graph's path: Inductor launches the kernels
        there); for checks and the op's fallback path."""
        outs = self.empty_outputs(tensors[0].device if tensors else "cuda")
        rc = self._launch(list(tensors), outs)
        if rc not in (None, 0):
            raise RuntimeError(f"kforge kernel {self.task_id} returned error {rc}")
        return outs

    def subgraph(self, vals: list) -> fx.GraphModule:
        """The functional graph of one call, traced on the site's fake input values with this
        kernel's strides: placeholders = the region's inputs, outputs = its outputs."""
        from torch.fx.experimental.proxy_tensor import make_fx

        if self._traced is None:
            self._traced = _traceable_launch(self.module)
        launch, layouts = self._traced, self.outputs

        def call(*xs):
            outs = [torch.empty_strided(s, st, dtype=dt, device=xs[0].device) for s, dt, st in layouts]
            launch(list(xs), outs)
            return outs

        fakes = self.fake_inputs(vals)
        try:
            # views stay views: functionalised away they become *_copy ops, which Inductor lowers
            # to copy kernels (a seed's mm on a transposed weight copied the weight every call)
            gm = make_fx(torch.func.functionalize(call, remove="mutations"))(*fakes)
        except Exception as e:  # noqa: BLE001 - Python in kforge_launch a trace cannot follow
            raise TritonLoadError(f"{self.task_id}: its kforge_launch cannot be traced into the graph: "
                                  f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
        if any(n.op == "get_attr" for n in gm.graph.nodes):
            raise TritonLoadError(f"{self.task_id}: its kforge_launch makes a constant tensor, which "
                                  "cannot be inlined into the model's graph")
        hops = [n for n in gm.graph.nodes
                if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target)]
        if not hops:  # node zero of a fallback region (torch.sort / torch.topk into the outputs)
            raise TritonLoadError(f"{self.task_id}: its kforge_launch launched no Triton kernel in the trace "
                                  "(PyTorch's own call only: the compiled model already runs it)")
        _inputs_are_read_only(gm, hops)
        _no_written_aliases(gm, hops, self.task_id)
        _fresh_scatters_are_views(gm)
        for n in hops:  # the strides it was verified on, which Inductor then hands over exactly
            n.meta["eager_input_vals"] = ((), torch.utils._pytree.tree_map(_fake, dict(n.kwargs)))
        return gm


def _fresh_scatters_are_views(gm: fx.GraphModule) -> None:
    """`torch.mm(a, b, out=outputs[0].as_strided(...))` (a GEMM seed's library call into its
    output at the call's shape) is, functionalised, an `as_strided_scatter` of mm's result into
    a fresh empty buffer: a copy kernel of the whole output in the model. Where the buffer has
    no other use, the scatter covers it in order (both row-major, same size) and the result is
    contiguous, the scattered buffer is the result itself reshaped: a view, no copy."""
    changed = False
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops.aten.as_strided_scatter.default:
            continue
        base, src, size, stride = n.args[:4]
        offset = n.args[4] if len(n.args) > 4 else n.kwargs.get("storage_offset")
        if not (isinstance(base, fx.Node) and base.target is torch.ops.aten.empty_strided.default
                and len(base.users) == 1 and isinstance(src, fx.Node)):
            continue
        b, v = base.meta.get("val"), src.meta.get("val")
        if not (isinstance(b, torch.Tensor) and isinstance(v, torch.Tensor)) or offset:
            continue
        if not (b.is_contiguous() and v.is_contiguous() and b.dtype == v.dtype and b.numel() == v.numel()
                and list(size) == list(v.shape)
                and torch.empty_strided(size, stride, device="meta").is_contiguous()):
            continue
        with gm.graph.inserting_before(n):
            view = gm.graph.call_function(torch.ops.aten.view.default, (src, list(b.shape)))
        view.meta["val"] = v.view(b.shape)
        n.replace_all_uses_with(view)
        gm.graph.erase_node(n)
        gm.graph.erase_node(base)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _no_written_aliases(gm: fx.GraphModule, hops: list, task_id: str) -> None:
    """A launch that hands one buffer to two pointer arguments and writes through either cannot
    be a functional graph: each written argument becomes a copy of its own, so the writes
    through one are lost (qwen_moe's QK-norm + RoPE seed wrote a cat's two halves through two
    pointers into one buffer: 93 % of the logits changed, H100 2026-12-06). Refused here, with
    the reason, rather than found by the whole-model accuracy check."""
    for n in hops:
        kw = dict(n.kwargs)
        args, written = kw.get("kwargs") or {}, set(kw.get("tensors_to_clone") or [])
        by_node: dict = {}
        for name, v in args.items():
            if isinstance(v, fx.Node):
                by_node.setdefault(v, []).append(name)
        for names in by_node.values():
            if len(names) > 1 and written & set(names):
                raise TritonLoadError(f"{task_id}: a launch passes one buffer as {', '.join(names)} and "
                                      "writes through it; pass it once and offset from it")


def _inputs_are_read_only(gm: fx.GraphModule, hops: list) -> None:
    """No clone of a region input before a kernel and no write-back after it. Functionalisation
    treats every tensor a Triton kernel may store to (by torch's analysis of its IR, or all of
    them where that analysis cannot run) as mutated: it clones it before the launch and copies
    the result back into the input. The sandbox verified that this kernel leaves its inputs as
    they were, so those are copies of unchanged values: they go, and only the buffers the
    launcher allocated (outputs, scratch) stay functional."""
    holders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    for n in hops:
        kw = dict(n.kwargs)
        args = kw.get("kwargs") or {}
        kw["tensors_to_clone"] = [name for name in kw.get("tensors_to_clone") or []
                                  if args.get(name) not in holders]
        n.kwargs = kw
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in holders:
            gm.graph.erase_node(n)
    gm.graph.eliminate_dead_code()
    gm.recompile()
