"""The runner: one fresh process per candidate, forked by the zygote (sandbox/worker.py).

It maps the task's arena (sandbox/backends/arena.py), records the process state, loads the
candidate (a library with ctypes, or a Triton file through sandbox/triton_loader.py), records the
state again, and calls the kernel only when the supervisor says so; the timing loop runs here,
pausing at checked calls for the supervisor (sandbox/timing.py). It never judges anything: every
verdict is the supervisor's. A crash, hang, sticky CUDA error, leftover thread, signal handler,
timer or FP-environment change dies with it.

Messages to the supervisor (JSON over the SOCK_SEQPACKET socket the zygote handed it):
    {"ev": "ready"} | {"ev": "loaded", "error"?, "problem"?, "status"?, "jit_s"?}
    {"ev": "called", "rc", "problem", "candidate_error"?}
    {"ev": "before", "i", "set", "refresh"} | {"ev": "after", "i", "set", "rc", "problem"}
    {"ev": "timed", "timing", "mismatch"?, "error"?} | {"ev": "final", "problem", "device_error"}
    {"ev": "oom", "error"} (an infrastructure event)
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
from dataclasses import asdict

from kforge_tui.sandbox.backends import device_kind, make_backend
from kforge_tui.sandbox.channel import MSG_MAX, RunnerGone, recv, send

def _keep_freed_memory(backend_name: str, device: int) -> None:
    """Make freed memory stay where it was, as in a long-running model process: no heap trimming
    and no mmap for blocks under 32 MiB (glibc). A result a kernel hides in a freed block (a
    "ghost" it finds again on the next call of the same size) then really survives between
    calls here, and the replay checks catch it instead of the heap erasing it by luck."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (its maximum on 64-bit)
    except (OSError, AttributeError):
        pass


def _keep_freed_device_memory(device: int) -> None:
    """The same for cudaMallocAsync's default pool: keep freed blocks across synchronisations."""
    import ctypes

    from kforge_tui.sandbox.backends.arena import Driver

    try:
        dev = ctypes.c_int()
        Driver.check(Driver.fn("cuDeviceGet")(ctypes.byref(dev), device), "cuDeviceGet")
        pool = ctypes.c_void_p()
        Driver.check(Driver.fn("cuDeviceGetDefaultMemPool")(ctypes.byref(pool), dev), "cuDeviceGetDefaultMemPool")
        val = ctypes.c_uint64(2**64 - 1)
        Driver.fn("cuMemPoolSetAttribute")(pool, 4, ctypes.byref(val))  # RELEASE_THRESHOLD
    except Exception:
        pass


def _warm_cudart() -> None:
    """Load and initialise the CUDA runtime a candidate's library will bind to (the same soname
    resolves to this copy), so its descriptors and threads exist before the census that the
    candidate's are compared with."""
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            rt = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        try:
            n = ctypes.c_int()
            rt.cudaGetDeviceCount(ctypes.byref(n))
            rt.cudaFree(ctypes.c_void_p(0))
            # The driver opens files the first time a process uses stream-ordered allocation
            # (its default memory pool): an honest kernel's first cudaMallocAsync would meet the
            # RUN filter's refusal of openat (seen on the H200). Done once here, before any filter.
            ptr = ctypes.c_void_p()
            if rt.cudaMallocAsync(ctypes.byref(ptr), ctypes.c_size_t(1 << 21), None) == 0:
                rt.cudaMemsetAsync(ptr, 0, ctypes.c_size_t(1 << 21), None)
                rt.cudaFreeAsync(ptr, None)
            rt.cudaStreamSynchronize(None)
        except AttributeError:
            pass
        return



def _import_triton() -> None:
    """Triton and what its first kernel needs, imported before candidates exist (the zygote and
    every runner): a runner starts warm, and a module Triton loads lazily is not a change of
    state that a candidate's census would blame on it."""
    import numpy  # noqa: F401  (the interpreter's array library)
    import torch._dynamo  # noqa: F401  (the loader's torch-op guard, a TorchDispatchMode, imports
    # it on first use: ~2 s that would otherwise land in every candidate's first call)
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    from kforge_tui.sandbox import triton_loader

    if triton_loader.interpreting():
        import triton.runtime.interpreter  # noqa: F401

        triton_loader._interpreter_libdevice()


def _warm_triton(backend, cache_dir: str | None) -> str:
    """Before any candidate code: Triton's driver and compile pipeline ready in this runner,
    with a trusted cache dir shared by runners (on a GPU Triton's launcher module, cuda_utils,
    is compiled there once per machine instead of once per candidate). A tiny kernel of ours
    runs once. Failures are reported (stderr) and left to the candidate's own load to hit."""
    import torch

    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        os.environ["TRITON_CACHE_DIR"] = cache_dir
    try:
        _import_triton()
        from kforge_tui.sandbox import triton_loader
        from kforge_tui.sandbox.triton_loader import TorchOpGuard

        # On a GPU the kernel is compiled here for real (SALT: this runner's pid, never in the
        # cache): Triton's first compile in a process installs LLVM's crash handlers, and done
        # here it comes before the census a candidate is compared with; left to the candidate's
        # JIT, every honest candidate read as "signal handler changed" (H200). The launcher
        # module (cuda_utils) still comes from the shared cache.
        salt = 0 if triton_loader.interpreting() else os.getpid()
        x = torch.zeros(16, device=backend.device)
        with backend.stream_context(), TorchOpGuard(os.devnull).mode():  # the guarded path, warm
            triton_loader.warm_kernel()[(1,)](x, 16, B=16, SALT=salt)
            backend.sync()
        return ""
    except Exception as e:  # noqa: BLE001
        msg = f"kforge runner: Triton warm-up failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(msg, file=sys.stderr, flush=True)
        return msg


def _python_dirs() -> tuple[str, ...]:
    """Where installed Python code lives: a module imported lazily by Triton or torch maps an
    extension from here (never a file a candidate wrote: candidates cannot write files)."""
    import site
    import sysconfig

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for k in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(sysconfig.get_paths()[k])
        except KeyError:
            pass
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:
        pass
    return tuple(sorted(os.path.realpath(d) for d in dirs if d))


def _library_code(word: str) -> tuple[tuple[int, int], ...]:
    """Executable mappings of installed libraries (under _python_dirs) whose file name holds
    `word`: code no candidate wrote (candidates cannot write files there). Read from
    /proc/self/maps, so only before the RUN filter."""
    dirs = tuple(d.rstrip(os.sep) + os.sep for d in _python_dirs())
    out = []
    try:
        with open("/proc/self/maps", "rb", buffering=0) as f:
            text = b"".join(iter(lambda: f.read(1 << 16), b"")).decode()
    except OSError:
        return ()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and "x" in parts[1]:
            path = os.path.realpath(parts[5].strip())
            if word in os.path.basename(path) and path.startswith(dirs):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return tuple(out)


_FILTERED = False  # the RUN filter is on: nothing of Python's may open or stat a file


def _quiet_python() -> None:
    """Nothing of Python's may open a file once the RUN filter is on: warnings and tracebacks
    read source lines (linecache), imports write bytecode. In a runner those lines are not worth
    a killed process. Before it, source lines are read as usual: Triton's JIT reads its kernels'
    source through linecache (inspect.getsource) at decoration, and a linecache that had no
    lines made every Triton candidate fail to load on a GPU ("@jit functions should be defined
    in a Python file"; the interpreter never asks)."""
    import linecache
    import warnings

    warnings.simplefilter("ignore")
    getlines, checkcache = linecache.getlines, linecache.checkcache

    def lines(filename, module_globals=None):
        entry = linecache.cache.get(filename)
        if entry is not None and len(entry) != 1:  # read already (or registered lazily: len 1)
            return entry[2]
        return [] if _FILTERED else getlines(filename, module_globals)

    def check(filename=None):
        if not _FILTERED:
            checkcache(filename)

    linecache.getlines = lines  # type: ignore[assignment]
    linecache.checkcache = check  # type: ignore[assignment]
    sys.dont_write_bytecode = True


def _filter(stage: str, backend_name: str, probe) -> str:
    """Install the LOAD or RUN system-call filter (sandbox/seccomp.py); the problem text when the
    kernel refused it ("" when installed or switched off)."""
    from kforge_tui.sandbox import seccomp

    global _FILTERED
    if not seccomp.enabled():
        return ""
    try:
        (seccomp.load_filter if stage == "load" else seccomp.run_filter)(backend_name, probe.native)
    except OSError as e:
        return f"the runner could not install its system-call filter ({e})"
    _FILTERED = _FILTERED or stage == "run"
    return ""


class _LibraryState:
    """The candidate library's own writable pages, compared after every call. The binary check
    refuses writable symbols, but a page that holds .bss is writable to its end and no symbol
    covers the tail: a note kept there (a table of guard bytes, a call counter) is state all the
    same. Read with no system call (the mappings are listed before the filter). On cuda the
    first call may fill nvcc's kernel-handle caches, so the reference is taken after it."""

    def __init__(self, lib_path: str | None, first_call_writes: bool):
        self.ranges: list[tuple[int, int]] = []
        if lib_path:
            real = os.path.realpath(lib_path)
            try:
                with open("/proc/self/maps", "rb", buffering=0) as f:  # raw: no isatty ioctl
                    text = b"".join(iter(lambda: f.read(1 << 16), b"")).decode()
                    for line in text.splitlines():
                        parts = line.split(None, 5)
                        if len(parts) == 6 and parts[1].startswith("rw") and parts[5].strip() == real:
                            a, b = (int(x, 16) for x in parts[0].split("-"))
                            self.ranges.append((a, b - a))
            except OSError:
                pass
        self.snap = self._read()
        self.settled = not first_call_writes

    def _read(self) -> list[bytes]:
        import ctypes

        return [ctypes.string_at(a, n) for a, n in self.ranges]

    def problem(self) -> str:
        if not self.ranges:
            return ""
        now = self._read()
        if now != self.snap:
            if not self.settled:
                self.snap, self.settled = now, True
                return ""
            return ("worker state changed: the kernel keeps values in its library's own writable "
                    "memory between calls (state the binary check cannot see)")
        self.settled = True
        return ""


def _runner_main(sock: socket.socket, lang: str, device: int, spawn: dict) -> None:
    import ctypes

    import torch

    from kforge_tui.regions.abi import ENTRY, Signature
    from kforge_tui.regions.meta import TensorMeta
    from kforge_tui.sandbox import bench, verify
    from kforge_tui.sandbox.backends import arena as arena_mod
    from kforge_tui.sandbox.backends import probe as probe_mod

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    backend_name = device_kind(lang)
    triton = lang == "triton"
    _keep_freed_memory(backend_name, device)
    try:
        backend = make_backend(backend_name, device)
        backend.setup()
        if backend_name == "cuda":
            _keep_freed_device_memory(device)
            _warm_cudart()
        probe = probe_mod.Probe(spawn.get("probe"))
        if backend_name == "cpu":
            probe.omp_warm(torch.get_num_threads())
            torch.ones(4096).add_(1)  # the intra-op pool (the same libgomp) at its size
        if triton:
            _warm_triton(backend, spawn.get("triton_warm_dir"))
        probe.arm_sigsys(sock.fileno())  # a refused system call is reported, then the runner exits
        _quiet_python()
    except Exception as e:
        kind = "oom" if verify.is_oom(e) else "ready"
        send(sock, {"ev": kind, "error": f"runner start failed: {type(e).__name__}: {str(e)[:300]}"})
        return
    send(sock, {"ev": "ready", "pid": os.getpid()})
    try:
        job, fds = recv(sock, None, want_fds=True)
    except RunnerGone:
        return
    if job.get("cmd") != "job":
        return
    try:
        mem = arena_mod.attach(job["arena"], fds)
        slots = [([verify.Slot.from_json(x) if x is not None else None for x in ins],
                  [verify.Slot.from_json(x) for x in outs]) for ins, outs in job["slots"]]
        sets = verify.views(mem, slots, job.get("names"))
        sig = Signature(job["backend"], tuple(TensorMeta.from_json(m) for m in job["inputs"]),
                        tuple(TensorMeta.from_json(m) for m in job["outputs"]))
    except Exception as e:
        send(sock, {"ev": "oom" if verify.is_oom(e) else "loaded",
                    "error": f"runner could not map the task: {type(e).__name__}: {str(e)[:300]}"})
        return
    lib_path = job.get("lib")
    entry = None
    if triton:
        # the candidate's files and Triton's cache live in its own directory (compiled kernels
        # are mapped from there on a GPU)
        cand_dir = job["cand_dir"]
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cand_dir, "triton_cache")
        try:
            with open(job["source_path"], encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as e:
            send(sock, {"ev": "loaded", "error": f"cannot read the candidate: {str(e)[:300]}",
                        "status": "load_error"})
            return
    before = probe_mod.self_census(probe)
    if triton:
        from kforge_tui.sandbox import triton_loader

        s0 = sets[0]
        with backend.stream_context():
            # check, import, first call (Triton's JIT + one run on set 0, timed to its end);
            # the JIT compiles with a subprocess and writes its cache: before any filter
            entry = triton_loader.worker_entry(source, cand_dir, s0.tensors(), s0.out_tensors(),
                                               sync=backend.sync, reuse_cache_from=job.get("reuse_cache") or ())
        if entry.status != "ok":
            send(sock, {"ev": "loaded", "error": entry.message or entry.status, "status": entry.status,
                        "log": (entry.log or "")[-4000:], "jit_s": entry.jit_s, "load_s": entry.load_s})
            return
        os.environ.pop("TRITON_CACHE_DIR", None)  # the candidate's path is no word for it to find
        fn = None
    else:
        refused = _filter("load", backend_name, probe)
        if refused:
            send(sock, {"ev": "loaded", "error": refused})
            return
        try:
            lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_LOCAL)
            fn = getattr(lib, ENTRY)
        except OSError as e:
            send(sock, {"ev": "loaded", "error": f"cannot load the library: {str(e)[:300]}"})
            return
        except AttributeError:
            send(sock, {"ev": "loaded", "error": f'missing entry point {ENTRY} (extern "C" needed)'})
            return
        fn.restype = ctypes.c_int
        fn.argtypes = sig.argtypes()
    handler_code: tuple = ()
    if triton:
        # Triton's first compile in this process (the candidate's JIT, when the warm-up kernel
        # came from the cache) installs LLVM's crash handlers, SIGSYS among them: ours again,
        # and the others judged by where they point (probe.diff's handler_code).
        probe.arm_sigsys(sock.fileno())
        handler_code = _library_code("triton")
    after = probe_mod.self_census(probe)
    lib_state = _LibraryState(lib_path if not triton else None, first_call_writes=backend_name == "cuda")
    stream = backend.stream_handle()
    arg_cache: dict = {}

    def args_of(s):
        """The call's arguments for s where its tensors are now (cached per placement)."""
        key = (id(s), tuple(g.slot.offset for g in s.outputs),
               tuple(g.slot.offset if g is not None else -1 for g in s.inputs))
        got = arg_cache.get(key)
        if got is None:
            if len(arg_cache) > 4 * len(sets):
                arg_cache.clear()
            got = [s.tensors(), s.out_tensors()] if triton else sig.call_args(s.tensors(), s.out_tensors(), stream)
            arg_cache[key] = got
        return got

    for s_ in sets:  # built now: nothing is allocated between the kernel's calls in verification
        args_of(s_)
    probe.scrub_stack()
    refused = _filter("run", backend_name, probe)
    problems = probe_mod.diff(before, after, lib_path, at_load=True, handler_code=handler_code)
    fp = probe_mod.fp_diff(before, after)
    problem = refused
    what = "the candidate was loaded and first called" if triton else "the library was loaded"
    if fp and not problem:
        problem = f"floating-point environment changed when {what}: {fp}"
    elif problems and not problem:
        problem = (f"worker state changed when {what}: " if triton else
                   "worker state changed when the library was loaded (static initialiser or "
                   "constructor): ") + "; ".join(problems)
    loaded = {"ev": "loaded", "problem": problem}
    if entry is not None:
        loaded.update(jit_s=entry.jit_s, load_s=entry.load_s, scratch_bytes=entry.scratch_bytes)
    send(sock, loaded)
    if problem:
        return
    base_env = after["fpenv"]
    rbuf = bytearray(MSG_MAX)

    def rx() -> dict:
        # recv_into a buffer allocated once: between two calls of the kernel the runner touches
        # the malloc heap as little as it can, so a result kept in a freed block (a "ghost") is
        # still there on the next call and the replay checks catch it deterministically
        n = sock.recv_into(rbuf)
        if not n:
            raise RunnerGone()
        return json.loads(rbuf[:n])

    if triton:
        launch, launch_fast = entry.launch, entry.launch_fast

        def call(s) -> int:  # timed calls: no guard (the guarded calls verified the same code)
            rc = launch_fast(*args_of(s))
            if rc != 0:
                raise verify.CandidateError(f"{entry.last_error or f'{ENTRY} returned {rc}'} "
                                            f"(timed call on {s.name})")
            return 0

        def checked_call(s) -> tuple[int, str]:  # verification calls: under the torch-op guard
            rc = launch(*args_of(s))
            return rc, (entry.last_error or f"{ENTRY} returned {rc}") if rc != 0 else ""
    else:
        def call(s) -> int:
            return fn(*args_of(s))

        def checked_call(s) -> tuple[int, str]:
            return call(s), ""

    def after_call(s=None) -> str:
        env = probe.fpenv()
        if env != base_env:
            return f"floating-point environment changed by the call: {probe_mod.describe_fpenv(base_env, env)}"
        return lib_state.problem()  # threads, files, mappings: the supervisor reads /proc after every call

    index = {id(s): i for i, s in enumerate(sets)}

    class Remote(bench.Checks):
        """The runner's side of every timed call's checkpoints: the supervisor places the
        call's tensors anew and writes them (before), then judges the call (after) and, in the
        same reply, prepares the next one: one message each way per timed call."""

        ready: tuple | None = None  # (set index, slots) the supervisor prepared with its last verdict

        def before(self, i, s, refresh):
            j = index[id(s)]
            if self.ready is not None and self.ready[0] == j:
                slots, self.ready = self.ready[1], None
            else:  # not what the last reply prepared: ask
                self.ready = None
                send(sock, {"ev": "before", "i": i, "set": j, "refresh": bool(refresh)})
                slots = rx().get("slots")
            if slots:
                ins, outs = slots
                verify.relocate(s, mem, [verify.Slot.from_json(x) if x is not None else None for x in ins],
                                [verify.Slot.from_json(x) for x in outs])

        def after(self, i, s, report, upcoming=None):
            msg = {"ev": "after", "i": i, "set": index[id(s)], "rc": report.rc if report else 0, "problem": ""}
            if upcoming is not None:
                msg["next"] = {"set": index[id(upcoming[0])], "refresh": bool(upcoming[1])}
            send(sock, msg)
            rep = rx()
            nxt = rep.get("next")
            self.ready = (int(nxt["set"]), nxt.get("slots")) if isinstance(nxt, dict) else None
            mm = rep.get("mismatch")
            return verify.Mismatch(**mm) if mm else None

    def home() -> None:
        for s_, (ins, outs) in zip(sets, slots):
            verify.relocate(s_, mem, ins, outs)

    while True:
        try:
            cmd = rx()
        except (RunnerGone, OSError, ValueError):
            return
        c = cmd.get("cmd")
        try:
            if c == "call":
                s = sets[int(cmd["set"])]
                if triton:  # Triton launches on torch's current stream: the harness's
                    with backend.stream_context():
                        rc, err = checked_call(s)
                        backend.sync()
                else:
                    rc, err = checked_call(s)
                    backend.sync()
                msg = {"ev": "called", "rc": int(rc), "problem": after_call()}
                if err:
                    msg["candidate_error"] = f"{err} (on {s.name})"
                send(sock, msg)
            elif c == "time":
                try:
                    with backend.stream_context():
                        timing, mm = bench.time_calls(backend, call, sets, cmd.get("cfg"),
                                                      checks=Remote(), after_call=after_call,
                                                      seed=int(cmd.get("seed", 0)) or None)
                finally:
                    home()
                send(sock, {"ev": "timed", "timing": asdict(timing),
                            "mismatch": asdict(mm) if mm is not None else None})
            elif c == "final":
                err = ""
                try:
                    backend.check_device()
                except Exception as e:
                    err = str(e)
                end = probe_mod.self_census(probe)
                probs = probe_mod.diff(after, end, lib_path)
                fp = probe_mod.fp_diff(after, end)
                problem = (f"floating-point environment changed: {fp}" if fp else
                           ("worker state changed after the calls: " + "; ".join(probs) if probs else ""))
                send(sock, {"ev": "final", "problem": problem, "device_error": err})
            elif c == "exit":
                return
        except verify.CandidateError as e:
            send(sock, {"ev": "timed" if c == "time" else "called", "rc": -1, "error": str(e),
                        "candidate_error": str(e)})
        except Exception as e:
            if verify.is_oom(e):
                send(sock, {"ev": "oom", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
                return
            dev = ""
            try:
                backend.check_device()
            except Exception as de:
                dev = str(de)
            send(sock, {"ev": "error", "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}",
                        "device_error": dev})
            return
