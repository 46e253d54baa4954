"""The isolated worker: a supervisor that never runs candidate code, and one fresh runner process
per candidate.

    python -m kforge_tui.sandbox.worker --backend cpu|cuda|triton [--device N] [--cache-dir DIR]

Processes (all in the worker's session, so the pool's killpg takes every one):

  supervisor  talks JSON lines to the pool; builds the input sets, computes every reference
              (PyTorch eager on the region's graph, float64 for edge cases), times eager and
              torch.compile, writes poison, guards and new input values, and judges outputs.
              It never loads a candidate library: references are computed where no candidate
              was ever loaded, and nothing a candidate did can reach the next one.
  zygote      forked right after imports, before any OpenMP thread, CUDA context or task data
              exists (GNU OpenMP and CUDA do not survive a fork once used); forks runners.
  runner      one per candidate (forked by the zygote, pre-warmed: CUDA context or OpenMP pool
              ready before it is needed); maps the task's arena (sandbox/backends/arena.py),
              records the process state, loads the library, records it again, and calls the
              kernel when the supervisor says so; runs the timing loop, pausing at checked calls
              for the supervisor; exits. A crash, hang, sticky CUDA error, leftover thread,
              signal handler, timer or FP-environment change dies with it.

Triton (`--backend triton`): the device side is the cuda backend (device, stream, events, memory),
or the cpu backend when the pool set TRITON_INTERPRET=1 (no GPU: Triton's interpreter runs the
kernels in numpy on CPU tensors; CI). What differs from a C candidate, and only this:
  zygote      imports Triton (and what the loader's torch-op guard needs) before it forks.
  runner      warms Triton before any candidate exists (a tiny kernel of ours, with a trusted cache
              dir shared by runners: on a GPU Triton's cuda_utils module is built there once);
              then, instead of `ctypes.CDLL`, `triton_loader.worker_entry` checks the source
              again (the wire is not trusted), imports it from a fresh per-candidate directory
              made by the supervisor (removed afterwards) with TRITON_CACHE_DIR inside it, and
              makes the first call on set 0 (Triton's JIT, timed to the end of its work: it
              counts in the load stage, `stage_s["jit"]`, reported as the compile time). The
              census around it allows new executable mappings only from that directory and
              installed Python code. Verification calls use the guarded `entry.launch` (an aten
              op issued by the candidate's own Python is refused; a non-zero return or an
              exception fails it with the loader's message); timed calls use
              `entry.launch_fast`. Poison, guards, replay checks, edge cases, the census after
              calls and at the end, and the adjacent baselines are the C path's, unchanged.
  supervisor  `prepare` on a GPU compiles the region with Inductor (`inductor_seed.compile_region`,
              autotuned on set 0): that callable is the torch.compile baseline, and its Triton
              code on the candidate ABI is the seed, sent in the reply (`baseline["seed"]`) for
              the engine to `remember`. On the CPU there is no seed (`baseline["seed_note"]`).
  statuses    loader "compile_error" -> compile_error; "load_error"/"launch_error" (the first
              call raised or returned non-zero) -> load_error; a device fault in it -> crash;
              "torch_op" -> verify_error; "static_error" (re-check) -> static_error.

Supervisor <-> runner: one JSON object per message over a SOCK_SEQPACKET socket (never pickle:
the runner runs untrusted code). Runner messages:
    {"ev": "ready"} | {"ev": "loaded", "error"?, "problem"?, "status"?, "jit_s"?}
    {"ev": "called", "rc", "problem", "candidate_error"?}
    {"ev": "before", "i", "set", "refresh"} | {"ev": "after", "i", "set", "rc", "problem"}
    {"ev": "timed", "timing", "mismatch"?, "error"?} | {"ev": "final", "problem", "device_error"}
    {"ev": "oom", "error"} (an infrastructure event)

Pool protocol (unchanged): requests `{"id", "cmd", ...}` with cmd in ping | prepare | evaluate |
exit; progress `{"id", "event": "stage", "stage"}`; one final `{"id", "ok": true, ...}` or
`{"id", "ok": false, "error"}`. File descriptor 1 is re-pointed at stderr at start-up and the
protocol uses a private duplicate (closed in the zygote and runners), so a candidate can
neither corrupt nor forge the protocol.

Memory (issue 14): the number of input sets follows free memory and the region's bytes
(`plan_sets`); an out-of-memory error anywhere in the harness is retried with fewer sets, and
when even one set does not fit the result is "infra_error", never a candidate failure.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import socket
import sys
import time
import traceback
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field

# before torch is imported: one OpenMP thread count for torch and candidates, capped
if __name__ == "__main__" or os.environ.get("KFORGE_WORKER_PROCESS"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

MSG_MAX = 1 << 22
SPARES = {"cpu": 1, "cuda": 2}


def _protocol_stream():
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1), fd


# --------------------------------------------------------------------------- messages

class RunnerGone(Exception):
    """The runner closed its socket (exited or was killed)."""


def send(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def recv(sock: socket.socket, timeout: float | None = None, want_fds: bool = False):
    sock.settimeout(timeout)
    try:
        if want_fds:
            data, fds, _, _ = socket.recv_fds(sock, MSG_MAX, 8)
        else:
            data, fds = sock.recv(MSG_MAX), []
    except (ConnectionResetError, BrokenPipeError):
        raise RunnerGone() from None
    if not data:
        raise RunnerGone()
    try:
        obj = json.loads(data)
    except ValueError:
        raise RunnerGone() from None  # garbage on the channel: treat the runner as lost
    if not isinstance(obj, dict):
        raise RunnerGone()
    return (obj, fds) if want_fds else obj


# --------------------------------------------------------------------------- zygote

def _close_fds(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
        except ValueError:
            continue
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


class Zygote:
    """Handle of the zygote process (in the supervisor)."""

    def __init__(self, backend: str, device: int, proto_fd: int):
        try:
            n = len(os.listdir("/proc/self/task"))
        except OSError:
            n = 0
        if n > 2:  # GNU OpenMP does not survive a fork once its pool exists (runners would hang)
            print(f"kforge worker: {n} threads exist before the zygote forks (OpenMP pool "
                  f"started at import?); cpu runners may hang", file=sys.stderr, flush=True)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the zygote
            try:
                a.close()
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)  # the pool's request pipe is not for candidates
                _close_fds({b.fileno()})
                _zygote_main(b, backend, device)
            finally:
                os._exit(0)
        b.close()
        self.pid = pid
        self.sock = a

    def spawn(self, args: dict) -> "RunnerHandle":
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            send(self.sock, {"cmd": "spawn", **args}, [theirs.fileno()])
        finally:
            theirs.close()
        rep = recv(self.sock, 30)
        return RunnerHandle(int(rep["pid"]), mine, self)

    def status(self, pid: int) -> int | None:
        """The runner's wait status (as returncode: -signal or exit code), after it ended."""
        try:
            send(self.sock, {"cmd": "status", "pid": pid})
            return recv(self.sock, 15).get("status")
        except Exception:
            return None


def _zygote_main(sock: socket.socket, backend: str, device: int) -> None:
    statuses: dict[int, int] = {}

    def reap(block_pid: int | None = None) -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            statuses[pid] = os.waitstatus_to_exitcode(st)
        if block_pid is not None and block_pid not in statuses:
            try:
                _, st = os.waitpid(block_pid, 0)
                statuses[block_pid] = os.waitstatus_to_exitcode(st)
            except ChildProcessError:
                pass

    while True:
        try:
            req, fds = recv(sock, None, want_fds=True)
        except (RunnerGone, OSError):
            return
        reap()
        if req.get("cmd") == "spawn":
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    sock.close()
                    conn = socket.socket(fileno=fds[0])
                    _runner_main(conn, backend, device, req)
                except BaseException:
                    traceback.print_exc()
                    code = 70
                finally:
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            send(sock, {"pid": pid})
        elif req.get("cmd") == "status":
            pid = int(req["pid"])
            reap(pid)
            send(sock, {"status": statuses.pop(pid, None)})


# --------------------------------------------------------------------------- runner

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


def device_kind(lang: str) -> str:
    """The device backend that runs a candidate language: cpu and cuda run themselves; Triton
    runs on cuda, or on the cpu under Triton's interpreter (TRITON_INTERPRET=1, set by the pool
    where no GPU is visible)."""
    if lang != "triton":
        return lang
    from kforge_tui.sandbox.triton_loader import interpreting

    return "cpu" if interpreting() else "cuda"


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
        backend = _make_backend(backend_name, device)
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


def thread_env() -> int:
    """Pin the OpenMP thread count before torch is imported: OMP_NUM_THREADS (or
    KFORGE_CPU_THREADS) if set, else the physical cores this process may run on; and cap the
    pool there (OMP_THREAD_LIMIT), so a candidate's num_threads(64) cannot grow it and every
    thread that appears after the runner warmed the pool is the candidate's."""
    n = os.environ.get("KFORGE_CPU_THREADS") or os.environ.get("OMP_NUM_THREADS")
    try:
        count = int(n) if n else 0
    except ValueError:
        count = 0
    if count <= 0:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except AttributeError:
            cpus = list(range(os.cpu_count() or 1))
        cores = set()
        for c in cpus:
            base = f"/sys/devices/system/cpu/cpu{c}/topology"
            try:
                with open(f"{base}/physical_package_id") as f1, open(f"{base}/core_id") as f2:
                    cores.add((f1.read().strip(), f2.read().strip()))
            except OSError:
                cores.add(("?", str(c)))
        count = max(1, len(cores))
    os.environ["OMP_NUM_THREADS"] = str(count)
    os.environ["OMP_THREAD_LIMIT"] = str(count)
    os.environ.setdefault("OMP_DYNAMIC", "false")
    return count


class RunnerHandle:
    def __init__(self, pid: int, sock: socket.socket, zygote: Zygote):
        self.pid = pid
        self.sock = sock
        self.zygote = zygote
        self.ready = False
        self.error = ""
        self.started = time.perf_counter()

    def wait_ready(self, timeout: float) -> bool:
        if self.ready:
            return True
        try:
            msg = recv(self.sock, timeout)
        except (RunnerGone, OSError, socket.timeout):
            self.error = "runner did not start"
            return False
        if msg.get("error"):
            self.error = msg["error"]
            self.oom = msg.get("ev") == "oom"
            return False
        self.ready = True
        return True

    def kill(self) -> int | None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        return self.zygote.status(self.pid)

    def exit_status(self) -> int | None:
        try:
            self.sock.close()
        except OSError:
            pass
        st = self.zygote.status(self.pid)
        return st


# --------------------------------------------------------------------------- supervisor

class InfraError(Exception):
    """The evaluation could not run (memory, runner start): not the candidate's doing."""


class _Timeout(Exception):
    pass


@dataclass
class PreparedTask:
    """What the supervisor keeps per task between candidates (renamed from TaskState)."""

    task: object
    gm: object  # the region's GraphModule on the device (the reference)
    sets: list
    arena: object
    slots: list
    stats: list
    note: str
    baseline: dict
    floor: float | None
    floor_note: str
    k: int
    plan_note: str = ""
    edge: bool = True
    poison_pools: bool = True
    ref64: object = None
    compiled_fn: object = None
    retries: list = field(default_factory=list)

    def reference(self, inputs: list) -> list:
        import torch

        with torch.no_grad():
            out = self.gm(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def close(self) -> None:
        for s in self.sets:
            s.expected = []
            s.saved = []
        self.sets = []
        if self.arena is not None:
            self.arena.close()
            self.arena = None


def _make_backend(name: str, device: int):
    if name == "cuda":
        from kforge_tui.sandbox.backends.cuda import CudaBackend

        return CudaBackend(device)
    from kforge_tui.sandbox.backends.cpu import CpuBackend

    return CpuBackend(device)


def estimate_workspace(task, f64: bool = False) -> int:
    """Upper bound of the bytes the reference allocates besides its inputs: every value the graph
    produces (run on meta tensors), plus float64 copies of the inputs for the float64 run."""
    import torch
    import torch.fx

    from kforge_tui.regions.graph import to_graph_module
    from kforge_tui.regions.meta import DTYPE_BYTES, FLOAT_DTYPES
    from kforge_tui.sandbox.verify import graph64

    def nbytes(x) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, (tuple, list)):
            return sum(nbytes(y) for y in x)
        return 0

    extra = 0
    try:
        gm = to_graph_module(graph64(task.graph) if f64 else task.graph, "meta")
        ins = []
        for m in task.inputs:
            if not m.present:
                ins.append(None)
                continue
            dt = getattr(torch, "float64" if f64 and m.dtype in FLOAT_DTYPES else m.dtype)
            ins.append(torch.empty_strided(m.shape, m.strides, dtype=dt, device="meta"))
            if f64 and m.dtype in FLOAT_DTYPES:
                extra += m.numel * 8
        total = [0]

        class Count(torch.fx.Interpreter):
            def run_node(self, n):
                r = super().run_node(n)
                if n.op == "call_function":
                    total[0] += nbytes(r)
                return r

        with torch.no_grad():
            Count(gm).run(*ins)
        return total[0] + extra
    except Exception:
        b = sum(m.numel * DTYPE_BYTES[m.dtype] for m in list(task.inputs) + list(task.outputs) if m.present)
        return 4 * b * (8 if f64 else 1)


@dataclass
class Plan:
    k: int
    host_saved: bool
    edge: bool
    edge64: bool
    note: str


class Budget:
    """Memory knob (tests, or a cap on a shared box): `free_bytes` overrides what the planner
    believes is free; `limit_bytes` makes supervisor allocations beyond it fail like a real OOM."""

    def __init__(self, cfg: dict | None):
        cfg = cfg or {}
        self.free = cfg.get("free_bytes")
        self.limit = cfg.get("limit_bytes")
        self.used = 0

    def account(self, n: int) -> None:
        import torch

        if self.limit is not None and self.used + n > self.limit:
            raise torch.OutOfMemoryError(f"simulated out of memory: {self.used + n} bytes over the "
                                         f"{self.limit} byte limit")
        self.used += n


class Worker:
    """The supervisor."""

    MAX_TASKS = 4

    def __init__(self, backend_name: str, device_index: int, zygote: Zygote, cache_dir: str | None = None):
        import torch

        self.torch = torch
        self.lang = backend_name  # the candidates' language: cpu | cuda | triton
        self.backend = _make_backend(device_kind(backend_name), device_index)  # device, clock, memory
        self.backend.setup()
        self.zygote = zygote
        self.tasks: OrderedDict[str, PreparedTask] = OrderedDict()
        self.evaluations = 0
        self.spares: deque[RunnerHandle] = deque()
        self.n_spares = int(os.environ.get("KFORGE_RUNNER_SPARES", SPARES.get(self.backend.name, 1)))
        self.probe_path: str | None = None
        self.cache_dir = cache_dir
        if cache_dir:
            self._ensure_probe(cache_dir)
            self._top_up()

    # ------------------------------------------------------------------ runners
    def _ensure_probe(self, cache_dir: str) -> None:
        if self.probe_path is None:
            from kforge_tui.sandbox.backends import probe

            try:
                self.probe_path = probe.build(cache_dir) or ""
            except Exception:
                self.probe_path = ""

    def _spawn_args(self) -> dict:
        args = {"probe": self.probe_path or None}
        if self.lang == "triton" and self.cache_dir:
            args["triton_warm_dir"] = os.path.join(self.cache_dir, "triton", "warm")
        return args

    def _top_up(self) -> None:
        while len(self.spares) < max(1, self.n_spares):
            self.spares.append(self.zygote.spawn(self._spawn_args()))

    def _take_runner(self, deadline: float) -> RunnerHandle:
        self._top_up()
        for _ in range(3):
            r = self.spares.popleft()
            if r.wait_ready(max(1.0, min(120.0, deadline - time.perf_counter()))):
                return r
            err = r.error
            r.kill()
            if getattr(r, "oom", False):
                raise InfraError(f"runner could not start: {err}")
            self._top_up()
        raise InfraError(f"runner could not start: {err}")

    # ------------------------------------------------------------------ per task
    def prepare(self, req: dict, emit) -> dict:
        task = self._task(req)
        self._ensure_probe(req.get("cache_dir") or self.cache_dir or ".")
        if self.cache_dir is None and req.get("cache_dir"):
            self.cache_dir = req["cache_dir"]
        st = self._state(task, req)
        seeded = self.lang == "triton" and self.backend.name == "cuda"
        want_seed = seeded and (req.get("with_compile") or req.get("seed")) and "seed_note" not in st.baseline
        if want_seed:
            # torch.compile of the region *is* Inductor's Triton code: one compile gives the
            # compile baseline and the seed, so the seed is the kernel the baseline measured
            compiled, note, seed = self._time_inductor(st, req.get("timing"))
            if compiled is not None or st.baseline.get("compiled") is None:
                st.baseline["compiled"] = compiled
            st.baseline["seed"] = seed
            st.baseline["seed_note"] = note
            self._add_note(st, note)
        elif req.get("with_compile") and st.baseline.get("compiled") is None:
            st.baseline["compiled"], note = self._time_compiled(st, req.get("timing"))
            if note:
                st.baseline["floor_note"] = (st.baseline.get("floor_note", "") + "; " + note).strip("; ")
        if self.lang == "triton" and not seeded and "seed_note" not in st.baseline:
            st.baseline["seed"] = None
            st.baseline["seed_note"] = ("no Inductor seed from the worker: no GPU, Triton candidates run "
                                        "under Triton's interpreter on the CPU (TRITON_INTERPRET=1)")
            self._add_note(st, st.baseline["seed_note"])
        self._top_up()
        return {"baseline": st.baseline, "note": st.note}

    @staticmethod
    def _add_note(st: "PreparedTask", note: str) -> None:
        if note and note not in st.baseline.get("note", ""):
            st.baseline["note"] = (st.baseline.get("note", "") + "; " + note).strip("; ")

    def _time_inductor(self, st: "PreparedTask", timing: dict | None):
        """(compiled timing or None, note, seed JSON or None): the region compiled by Inductor
        for the GPU (`inductor_seed.compile_region`, autotuned on set 0), timed as the
        torch.compile baseline; its Triton code rewritten to the candidate ABI is the seed."""
        from kforge_tui.sandbox import bench
        from kforge_tui.search import inductor_seed

        try:
            with self.backend.stream_context():
                t0 = time.perf_counter()
                call, seed, note = inductor_seed.compile_region(st.task, st.sets[0].tensors(), "cuda")
                compile_s = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - the task goes on without a compile baseline or seed
            compiled, note = self._time_compiled(st, timing)
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            return compiled, f"no Triton seed: Inductor's compile of the region failed ({why}); {note}", None
        fn = lambda *xs: call(list(xs))  # noqa: E731
        try:
            with self.backend.stream_context():
                t, _ = bench.time_calls(self.backend, lambda s: fn(*s.tensors()), st.sets,
                                        {**bench.DEFAULT_TIMING, **(timing or {}), "max_wall_s": 2.5})
            st.compiled_fn = fn
            compiled = asdict(t)
        except Exception as e:  # noqa: BLE001
            compiled = None
            note = (note + "; " if note else "") + f"timing torch.compile failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
        text = f"torch.compile took {compile_s:.1f} s to compile (Inductor, autotuned on the GPU)"
        if seed is not None:
            text += f"; Triton seed: Inductor's {len(seed.kernels)} kernel{'s' if len(seed.kernels) > 1 else ''}"
        return compiled, "; ".join(x for x in (text, note) if x), (seed.to_json() if seed is not None else None)

    def _task(self, req: dict):
        from kforge_tui.regions.task import Task

        return Task.from_json(req["task"]).with_backend(self.lang)

    def plan_sets(self, task, n_calls: int, budget: Budget) -> "Plan":
        """How many input sets, where the private input copies live, and which checks fit, for
        the free memory and the region's bytes (issue 14).

        Per set: the arena (inputs and outputs with guards), the expected outputs and - unless
        the region is too big for it - a private device copy of the inputs (else a host copy and
        a keyed device hash). Beside the sets: the reference's workspace (every value its graph
        makes, an upper bound from a run on meta tensors), what re-writing a set's values keeps
        alive for a moment, the float64 run of the edge cases, the runner's garbage pools and
        its CUDA context, and a margin. The richest configuration that still leaves enough sets
        to rotate wins; with no room for even that, the leanest one with a single set."""
        from kforge_tui.regions.meta import DTYPE_BYTES
        from kforge_tui.sandbox import verify

        ins, outs, per_arena = verify.set_layout(task)
        in_b = sum(x.total for x in ins if x is not None)
        out_b = sum(m.nbytes for m in task.outputs)
        gaps = sum(x.span for x, m in zip(outs, task.outputs) if x.span > m.nbytes)
        pools = sum((m.numel + 1024) * DTYPE_BYTES[m.dtype] for m in task.outputs)
        ws = estimate_workspace(task)
        ws64 = estimate_workspace(task, f64=True) + sum(m.numel * 8 for m in task.outputs)
        cmp_ws = min(max((m.numel for m in task.outputs), default=0), verify.CHUNK) * 8 * 6
        free = self.backend.free_bytes()
        if budget.free is not None:
            free = min(free, int(budget.free))
        avail = free - self.backend.reserve_bytes(self.n_spares) - pools - cmp_ws
        desired = max(4, n_calls + 3)
        big = per_arena > 4 * self.backend.cache_bytes  # rotation matters little past the cache
        need = 2 if big else 4
        host_ok = self.backend.name != "cpu"  # on cpu "host" is the same memory
        # (host_saved, edge, edge64), most checks first; device copies before host copies
        options = [(False, True, True), (False, True, False)]
        if host_ok:
            options += [(True, True, True), (True, True, False)]
        options += [(False, False, False)] + ([(True, False, False)] if host_ok else [])
        best = None
        for host, edge, e64 in options:
            per_set = per_arena + out_b + gaps + (0 if host else in_b)
            work = ws + (0 if host else out_b + in_b)  # re-writing a set: new copy, old reference
            if edge and not host:
                work += out_b + in_b  # an edge case keeps the originals (host mode restores them)
            if e64:
                work += ws64
            k = int((avail - work) // per_set) if per_set else desired
            k = min(k, desired)
            if best is None or (k >= 1 and best[0] < 1):  # the first that fits at all
                best = (k, host, edge, e64, per_set, work)
            if k >= min(desired, need):
                best = (k, host, edge, e64, per_set, work)
                break
        k, host, edge, e64, per_set, work = best
        k = max(1, k)
        gib = 2 ** 30
        note = (f"{k} input set{'s' if k > 1 else ''} of {per_set / gib:.3g} GiB each in "
                f"{free / gib:.3g} GiB free (reference workspace {ws / gib:.3g} GiB); input copies "
                f"{'in host memory, device hashes' if host else 'on the device'}; edge cases "
                + ("judged against float64" if e64 else "judged at the task dtype (no room for a float64 run)"
                   if edge else "skipped (no room)"))
        return Plan(k, host, edge, e64, note)

    def _state(self, task, req: dict, *, max_sets: int | None = None) -> PreparedTask:
        tid = task.task_id
        if tid in self.tasks and max_sets is None:
            self.tasks.move_to_end(tid)
            return self.tasks[tid]
        if tid in self.tasks:
            self.tasks.pop(tid).close()
        from kforge_tui.regions.graph import to_graph_module
        from kforge_tui.regions.task import load_calls
        from kforge_tui.sandbox import bench, verify

        torch = self.torch

        cap_id = req.get("capture_id") or tid
        calls = load_calls(req["run_dir"], cap_id) if req.get("run_dir") else []
        budget = Budget(req.get("memory"))
        while len(self.tasks) >= self.MAX_TASKS:
            self.tasks.popitem(last=False)[1].close()
        plan = self.plan_sets(task, len(calls), budget)
        while plan.k < 4 and self.tasks:  # make room: older tasks go first
            self.tasks.popitem(last=False)[1].close()
            self._collect()
            plan = self.plan_sets(task, len(calls), budget)
        k, plan_note = plan.k, plan.note
        if max_sets is not None:
            k = min(k, max_sets)
        gm = to_graph_module(task.graph, self.backend.device)
        stats = verify._captured_stats(task, calls)
        retries = []
        while True:
            budget.used = 0
            arena_box = []

            def alloc(n: int):
                a = self.backend.new_arena(n)
                arena_box.append(a)
                return a.tensor

            try:
                def ref(inputs: list) -> list:
                    with torch.no_grad():
                        out = gm(*inputs)
                    return list(out) if isinstance(out, (tuple, list)) else [out]

                with self.backend.stream_context():
                    sets, note, _ = verify.build_sets(
                        task, calls, 3, self.backend.device, int.from_bytes(os.urandom(4), "little"),
                        ref, min_sets=4, max_sets=k, alloc=alloc, account=budget.account,
                        host_saved=plan.host_saved)
                    self.backend.sync_all()
                    eager, _ = bench.time_calls(self.backend, lambda s: gm(*s.tensors()), sets,
                                                {**bench.DEFAULT_TIMING, **(req.get("timing") or {}),
                                                 "max_wall_s": 2.5})
                break
            except Exception as e:
                if not verify.is_oom(e):
                    for a in arena_box:
                        a.close()
                    raise
                sets = None
                for a in arena_box:
                    a.close()
                self._collect()
                retries.append(f"out of memory with {k} input set{'s' if k > 1 else ''} "
                               f"({str(e).splitlines()[0][:120]})")
                if k <= 1:
                    raise InfraError("out of memory even with one input set: " + "; ".join(retries)) from None
                k = max(1, k // 2)
        if retries:
            plan_note += f"; retried with {k} set{'s' if k > 1 else ''} after " + "; ".join(retries)
        slots = [([g.slot if g is not None else None for g in s.inputs], [g.slot for g in s.outputs])
                 for s in sets]
        floor, floor_note, extra = self._floor(task, req)
        baseline = {"eager": asdict(eager), "compiled": None, "floor_us": floor, "floor_note": floor_note,
                    **extra, "sets": len(sets), "note": f"{note}; {plan_note}"}
        ref64 = verify.reference64(task, self.backend.device) if plan.edge64 else None
        st = PreparedTask(task, gm, sets, arena_box[-1], slots, stats, note, baseline, floor, floor_note,
                          len(sets), plan_note, edge=plan.edge, ref64=ref64, retries=retries)
        self.tasks[tid] = st
        while len(self.tasks) > self.MAX_TASKS:
            self.tasks.popitem(last=False)[1].close()
        return st

    def _collect(self) -> None:
        gc.collect()
        self.backend.empty_cache()

    def _floor(self, task, req: dict):
        from kforge_tui.regions import floor as rfloor
        from kforge_tui.sandbox import bench

        cache = req.get("cache_dir") or self.cache_dir or "."
        bw = bench.bandwidth(self.backend, cache)
        pk = None
        if self.backend.name != "cpu" and rfloor.flops(task) > 0:
            try:
                pk = bench.peak(self.backend, cache, task.dtype)
            except Exception:
                pk = None
        f = rfloor.floor(task, bw["gbs"], pk["tflops"] if pk else None)
        note = f"{f.note}; {bw['note']}" + (f"; {pk['note']}" if pk else "")
        return f.us, note, {"bandwidth_gbs": bw["gbs"], "peak_tflops": pk["tflops"] if pk else None,
                            "floor_bound": f.bound}

    def _time_compiled(self, st: PreparedTask, timing: dict | None):
        from kforge_tui.sandbox import bench

        try:
            fn = self.torch.compile(st.gm)
            with self.backend.stream_context():
                t0 = time.perf_counter()
                fn(*st.sets[0].tensors())
                compile_s = time.perf_counter() - t0
                t, _ = bench.time_calls(self.backend, lambda s: fn(*s.tensors()), st.sets,
                                        {**bench.DEFAULT_TIMING, **(timing or {}), "max_wall_s": 2.5})
            st.compiled_fn = fn
            return asdict(t), f"torch.compile took {compile_s:.1f} s to compile"
        except Exception as e:  # inductor missing a compiler etc.: the baseline goes on without it
            return None, f"torch.compile unavailable: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"

    # ------------------------------------------------------------------ a candidate
    def evaluate(self, req: dict, emit) -> dict:
        from kforge_tui.sandbox import verify

        task = self._task(req)
        self._ensure_probe(req.get("cache_dir") or self.cache_dir or ".")
        deadline = time.perf_counter() + float(req.get("deadline_s") or 60.0)
        self.evaluations += 1
        attempts = []
        max_sets = None
        while True:
            try:
                st = self._state(task, req, max_sets=max_sets)
            except InfraError as e:
                return self._infra(str(e), attempts)
            try:
                res = self._evaluate_once(st, req, emit, deadline)
                if attempts:
                    res["log"] += "\nretried after: " + "; ".join(attempts)
                return res
            except InfraError as e:
                attempts.append(str(e))
                if st.k <= 1 or len(attempts) >= 4:
                    return self._infra(f"{e} (with {st.k} input set{'s' if st.k > 1 else ''})", attempts)
                max_sets = max(1, st.k // 2)
            finally:
                self._top_up_safely()

    def _top_up_safely(self) -> None:
        try:
            self._top_up()
        except Exception:
            pass

    @staticmethod
    def _infra(message: str, attempts: list) -> dict:
        return {"status": "infra_error", "stage": "load", "message": message.replace("\n", " ")[:400],
                "log": "\n".join(attempts), "mismatch": None, "timing": None, "baseline": None,
                "floor_us": None, "stage_s": {}, "fatal": False, "checks": {}}

    def _evaluate_once(self, st: PreparedTask, req: dict, emit, deadline: float) -> dict:
        from kforge_tui.sandbox import verify

        torch = self.torch
        stage_s: dict[str, float] = {}
        res = {"status": "ok", "stage": "load", "message": "", "log": f"inputs: {st.note}; {st.plan_note}",
               "mismatch": None, "timing": None, "baseline": st.baseline["eager"], "floor_us": st.floor,
               "stage_s": stage_s, "fatal": False, "checks": {}}
        t = time.perf_counter()
        try:
            runner = self._take_runner(deadline)
        except InfraError:
            raise
        stage_s["runner"] = time.perf_counter() - t
        sets_idx = {id(s): i for i, s in enumerate(st.sets)}
        info, fds = st.arena.handle()
        cand_dir = None
        if self.lang == "triton":
            cand_dir = self._candidate_dir(req)
            code = {"source_path": req["source_path"], "cand_dir": cand_dir}
        else:
            code = {"lib": req["lib_path"]}
        job = {"cmd": "job", **code, "arena": info,
               "slots": [([x.to_json() if x is not None else None for x in ins], [x.to_json() for x in outs])
                         for ins, outs in st.slots],
               "names": [s.name for s in st.sets], "backend": self.backend.name,
               "inputs": [m.to_json() for m in st.task.inputs],
               "outputs": [m.to_json() for m in st.task.outputs], "poison_pools": st.poison_pools}
        pool = None
        if st.poison_pools:
            # The garbage pool the runner copies into the outputs of unchecked timed calls is
            # made from a seed and window offsets chosen here, so checked timed calls can be
            # filled from the very same windows (verify.Verifier.timed_before): a kernel that
            # remembers which garbage it has seen, or the guard bytes, cannot tell them apart.
            prng = random.Random(int.from_bytes(os.urandom(8), "little"))
            pool = {"seed": prng.getrandbits(62),
                    "offsets": [[sorted(prng.sample(range(1024), 8)) for _ in st.task.outputs]
                                for _ in st.sets]}
            job["pool"] = pool
        log_lines: list[str] = []

        def remaining() -> float:
            r = deadline - time.perf_counter()
            if r <= 0:
                raise _Timeout()
            return r

        def rx() -> dict:
            try:
                msg = recv(runner.sock, remaining())
            except (socket.timeout, TimeoutError):
                raise _Timeout() from None
            if msg.get("ev") == "oom":
                raise InfraError(f"out of memory in the kernel process: {msg.get('error', '')}")
            if msg.get("ev") == "error":
                raise _RunnerError(msg.get("error", ""), msg.get("device_error", ""))
            return msg

        def call(s) -> verify.CallReport:
            send(runner.sock, {"cmd": "call", "set": sets_idx[id(s)]})
            m = rx()
            if m.get("candidate_error"):
                raise verify.CandidateError(m["candidate_error"])
            return verify.CallReport(int(m.get("rc", 0)), m.get("problem") or "")

        v = verify.Verifier(st.task, st.sets, call, st.reference, device=self.backend.device,
                            sync=self.backend.sync_all, stats=st.stats, reference64=st.ref64, edge=st.edge,
                            log=log_lines)
        v.pool = pool
        try:
            with _HarnessThreads(torch, st.task):
                return self._drive(st, req, emit, runner, job, fds, v, res, stage_s, rx, remaining, t)
        finally:
            res["checks"] = {**v.checks, "runner": "fresh process per candidate", "runner_pid": runner.pid,
                             "edge_float64": st.ref64 is not None}
            if log_lines:
                res["log"] += "\n" + "\n".join(log_lines)
            try:
                send(runner.sock, {"cmd": "exit"})
            except OSError:
                pass
            runner.kill()
            if cand_dir and not os.environ.get("KFORGE_KEEP_TRITON_DIRS"):
                import shutil

                shutil.rmtree(cand_dir, ignore_errors=True)

    def _candidate_dir(self, req: dict) -> str:
        """A fresh directory per Triton evaluation (the candidate's file and its Triton cache),
        made by the supervisor, removed when the runner is gone (KFORGE_KEEP_TRITON_DIRS keeps
        it for debugging)."""
        import tempfile

        root = os.path.join(self.cache_dir or req.get("cache_dir") or tempfile.gettempdir(), "triton", "runs")
        os.makedirs(root, mode=0o700, exist_ok=True)
        stem = os.path.splitext(os.path.basename(req["source_path"]))[0][:16]
        return tempfile.mkdtemp(prefix=f"{stem}-{self.evaluations}-", dir=root)

    # Triton loader statuses -> (EvalResult status, stage)
    TRITON_LOAD = {"static_error": ("static_error", "static"), "compile_error": ("compile_error", "compile"),
                   "torch_op": ("verify_error", "load"), "load_error": ("load_error", "load"),
                   "launch_error": ("load_error", "load")}

    def _load_failure(self, res: dict, m: dict) -> dict:
        if self.lang != "triton":
            return self._fail(res, "load_error", "load", m["error"])
        status, stage = self.TRITON_LOAD.get(m.get("status") or "", ("load_error", "load"))
        msg = m["error"]
        if m.get("status") == "launch_error" and msg.startswith("device error"):
            status = "crash"
            msg += " (kernel process discarded)"
        elif m.get("status") == "launch_error":
            msg = f"the first call failed: {msg}"
        if m.get("log"):
            res["log"] += "\n--- Triton ---\n" + m["log"]
        if m.get("jit_s") is not None:
            res["jit_s"] = m["jit_s"]
        return self._fail(res, status, stage, msg)

    def _drive(self, st, req, emit, runner, job, fds, v, res, stage_s, rx, remaining, t):
        """load -> verify (before timing) -> time -> verify (after timing) -> final census."""
        from kforge_tui.sandbox import verify

        if True:  # (one block: every way out of the protocol is handled below)
            try:
                send(runner.sock, job, fds)
                m = rx()
                stage_s["load"] = time.perf_counter() - t  # Triton: its JIT (first call) included
                if m.get("jit_s") is not None:
                    stage_s["jit"] = float(m["jit_s"])
                    res["jit_s"] = float(m["jit_s"])
                if m.get("error"):
                    return self._load_failure(res, m)
                if m.get("problem"):
                    return self._fail(res, "verify_error", "load", m["problem"])
                emit("verify")
                res["stage"] = "verify"
                t = time.perf_counter()
                with self.backend.stream_context():
                    mm = v.before_timing()
                stage_s["verify"] = time.perf_counter() - t
                if mm is not None:
                    res["mismatch"] = asdict(mm)
                    return self._fail(res, "verify_error", "verify", mm.summary())
                emit("time")
                res["stage"] = "time"
                t = time.perf_counter()
                timing, mm = self._time_remote(runner, v, st, req, rx, remaining)
                stage_s["time"] = time.perf_counter() - t
                if timing is not None:
                    res["timing"] = timing
                if mm is not None:
                    res["mismatch"] = asdict(mm)
                    return self._fail(res, "verify_error", "time", mm.summary())
                t = time.perf_counter()
                with self.backend.stream_context():
                    mm = v.after_timing()
                if mm is not None:
                    res["mismatch"] = asdict(mm)
                    return self._fail(res, "verify_error", "time", mm.summary())
                send(runner.sock, {"cmd": "final"})
                m = rx()
                stage_s["verify"] += time.perf_counter() - t
                if m.get("device_error"):
                    return self._fail(res, "crash", "time", f"{m['device_error']} (kernel process discarded)")
                if m.get("problem"):
                    return self._fail(res, "verify_error", "time", m["problem"])
            except verify.CandidateError as e:
                return self._fail(res, "verify_error", res["stage"], self._rc_text(str(e)))
            except _Timeout:
                runner.kill()
                return self._fail(res, "timeout", res["stage"],
                                  f"no result after {float(req.get('deadline_s') or 60):g} s; the kernel's "
                                  f"process was killed")
            except RunnerGone:
                status = runner.exit_status()
                from kforge_tui.sandbox.pool import describe_exit

                return self._fail(res, "crash", res["stage"],
                                  describe_exit(status).replace("worker", "kernel process"))
            except _RunnerError as e:
                if e.device:
                    return self._fail(res, "crash", res["stage"], f"{e.device} (kernel process discarded)")
                return self._fail(res, "verify_error", res["stage"], f"the kernel's process failed: {e}")
            except Exception as e:
                if verify.is_oom(e):
                    raise InfraError(f"out of memory in the supervisor: {str(e).splitlines()[0][:200]}") from None
                raise
        from kforge_tui.sandbox import bench

        timing = res["timing"]
        if not timing or not timing.get("n"):
            return self._fail(res, "crash", "time", "the kernel's process returned no timing")
        if bench.below_floor(timing["median_us"], st.floor):
            return self._fail(res, "impossible_timing", "time",
                              f"median {timing['median_us']:.3g} us is below the roofline floor "
                              f"{st.floor:.3g} us ({st.floor_note}); not a win")
        fresh = self._adjacent_baselines(st, req)
        res["baseline"] = fresh.get("eager") or st.baseline["eager"]
        res["compiled"] = fresh.get("compiled")
        eager = res["baseline"]["median_us"]
        comp = (res["compiled"] or {}).get("median_us")
        res["message"] = (f"{timing['median_us']:.3g} us (p10 {timing['p10_us']:.3g}, p90 {timing['p90_us']:.3g}, "
                          f"n {timing['n']}) vs eager {eager:.3g} us: {eager / timing['median_us']:.2f}x"
                          + (f", vs torch.compile {comp:.3g} us: {comp / timing['median_us']:.2f}x"
                             if comp else ""))
        return res

    # What the baselines timed next to each candidate cost: a short loop each (the task's full
    # baseline at prepare stays in the store for the tables).
    ADJACENT_TIMING = {"warmup": 2, "min_iters": 10, "max_iters": 40, "budget_s": 0.08,
                       "max_wall_s": 1.0}

    def _adjacent_baselines(self, st: PreparedTask, req: dict) -> dict:
        """Eager (and torch.compile, when the task has it) timed again right after this
        candidate, on the same input sets in the same process: a node's speedup is over the
        eager time measured with it, not a figure cached at the start of the task (issue 16).
        On any failure the prepared figures stand."""
        from kforge_tui.sandbox import bench

        out: dict = {}
        cfg = {**bench.DEFAULT_TIMING, **(req.get("timing") or {}), **self.ADJACENT_TIMING}
        fns = {"eager": st.gm}
        if getattr(st, "compiled_fn", None) is not None:
            fns["compiled"] = st.compiled_fn
        for name, fn in fns.items():
            try:
                with self.backend.stream_context():
                    t, _ = bench.time_calls(self.backend, lambda s, fn=fn: fn(*s.tensors()), st.sets, cfg)
                out[name] = asdict(t)
            except Exception:  # noqa: BLE001 - the prepared baseline is the fallback
                continue
        return out

    def _time_remote(self, runner, v, st: PreparedTask, req: dict, rx, remaining):
        from kforge_tui.sandbox import verify

        cfg = {**(req.get("timing") or {})}
        wall0 = time.perf_counter()
        send(runner.sock, {"cmd": "time", "cfg": cfg, "seed": int.from_bytes(os.urandom(6), "little") | 1})
        with self.backend.stream_context():
            while True:
                m = rx()
                ev = m.get("ev")
                if ev == "before":
                    fill = v.timed_before(st.sets[int(m["set"])], bool(m.get("refresh")),
                                          set_index=int(m["set"]))
                    send(runner.sock, {"go": 1, "fill": fill})
                elif ev == "after":
                    mm = v.timed_after(st.sets[int(m["set"])],
                                       verify.CallReport(int(m.get("rc", 0)), m.get("problem") or ""))
                    send(runner.sock, {"mismatch": asdict(mm) if mm is not None else None})
                elif ev == "timed" or ev == "called":
                    if m.get("candidate_error"):
                        raise verify.CandidateError(m["candidate_error"])
                    t = m.get("timing")
                    mm = m.get("mismatch")
                    wall = time.perf_counter() - wall0
                    if t and t.get("n") and t["median_us"] * t["n"] * 0.5e-6 > wall + 0.01:
                        return t, verify.special_mismatch(
                            "timing report", 1, "worker state changed: the kernel's process reported "
                            f"timings longer than the {wall:.3g} s the loop took (a forged report)")
                    return t, (verify.Mismatch(**mm) if mm else None)

    def _rc_text(self, msg: str) -> str:
        if self.lang == "triton":  # the loader's own words (a Python launcher has no CUDA codes)
            return msg
        parts = msg.split()
        try:
            rc = int(parts[parts.index("returned") + 1])
            return msg.replace(f"returned {rc}", f"returned {self.backend.error_name(rc)}")
        except (ValueError, IndexError):
            return msg

    @staticmethod
    def _fail(res: dict, status: str, stage: str, message: str) -> dict:
        res.update(status=status, stage=stage, message=message.replace("\n", " "))
        return res


class _HarnessThreads:
    """The supervisor's own checks on a small region run on one thread: OpenMP fan-out costs
    more than it saves there, and on a loaded box each parallel op waits for every thread to be
    scheduled (measured on the 2-core CI box under load: 16 s -> 0.8 s for one verification).
    Eager and torch.compile are timed with all threads (outside this)."""

    SMALL = 1 << 22  # elements

    def __init__(self, torch, task):
        self.torch = torch
        self.small = max([m.numel for m in list(task.inputs) + list(task.outputs) if m.present] or [0]) < self.SMALL

    def __enter__(self):
        self.n = self.torch.get_num_threads()
        if self.small and self.n > 1:
            self.torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        if self.small and self.n > 1:
            self.torch.set_num_threads(self.n)


class _RunnerError(Exception):
    def __init__(self, text: str, device: str = ""):
        super().__init__(text)
        self.device = device


def main(argv=None) -> int:
    proto, proto_fd = _protocol_stream()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser(prog="kforge_tui.sandbox.worker")
    ap.add_argument("--backend", choices=("cpu", "cuda", "triton"), required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    thread_env()  # before torch is imported (OpenMP reads it once)
    import torch  # noqa: F401  (imported before the zygote forks: runners start warm)

    from kforge_tui.regions import abi, graph, meta, task  # noqa: F401
    from kforge_tui.sandbox import bench, verify  # noqa: F401
    from kforge_tui.sandbox.backends import arena, probe  # noqa: F401

    def send_proto(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        if args.backend == "triton":
            _import_triton()  # before the zygote forks: runners start with Triton loaded
        zygote = Zygote(args.backend, args.device, proto_fd)
        worker = Worker(args.backend, args.device, zygote, args.cache_dir)
    except Exception as e:
        send_proto({"id": 0, "ok": False, "error": f"worker start failed: {e}"})
        return 3
    describe = worker.backend.describe()
    if args.backend == "triton":
        describe += ("; Triton under its interpreter (TRITON_INTERPRET=1)" if worker.backend.name == "cpu"
                     else "; Triton")
    send_proto({"id": 0, "ok": True, "ready": True, "pid": os.getpid(), "arch": worker.backend.arch(),
                "device": describe, "device_kind": worker.backend.name})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError:
            send_proto({"id": None, "ok": False, "error": "bad request line"})
            continue
        rid, cmd = req.get("id"), req.get("cmd")

        def emit(stage: str, rid=rid) -> None:
            send_proto({"id": rid, "event": "stage", "stage": stage})

        try:
            if cmd == "ping":
                send_proto({"id": rid, "ok": True})
            elif cmd == "exit":
                send_proto({"id": rid, "ok": True})
                return 0
            elif cmd == "prepare":
                try:
                    send_proto({"id": rid, "ok": True, **worker.prepare(req, emit)})
                except InfraError as e:
                    send_proto({"id": rid, "ok": False, "infra": True, "error": str(e)[:500]})
            elif cmd == "evaluate":
                res = worker.evaluate(req, emit)
                send_proto({"id": rid, "ok": True, "result": res})
            else:
                send_proto({"id": rid, "ok": False, "error": f"unknown command {cmd!r}"})
        except Exception as e:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            send_proto({"id": rid, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
