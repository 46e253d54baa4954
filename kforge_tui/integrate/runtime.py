"""Run verified region kernels inside torch.compile: the kforge backend and its region op.

This file is copied verbatim into exported packages (export.py) next to copies of
regions/graph.py, partition.py, rewrite.py and trace.py and of region_op.cpp, so it imports only
torch, ctypes and the standard library (and those, as siblings in an export or from
kforge_tui.regions here).

How a kernel joins the compiled model (DESIGN.md "Integration"):
  * `model.compile(backend=KforgeBackend(...))` compiles the model in place. The backend is
    Inductor's own `compile_fx` up to the aten inference graph (regions/trace.py), so it sees
    exactly the graph the capture saw and the partitioner finds the same regions;
  * each region whose site key (graph + the graph's own shapes, dtypes and strides + backend)
    has a verified kernel is replaced by one call of `kforge_<token>::region(key, inputs) ->
    outputs`, opaque to Inductor, tagged needs_exact_strides with the layouts the kernel was
    verified on: the layouts Inductor itself gives that region (regions/layout.py found them
    at capture), so Inductor hands them over without a copy;
  * compile mode hands the rewritten graph to Inductor's `compile_fx_inner` (everything else
    is Inductor's, CUDA graphs included under reduce-overhead); eager mode runs it eagerly.

The op is C++ (region_op.cpp, built once per machine and torch version with
torch.utils.cpp_extension and cached): the dispatcher calls it with no Python on the call path,
it allocates outputs from the caching allocator and launches on the current stream with no
synchronisation, so it can be captured in a CUDA graph. Where no C++ compiler is available the
same op is implemented in Python (ctypes; tens of microseconds of host time a call, which
`native_status()` reports). A call whose tensors differ from what its kernel was verified on
(it cannot happen through the rewrite, whose keys and layouts are exact, but the op is callable
by anyone) runs the region's own graph instead and is counted as a fallback. Training graphs
(grad enabled) are left untouched: the kernels have no backward.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from pathlib import Path

import torch
import torch.fx as fx

try:  # an exported package: siblings
    from . import graph as _graph, rewrite as _rewrite, trace as _trace  # type: ignore
    from . import triton_region as _triton  # type: ignore
    from .kernel_spec import ALIGN, KernelSpec  # type: ignore
except ImportError:
    from kforge_tui.regions import graph as _graph, rewrite as _rewrite, trace as _trace
    from kforge_tui.integrate import triton_region as _triton
    from kforge_tui.integrate.kernel_spec import ALIGN, KernelSpec

log = logging.getLogger("kforge.integrate")

ENTRY = "kforge_launch"
MODES = ("compile", "eager")
NATIVE_SOURCE = Path(__file__).with_name("region_op.cpp")


# One namespace per copy of this file: kforge itself and an exported package can live in one
# process. Its text is in the name too: Inductor's FX graph cache keys on the graph's code, in
# which the op appears by name, so a graph compiled with an older version of the op (other
# layout constraints) is not reused by this one.
def _token() -> str:
    h = hashlib.sha1(os.path.abspath(__file__).encode())
    for f in (__file__, NATIVE_SOURCE):
        try:
            h.update(Path(f).read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:10]


_TOKEN = _token()
OP_NS = f"kforge_{_TOKEN}"
OP_NAME = f"{OP_NS}::region"


class KernelLoadError(RuntimeError):
    """A kernel library could not be loaded or does not match its manifest."""


class ArchMismatch(RuntimeError):
    """Binaries were built for another GPU/CPU and no compiler is there to rebuild them."""


def _meta_json(t) -> dict:
    return {"shape": [int(s) for s in t.shape], "dtype": str(t.dtype).replace("torch.", ""),
            "stride": [int(s) for s in t.stride()]}


class Kernel(KernelSpec):
    """One verified CUDA or C++ region kernel: its compiled entry point (`kforge_launch` in a
    shared library), called by the region op. The layouts and keys are KernelSpec's."""

    def __init__(self, spec: dict):
        super().__init__(spec)
        try:
            self._lib = ctypes.CDLL(str(spec["lib"]))
            cfn = getattr(self._lib, ENTRY)
        except (OSError, AttributeError) as e:
            raise KernelLoadError(f"{self.task_id}: cannot load {ENTRY} from {spec['lib']}: {e}") from None
        self.address = ctypes.cast(cfn, ctypes.c_void_p).value
        n = 3 if self.cuda else 2
        self.fn = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * n))(self.address)
        self._ins_t = ctypes.c_void_p * max(1, len(self.inputs))
        self._outs_t = ctypes.c_void_p * max(1, len(self.outputs))

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
    """The kernels of one applied run, by key (`kernels`) and by site key (`sites`: what the
    graph rewrite looks up), and how often each ran or fell back.

    With the C++ op available, each kernel is registered with it and calls never reach Python;
    `native=False` keeps every call in Python (what tests use to watch calls)."""

    def __init__(self, kernels: list, native: bool | None = None):
        self.kernels: dict[str, Kernel] = {}
        self.sites: dict[str, Kernel] = {}
        for k in kernels:
            self.kernels.setdefault(k.key, k)
            for site in getattr(k, "site_keys", None) or (getattr(k, "site_key", k.key),):
                self.sites.setdefault(site, k)
        self._py_counts: dict[str, int] = {k.task_id: 0 for k in kernels}
        self.fallback_counts: dict[str, int] = {}
        self.replaced: dict[str, int] = {k.task_id: 0 for k in kernels}  # region sites rewritten
        self.native = None
        called = [k for k in self.kernels.values() if hasattr(k, "address")]  # the op's kernels
        if native is not False and called:
            self.native = _native()
            if self.native is not None:
                for k in called:
                    self.native.add(k)
            elif native:
                raise RuntimeError(f"the C++ region op is unavailable: {native_status()['reason']}")

    @property
    def counts(self) -> dict[str, int]:
        """task_id -> calls that ran its kernel (live). A Triton kernel is launched by Inductor's
        own code, which nothing counts: it reads as its call sites in the compiled graphs."""
        out = dict(self._py_counts)
        for k in self.kernels.values():
            if isinstance(k, _triton.TritonKernel):
                out[k.task_id] = self.replaced.get(k.task_id, 0)
            elif self.native is not None:
                out[k.task_id] = out.get(k.task_id, 0) + self.native.calls(k.key)
        return out

    @property
    def fallbacks(self) -> dict[str, int]:
        return dict(self.fallback_counts)

    def reset_counts(self) -> None:
        for t in self._py_counts:
            self._py_counts[t] = 0
        self.fallback_counts.clear()
        if self.native is not None:
            for k in self.kernels.values():
                self.native.reset(k.key)

    def run(self, key: str, tensors: list) -> list:
        k = self.kernels.get(key)
        if k is None:
            raise RuntimeError(f"kforge: no kernel {key[:12]} in this runtime")
        if not k.matches(tensors):
            why = f"{k.task_id}: tensors differ from the verified layout"
            self.fallback_counts[why] = self.fallback_counts.get(why, 0) + 1
            return [t.clone() for t in _graph.run(k.graph, list(tensors))]
        self._py_counts[k.task_id] = self._py_counts.get(k.task_id, 0) + 1
        return k.launch(tensors)


# ------------------------------------------------------------------ the C++ op

class _Native:
    """ctypes view of the built region_op library (registration and counters only: calls go
    through the dispatcher)."""

    def __init__(self, path: str):
        self.path = path
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.kforge_native_init.argtypes = [ctypes.c_char_p]
        i32p, i64p = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)
        L.kforge_native_add.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                        i32p, i64p, i64p, i32p, ctypes.c_int, i32p, i64p, i64p, i32p,
                                        ctypes.c_int64]
        L.kforge_native_calls.argtypes = [ctypes.c_char_p]
        L.kforge_native_calls.restype = ctypes.c_int64
        L.kforge_native_reset.argtypes = [ctypes.c_char_p]

    def init(self, ns: str) -> None:
        if self.lib.kforge_native_init(ns.encode()) != 0:
            raise RuntimeError(f"kforge_native_init({ns}) failed (see stderr)")

    @staticmethod
    def _flat(layouts):
        ndims = (ctypes.c_int32 * max(1, len(layouts)))(*[len(s) for s, _, _ in layouts])
        sizes = [int(x) for s, _, _ in layouts for x in s]
        strides = [int(x) for _, _, st in layouts for x in st]
        dtypes = (ctypes.c_int32 * max(1, len(layouts)))(*[_scalar_type(dt) for _, dt, _ in layouts])
        return (ndims, (ctypes.c_int64 * max(1, len(sizes)))(*sizes),
                (ctypes.c_int64 * max(1, len(strides)))(*strides), dtypes)

    def add(self, k: Kernel) -> None:
        i_nd, i_sz, i_st, i_dt = self._flat(k.inputs)
        o_nd, o_sz, o_st, o_dt = self._flat(k.outputs)
        rc = self.lib.kforge_native_add(k.key.encode(), k.address, int(k.cuda), len(k.inputs), i_nd,
                                        i_sz, i_st, i_dt, len(k.outputs), o_nd, o_sz, o_st, o_dt, ALIGN)
        if rc != 0:
            raise RuntimeError(f"kforge_native_add failed for {k.task_id}")

    def calls(self, key: str) -> int:
        return max(0, int(self.lib.kforge_native_calls(key.encode())))

    def reset(self, key: str) -> None:
        self.lib.kforge_native_reset(key.encode())


def _scalar_type(dt: torch.dtype) -> int:
    """c10::ScalarType's number for a dtype (the enum order of c10/core/ScalarType.h)."""
    order = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
             "complex32", "complex64", "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16"]
    return order.index(str(dt).replace("torch.", ""))


_NATIVE: dict = {}  # "lib": _Native | None, "reason": why not, "build_s": seconds spent building


def native_dir() -> Path:
    """Where the C++ op is built: the kforge cache (KFORGE_CACHE, else torch's extension root), per torch
    version and op namespace (this file's copy and text), so one build serves every run on the
    machine and two copies in one process (kforge and an export) each have their own library."""
    base = os.environ.get("KFORGE_CACHE")
    if not base:  # torch's own extension root (TORCH_EXTENSIONS_DIR): an export needs only torch
        from torch.utils.cpp_extension import get_default_build_root

        base = os.path.join(get_default_build_root(), "kforge")
    return Path(base) / "native" / f"torch-{torch.__version__.replace('+', '_')}-{OP_NS}"


def _native() -> _Native | None:
    """The built and loaded C++ op library, or None (with the reason in native_status())."""
    if "lib" in _NATIVE:
        return _NATIVE["lib"]
    import time

    if os.environ.get("KFORGE_NATIVE_OP", "1") == "0":
        _NATIVE.update(lib=None, reason="KFORGE_NATIVE_OP=0")
        return None
    t0 = time.perf_counter()
    try:
        from torch.utils import cpp_extension

        d = native_dir()
        d.mkdir(parents=True, exist_ok=True)
        name = "kforge_region_op"
        so = d / f"{name}.so"
        if not so.exists():
            log.info("building kforge's C++ region op once for torch %s (%s)", torch.__version__, d)
        # cpp_extension does the flags, the ABI, ninja and a lock against a concurrent build
        cpp_extension.load(name, [str(NATIVE_SOURCE)], build_directory=str(d), is_python_module=False,
                           extra_cflags=["-O2"], verbose=False)
        lib = _Native(str(so))
        _NATIVE.update(lib=lib, reason="", build_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, no headers: Python calls instead
        first = str(e).strip().splitlines()
        _NATIVE.update(lib=None, reason=f"{type(e).__name__}: {first[-1][:300] if first else ''}",
                       build_s=time.perf_counter() - t0)
    return _NATIVE["lib"]


def native_status() -> dict:
    """{"native": bool, "reason": why not, "path": the library}: how region calls are made."""
    lib = _native()
    return {"native": lib is not None, "reason": _NATIVE.get("reason", ""),
            "path": lib.path if lib is not None else None, "build_s": _NATIVE.get("build_s")}


# ------------------------------------------------------------------ the op

_RUNTIMES: dict[int, Runtime] = {}  # id(runtime) -> runtime; the op finds kernels by key
_OP = None
_LIB = None


def _find(key: str) -> Runtime:
    for rt in _RUNTIMES.values():
        if key in rt.kernels:
            return rt
    raise RuntimeError(f"kforge: kernel {key[:12]} is not loaded (was the model's kforge runtime removed?)")


def _py_region(key: str, inputs: list) -> list:
    return _find(key).run(key, list(inputs))


def _fake_region(key: str, inputs: list) -> list:
    k = _find(key).kernels[key]
    device = inputs[0].device if inputs else torch.device("cuda" if k.cuda else "cpu")
    return k.empty_outputs(device)


def region_op():
    """The region op (defined once per process and per copy of this file): C++ when the native
    library builds, else Python. `region_fallback` is the Python path the C++ op forwards a call
    it cannot launch to."""
    global _OP, _LIB
    if _OP is not None:
        return _OP
    lib = torch.library.Library(OP_NS, "FRAGMENT")
    # A kernel takes its inputs in the exact strides it was verified on: Inductor must hand
    # them over so (the strides are the fake values in the call's `eager_input_vals`).
    tag = getattr(torch.Tag, "needs_exact_strides", None)
    schema = "(str key, Tensor[] inputs) -> Tensor[]"
    lib.define("region" + schema, tags=(tag,) if tag is not None else ())
    lib.define("region_fallback" + schema)
    lib.impl("region_fallback", _py_region, "CompositeExplicitAutograd")
    nat = _native()
    if nat is not None:
        nat.init(OP_NS)
    else:
        for key in ("CPU", "CUDA"):
            lib.impl("region", _py_region, key)
    torch.library.register_fake(f"{OP_NS}::region", _fake_region, lib=lib)
    torch.library.register_fake(f"{OP_NS}::region_fallback", _fake_region, lib=lib)
    _LIB = lib
    _OP = getattr(getattr(torch.ops, OP_NS), "region").default
    return _OP


# ------------------------------------------------------------------ the graph rewrite

def kernel_for(spec: dict):
    """The loaded kernel of one spec: a Triton kernel (inlined for Inductor to launch) or a
    compiled library (called by the region op)."""
    return _triton.TritonKernel(spec) if spec.get("lang") == "triton" else Kernel(spec)


def rewrite(gm: fx.GraphModule, runtime: Runtime, backend: str) -> int:
    """Replace every region of `gm` that has a verified kernel by one region-op call, or by the
    launches of its Triton kernel."""
    op = region_op()
    chosen = []
    for site in _rewrite.sites(gm, backend):
        k = runtime.sites.get(site.key)
        if k is None:
            continue
        vals = [i.meta.get("val") for i in site.spec.inputs]
        if isinstance(k, _triton.TritonKernel):  # Inductor launches it: its graph, no op
            chosen.append((site, k.subgraph(vals), None, None, k.key))
        else:
            chosen.append((site, op, k.fake_inputs(vals),
                           k.fake_outputs([o.meta.get("val") for o in site.spec.outputs]), k.key))
        runtime.replaced[k.task_id] = runtime.replaced.get(k.task_id, 0) + 1
    return _rewrite.replace(gm, chosen)


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
    """Compile `model` in place with the kforge backend (nn.Module.compile). With no kernel in
    compile mode it is torch.compile itself in that Inductor mode: the same code as the user's
    own `torch.compile`, so "never slower than torch.compile" holds there by construction."""
    uninstall(model)
    _RUNTIMES[id(runtime)] = runtime
    prev = getattr(model, "_compiled_call_impl", None)
    if not runtime.kernels and mode == "compile":
        be = None
        model.compile(mode=inductor_mode, dynamic=False)  # as decide.py compiles the baseline
    else:
        region_op()
        be = KforgeBackend(runtime, backend, mode, inductor_mode)
        model.compile(backend=be, dynamic=False)
    _INSTALLED[id(model)] = (runtime, prev, be)


def uninstall(model: torch.nn.Module) -> bool:
    rec = _INSTALLED.pop(id(model), None)
    if rec is None:
        return False
    runtime, prev, be = rec
    if be is not None:
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
        if spec.get("lang") == "triton":  # a source: Inductor compiles it for this GPU
            kernels.append(kernel_for(dict(spec, source_path=str(pkg_dir / entry["source"]))))
            continue
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
