"""Process-state census of a kernel runner, and the tiny trusted native helper it reads it with.

A candidate's code can run when its library loads (static initialisers, constructors,
`.init_array`) and during every call; what it can leave behind - threads, signal handlers,
timers, open files, executable mappings, a changed floating-point environment - outlives the
call and can do work outside the timed window or poison what runs next. The runner records a
`census()` before it loads the library, after loading, after every call (the cheap parts) and at
the end, and `diff()` says in words what changed.

The floating-point environment (flush-to-zero, denormals-are-zero, rounding mode) is not
visible from Python, so a fixed helper library (`PROBE_SRC`, compiled once per machine with the
host C++ compiler into the compile cache) reads MXCSR / the x87 control word (x86) or FPCR
(aarch64) and `fegetround()`, lists every signal's handler with `sigaction`, and warms the
OpenMP thread pool before the candidate loads (so the pool's threads are part of the baseline,
not "new threads"). Without a compiler the census falls back to a functional test of the FP
environment (denormal arithmetic and rounding of Python floats, which run under the same
MXCSR) and to /proc/self/status for signal dispositions.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

PROBE_SRC = r"""
// kforge trusted runner probe (not candidate code)
#include <signal.h>
#include <string.h>
#include <stdint.h>
#include <fenv.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdlib.h>
#include <omp.h>
#include <sys/syscall.h>
#include <sys/socket.h>
extern "C" {
// The syscall filter's reporter (sandbox/seccomp.py): a call the filter refuses traps here; the
// number goes to the supervisor on the runner's socket and the process exits at once. No libc
// state is touched (no malloc, no stdio, no errno-dependent path).
static int kf_report_fd = -1;
static void kf_on_sigsys(int sig, siginfo_t* si, void* uc) {
    (void)sig; (void)uc;
    char buf[64]; int n = 0;
    const char* head = "{\"ev\": \"sigsys\", \"nr\": ";
    while (*head) buf[n++] = *head++;
    unsigned v = (unsigned)si->si_syscall; char d[12]; int k = 0;
    do { d[k++] = (char)('0' + v % 10); v /= 10; } while (v && k < 11);
    while (k) buf[n++] = d[--k];
    buf[n++] = '}';
    if (kf_report_fd >= 0) syscall(SYS_sendto, kf_report_fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL, 0, 0);
    syscall(SYS_exit_group, 159);
}
int kf_sigsys_arm(int fd) {
    kf_report_fd = fd;
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = kf_on_sigsys; sa.sa_flags = SA_SIGINFO; sigfillset(&sa.sa_mask);
    return sigaction(SIGSYS, &sa, 0);
}
// Zero the dead stack below the caller: what the runner's set-up left there (paths the loader
// copied, argument strings) is not for a kernel that scans its stack.
__attribute__((noinline)) void kf_scrub_stack(void) {
    volatile char buf[256 * 1024];
    for (unsigned i = 0; i < sizeof buf; ++i) buf[i] = 0;
}
// thread count from /proc/self/stat, with no heap allocation (a call must not disturb malloc's
// free lists: a replay kept in a freed block would otherwise be destroyed by luck, not caught)
int kf_num_threads(void) {
    char buf[2048];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char* p = strrchr(buf, ')');
    if (!p) return -1;
    p += 2;
    int field = 3;
    while (*p && field < 20) { if (*p == ' ') ++field; ++p; }
    return atoi(p);
}
int kf_fpenv(uint32_t* out) {
    out[0] = (uint32_t)fegetround(); out[1] = 0; out[2] = 0;
#if defined(__x86_64__) || defined(__i386__)
    uint32_t csr; __asm__ volatile("stmxcsr %0" : "=m"(csr));
    out[1] = csr & 0xFFC0u;  // control bits only: bits 0-5 are sticky exception flags
    uint16_t cw; __asm__ volatile("fnstcw %0" : "=m"(cw));
    out[2] = cw;
#elif defined(__aarch64__)
    uint64_t fpcr; __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    out[1] = (uint32_t)fpcr;
#endif
    return 3;
}
int kf_sigactions(uint64_t* out, int n) {
    for (int s = 1; s <= n; ++s) {
        struct sigaction sa; memset(&sa, 0, sizeof sa);
        if (sigaction(s, NULL, &sa) != 0) { out[2 * (s - 1)] = ~0ull; out[2 * (s - 1) + 1] = 0; continue; }
        out[2 * (s - 1)] = (uint64_t)(uintptr_t)sa.sa_handler;
        out[2 * (s - 1) + 1] = (uint64_t)sa.sa_flags;
    }
    sigset_t cur; sigemptyset(&cur);
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    uint64_t mask = 0;
    for (int s = 1; s <= 64 && s <= n; ++s) if (sigismember(&cur, s) == 1) mask |= 1ull << (s - 1);
    out[2 * n] = mask;
    return n;
}
void kf_omp_warm(int n) {
#pragma omp parallel num_threads(n)
    { volatile int x = omp_get_thread_num(); (void)x; }
}
int kf_omp_max_threads(void) { return omp_get_max_threads(); }
}
"""

NSIG = 64
_VERSION = 4


def _compiler() -> str | None:
    for c in (os.environ.get("KFORGE_CXX"), "g++", "c++", "clang++"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def build(cache_dir: str | Path) -> str | None:
    """Path of the compiled probe (built once per cache dir and compiler), or None."""
    cxx = _compiler()
    if cxx is None:
        return None
    key = hashlib.sha256(f"{_VERSION}\n{cxx}\n{PROBE_SRC}".encode()).hexdigest()[:16]
    out = Path(os.path.abspath(cache_dir)) / "probe" / f"kforge_probe_{key}.so"
    if out.exists():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(PROBE_SRC)
        lib = Path(tmp) / "probe.so"
        r = subprocess.run([cxx, "-O2", "-fPIC", "-shared", "-fopenmp", str(src), "-o", str(lib)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return None
        os.replace(lib, out)
    return str(out)


class Probe:
    """ctypes wrapper of the helper; every method has a pure-Python fallback."""

    def __init__(self, path: str | None):
        self.lib = None
        if path:
            try:
                self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
                self.lib.kf_fpenv.argtypes = [ctypes.POINTER(ctypes.c_uint32)]
                self.lib.kf_sigactions.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
                self.lib.kf_omp_warm.argtypes = [ctypes.c_int]
                self.lib.kf_num_threads.restype = ctypes.c_int
                self.lib.kf_sigsys_arm.argtypes = [ctypes.c_int]
            except (OSError, AttributeError):
                self.lib = None
        self._env = (ctypes.c_uint32 * 3)()
        self._sig = (ctypes.c_uint64 * (2 * NSIG + 1))()
        self._stat = bytearray(4096)

    @property
    def native(self) -> bool:
        return self.lib is not None

    def fpenv(self) -> tuple:
        if self.lib is not None:
            self.lib.kf_fpenv(self._env)
            return ("native", int(self._env[0]), int(self._env[1]), int(self._env[2]))
        return ("functional",) + functional_fpenv()

    def sigactions(self) -> tuple:
        if self.lib is not None:
            self.lib.kf_sigactions(self._sig, NSIG)
            return tuple(int(v) for v in self._sig)
        return _status_sig_fields()

    def num_threads(self) -> int:
        """Threads of this process, without touching the malloc heap (native) or with as little
        as Python allows (fallback)."""
        if self.lib is not None:
            return int(self.lib.kf_num_threads())
        fd = os.open("/proc/self/stat", os.O_RDONLY)
        try:
            n = os.readv(fd, [self._stat])
        finally:
            os.close(fd)
        text = bytes(self._stat[:n])
        return int(text[text.rindex(b")") + 2:].split()[17])

    def arm_sigsys(self, fd: int) -> bool:
        """Report a refused system call's number on `fd` (the runner's socket), then exit
        (sandbox/seccomp.py); False without the native helper (the filter then kills)."""
        return self.lib is not None and self.lib.kf_sigsys_arm(int(fd)) == 0

    def scrub_stack(self) -> None:
        if self.lib is not None:
            self.lib.kf_scrub_stack()

    def omp_warm(self, n: int) -> None:
        if self.lib is not None and n > 0:
            self.lib.kf_omp_warm(int(n))


def functional_fpenv() -> tuple:
    """FTZ/DAZ and rounding seen through arithmetic (Python floats run under the same MXCSR)."""
    import torch

    tiny = torch.tensor([2.0 ** -140], dtype=torch.float32)
    daz_ftz = float((tiny * 1.0)[0]) == 0.0 or float((tiny * 0.5)[0]) == 0.0
    up = (1.0 + 3 * 2.0 ** -54) - 1.0  # 2**-52 under round-to-nearest and upward
    down = (-1.0 - 3 * 2.0 ** -54) + 1.0
    return (daz_ftz, up, down)


def describe_fpenv(before: tuple, after: tuple) -> str:
    """What changed, in words a kernel author understands."""
    if before == after:
        return ""
    if before[0] != "native" or after[0] != "native":
        bits = []
        if before[1:2] != after[1:2]:
            bits.append("denormals now flush to zero" if after[1] else "denormal flushing turned off")
        if before[2:] != after[2:]:
            bits.append("the rounding mode")
        return ", ".join(bits) or "the floating-point environment"
    _, r0, c0, w0 = before
    _, r1, c1, w1 = after
    bits = []
    import platform

    if platform.machine() in ("x86_64", "AMD64", "i386", "i686"):
        if (c0 ^ c1) & (1 << 15):
            bits.append(f"flush-to-zero (FTZ) turned {'on' if c1 & (1 << 15) else 'off'}")
        if (c0 ^ c1) & (1 << 6):
            bits.append(f"denormals-are-zero (DAZ) turned {'on' if c1 & (1 << 6) else 'off'}")
        if (c0 ^ c1) & (3 << 13):
            modes = ("to nearest", "down", "up", "toward zero")
            bits.append(f"SSE rounding changed to {modes[(c1 >> 13) & 3]}")
        if (c0 ^ c1) & 0x1F80:
            bits.append("SSE exception masks changed (MXCSR)")
        if w0 != w1:
            bits.append(f"x87 control word changed ({w0:#x} -> {w1:#x})")
    elif c0 != c1:
        bits.append(f"FPCR changed ({c0:#x} -> {c1:#x}; bit 24 is flush-to-zero)")
    if r0 != r1:
        bits.append("fegetround() changed")
    return ", ".join(bits) or "the floating-point environment"


def _status_sig_fields() -> tuple:
    out = []
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(("SigIgn", "SigCgt", "SigBlk")):
                out.append(line)
    except OSError:
        pass
    return tuple(out)


# --------------------------------------------------------------------------- census

def _proc(pid: int | None) -> str:
    return f"/proc/{pid}" if pid else "/proc/self"


def threads(pid: int | None = None) -> frozenset:
    try:
        return frozenset(os.listdir(f"{_proc(pid)}/task"))
    except OSError:
        return frozenset()


def thread_names(pid: int | None = None) -> dict:
    """tid -> name (comm) of every thread of `pid`."""
    out = {}
    for tid in threads(pid):
        try:
            with open(f"{_proc(pid)}/task/{tid}/comm") as f:
                out[tid] = f.read().strip()
        except OSError:
            pass
    return out


def _fds(pid: int | None = None) -> dict:
    out = {}
    base = f"{_proc(pid)}/fd"
    try:
        for fd in os.listdir(base):
            try:
                out[fd] = os.readlink(f"{base}/{fd}")
            except OSError:
                pass  # the directory's own descriptor, closed by now
    except OSError:
        pass
    return out


def _maps(pid: int | None = None) -> dict:
    """start -> (perms, path) of every mapping that is executable or file-backed."""
    out = {}
    try:
        text = Path(f"{_proc(pid)}/maps").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        rng, perms = parts[0], parts[1]
        path = parts[5].strip() if len(parts) > 5 else ""
        if "x" in perms or (path and not path.startswith("[")):
            out[rng.split("-")[0]] = (perms, path)
    return out


def _itimers() -> tuple:
    return tuple(signal.getitimer(w) for w in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF))


def _posix_timers(pid: int | None = None) -> str:
    try:
        return Path(f"{_proc(pid)}/timers").read_text()
    except OSError:
        return ""


def self_census(probe: Probe) -> dict:
    """What only the process itself can see, with no file access (the runner runs under a
    syscall filter that refuses every open): signal dispositions, interval timers, FP env."""
    return {"signals": probe.sigactions(), "itimers": _itimers(), "fpenv": probe.fpenv()}


def proc_census(pid: int | None = None) -> dict:
    """What /proc says about `pid` (the supervisor reads its runner's from outside, where a
    candidate cannot hide or forge it): threads with names, open files, mappings, POSIX timers."""
    return {"threads": threads(pid), "names": thread_names(pid), "fds": _fds(pid), "maps": _maps(pid),
            "posix_timers": _posix_timers(pid)}


def census(probe: Probe, pid: int | None = None) -> dict:
    """Both halves (a process looking at itself: tests, and the worker's own checks)."""
    return {**proc_census(pid), **self_census(probe)}


# runtime libraries a candidate may legitimately bring in when it loads
_RUNTIME_LIBS = ("libcudart", "libgomp", "libm.", "libm-", "libstdc++", "libgcc_s", "libc.", "libc-",
                 "ld-linux", "libcuda.", "libnvidia-ptxjitcompiler", "libdl", "libpthread", "librt",
                 "libcudadevrt", "libomp", "libiomp")


def _allowed_new_mapping(path: str, lib_path: str | None, allow_dirs: tuple = ()) -> bool:
    if lib_path and path and os.path.realpath(path) == os.path.realpath(lib_path):
        return True
    if path and allow_dirs:
        real = os.path.realpath(path)
        if any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in allow_dirs):
            return True
    base = os.path.basename(path)
    return any(base.startswith(p) for p in _RUNTIME_LIBS)


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def diff(before: dict, after: dict, lib_path: str | None = None, *, at_load: bool = False,
         allow_dirs: tuple = (), handler_code: tuple = ()) -> list[str]:
    """Human-readable changes from `before` to `after` (FP environment excluded: see fp_diff).
    `allow_dirs`: directories whose files may be newly mapped executable (a Triton candidate's
    own directory, where Triton writes its compiled kernels, and installed Python code).
    `handler_code`: (start, end) ranges of an installed library's code; a signal handler that
    now points there is that library's own (LLVM's crash handlers, installed by Triton's first
    compile in a process), never code a candidate wrote."""
    out = []
    new_t = after["threads"] - before["threads"] if "threads" in before and "threads" in after else ()
    if new_t:
        out.append(f"{len(new_t)} new thread{'s' if len(new_t) > 1 else ''} left running")
    sb, sa = before.get("signals"), after.get("signals")
    if sb is not None and sa is not None and sb != sa:
        if len(sb) == len(sa) == 2 * NSIG + 1 and all(isinstance(x, int) for x in sb + sa):
            def library_own(h: int) -> bool:
                return any(lo <= h < hi for lo, hi in handler_code)

            changed = [_signame(s) for s in range(1, NSIG + 1)
                       if (sb[2 * (s - 1)] != sa[2 * (s - 1)] or sb[2 * (s - 1) + 1] != sa[2 * (s - 1) + 1])
                       and not library_own(sa[2 * (s - 1)])]
            if changed:
                out.append("signal handler changed for " + ", ".join(changed[:6]))
            if sb[-1] != sa[-1]:
                out.append("the blocked-signal mask changed")
        else:
            out.append("signal dispositions changed")
    names = ("ITIMER_REAL (alarm)", "ITIMER_VIRTUAL", "ITIMER_PROF")
    for n, b, a in zip(names, before.get("itimers", ()), after.get("itimers", ())):
        if (a[0] > 0 or a[1] > 0) and not (b[0] > 0 or b[1] > 0):
            out.append(f"interval timer {n} armed")
    pb, pa = before.get("posix_timers", ""), after.get("posix_timers", "")
    if pa != pb and pa.strip():
        out.append("a POSIX timer was created")
    if "fds" not in before or "fds" not in after:
        return out
    new_fds = {k: v for k, v in after["fds"].items() if before["fds"].get(k) != v}
    # the directory listing's own descriptor, and the GPU driver's device files
    new_fds = {k: v for k, v in new_fds.items()
               if not v.startswith(("/proc/", "/dev/nvidia", "anon_inode:[eventfd]", "/dev/dri"))}
    if new_fds:
        shown = ", ".join(f"{k} -> {v}" for k, v in list(new_fds.items())[:3])
        out.append(f"{len(new_fds)} new open file descriptor{'s' if len(new_fds) > 1 else ''} ({shown})")
    mb, ma = before["maps"], after["maps"]
    bad = []
    for start, (perms, path) in ma.items():
        old = mb.get(start)
        if old is None:
            if "x" in perms and not _allowed_new_mapping(path, lib_path, allow_dirs):
                bad.append(f"new executable mapping {path or '(anonymous)'} {perms}")
        elif old[0] != perms and ("x" in perms or "x" in old[0]):
            bad.append(f"permissions of {path or start} changed {old[0]} -> {perms}")
    if bad:
        out.append("; ".join(bad[:3]))
    return out


def fp_diff(before: dict | tuple, after: dict | tuple) -> str:
    b = before["fpenv"] if isinstance(before, dict) else before
    a = after["fpenv"] if isinstance(after, dict) else after
    return describe_fpenv(b, a)
