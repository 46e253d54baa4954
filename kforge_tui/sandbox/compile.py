"""Compile one candidate source into a shared library, in a subprocess, with a timeout and a cache.

Why a shared library and not a cubin: the candidate contract (workload/catalogue.py) is a *host*
launcher `extern "C" int kforge_launch(..., cudaStream_t stream)` that picks grid sizes and may
launch several kernels; a cubin holds device code only and would need a second, per-op launcher
in the worker. The worker loads the library with ctypes (about 0.3 µs per call).

cuda: `nvcc -O3 -arch=sm_XX -shared -Xcompiler -fPIC -Xptxas -v -lineinfo -std=c++17`.
Measured on the 2-core dev box (CPU seconds of the whole nvcc run, median of 4, configurations
interleaved; 2026-11-30, nvcc 13.0): softmax_f32.cu 1.85-2.13 s and group_norm_f16.cu (with
cub::BlockReduce) 5.7-6.4 s for *every* variant tried (--threads 0, -Xcompiler -O1, nvcc -O1,
SASS-only -gencode, -lineinfo): no flag shortened the compile beyond noise. The time is in
preprocessing, cudafe++, cicc and the host g++ pass over the CUDA headers (ptxas is ~0.26 s),
so the lever is header weight (cub triples it), not flags. Host -O level leaves the cubin
byte-identical, so nothing is lost either way; we keep the conventional -O3. -lineinfo costs
nothing measurable and lets compute-sanitizer / Nsight point at candidate source lines.
`-Xptxas -v` prints the register, shared-memory and spill figures parse_ptxas() reads.

cpu: `g++ -O3 -march=native -fopenmp -shared -fPIC -std=c++17 -Wl,-z,defs` (`-z defs` turns a
call to something that does not exist into a compile error here instead of a load error later).

Cache: `cache_dir/<sha256(source, flags, target, compiler version)>/` holds kernel.<ext>,
kernel.so (on success), log.txt and result.json. A compile runs in a private temp directory
(also its TMPDIR, so nvcc's intermediates do not collide) that is renamed into place in one
step, so readers never see a half-written entry and two processes compiling the same source
race harmlessly (the loser drops its copy). Concurrent compiles of the same key in one event
loop share one subprocess. Failed compiles are cached too: the same source, flags and compiler
fail the same way, and a search re-proposes duplicates. Timeouts and a missing compiler are not
cached: they depend on the machine's load and set-up, not on the source.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kforge_tui import device
from kforge_tui.errors import UsageError

_EXT = {"cuda": "cu", "cpu": "cpp"}
_LIB = "kernel.so"
_LOG_LIMIT = 256 * 1024  # a template error cascade can be megabytes; keep head and tail
_CACHE_FORMAT = 1


@dataclass
class CompileResult:
    ok: bool
    lib_path: str | None
    log: str  # the compiler's full output (stdout and stderr together)
    resources: dict  # parse_ptxas() figures on cuda; {} on cpu
    seconds: float  # wall time of this call (near 0 on a cache hit)
    cached: bool
    error_line: int | None  # 1-based line in the candidate of the first compiler error
    command: list[str]
    timed_out: bool = False
    message: str = ""  # one line, for tables and trees
    compile_seconds: float | None = field(default=None)  # the original compile's wall time

    def to_json(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------- flags

_CUDA_ARCH = re.compile(r"^(?:sm_|compute_)?(\d{2,3}[af]?)$")


def compile_flags(backend: str, arch: str) -> list[str]:
    """Compiler flags (without the compiler, input or output) for a backend and target."""
    if backend == "cuda":
        m = _CUDA_ARCH.match(arch or "")
        if not m:
            raise UsageError(f"bad cuda arch {arch!r}: expected e.g. sm_90 or sm_90a")
        return ["-O3", f"-arch=sm_{m.group(1)}", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
                "-lineinfo", "-std=c++17"]
    if backend == "cpu":
        if not re.match(r"^[A-Za-z0-9_.+-]+$", arch or ""):
            raise UsageError(f"bad cpu arch {arch!r}: expected e.g. native or x86-64-v3")
        return ["-O3", f"-march={arch}", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                "-Wl,-z,defs"]
    raise UsageError(f"unknown backend {backend!r}: expected cuda or cpu")


def _find_compiler(backend: str) -> tuple[str | None, str]:
    """(path, why-not). An explicit KFORGE_NVCC/KFORGE_CXX that does not exist is an error,
    not a silent fall-back to another compiler."""
    env, label = ("KFORGE_NVCC", "nvcc") if backend == "cuda" else ("KFORGE_CXX", "c++ compiler")
    override = os.environ.get(env)
    if override:
        found = shutil.which(override)
        if not found:
            return None, f"{label} not found: {env}={override} does not exist or is not executable"
        return found, ""
    path = device.nvcc_path() if backend == "cuda" else device.cxx_path()
    if not path:
        hint = "install the CUDA toolkit or set KFORGE_NVCC" if backend == "cuda" \
            else "install g++ or set KFORGE_CXX"
        return None, f"{label} not found: {hint}"
    return path, ""


@functools.lru_cache(maxsize=None)
def _compiler_version(path: str, mtime: float) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        return (out.stdout + out.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"


def _cache_key(source: str, backend: str, arch: str, flags: list[str], version: str) -> str:
    h = hashlib.sha256()
    for part in (f"kforge-compile-v{_CACHE_FORMAT}", backend, arch, json.dumps(flags), version,
                 source):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


# ------------------------------------------------------------------------- log parsing

_NVCC_ERR = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?:catastrophic )?error", re.M)
_GCC_ERR = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)? (?:fatal )?error", re.M)
_ANY_ERR = re.compile(r"^.*\berror\b.*$", re.M | re.I)


def parse_error_line(log: str, filename: str) -> int | None:
    """Line of the first `file(line): error` (nvcc) or `file:line:col: error` (gcc) in the candidate."""
    hits = []
    for rx in (_NVCC_ERR, _GCC_ERR):
        for m in rx.finditer(log):
            if os.path.basename(m.group("file")) == filename:
                hits.append((m.start(), int(m.group("line"))))
                break
    return min(hits)[1] if hits else None


def _first_error(log: str) -> str:
    m = _ANY_ERR.search(log)
    line = (m.group(0) if m else next((ln for ln in log.splitlines() if ln.strip()), "")).strip()
    return line[:240]


_PTX_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTX_PROPS = re.compile(r"Function properties for (\S+)")
_PTX_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTX_USED = re.compile(r"Used (\d+) registers")
_PTX_SMEM = re.compile(r"(\d+) bytes smem")
_PTX_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_PTX_BAR = re.compile(r"used (\d+) barriers")
_PTX_GMEM = re.compile(r"ptxas info\s*:\s*(\d+) bytes gmem")


def parse_ptxas(log: str) -> dict:
    """Resource figures from `-Xptxas -v` output.

    Per kernel (entry function) in `per_kernel`; the top level summarises the library:
    registers, smem_bytes, cmem_bytes, stack_bytes, barriers = the maximum over kernels (what
    limits occupancy is the worst kernel); spill_stores, spill_loads = the sum over every
    function including non-inlined device functions (any spill is a cost); gmem_bytes as ptxas
    reports it for the file. Empty dict when the log has no ptxas lines (cpu, or a failed compile).
    """
    per: dict[str, dict] = {}
    spills = [0, 0]
    current = None
    gmem = 0
    for line in log.splitlines():
        if m := _PTX_GMEM.search(line):
            gmem = max(gmem, int(m.group(1)))
        if m := _PTX_ENTRY.search(line):
            current = m.group(1)
            per.setdefault(current, {"registers": 0, "smem_bytes": 0, "cmem_bytes": 0,
                                     "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0,
                                     "barriers": 0})
            continue
        if m := _PTX_PROPS.search(line):
            current = m.group(1)
            continue
        if m := _PTX_STACK.search(line):
            stack, st, ld = (int(g) for g in m.groups())
            spills[0] += st
            spills[1] += ld
            if current in per:
                k = per[current]
                k["stack_bytes"] = max(k["stack_bytes"], stack)
                k["spill_stores"] += st
                k["spill_loads"] += ld
            continue
        if (m := _PTX_USED.search(line)) and current in per:
            k = per[current]
            k["registers"] = int(m.group(1))
            if s := _PTX_SMEM.search(line):
                k["smem_bytes"] = int(s.group(1))
            k["cmem_bytes"] = sum(int(c) for c in _PTX_CMEM.findall(line))
            if b := _PTX_BAR.search(line):
                k["barriers"] = int(b.group(1))
    if not per:
        return {}

    def worst(key: str) -> int:
        return max(k[key] for k in per.values())

    return {"registers": worst("registers"), "smem_bytes": worst("smem_bytes"),
            "cmem_bytes": worst("cmem_bytes"), "stack_bytes": worst("stack_bytes"),
            "barriers": worst("barriers"), "spill_stores": spills[0], "spill_loads": spills[1],
            "gmem_bytes": gmem, "kernels": len(per), "per_kernel": per}


def _clip(log: str) -> str:
    if len(log) <= _LOG_LIMIT:
        return log
    half = _LOG_LIMIT // 2
    return f"{log[:half]}\n... [{len(log) - _LOG_LIMIT} characters cut] ...\n{log[-half:]}"


# ------------------------------------------------------------------------------ compile

_inflight: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}


def _fail(message: str, command: list[str], t0: float, **kw) -> CompileResult:
    return CompileResult(ok=False, lib_path=None, log=kw.pop("log", message), resources={},
                         seconds=time.perf_counter() - t0, cached=False, error_line=None,
                         command=command, message=message, **kw)


def _read_cached(entry: Path, t0: float) -> CompileResult | None:
    try:
        meta = json.loads((entry / "result.json").read_text())
        log = (entry / "log.txt").read_text(errors="replace")
    except (OSError, ValueError):
        return None
    lib = entry / _LIB
    if meta.get("ok") and not lib.is_file():
        return None
    return CompileResult(ok=bool(meta["ok"]), lib_path=str(lib) if meta["ok"] else None, log=log,
                         resources=meta.get("resources", {}), seconds=time.perf_counter() - t0,
                         cached=True, error_line=meta.get("error_line"),
                         command=meta.get("command", []), message=meta.get("message", ""),
                         compile_seconds=meta.get("compile_seconds"))


async def compile_candidate(source: str, backend: str, arch: str, cache_dir: str | Path,
                            timeout_s: float = 120.0) -> CompileResult:
    """Compile `source` for `backend`/`arch` into `cache_dir`; never raises for bad input."""
    t0 = time.perf_counter()
    if not isinstance(source, str):
        return _fail(f"source is {type(source).__name__}, not text", [], t0)
    try:
        flags = compile_flags(backend, arch)
    except UsageError as e:
        return _fail(str(e), [], t0)
    compiler, why = _find_compiler(backend)
    if compiler is None:
        return _fail(why, [], t0)
    try:
        mtime = os.stat(compiler).st_mtime
    except OSError:
        mtime = 0.0
    version = await asyncio.to_thread(_compiler_version, compiler, mtime)
    key = _cache_key(source, backend, arch, flags, version)
    cache = Path(os.path.abspath(cache_dir))  # lib_path is handed to a worker with another cwd
    entry = cache / key

    loop = asyncio.get_running_loop()
    while True:
        hit = _read_cached(entry, t0)
        if hit is not None:
            return hit
        shared = _inflight.get(key)
        if shared is None or shared[0] is not loop:
            break
        # Same key already compiling in this loop: wait for it rather than run the compiler twice.
        try:
            res = await asyncio.shield(shared[1])
        except asyncio.CancelledError:
            if not shared[1].cancelled():
                raise  # we were cancelled ourselves
            continue  # the owner was cancelled: look again, compile if nobody else does
        except Exception:
            continue
        hit = _read_cached(entry, t0)
        if hit is not None:
            return hit
        # not cached (a timeout): share the outcome rather than start another long compile
        return CompileResult(**{**asdict(res), "seconds": time.perf_counter() - t0})
    fut: asyncio.Future = loop.create_future()
    _inflight[key] = (loop, fut)
    try:
        res = await _compile_fresh(source, backend, compiler, flags, cache, entry, key,
                                   timeout_s, t0)
        fut.set_result(res)
        return res
    except BaseException as e:
        if not fut.done():
            fut.set_exception(e) if not isinstance(e, asyncio.CancelledError) else fut.cancel()
        raise
    finally:
        if _inflight.get(key, (None, None))[1] is fut:
            del _inflight[key]
        if fut.done() and not fut.cancelled():
            fut.exception()  # mark retrieved: no "exception never retrieved" noise


async def _compile_fresh(source, backend, compiler, flags, cache: Path, entry: Path, key: str,
                         timeout_s: float, t0: float) -> CompileResult:
    ext = _EXT[backend]
    src_name = f"kernel.{ext}"
    command = [compiler, *flags, src_name, "-o", _LIB]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=cache))
    except OSError as e:
        return _fail(f"cannot use cache dir {str(cache)!r}: {e.strerror or e}", command, t0)
    try:
        (work / src_name).write_text(source, encoding="utf-8", errors="surrogatepass")
        env = dict(os.environ, LC_ALL="C", TMPDIR=str(work))
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, cwd=str(work), env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)  # its own process group: a timeout kills cicc/ptxas/cc1plus too
        except OSError as e:
            return _fail(f"cannot run {compiler}: {e.strerror or e}", command, t0)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
        except asyncio.TimeoutError:
            _kill_group(proc)
            await proc.wait()
            return _fail(f"compile timed out after {timeout_s:g} s (compiler process group killed)",
                         command, t0, timed_out=True)
        except BaseException:
            _kill_group(proc)
            raise
        seconds = time.perf_counter() - t0
        log = _clip(out.decode("utf-8", "replace"))
        ok = proc.returncode == 0 and (work / _LIB).is_file()
        error_line = None if ok else parse_error_line(log, src_name)
        resources = parse_ptxas(log) if (ok and backend == "cuda") else {}
        if ok:
            regs = f", {resources['registers']} registers" if resources.get("registers") else ""
            spill = (f", {resources['spill_stores']}+{resources['spill_loads']} bytes spilled"
                     if resources.get("spill_stores") or resources.get("spill_loads") else "")
            message = f"compiled in {seconds:.1f} s{regs}{spill}"
        else:
            first = _first_error(log) or f"compiler exited with status {proc.returncode}"
            message = f"compile error: {first}"
        meta = {"ok": ok, "resources": resources, "error_line": error_line, "command": command,
                "message": message, "compile_seconds": seconds, "returncode": proc.returncode}
        (work / "log.txt").write_text(log)
        (work / "result.json").write_text(json.dumps(meta))
        lib_path = _publish(work, entry)
        work = None  # moved (or discarded in favour of an identical winner)
        return CompileResult(ok=ok, lib_path=str(entry / _LIB) if ok and lib_path else None,
                             log=log, resources=resources, seconds=time.perf_counter() - t0,
                             cached=False, error_line=error_line, command=command,
                             message=message, compile_seconds=seconds)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def _publish(work: Path, entry: Path) -> bool:
    """Move a finished temp dir into place atomically; a concurrent winner's copy is kept."""
    try:
        os.rename(work, entry)
        return True
    except OSError:
        # entry exists: another process (or an earlier broken entry) got there first
        if _read_cached(entry, 0.0) is None:
            shutil.rmtree(entry, ignore_errors=True)
            try:
                os.rename(work, entry)
                return True
            except OSError:
                pass
        shutil.rmtree(work, ignore_errors=True)
        return (entry / _LIB).is_file()


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def compile_candidate_sync(source, backend, arch, cache_dir, timeout_s=120.0) -> CompileResult:
    """Blocking form of compile_candidate (for scripts and worker threads)."""
    coro = compile_candidate(source, backend, arch, cache_dir, timeout_s)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # called from inside a running loop: run on a private loop in another thread
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(asyncio.run, coro).result()
