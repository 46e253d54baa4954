"""Inductor's own Triton code for a region, rewritten to the Triton candidate ABI: the seed.

torch.compile already writes a correct Triton kernel for every fusible region. That kernel,
launched through `def kforge_launch(inputs, outputs)`, is a free, verified starting point: a
search that starts from it starts at torch.compile's speed.

Getting the code (`generate`, `compile_region`):
  * the region's GraphModule (regions/graph.py, placeholders in ABI order) is compiled with
    `torch.compile(..., backend=<Inductor's compile_fx behind a recorder>)`. The recorder
    sees the example inputs dynamo hands to the backend, so the order of Inductor's
    `call(args)` (`arg0_1, arg1_1, ...`) is mapped to ABI inputs by tensor identity (dynamo
    orders graph inputs by first use and drops unused ones: position is not enough);
  * the wrapper source is captured through `GraphLowering.save_output_code` (what
    `torch._inductor.utils.run_and_get_code` uses);
  * on a CUDA device (`compile_region`, in the worker) the compiled region is run once, so its
    autotuner picks a config per kernel, which is read back from the loaded module; the same
    compiled callable is the torch.compile baseline the worker times, so the seed *is* the
    kernel the baseline measured;
  * on the CPU (`generate(task, "cpu")`: CI, or an engine with no seed from a worker) there is
    no GPU: Inductor is asked for Triton on the CPU (`cpu_backend="triton"`), the backend hash
    (which needs an active Triton driver) is stubbed and compilation stops right after code
    generation, before any kernel is compiled or run. The kernel bodies are Inductor's
    (device-independent); launch configs come from Inductor's own heuristics, evaluated from
    the decorator's arguments with a CUDA device description (`TARGET_CUDA`), not autotuned.

The rewrite is search/seed_rewrite.py, the data and its rendering search/seed_model.py (both
re-exported here).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from kforge_tui.regions.task import Task
from kforge_tui.search.seed_model import (TARGET_CUDA, Seed, SeedKernel, SeedLaunch,
                                          SeedUnsupported, _config_dict, compute_grid)
from kforge_tui.search.seed_rewrite import rewrite

# Inductor config patches that give the variants a search can start from.
VARIANTS = {
    "default": {},
    "looped": {"triton.persistent_reductions": False},
    "nosplit": {"split_reductions": False},
    # one reduction split over RSPLIT programs per row that meet at a grid barrier (GPU only:
    # the interpreter runs programs one after another, so a barrier never opens there)
    "coop": {"triton.cooperative_reductions": True, "triton.force_cooperative_reductions": True},
}
GPU_ONLY_VARIANTS = ("coop",)


# ------------------------------------------------------------------------------ capture

_CAPTURE_LOCK = threading.Lock()


class _Stop(Exception):
    """Raised after code generation when no kernel may be compiled (CPU generation)."""


@dataclass
class Capture:
    codes: list[str] = field(default_factory=list)
    modules: list = field(default_factory=list)
    input_order: list[int] | None = None

    def chosen_configs(self) -> dict[str, dict]:
        """After a real run: the config each kernel's autotuner settled on."""
        out = {}
        for mod in self.modules:
            for name, obj in vars(mod).items():
                launchers = getattr(obj, "launchers", None)
                if not launchers or not name.startswith("triton_"):
                    continue
                cfg = getattr(launchers[0], "config", None)
                if cfg is None:
                    continue
                out[name] = _config_dict(cfg)
        return out


@contextmanager
def capture(stop_after_codegen: bool = False):
    """Record Inductor's output code (and loaded modules) of compiles inside the block."""
    from unittest import mock

    from torch._inductor import codecache
    from torch._inductor.graph import GraphLowering

    cap = Capture()
    prev = GraphLowering.save_output_code
    orig_load = codecache.PyCodeCache.load_by_key_path

    def save(code: str) -> None:
        cap.codes.append(code)
        if prev is not None:
            prev(code)
        if stop_after_codegen:
            raise _Stop()

    def load_by_key_path(*a, **kw):
        mod = orig_load(*a, **kw)
        cap.modules.append(mod)
        return mod

    with _CAPTURE_LOCK, mock.patch.object(GraphLowering, "save_output_code", save), \
            mock.patch.object(codecache.PyCodeCache, "load_by_key_path",
                              staticmethod(load_by_key_path)):
        yield cap


def _backend(cap: Capture, inputs: list):
    """Inductor (compile_fx), recording how dynamo ordered the region's inputs."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        order = []
        for t in example_inputs:
            idx = next((i for i, x in enumerate(inputs) if x is t), None)
            order.append(idx)
        cap.input_order = order
        return compile_fx(gm, example_inputs)

    return backend


def example_inputs(task: Task, device: str, seed: int = 0) -> list:
    import torch

    from kforge_tui.regions.meta import torch_dtype

    g = torch.Generator().manual_seed(seed)
    out = []
    for m in task.inputs:
        if not m.present:
            out.append(None)
            continue
        dt = torch_dtype(m.dtype)
        t = torch.empty_strided(tuple(m.shape), tuple(m.strides), dtype=dt, device=device)
        if dt.is_floating_point:
            t.copy_(torch.randn(tuple(m.shape), generator=g).to(dt))
        elif dt == torch.bool:
            t.copy_(torch.rand(tuple(m.shape), generator=g) > 0.5)
        else:
            t.copy_(torch.randint(0, 8, tuple(m.shape), generator=g).to(dt))
        out.append(t)
    return out


def _inductor_patches(variant: str, cpu: bool) -> dict:
    p = {"fx_graph_cache": False, "fx_graph_remote_cache": False,
         "triton.autotune_at_compile_time": False, "triton.cudagraphs": False,
         "cpp_wrapper": False, "max_autotune": False, "max_autotune_pointwise": False,
         "coordinate_descent_tuning": False}
    if cpu:
        p["cpu_backend"] = "triton"
    p.update(VARIANTS.get(variant, {}))
    return p


def compile_region(task: Task, inputs: list, device: str = "cuda", variant: str = "default"):
    """Compile the region with Inductor on `device`, run it once (autotuning) and return
    (compiled callable taking a list of inputs, Seed or None, note). The worker times the
    callable as the torch.compile baseline, so the seed is the kernel the baseline ran."""
    import torch
    import torch._inductor.config as icfg

    from kforge_tui.regions.graph import to_graph_module

    gm = to_graph_module(task.graph, device)
    with icfg.patch(_inductor_patches(variant, cpu=False)), capture() as cap:
        fn = torch.compile(gm, backend=_backend(cap, inputs), dynamic=False, fullgraph=True)
        with torch.no_grad():
            fn(*inputs)
    note = ""
    seed = None
    try:
        seed = rewrite(cap.codes[-1] if cap.codes else "", task, cap.input_order,
                       cap.chosen_configs(), device=device, variant=variant)
    except SeedUnsupported as e:
        note = f"no Triton seed: {e}"
    except Exception as e:  # an Inductor version the rewrite does not know: no seed, no crash
        note = f"no Triton seed: rewrite failed ({type(e).__name__}: {str(e)[:200]})"

    def call(xs):
        with torch.no_grad():
            return fn(*xs)

    # Inductor's own module (its `call(args)`: the kernels plus its thin Python wrapper, no
    # dynamo guards): the like-for-like baseline for a seed's launcher
    call.inductor_module = cap.modules[-1] if cap.modules else None
    return call, seed, note


def generate(task: Task, device: str = "cpu", variant: str = "default") -> Seed:
    """Inductor's Triton code for the region, generated without running any kernel on the CPU
    (cpu_backend="triton", stopped after code generation) or run once on CUDA."""
    if device != "cpu":
        _, seed, note = compile_region(task, example_inputs(task, device), device, variant)
        if seed is None:
            raise SeedUnsupported(note.replace("no Triton seed: ", ""))
        return seed
    import torch
    import torch._inductor.config as icfg
    import torch.utils._triton as ut
    from unittest import mock

    from kforge_tui.regions.graph import to_graph_module

    inputs = example_inputs(task, "cpu")
    gm = to_graph_module(task.graph, "cpu")
    with icfg.patch(_inductor_patches(variant, cpu=True)), \
            mock.patch.object(ut, "triton_hash_with_backend", lambda: "0" * 64), \
            capture(stop_after_codegen=True) as cap:
        try:
            fn = torch.compile(gm, backend=_backend(cap, inputs), dynamic=False, fullgraph=True)
            with torch.no_grad():
                fn(*inputs)
        except Exception as e:
            if not cap.codes:
                raise SeedUnsupported(f"Inductor did not generate code: {type(e).__name__}: "
                                      f"{str(e).splitlines()[0][:200] if str(e) else ''}") from None
    if not cap.codes:
        raise SeedUnsupported("Inductor generated no code for this region")
    return rewrite(cap.codes[-1], task, cap.input_order, None, device="cpu", variant=variant,
                   target=TARGET_CUDA)



# ------------------------------------------------------------------------------ per-task cache

_SEEDS: dict[tuple[str, str], Seed | str] = {}
_SEEDS_LOCK = threading.Lock()


def remember(task: Task, seed: Seed | dict | None, variant: str = "default",
             note: str = "") -> None:
    """Record a seed produced elsewhere (the worker's compile of the region) for this task."""
    if isinstance(seed, dict):
        seed = Seed.from_json(seed)
    with _SEEDS_LOCK:
        _SEEDS[(task.key, variant)] = seed if seed is not None else (note or "no seed")


def seed_for(task: Task, variant: str = "default", generate_on_cpu: bool = True) -> Seed | None:
    """The task's seed: one the worker sent (`remember`), else generated here on the CPU
    (no kernel runs; cached per task). None when Inductor's code cannot be a Triton seed."""
    k = (task.key, variant)
    with _SEEDS_LOCK:
        got = _SEEDS.get(k)
    if isinstance(got, Seed):
        return got
    if got is not None or not generate_on_cpu:
        return None
    try:
        seed = generate(task, "cpu", variant)
    except SeedUnsupported as e:
        seed, note = None, str(e)
    except Exception as e:  # Inductor internals moved: no seed rather than a crash
        seed, note = None, f"{type(e).__name__}: {str(e)[:200]}"
    with _SEEDS_LOCK:
        _SEEDS[k] = seed if seed is not None else note
    return seed


def why_no_seed(task: Task, variant: str = "default") -> str:
    got = _SEEDS.get((task.key, variant))
    return got if isinstance(got, str) else ""


def seed_source(task: Task) -> str | None:
    """Inductor's kernel for the region on the ABI (for the LLM prompt), or None."""
    s = seed_for(task)
    return s.render() if s is not None else None


__all__ = ["Seed", "SeedKernel", "SeedLaunch", "SeedUnsupported", "capture", "compile_region",
           "generate", "rewrite", "remember", "seed_for", "seed_source", "compute_grid",
           "example_inputs", "VARIANTS"]
