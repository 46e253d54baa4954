"""Triton's JIT ahead of the GPU slot (issue 20): a candidate compiles while it waits for a worker.

The GPU worker evaluates one candidate at a time, and a Triton candidate's first call used to
compile it there: JIT 0.34-2.0 s a candidate on the H100/H200 (2026-12-02..05), half or more of
the worker's time, with the GPU idle. Here the compile happens before the candidate queues:

    pool --JSON lines--> server (torch and Triton imported once; CUDA never initialised, so it
                         may fork) --fork--> one child per candidate, at most `jobs` at once

The child imports the candidate and calls its entry on *meta* tensors of the task's shapes,
dtypes and strides, with every Triton launch turned into `warmup` (compile, do not run): the
kernels Triton would compile on the first real call land in a cache directory of the child's
own. The runner then links that directory into its candidate's Triton cache
(triton_loader's `reuse_cache_from`), so its first call loads instead of compiling.

Nothing here is trusted or judged. The child is a fresh process that runs code the static check
passed, as a runner's load stage does before its filters (and with no tensor data to read). If
it fails, hangs (its process group is killed at the deadline) or compiles other kernels, the
runner compiles as before; every verdict still comes from the runner's own first call,
verification and timing. A candidate that can tell it is here (meta tensors) only loses its
head start. Meta tensors are used instead of device tensors because a CUDA context per child
would cost ~0.3 s and ~0.5 GB of GPU memory; their data_ptr() is 0, so Triton's alignment
specialisation matches the runner's 16-byte-aligned arena slots and the cache keys agree.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import selectors
import signal
import sys
import time
from collections import deque
from pathlib import Path

from kforge_tui.sandbox.trampoline import die_with_parent

DEFAULT_TIMEOUT_S = 60.0
STDERR_TAIL = 50


def jobs_default() -> int:
    """Children at once: the JIT is one core each (LLVM, then ptxas); half the cores leaves the
    rest to the harness, whose host-side launches are part of what is timed."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def job_key(source_path: str, inputs: list, outputs: list) -> str:
    """One directory per candidate and task ABI: the same source on the same shapes compiles to
    the same kernels."""
    h = hashlib.sha256(json.dumps([os.path.basename(source_path), inputs, outputs], sort_keys=True).encode())
    return h.hexdigest()[:24]


# --------------------------------------------------------------------------- the child
def compile_ahead(job: dict) -> dict:
    """In the forked child: import the candidate and call its entry with Triton launches in
    warmup mode, on meta tensors. Returns {"ok", "kernels", "seconds", "error"?}."""
    t0 = time.perf_counter()
    with open(job["source_path"], encoding="utf-8") as f:
        source = f.read()
    import torch

    from kforge_tui.regions.meta import TensorMeta, torch_dtype
    from kforge_tui.sandbox import triton_loader

    warm = job.get("warm_dir")
    if warm:  # Triton's driver utilities come from the runners' shared cache, as in a runner
        os.makedirs(warm, exist_ok=True)
        os.environ["TRITON_CACHE_DIR"] = warm
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.active.get_current_target()
    pre_dir = Path(job["pre_dir"])
    os.environ["TRITON_CACHE_DIR"] = str(pre_dir / triton_loader.CACHE_SUBDIR)
    compiled: list = []
    real_run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None:
            compiled.append(kernel)
        return kernel

    JITFunction.run = compile_only
    entry = triton_loader.load(source, pre_dir, check=False)
    if entry.status != "ok":
        return {"ok": False, "kernels": 0, "seconds": time.perf_counter() - t0, "error": entry.message}

    def meta(m: dict):
        tm = TensorMeta.from_json(m)
        if not tm.present:
            return None
        return torch.empty_strided(tm.shape, tm.strides, dtype=torch_dtype(tm.dtype), device="meta")

    rc = entry.launch_fast([meta(m) for m in job["inputs"]], [meta(m) for m in job["outputs"]])
    for kernel in compiled:  # older Tritons compile a C launcher per signature on first use
        try:
            driver.active.launcher_cls(kernel.src, kernel.metadata)
        except Exception:  # noqa: BLE001 - then the runner builds it, as before
            pass
    out = {"ok": rc == 0 and bool(compiled), "kernels": len(compiled), "seconds": time.perf_counter() - t0}
    if rc != 0:
        out["error"] = entry.last_error or f"entry returned {rc}"
    elif not compiled:
        out["error"] = "no Triton kernel was launched"
    return out


def _child(job: dict, wfd: int) -> None:
    """The forked child's whole life: its own process group (the deadline kills ptxas with it),
    dead with the server, one JSON reply on the pipe, then _exit (no atexit, no finalizers)."""
    try:
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the server's request and reply pipes are not the candidate's
        os.dup2(null, 1)
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
        try:
            res = compile_ahead(job)
        except BaseException as e:  # noqa: BLE001 - anything the candidate raised
            res = {"ok": False, "kernels": 0, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
        os.write(wfd, (json.dumps(res) + "\n").encode())
    finally:
        os._exit(0)


# --------------------------------------------------------------------------- the server
def warm(arch: str | None, warm_dir: str | None) -> dict:
    """Before the first fork: make this server's Triton compile a kernel once, for `arch`
    (`sm_90`), without a CUDA context, so every child starts with the compiler warm.

    Triton sets up its backend, LLVM and MLIR lazily, on the first compile in a process: done in
    each forked child that cost 1.5 s a candidate (p90 7.6 s, H100, 2026-12-06), against 0.23 s
    for a warm runner, and made compiling ahead slower than not. Here the driver's device,
    stream and target queries answer from `arch` instead of CUDA (the children only compile;
    a CUDA context before fork would not survive it), and a tiny kernel of ours, salted with
    this pid so that it is never a cache hit, is compiled for real into a throwaway directory.
    The runner's cache keys agree with the children's: same source, options and target.
    Returns {"ok", "seconds", "threads", "error"?}; on failure the children compile cold, as
    before."""
    t0 = time.perf_counter()
    before = len(os.listdir("/proc/self/task"))
    m = re.fullmatch(r"sm_(\d+)a?", arch or "")
    if not m:
        return {"ok": False, "seconds": 0.0, "error": f"no CUDA target to compile for ({arch!r})"}
    cache_env = os.environ.get("TRITON_CACHE_DIR")
    try:
        if warm_dir:  # cuda_utils (the driver's C module) from the runners' shared cache
            os.makedirs(warm_dir, exist_ok=True)
            os.environ["TRITON_CACHE_DIR"] = warm_dir
        import tempfile

        import torch
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.driver import CudaDriver
        from triton.runtime import driver

        active = CudaDriver()  # not `driver.active`: its is_active() would initialise CUDA
        target = GPUTarget("cuda", int(m.group(1)), 32)
        active.get_current_target = lambda: target
        active.get_current_device = lambda: 0
        active.get_current_stream = lambda device=None: 0
        driver.set_active(active)

        from kforge_tui.sandbox.triton_loader import warm_kernel

        with tempfile.TemporaryDirectory(prefix="kf-warm-") as tmp:
            os.environ["TRITON_CACHE_DIR"] = tmp
            warm_kernel().warmup(torch.empty(16, device="meta"), 16, B=16, SALT=os.getpid(), grid=(1,))
    except Exception as e:  # noqa: BLE001 - a cold start is slower, never wrong
        return {"ok": False, "seconds": time.perf_counter() - t0,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    finally:  # each child names its own cache directory
        if cache_env is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = cache_env
    threads = len(os.listdir("/proc/self/task"))
    out = {"ok": threads <= before, "seconds": time.perf_counter() - t0, "threads": threads}
    if threads > before:  # a thread pool would be dead in every child: say so, they may hang
        out["error"] = f"the warm-up compile started {threads - before} thread(s): forked children may hang"
    return out


def serve(jobs: int, arch: str | None = None, warm_dir: str | None = None) -> int:
    """Read jobs (JSON lines) on stdin, fork a child each (at most `jobs` at once), answer each
    with {"id", "ok", "kernels", "seconds", "error"?} on stdout. Single-threaded: it forks. The
    ready line carries the warm-up's facts (`warm`)."""
    from kforge_tui.sandbox.runner import _import_triton

    _import_triton()
    warmed = warm(arch, warm_dir)
    out = sys.stdout
    sel = selectors.DefaultSelector()
    stdin_fd = sys.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_READ, "stdin")
    waiting: deque[dict] = deque()
    running: dict[int, dict] = {}  # pid -> {id, fd, deadline, buf}
    inbuf = b""
    open_ = True

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def start(job: dict) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(job, w)
        os.close(w)
        running[pid] = {"id": job["id"], "fd": r, "buf": b"", "t0": time.monotonic(),
                        "deadline": time.monotonic() + float(job.get("timeout_s") or DEFAULT_TIMEOUT_S)}
        sel.register(r, selectors.EVENT_READ, pid)

    def finish(pid: int, res: dict) -> None:
        st = running.pop(pid)
        try:
            sel.unregister(st["fd"])
        except (KeyError, ValueError):
            pass
        os.close(st["fd"])
        try:
            os.killpg(pid, signal.SIGKILL)  # ptxas or a thread the candidate left behind
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        res.setdefault("seconds", time.monotonic() - st["t0"])
        reply({"id": st["id"], **res})

    reply({"id": 0, "ready": True, "pid": os.getpid(), "warm": warmed})
    while open_ or running or waiting:
        while waiting and len(running) < jobs:
            start(waiting.popleft())
        now = time.monotonic()
        timeout = min((st["deadline"] - now for st in running.values()), default=None)
        for key, _ in sel.select(None if timeout is None else max(0.0, timeout)):
            if key.data == "stdin":
                chunk = os.read(stdin_fd, 1 << 16)
                if not chunk:
                    open_ = False
                    sel.unregister(stdin_fd)
                    waiting.clear()
                    continue
                inbuf += chunk
                while b"\n" in inbuf:
                    line, inbuf = inbuf.split(b"\n", 1)
                    if line.strip():
                        try:
                            waiting.append(json.loads(line))
                        except ValueError:
                            reply({"id": None, "ok": False, "error": "bad request line"})
            else:
                pid = key.data
                st = running[pid]
                chunk = os.read(st["fd"], 1 << 16)
                st["buf"] += chunk
                if not chunk or st["buf"].endswith(b"\n"):
                    try:
                        res = json.loads(st["buf"] or b"{}")
                    except ValueError:
                        res = {}
                    if not res:
                        res = {"ok": False, "kernels": 0, "error": "the compile process died"}
                    finish(pid, res)
        now = time.monotonic()
        for pid in [p for p, st in running.items() if st["deadline"] <= now]:
            finish(pid, {"ok": False, "kernels": 0, "error": "timed out"})
    return 0


# --------------------------------------------------------------------------- the client
class Precompiler:
    """The pool's handle on one server. `compile()` never raises: on any failure it answers
    None, and the candidate goes to its worker to compile there as before."""

    def __init__(self, cache_dir: str | Path, *, jobs: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 arch: str | None = None):
        self.arch = arch  # the GPU's target (`sm_90`); the pool sets it once its workers report it
        self.warm: dict = {}  # the server's warm-up facts (its ready line)
        self.root = Path(cache_dir) / "triton" / "pre"
        self.warm_dir = str(Path(cache_dir) / "triton" / "warm")
        self.jobs = jobs or jobs_default()
        self.timeout_s = timeout_s
        self.proc: asyncio.subprocess.Process | None = None
        self.dead = ""  # why the server is gone for good (then nothing is precompiled)
        self._pending: dict[int, asyncio.Future] = {}
        self._next = 1
        self._start_lock = asyncio.Lock()
        self._reader: asyncio.Task | None = None
        self._stderr: deque[str] = deque(maxlen=STDERR_TAIL)
        self.stats = {"compiled": 0, "failed": 0}

    async def start(self) -> bool:
        """Start and warm the server (once; True when it is usable). The pool calls it as it
        starts, so the import and warm-up (seconds) overlap the baselines instead of holding
        the first candidates: started on the first compile, the H200's first six candidates
        waited for it, and the stage's mean was 1.50 s against 0.47 on a warm server."""
        async with self._start_lock:
            if self.proc is not None or self.dead:
                return not self.dead
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            env.pop("TRITON_INTERPRET", None)
            try:
                args = ["--jobs", str(self.jobs), "--warm-dir", self.warm_dir]
                if self.arch:
                    args += ["--arch", self.arch]
                self.proc = await asyncio.create_subprocess_exec(
                    *die_with_parent("kforge_tui.sandbox.triton_precompile", *args),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=env, limit=1 << 20)
                line = await asyncio.wait_for(self.proc.stdout.readline(), 180.0)
                ready = json.loads(line or b"{}")
                if not ready.get("ready"):
                    raise RuntimeError("no ready line")
                self.warm = ready.get("warm") or {}
                if self.arch and not self.warm.get("ok"):
                    # cold children compile slower than the runner's own JIT (1.5 s against
                    # 0.23 s a candidate, H100 2026-12-06): then leave the JIT to the runner
                    self.dead = ("compile-ahead server not used (the runner compiles): its warm-up "
                                 f"failed: {self.warm.get('error', 'no reason given')}")[:300]
                    await self.close()
                    return False
            except Exception as e:  # noqa: BLE001
                self.dead = f"compile-ahead server did not start: {type(e).__name__}: {e}"[:300]
                await self.close()
                return False
            self._reader = asyncio.ensure_future(self._read())
            asyncio.ensure_future(self._drain_stderr())
            return True

    async def _drain_stderr(self) -> None:
        proc = self.proc
        while proc is not None and proc.stderr is not None:
            line = await proc.stderr.readline()
            if not line:
                return
            self._stderr.append(line.decode(errors="replace").rstrip())

    async def _read(self) -> None:
        proc = self.proc
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                fut = self._pending.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            self.dead = self.dead or "compile-ahead server exited: " + " | ".join(list(self._stderr)[-3:])
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_result({"ok": False, "error": self.dead})
            self._pending.clear()

    async def compile(self, source_path: str, inputs: list, outputs: list) -> tuple[str | None, dict]:
        """(the directory of compiled kernels for the runner to link, or None; the server's
        reply). The caller discards the directory after the evaluation."""
        if not await self.start():
            return None, {"ok": False, "error": self.dead}
        rid = self._next
        self._next += 1
        pre_dir = self.root / f"{job_key(source_path, inputs, outputs)}-{os.getpid()}-{rid}"
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        job = {"id": rid, "source_path": source_path, "pre_dir": str(pre_dir), "inputs": inputs,
               "outputs": outputs, "warm_dir": self.warm_dir, "timeout_s": self.timeout_s}
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            await self.proc.stdin.drain()
            rep = await asyncio.wait_for(fut, self.timeout_s + 30.0)
        except Exception as e:  # noqa: BLE001 - a dead server or pipe: compile in the worker
            self._pending.pop(rid, None)
            return None, {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
        if not rep.get("ok"):
            self.stats["failed"] += 1
            return None, rep
        self.stats["compiled"] += 1
        return str(pre_dir / "triton_cache"), rep

    @staticmethod
    def discard(cache: str | None) -> None:
        """Remove a compiled-kernel directory once its runner linked it (or never will)."""
        if cache:
            import shutil

            shutil.rmtree(Path(cache).parent, ignore_errors=True)

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 5.0)
        except Exception:  # noqa: BLE001
            try:
                proc.kill()
                await proc.wait()
            except ProcessLookupError:
                pass
        if self._reader is not None:
            self._reader.cancel()


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="kforge_tui.sandbox.triton_precompile")
    ap.add_argument("--jobs", type=int, default=jobs_default())
    ap.add_argument("--arch", default=None, help="the GPU's target, e.g. sm_90: the server compiles once for it before forking")
    ap.add_argument("--warm-dir", default=None, help="Triton cache dir shared with the runners (the driver's C module)")
    args = ap.parse_args(argv)
    return serve(max(1, args.jobs), args.arch, args.warm_dir)


if __name__ == "__main__":
    sys.exit(main())
