"""Run verified region kernels inside torch.compile: the kforge backend and its custom op.

This file is copied verbatim into exported packages (export.py) next to copies of
regions/graph.py, partition.py and trace.py, so it imports only torch, ctypes and the standard
library (and those three, as siblings in an export or from kforge_tui.regions here).

How a kernel joins the compiled model (DESIGN.md "Integration"):
  * `model.compile(backend=KforgeBackend(...))` compiles the model in place. The backend is
    Inductor's own `compile_fx` up to the aten inference graph (regions/trace.py), so it sees
    exactly the graph the capture saw and the partitioner finds the same regions;
  * each region whose key (graph + every input/output shape, dtype and stride + backend) has a
    verified kernel is replaced by one call of the custom op `kforge::region_<token>(key,
    inputs) -> outputs` (`torch.library.custom_op`: opaque to Inductor, with a fake
    implementation giving the verified output layouts);
  * compile mode hands the rewritten graph to Inductor's `compile_fx_inner` (everything else
    is Inductor's, CUDA graphs included under reduce-overhead); eager mode runs it eagerly.

The op launches on the current stream with outputs from the caching allocator and no host
synchronisation, so it can be captured in a CUDA graph. A call whose tensors differ from what
the kernel was verified on (it cannot happen through the rewrite, whose keys are exact, but the
op is callable by anyone) runs the region's own graph instead and is counted as a fallback.
Training graphs (grad enabled) are left untouched: the kernels have no backward.
"""
from __future__ import annotations

import ctypes
import hashlib
import operator
import os
from pathlib import Path

import torch
import torch.fx as fx

try:  # an exported package: siblings
    from . import graph as _graph, partition as _partition, trace as _trace  # type: ignore
except ImportError:
    from kforge_tui.regions import graph as _graph, partition as _partition, trace as _trace

ENTRY = "kforge_launch"
MODES = ("compile", "eager")
# One op per copy of this file: kforge itself and an exported package can live in one process.
# Its text is in the name too: Inductor's FX graph cache keys on the graph's code, in which the
# op appears by name, so a graph compiled with an older version of the op (other layout
# constraints) is not reused by this one.
def _token() -> str:
    h = hashlib.sha1(os.path.abspath(__file__).encode())
    try:
        with open(__file__, "rb") as f:
            h.update(f.read())
    except OSError:
        pass
    return h.hexdigest()[:10]


_TOKEN = _token()
OP_NAME = f"kforge::region_{_TOKEN}"


class KernelLoadError(RuntimeError):
    """A kernel library could not be loaded or does not match its manifest."""


class ArchMismatch(RuntimeError):
    """Binaries were built for another GPU/CPU and no compiler is there to rebuild them."""


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _meta_json(t) -> dict:
    return {"shape": [int(s) for s in t.shape], "dtype": str(t.dtype).replace("torch.", ""),
            "stride": [int(s) for s in t.stride()]}


class Kernel:
    """One verified region kernel: its compiled entry point and the exact layouts it takes."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.task_id = spec["task_id"]
        self.key = spec["key"]
        self.op = spec.get("op", "")
        self.backend = spec["backend"]
        self.cuda = self.backend == "cuda"
        self.graph = spec["graph"]
        self.inputs = [(tuple(m["shape"]), _dtype(m["dtype"]), tuple(m["stride"])) for m in spec["inputs"]]
        self.outputs = [(tuple(m["shape"]), _dtype(m["dtype"]), tuple(m["stride"])) for m in spec["outputs"]]
        try:
            self._lib = ctypes.CDLL(str(spec["lib"]))
            cfn = getattr(self._lib, ENTRY)
        except (OSError, AttributeError) as e:
            raise KernelLoadError(f"{self.task_id}: cannot load {ENTRY} from {spec['lib']}: {e}") from None
        n = 3 if self.cuda else 2
        self.fn = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * n))(
            ctypes.cast(cfn, ctypes.c_void_p).value)
        self._ins_t = ctypes.c_void_p * max(1, len(self.inputs))
        self._outs_t = ctypes.c_void_p * max(1, len(self.outputs))

    def matches(self, tensors) -> bool:
        if len(tensors) != len(self.inputs):
            return False
        for t, (shape, dt, stride) in zip(tensors, self.inputs):
            if t.dtype != dt or tuple(t.shape) != shape or t.is_cuda != self.cuda:
                return False
            # the stride of a dim of size 1 never moves a pointer ([16, 1] as (1, 0) or (1, 1))
            if any(a != b for a, b, n in zip(t.stride(), stride, shape) if n > 1):
                return False
        return True

    def empty_outputs(self, device) -> list:
        return [torch.empty_strided(s, st, dtype=dt, device=device) for s, dt, st in self.outputs]

    def launch(self, tensors) -> list:
        device = tensors[0].device if tensors else torch.device("cuda" if self.cuda else "cpu")
        outs = self.empty_outputs(device)
        # pointer arrays per call (about a microsecond): the host reads them only during the
        # launch, and a kernel object shared by two threads must not share them
        ins = self._ins_t(*[t.data_ptr() for t in tensors])
        outp = self._outs_t(*[t.data_ptr() for t in outs])
        if self.cuda:
            stream = torch.cuda.current_stream(device).cuda_stream
            rc = self.fn(ctypes.addressof(ins), ctypes.addressof(outp), stream)
        else:
            rc = self.fn(ctypes.addressof(ins), ctypes.addressof(outp))
        if rc != 0:
            raise RuntimeError(f"kforge kernel {self.task_id} returned error {rc}")
        return outs


class Runtime:
    """The kernels of one applied run, by key, and how often each ran or fell back."""

    def __init__(self, kernels: list[Kernel]):
        self.kernels = {k.key: k for k in kernels}
        self.counts: dict[str, int] = {k.task_id: 0 for k in kernels}
        self.fallback_counts: dict[str, int] = {}
        self.replaced: dict[str, int] = {k.task_id: 0 for k in kernels}  # region sites rewritten

    @property
    def fallbacks(self) -> dict[str, int]:
        return dict(self.fallback_counts)

    def reset_counts(self) -> None:
        for t in self.counts:
            self.counts[t] = 0
        self.fallback_counts.clear()

    def run(self, key: str, tensors: list) -> list:
        k = self.kernels.get(key)
        if k is None:
            raise RuntimeError(f"kforge: no kernel {key[:12]} in this runtime")
        if not k.matches(tensors):
            why = f"{k.task_id}: tensors differ from the verified layout"
            self.fallback_counts[why] = self.fallback_counts.get(why, 0) + 1
            return [t.clone() for t in _graph.run(k.graph, list(tensors))]
        self.counts[k.task_id] += 1
        return k.launch(tensors)


# ------------------------------------------------------------------ the custom op

_RUNTIMES: dict[int, Runtime] = {}  # id(runtime) -> runtime; the op finds kernels by key
_OP = None


def _find(key: str) -> Runtime:
    for rt in _RUNTIMES.values():
        if key in rt.kernels:
            return rt
    raise RuntimeError(f"kforge: kernel {key[:12]} is not loaded (was the model's kforge runtime removed?)")


def region_op():
    """The custom op (registered once per process and per copy of this file)."""
    global _OP
    if _OP is not None:
        return _OP

    def region(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return _find(key).run(key, inputs)

    # A kernel takes its inputs in the exact strides it was verified on: Inductor must hand
    # them over so (the strides are the fake values in the call's `eager_input_vals`).
    tag = getattr(torch.Tag, "needs_exact_strides", None)
    try:
        region = torch.library.custom_op(OP_NAME, mutates_args=(),
                                         tags=(tag,) if tag is not None else ())(region)
    except TypeError:  # a torch whose custom_op takes no tags
        region = torch.library.custom_op(OP_NAME, mutates_args=())(region)

    @region.register_fake
    def _(key, inputs):
        k = _find(key).kernels[key]
        device = inputs[0].device if inputs else torch.device("cuda" if k.cuda else "cpu")
        return k.empty_outputs(device)

    _OP = torch.ops.kforge.__getattr__(OP_NAME.split("::", 1)[1]).default
    return _OP


# ------------------------------------------------------------------ the graph rewrite

def rewrite(gm: fx.GraphModule, runtime: Runtime, backend: str) -> int:
    """Replace every region of `gm` that has a verified kernel by one custom-op call."""
    op = region_op()
    part = _partition.partition(gm)
    # Every key is computed on the untouched graph first: replacing a region rewires its
    # consumers to the custom op's results, so a later region's spec, read after that, would
    # name arguments outside itself and no longer match its kernel (two adjacent winners).
    chosen = []
    for spec in part.regions:
        if spec.unsupported:
            continue
        metas_in = [_partition.tensor_meta(n) for n in spec.inputs]
        metas_out = [_partition.tensor_meta(n) for n in spec.outputs]
        if any(m is None for m in metas_in + metas_out) or not metas_out:
            continue
        try:
            graph = _partition.extract(spec)
        except _graph.UnsupportedRegion:
            continue
        j_in = [{"shape": list(s), "dtype": str(d).replace("torch.", ""), "stride": list(st)}
                for s, st, d in metas_in]
        j_out = [{"shape": list(s), "dtype": str(d).replace("torch.", ""), "stride": list(st)}
                 for s, st, d in metas_out]
        key = _graph.region_key(graph, j_in, j_out, backend)
        k = runtime.kernels.get(key)
        if k is None:
            continue
        chosen.append((spec, key, k))
    subst: dict = {}  # a replaced region's output node -> the getitem of its custom-op call
    for spec, key, k in chosen:
        _replace(gm, spec, op, key, subst)
        runtime.replaced[k.task_id] = runtime.replaced.get(k.task_id, 0) + 1
    done = len(chosen)
    if done:
        from torch.fx.passes.tools_common import legalize_graph

        legalize_graph(gm)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return done


def _replace(gm: fx.GraphModule, spec, op, key: str, subst: dict | None = None) -> None:
    g = gm.graph
    subst = {} if subst is None else subst
    members = set(spec.nodes)
    with g.inserting_before(spec.nodes[0]):
        call = g.call_function(op, (key, [subst.get(i, i) for i in spec.inputs]))
        call.meta["val"] = [o.meta.get("val") for o in spec.outputs]
        # The exact layouts the kernel was verified on. Without them Inductor treats an op
        # inserted by a graph pass as free of layout constraints and may hand it a buffer laid
        # out its own way (a channels_last conv input came in contiguous): every call would
        # fall back to the region's graph. With them it constrains the inputs to these strides.
        call.meta["eager_input_vals"] = ((key, [i.meta.get("val") for i in spec.inputs]), {})
        call.meta["stack_trace"] = spec.nodes[0].meta.get("stack_trace")
        outs = []
        for j, o in enumerate(spec.outputs):
            gi = g.call_function(operator.getitem, (call, j))
            gi.meta["val"] = o.meta.get("val")
            outs.append(gi)
    for o, gi in zip(spec.outputs, outs):
        subst[o] = gi
        for user in list(o.users):
            if user not in members:
                user.replace_input_with(o, gi)
    for n in reversed(spec.nodes):  # later members first: their users are gone by then
        g.erase_node(n)


# ------------------------------------------------------------------ backend and install

class KforgeBackend:
    """A torch.compile backend: Inductor with verified region kernels as opaque custom ops."""

    def __init__(self, runtime: Runtime, backend: str, mode: str = "compile",
                 inductor_mode: str | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.runtime, self.backend, self.mode = runtime, backend, mode
        patches = None
        if inductor_mode and inductor_mode != "default":
            patches = dict(torch._inductor.list_mode_options(inductor_mode))
        self._fn = _trace.make_backend(self._hook, config_patches=patches)
        self.__name__ = "kforge"

    def _hook(self, gm, example_inputs, is_inference, kwargs):
        if is_inference:
            rewrite(gm, self.runtime, self.backend)
        if self.mode == "compile":
            return _trace.inductor_inner(gm, example_inputs, kwargs)
        return _trace.eager_runner(gm)

    def __call__(self, gm, example_inputs):
        return self._fn(gm, example_inputs)


_INSTALLED: dict[int, tuple] = {}  # id(model) -> (runtime, previous compiled call, backend)
# Backends of removed installs stay referenced: dynamo guards a cached graph on id(backend), and
# a freed backend's id can be reused by the next one, which would then run the old graph.
_RETIRED: list = []


def install(model: torch.nn.Module, runtime: Runtime, backend: str, mode: str = "compile",
            inductor_mode: str | None = None) -> None:
    """Compile `model` in place with the kforge backend (nn.Module.compile)."""
    uninstall(model)
    region_op()
    _RUNTIMES[id(runtime)] = runtime
    prev = getattr(model, "_compiled_call_impl", None)
    be = KforgeBackend(runtime, backend, mode, inductor_mode)
    model.compile(backend=be, dynamic=False)
    _INSTALLED[id(model)] = (runtime, prev, be)


def uninstall(model: torch.nn.Module) -> bool:
    rec = _INSTALLED.pop(id(model), None)
    if rec is None:
        return False
    runtime, prev, be = rec
    _RETIRED.append(be)
    model._compiled_call_impl = prev
    if not any(r is runtime for r, _, _ in _INSTALLED.values()):
        _RUNTIMES.pop(id(runtime), None)
    return True


def runtime_of(model) -> Runtime | None:
    rec = _INSTALLED.get(id(model))
    return rec[0] if rec else None


# ------------------------------------------------------------------ architectures and rebuilds

def current_arch(backend: str) -> str:
    """What binaries must have been built for: 'sm_90' on cuda; machine and CPU model on cpu
    (the cpu backend builds with -march=native, so another CPU model may lack instructions)."""
    import platform

    if backend == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA GPU"
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    name = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.machine()} {name}".strip()


def find_compiler(backend: str) -> str | None:
    import shutil

    names = (os.environ.get("KFORGE_NVCC"), "nvcc",
             os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")) \
        if backend == "cuda" else (os.environ.get("KFORGE_CXX"), os.environ.get("CXX"), "g++",
                                   "c++", "clang++")
    for n in names:
        if n and shutil.which(n):
            return shutil.which(n)
    return None


def rebuild(spec: dict, src_path: Path, header: str, flags: list[str], backend: str, arch: str,
            cache_dir: Path) -> Path:
    """Compile one kernel source for this machine into cache_dir (kept across imports by hash),
    with the flags the manifest records (the sandbox's own)."""
    import subprocess

    compiler = find_compiler(backend)
    if compiler is None:
        raise ArchMismatch("no compiler")
    code = src_path.read_bytes()
    h = hashlib.sha1(code + header.encode() + arch.encode() + backend.encode()).hexdigest()[:16]
    out = cache_dir / f"{spec['task_id']}_{h}.so"
    if out.exists():
        return out
    work = cache_dir / f".{out.name}.{os.getpid()}.d"
    work.mkdir(parents=True, exist_ok=True)
    (work / "kforge_region.h").write_text(header)
    src = work / src_path.name
    src.write_bytes(code)
    tmp = work / "kernel.so"
    cmd = [compiler] + [f.replace("{arch}", arch) for f in flags] + ["-o", str(tmp), str(src)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(work))
    if p.returncode != 0:
        raise KernelLoadError(f"rebuilding {spec['task_id']} failed: {(p.stderr or p.stdout).strip()[-500:]}")
    os.replace(tmp, out)
    return out


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in s)[:80]


def load_export(pkg_dir: str | Path) -> Runtime:
    """Load an exported package's manifest and binaries for this machine (rebuilding if needed)."""
    import json
    import tempfile

    pkg_dir = Path(pkg_dir)
    manifest = json.loads((pkg_dir / "manifest.json").read_text())
    backend, built_for = manifest["backend"], manifest["arch"]
    here = current_arch(backend)
    kernels = []
    for entry in manifest["kernels"]:
        spec = dict(entry)
        if here == built_for:
            spec["lib"] = str(pkg_dir / entry["binary"])
        else:
            cache = pkg_dir / "build" / _safe(here)
            if not os.access(pkg_dir, os.W_OK):
                cache = Path(tempfile.gettempdir()) / "kforge_export_build" / _safe(here)
            try:
                spec["lib"] = str(rebuild(entry, pkg_dir / entry["source"],
                                          (pkg_dir / entry["header"]).read_text(),
                                          manifest["flags"], backend,
                                          here if backend == "cuda" else "native", cache))
            except ArchMismatch:
                tool = "nvcc" if backend == "cuda" else "a C++ compiler (g++)"
                raise ArchMismatch(
                    f"kernels in {pkg_dir} were built for {built_for} but this machine is {here}, "
                    f"and {tool} was not found to rebuild them from source") from None
        kernels.append(Kernel(spec))
    return Runtime(kernels)
