"""Load and run a checked Triton candidate — in the *worker* process only, never the engine.

    entry = worker_entry(source, cand_dir, inputs, outputs, sync=backend.sync)
    if entry.status != "ok": fail the candidate with entry.status / entry.message / entry.log
    rc = entry.launch(inputs, outputs)        # verification calls (guarded)
    rc = entry.launch_fast(inputs, outputs)   # timed calls (same code, no guard)

What happens:
  * the source (already passed sandbox/triton_check.py, which the loader runs again: cheap, and
    the worker must not trust the wire) is written to `cand_dir/candidate.py` and imported from
    that file as a fresh module (never put in sys.modules: nothing can find it later, and every
    candidate gets new JITFunction objects, so no compiled kernel or autotune choice crosses
    candidates in memory);
  * `TRITON_CACHE_DIR` is `cand_dir/triton_cache`, set around the import and the first call:
    Triton's on-disk cache is per candidate. `reuse_cache_from` hard-links the compiled kernels
    of earlier candidates of the same task (e.g. the Inductor seed's) into it: a kernel whose
    source, constants, options and target are identical hashes to the same key and is not
    compiled again (Triton's cache key covers all of them; only Triton writes these files);
  * the first call is made here, on the caller's tensors and current stream, and timed to the
    end of its work (`sync`): it includes Triton's JIT compile (and any autotuning the candidate
    asked for), so `jit_s` counts in the candidate's latency figure;
  * every call runs `kforge_launch(inputs, outputs)` on the current stream (Triton launches on
    torch's current stream); `None` or 0 returned means success;
  * `launch` runs under a dispatch guard: an aten op issued by the candidate's own Python (a
    tensor operator the static check cannot see, `o = outputs[0]; o += x`) is refused and
    recorded; ops issued by Triton itself (the interpreter's copies, its launcher) are not the
    candidate's and pass. Allowed from candidate code: scratch allocation (empty,
    empty_strided, zeros), zero_/fill_, and slicing views. The record survives a `try` in the
    candidate (which the static check refuses anyway).

Return codes of `launch`: 0 ok, 1 the candidate raised (message in `entry.last_error`), 2 it
called a PyTorch op from its own code (`entry.last_error` names it).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kforge_tui.regions import abi

ENTRY = abi.ENTRY
FILE_NAME = "candidate.py"
CACHE_SUBDIR = "triton_cache"

RC_OK, RC_RAISED, RC_TORCH_OP = 0, 1, 2

# aten ops the candidate's own Python may issue (by overload packet name)
ALLOWED_OPS = {"empty", "empty_strided", "zeros", "zero_", "fill_", "slice", "select", "alias",
               "detach", "lift_fresh", "as_strided",
               "mm", "addmm", "bmm", "baddbmm", "topk", "sort"}  # libraries (triton_check)


@dataclass
class Entry:
    """A loaded candidate (or why it could not be loaded)."""

    status: str  # "ok" | "load_error" | "compile_error" | "launch_error" | "torch_op" | "static_error"
    message: str = ""
    log: str = ""
    load_s: float = 0.0  # check + write + import
    jit_s: float = 0.0  # the first call to the end of its work: JIT compile + one run
    scratch_bytes: int = 0
    launch: Callable[[list, list], int] | None = None
    launch_fast: Callable[[list, list], int] | None = None
    last_error: str = ""
    cache_dir: str = ""
    path: str = ""
    violations: list[str] = field(default_factory=list)

    def result(self) -> dict:
        """JSON-able summary for the worker's response."""
        return {"status": self.status, "message": self.message, "log": self.log,
                "load_s": self.load_s, "jit_s": self.jit_s, "scratch_bytes": self.scratch_bytes}


@contextmanager
def _env(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _link_cache(dst: Path, sources) -> int:
    """Hard-link (copy if linking fails) compiled-kernel directories of earlier candidates."""
    n = 0
    for src in sources or ():
        src = Path(src)
        if not src.is_dir():
            continue
        for kdir in src.iterdir():
            if not kdir.is_dir() or (dst / kdir.name).exists():
                continue
            tmp = dst / (kdir.name + ".tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            for f in kdir.iterdir():
                if f.name.startswith("tmp."):
                    continue  # a write in progress
                try:
                    os.link(f, tmp / f.name)
                except OSError:
                    import shutil

                    shutil.copy2(f, tmp / f.name)
            os.replace(tmp, dst / kdir.name)
            n += 1
    return n


# Triton's own code that issues aten ops for a launch (the interpreter's copies, the launcher):
# ops issued from under it are Triton's, not the candidate's
_LAUNCH_MACHINERY = ("runtime", "compiler", "backends", "_C")


class TorchOpGuard:
    """Records aten ops issued by the candidate's own code (not by Triton) that it may not use."""

    def __init__(self, candidate_file: str):
        self.file = os.path.realpath(candidate_file)
        # compared as strings: a realpath per frame would stat files, which the runner's
        # syscall filter refuses
        self.files = {self.file, candidate_file, os.path.abspath(candidate_file)}
        self.violations: list[str] = []
        self._mode = None

    def _from_candidate(self) -> bool:
        """True when the candidate's own code caused the op: a candidate frame is on the stack
        and no frame of Triton's launch machinery (runtime, compiler, backends: the launcher
        and the interpreter issue their own ops for a launch) lies between it and the op.
        Triton's language objects do not excuse an op: `tl.constexpr(x) * tl.constexpr(y)`
        multiplies tensors in Triton's operator method, but the candidate asked for it (issue
        21; deciding by the innermost frame let that through)."""
        f = sys._getframe(2)
        while f is not None:
            fn = f.f_code.co_filename
            if fn in self.files:
                return True
            if any(f"{os.sep}triton{os.sep}{part}{os.sep}" in fn for part in _LAUNCH_MACHINERY) \
                    and f"{os.sep}torch{os.sep}" not in fn:
                return False
            f = f.f_back
        return False

    def mode(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        guard = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
                if name not in ALLOWED_OPS and guard._from_candidate():
                    guard.violations.append(str(func))
                    raise RuntimeError(f"the candidate called the PyTorch op {func} from its own "
                                       "code: compute in the kernel")
                return func(*args, **(kwargs or {}))

        return _Mode()


# ------------------------------------------------------------------ warm-up kernel

def warm_kernel():
    """The one tiny kernel our own processes compile before any candidate: the runner (for
    real, on its device) and the compile-ahead server (for a target, no device). `SALT` is the
    caller's pid, so the compile is never a cache hit and Triton's backend, LLVM and MLIR are
    all set up by it."""
    import triton
    import triton.language as tl

    @triton.jit
    def _kforge_warm(p, n, B: tl.constexpr, SALT: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(p + o, tl.exp(o.to(tl.float32)) * 2.0 + SALT * 0.0, o < n)

    return _kforge_warm


# ------------------------------------------------------------------ interpreter support (CI)

def interpreting() -> bool:
    """Triton's interpreter (TRITON_INTERPRET=1): kernels run as numpy on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


_SHIMMED = False


def _interpreter_libdevice() -> None:
    """Give libdevice bodies under Triton's interpreter.

    On the GPU, `libdevice.tanh` etc. are lowered to CUDA's libdevice; the interpreter (3.6-3.9)
    patches only tl, tl.core and tl.math, leaving libdevice's stubs returning None. Inductor's
    kernels use libdevice (rsqrt, tanh, erf, pow, ...), so in interpreter mode only (CI on the
    CPU) this process's libdevice modules get numpy implementations. Never done on a GPU.
    """
    global _SHIMMED
    if _SHIMMED:
        return
    import math as pymath

    from triton.runtime import interpreter as _interp
    from triton.runtime.jit import JITFunction

    # Triton imported before TRITON_INTERPRET was set (torch imports it lazily) made
    # tl.max, tl.sum, ... plain JITFunctions, which refuse device calls under the interpreter:
    # interpret them the way the interpreter interprets its own.
    if not getattr(JITFunction, "_kforge_interpreted", False):
        def _device_call(self, *args, **kwargs):
            f = _interp.InterpretedFunction.__new__(_interp.InterpretedFunction)
            f.fn = self.fn
            f.rewriter = _interp.FunctionRewriter(self.fn)
            return _interp.InterpretedFunction.__call__(f, *args, **kwargs)

        JITFunction.__call__ = _device_call
        JITFunction._kforge_interpreted = True

    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def c_round(x):
        return np.sign(x) * np.floor(np.abs(x) + 0.5)

    def vec(f):
        return np.vectorize(f, otypes=[np.float64])

    unary = {
        "tanh": np.tanh, "fast_tanhf": np.tanh, "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh,
        "atan": np.arctan, "asin": np.arcsin, "acos": np.arccos, "atanh": np.arctanh,
        "asinh": np.arcsinh, "acosh": np.arccosh, "sin": np.sin, "cos": np.cos, "exp": np.exp,
        "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "log": np.log, "log2": np.log2,
        "log10": np.log10, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
        "rsqrt": lambda x: 1.0 / np.sqrt(x), "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
        "nearbyint": np.rint, "rint": np.rint, "round": c_round, "abs": np.abs, "fabs": np.abs,
        "erf": vec(pymath.erf), "erfc": vec(pymath.erfc), "lgamma": vec(pymath.lgamma),
        "tgamma": vec(pymath.gamma), "rcp": lambda x: 1.0 / x, "sqrt_rn": np.sqrt,
        "cbrt": np.cbrt, "llrint": lambda x: np.rint(x).astype(np.int64),
    }
    binary = {"pow": np.power, "atan2": np.arctan2, "hypot": np.hypot, "fmod": np.fmod,
              "copysign": np.copysign, "nextafter": np.nextafter, "fmax": np.fmax,
              "fmin": np.fmin, "div_rn": np.divide, "fdiv": np.divide, "ldexp": np.ldexp,
              "remainder": np.remainder}
    predicates = {"isnan": np.isnan, "isinf": np.isinf, "signbit": np.signbit,
                  "isfinited": np.isfinite, "finitef": np.isfinite}

    def data(a):
        if isinstance(a, tl.tensor):
            return a.handle.data
        if isinstance(a, tl.constexpr):
            a = a.value
        return np.array(a)

    def wrap(np_fn, kind):
        def f(*args, **kwargs):
            ref = next((a for a in args if isinstance(a, tl.tensor)), None)
            out = np.asarray(np_fn(*[data(a) for a in args]))
            if kind == "pred":
                scal = tl.int1
                out = out.astype(np.bool_)
            else:
                scal = ref.dtype.scalar if ref is not None else tl.float32
                if kind != "int":
                    want = ref.handle.data.dtype if ref is not None else np.float32
                    out = out.astype(want)
                else:
                    scal = tl.int64
            shape = list(out.shape)
            ty = tl.block_type(scal, shape) if shape else scal
            return tl.tensor(TensorHandle(out, scal), ty)
        return f

    mods = []
    for name in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            continue
    shims = {**{k: wrap(fn, "int" if k == "llrint" else "unary") for k, fn in unary.items()},
             **{k: wrap(fn, "binary") for k, fn in binary.items()},
             **{k: wrap(fn, "pred") for k, fn in predicates.items()}}
    for m in mods:
        for k, shim in shims.items():
            _SHIMS.append((m, k, getattr(m, k, None), shim))
            setattr(m, k, shim)
    _SHIMMED = True


_SHIMS: list = []  # (module, name, Triton's own, the interpreter's body): what the shim replaced


@contextmanager
def libdevice_as_installed():
    """Triton's own libdevice in the block, the interpreter's bodies after it: a kernel traced
    into a graph (wrap_triton) hashes the functions it references, and a shim is no function
    of Triton's. Only a process that ran candidates under the interpreter (the CPU tests) has
    anything to swap."""
    for m, k, own, _ in _SHIMS:
        if own is None:
            m.__dict__.pop(k, None)  # a name the shim added
        else:
            setattr(m, k, own)
    try:
        yield
    finally:
        for m, k, _, shim in _SHIMS:
            setattr(m, k, shim)


def load(source: str, cand_dir: str | Path, *, check: bool = True,
         reuse_cache_from=()) -> Entry:
    """Check, write and import a candidate; no call yet. `entry.launch*` are set when ok."""
    t0 = time.perf_counter()
    cand_dir = Path(cand_dir)
    cand_dir.mkdir(parents=True, exist_ok=True)
    cache = cand_dir / CACHE_SUBDIR
    cache.mkdir(exist_ok=True)
    entry = Entry("load_error", cache_dir=str(cache))
    if check:
        from kforge_tui.sandbox import triton_check

        rep = triton_check.check_source(source)
        entry.scratch_bytes = rep.scratch_bytes
        if not rep.ok:
            entry.status, entry.message = "static_error", rep.diagnostics[0].text()
            entry.log = rep.text()
            entry.load_s = time.perf_counter() - t0
            return entry
    if reuse_cache_from:
        _link_cache(cache, reuse_cache_from)
    if interpreting():
        _interpreter_libdevice()
    path = cand_dir / FILE_NAME
    path.write_text(source)
    entry.path = str(path)
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    name = f"kforge_candidate_{digest}_{os.getpid()}_{int(time.monotonic_ns()) % 10**9}"
    guard = TorchOpGuard(str(path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        with _env("TRITON_CACHE_DIR", str(cache)), guard.mode():
            spec.loader.exec_module(module)
    except Exception as e:
        entry.message = f"importing the candidate raised {type(e).__name__}: {_first(e)}"
        entry.log = traceback.format_exc(limit=-4)
        entry.load_s = time.perf_counter() - t0
        return entry
    fn = getattr(module, ENTRY, None)
    if not callable(fn):
        entry.message = f"the candidate defines no callable `{ENTRY}`"
        entry.load_s = time.perf_counter() - t0
        return entry

    def launch_fast(inputs, outputs) -> int:
        try:
            rc = fn(inputs, outputs)
        except Exception as e:
            entry.last_error = f"{ENTRY} raised {type(e).__name__}: {_first(e)}"
            return RC_RAISED
        return 0 if rc is None else int(rc)

    def launch(inputs, outputs) -> int:
        n = len(guard.violations)
        before = _tensor_metas(inputs, outputs)
        try:
            with _env("TRITON_CACHE_DIR", str(cache)), guard.mode():
                rc = fn(inputs, outputs)
        except Exception as e:
            if len(guard.violations) > n:
                entry.last_error = (f"{ENTRY} called the PyTorch op {guard.violations[n]} from its "
                                    "own code (computing with PyTorch is not writing the kernel)")
                return RC_TORCH_OP
            entry.last_error = f"{ENTRY} raised {type(e).__name__}: {_first(e)}"
            entry.log = traceback.format_exc(limit=-6)
            return RC_RAISED
        if len(guard.violations) > n:  # swallowed by the candidate: still a violation
            entry.last_error = (f"{ENTRY} called the PyTorch op {guard.violations[n]} from its own "
                                "code (computing with PyTorch is not writing the kernel)")
            return RC_TORCH_OP
        changed = _changed_meta(before, _tensor_metas(inputs, outputs))
        if changed:
            entry.last_error = f"{ENTRY} {changed}"
            return RC_RAISED
        try:
            return 0 if rc is None else int(rc)
        except (TypeError, ValueError):
            entry.last_error = f"{ENTRY} returned {type(rc).__name__}, not an int"
            return RC_RAISED

    entry.violations = guard.violations
    entry.status, entry.launch, entry.launch_fast = "ok", launch, launch_fast
    entry.load_s = time.perf_counter() - t0
    return entry


def _tensor_metas(inputs, outputs) -> list:
    return [[None if t is None else (tuple(t.shape), t.stride(), t.storage_offset(), t.data_ptr())
             for t in ts] for ts in (inputs, outputs)]


def _changed_meta(before: list, after: list) -> str:
    """How a call changed the tensor objects it was handed ('' when it did not). Inside the
    model the launch is traced into the graph (integrate/triton_region.py), and the graph takes
    the tensors it hands over as they are after the call: `torch.mm(a, b, out=outputs[0])` at
    another shape resizes outputs[0] (the memory is the same, so the values verify) and the
    traced region returns a tensor of the wrong shape (gemma's linear+gelu seed, H100
    2026-12-06). A kernel writes into its tensors; it does not reshape or move them."""
    for kind, was, now in zip(("input", "output"), before, after):
        for i, (a, b) in enumerate(zip(was, now)):
            if a == b:
                continue
            what = ("its shape " + f"{list(a[0])} -> {list(b[0])}" if a[0] != b[0] else
                    f"its strides {list(a[1])} -> {list(b[1])}" if a[1] != b[1] else "where it points")
            return (f"changed {kind} {i} itself ({what}; an out= call at another shape resizes "
                    "its out tensor): write into the tensors as they are given, through views")
    return ""


def _first(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else type(e).__name__)[:300]


def _classify(msg: str, log: str) -> str:
    text = msg + "\n" + log
    if "CompilationError" in text or "compile" in msg.lower() and "triton" in text.lower():
        return "compile_error"
    return "launch_error"


def first_call(entry: Entry, inputs: list, outputs: list, sync: Callable[[], None]) -> Entry:
    """The first call (JIT compile + one run), timed to the end of its work."""
    t = time.perf_counter()
    rc = entry.launch(inputs, outputs)
    try:
        sync()
    except Exception as e:  # an illegal access surfaces at the sync
        entry.status, entry.message = "launch_error", f"device error after the first call: {_first(e)}"
        entry.jit_s = time.perf_counter() - t
        return entry
    entry.jit_s = time.perf_counter() - t
    if rc == RC_TORCH_OP:
        entry.status, entry.message = "torch_op", entry.last_error
    elif rc != 0:
        entry.status = _classify(entry.last_error, entry.log)
        entry.message = entry.last_error or f"{ENTRY} returned {rc}"
    return entry


def worker_entry(source: str, cand_dir: str | Path, inputs: list, outputs: list,
                 sync: Callable[[], None], *, reuse_cache_from=()) -> Entry:
    """The worker's one call per Triton candidate: check, load, first call (JIT, timed).

    `inputs`/`outputs` are one input set's tensors in ABI order (absent inputs None) on the
    device, `sync` waits for the harness stream. On `status == "ok"` the worker verifies with
    `entry.launch` and times with `entry.launch_fast`; otherwise it fails the candidate with
    `entry.status` ("static_error", "load_error", "compile_error", "launch_error", "torch_op")
    and `entry.message` (one line) / `entry.log`.
    """
    entry = load(source, cand_dir, reuse_cache_from=reuse_cache_from)
    if entry.status != "ok":
        return entry
    return first_call(entry, inputs, outputs, sync)
