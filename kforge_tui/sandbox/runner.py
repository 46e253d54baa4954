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
import random
import signal
import socket
import sys
from dataclasses import asdict

from kforge_tui.sandbox.backends import device_kind, make_backend
from kforge_tui.sandbox.worker import MSG_MAX, RunnerGone, recv, send

def _thread_names() -> dict:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[tid] = f.read().strip()
        except OSError:
            pass
    return out


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
        import triton
        import triton.language as tl

        @triton.jit
        def _kforge_warm(p, n, B: tl.constexpr):
            o = tl.arange(0, B)
            tl.store(p + o, o.to(tl.float32) * 2.0, o < n)

        from kforge_tui.sandbox.triton_loader import TorchOpGuard

        x = torch.zeros(16, device=backend.device)
        with backend.stream_context(), TorchOpGuard(os.devnull).mode():  # the guarded path, warm
            _kforge_warm[(1,)](x, 16, B=16)
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
        # garbage for unchecked timed calls: one pool per output, copied at a random offset
        spec = job.get("pool") or {}
        pool_seed = int(spec.get("seed") or int.from_bytes(os.urandom(7), "little"))
        pools = verify.garbage_pools(sig.outputs, backend.device, pool_seed) \
            if job.get("poison_pools", True) else []
        gen = verify.generator(backend.device, int.from_bytes(os.urandom(7), "little"))
    except Exception as e:
        send(sock, {"ev": "oom" if verify.is_oom(e) else "loaded",
                    "error": f"runner could not map the task: {type(e).__name__}: {str(e)[:300]}"})
        return
    allow_threads = ("cuda",) if backend_name == "cuda" else ()

    def new_threads(before: dict) -> list[str]:
        now = _thread_names()
        return [n for t, n in now.items() if t not in before and not n.startswith(allow_threads or ("\0",))]

    lib_path = job.get("lib")
    allow_dirs: tuple[str, ...] = ()
    entry = None
    if triton:
        # the candidate's files and Triton's cache live in its own directory (compiled kernels
        # are mapped from there on a GPU); installed Python code may be mapped by lazy imports
        cand_dir = job["cand_dir"]
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cand_dir, "triton_cache")
        allow_dirs = (os.path.realpath(cand_dir),) + _python_dirs()
        try:
            with open(job["source_path"], encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as e:
            send(sock, {"ev": "loaded", "error": f"cannot read the candidate: {str(e)[:300]}",
                        "status": "load_error"})
            return
    before = probe_mod.census(probe)
    names0 = _thread_names()
    if triton:
        from kforge_tui.sandbox import triton_loader

        s0 = sets[0]
        with backend.stream_context():
            # check, import, first call (Triton's JIT + one run on set 0, timed to its end)
            entry = triton_loader.worker_entry(source, cand_dir, s0.tensors(), s0.out_tensors(),
                                               sync=backend.sync)
        if entry.status != "ok":
            send(sock, {"ev": "loaded", "error": entry.message or entry.status, "status": entry.status,
                        "log": (entry.log or "")[-4000:], "jit_s": entry.jit_s, "load_s": entry.load_s})
            return
        fn = None
    else:
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
    after = probe_mod.census(probe)
    problems = [x for x in probe_mod.diff(before, after, lib_path, at_load=True, allow_dirs=allow_dirs)
                if not x.endswith("left running")]
    nt = new_threads(names0)
    if nt:
        problems.insert(0, f"{len(nt)} new thread{'s' if len(nt) > 1 else ''} started")
    fp = probe_mod.fp_diff(before, after)
    problem = ""
    what = "the candidate was loaded and first called" if triton else "the library was loaded"
    if fp:
        problem = f"floating-point environment changed when {what}: {fp}"
    elif problems:
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
    base_threads = probe.num_threads()
    counts = [base_threads]
    stream = backend.stream_handle()
    arg_cache: dict[int, list] = {}
    for s_ in sets:  # built now: nothing is allocated between the kernel's calls later
        if triton:
            arg_cache[id(s_)] = [s_.tensors(), s_.out_tensors()]
        else:
            arg_cache[id(s_)] = sig.call_args(s_.tensors(), s_.out_tensors(), stream)
    rbuf = bytearray(MSG_MAX)
    pick = random.Random(int.from_bytes(os.urandom(8), "little"))

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
            rc = launch_fast(*arg_cache[id(s)])
            if rc != 0:
                raise verify.CandidateError(f"{entry.last_error or f'{ENTRY} returned {rc}'} "
                                            f"(timed call on {s.name})")
            return 0

        def checked_call(s) -> tuple[int, str]:  # verification calls: under the torch-op guard
            rc = launch(*arg_cache[id(s)])
            return rc, (entry.last_error or f"{ENTRY} returned {rc}") if rc != 0 else ""
    else:
        def call(s) -> int:
            return fn(*arg_cache[id(s)])

        def checked_call(s) -> tuple[int, str]:
            return call(s), ""

    def after_call(s=None) -> str:
        env = probe.fpenv()
        if env != base_env:
            return f"floating-point environment changed by the call: {probe_mod.describe_fpenv(base_env, env)}"
        n = probe.num_threads()
        if n > counts[0]:
            if not new_threads(names0):  # the CUDA driver's own (named cuda-*), started lazily
                counts[0] = n
                return ""
            return (f"worker state changed: {n - base_threads} new thread{'s' if n - base_threads > 1 else ''} "
                    f"left running after the call (work outside the timed call)")
        return ""

    def state_problem() -> str:
        nt = new_threads(names0)
        if nt:
            return (f"worker state changed: {len(nt)} new thread{'s' if len(nt) > 1 else ''} left "
                    f"running after the call (work outside the timed call)")
        return ""

    fill_views = []
    offsets = spec.get("offsets")
    for si, s_ in enumerate(sets):
        views_ = []
        for j, (o, p) in enumerate(zip(s_.outputs, pools)):
            offs = offsets[si][j] if offsets else pick.sample(range(1024), 8)
            views_.append([p[off:off + o.numel].view(o.tensor.shape) for off in offs])
        fill_views.append(views_)
    index = {id(s): i for i, s in enumerate(sets)}

    def fill(s) -> None:
        if pools:
            for o, vs in zip(s.outputs, fill_views[index[id(s)]]):
                o.tensor.copy_(vs[pick.randrange(len(vs))])
        else:
            for o in s.outputs:
                verify.fill_random(o.tensor, gen)

    class Remote(bench.Checks):
        def before(self, i, s, refresh):
            send(sock, {"ev": "before", "i": i, "set": index[id(s)], "refresh": bool(refresh)})
            fill_ = rx().get("fill")
            if fill_ and pools:  # the supervisor's pick among the windows unchecked calls get
                for o, vs, k_ in zip(s.outputs, fill_views[index[id(s)]], fill_):
                    o.tensor.copy_(vs[int(k_)])

        def after(self, i, s, report):
            send(sock, {"ev": "after", "i": i, "set": index[id(s)], "rc": report.rc if report else 0,
                        "problem": state_problem()})
            mm = rx().get("mismatch")
            return verify.Mismatch(**mm) if mm else None

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
                with backend.stream_context():
                    timing, mm = bench.time_calls(backend, call, sets, cmd.get("cfg"), fill=fill,
                                                  checks=Remote(), after_call=after_call,
                                                  seed=int(cmd.get("seed", 0)) or None)
                send(sock, {"ev": "timed", "timing": asdict(timing),
                            "mismatch": asdict(mm) if mm is not None else None})
            elif c == "final":
                err = ""
                try:
                    backend.check_device()
                except Exception as e:
                    err = str(e)
                end = probe_mod.census(probe)
                probs = [x for x in probe_mod.diff(after, end, lib_path, allow_dirs=allow_dirs)
                         if not x.endswith("left running")]
                st = state_problem()
                fp = probe_mod.fp_diff(after, end)
                problem = (f"floating-point environment changed: {fp}" if fp else
                           st or ("worker state changed after the calls: " + "; ".join(probs) if probs else ""))
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

