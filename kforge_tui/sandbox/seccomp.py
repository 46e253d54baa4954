"""The runner's system-call filter (seccomp-BPF): what candidate code cannot reach, by construction.

Every rule that works by names (forbidden calls, imports, "address of an import", no host asm)
is blind to a kernel that finds a `syscall; ret` sequence in code already loaded and calls it
through a pointer (issue 21). Only the kernel can stop that, so every runner installs an
allow-list filter before candidate code runs; any other system call traps, a trusted handler
(the probe library, sandbox/backends/probe.py) reports its number on the runner's socket, and
the runner exits (status 159). Where the probe could not be built the filter kills the process
outright (SIGSYS, number unknown).

Two filters, stacked (a filter can only add restrictions to the ones before it):
  LOAD  before the candidate library is loaded (C candidates): what the runner needs from then
        on plus the dynamic loader's read-only `openat`, `newfstatat`, `lseek`, and `seccomp`
        itself to add the second filter. A library has no load-time code of its own (the binary
        check refuses it), so nothing of the candidate's runs with more than this.
  RUN   once the library is loaded (or a Triton candidate made its first call: Triton's JIT runs
        a compiler and writes its cache, so it comes before any filter; the AST check guards
        that code): memory, futexes, clocks, the socket to the supervisor, reading signal
        dispositions, exit - and on cuda the driver's ioctls, eventfds and its own threads. No
        open, stat, exec, fork, kill, ptrace, prctl, socket, signal handler, timer or seccomp.

The process census that reads /proc runs in the supervisor for that reason (it reads
/proc/<runner>/...; the runner keeps only what has no system call: the FP environment and its
signal dispositions, read with rt_sigaction(sig, NULL, &old)).

Hand-built BPF rather than a library: PyPI's pyseccomp is a ctypes binding to libseccomp.so.2,
a native library every GPU host would need besides; the program here is ~60 instructions over
two architectures and needs only prctl/seccomp from libc. `KFORGE_SECCOMP=0` turns the filter
off (diagnosis of a GPU driver that needs a call the list lacks; never in production).
"""
from __future__ import annotations

import ctypes
import platform
import re

# --- the architectures (seccomp_data.arch) and the system calls we name, per architecture
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000
_NR = {  # name -> (x86_64, aarch64); -1: does not exist there
    "read": (0, 63), "write": (1, 64), "close": (3, 57), "fstat": (5, 80), "poll": (7, -1),
    "lseek": (8, 62), "mmap": (9, 222), "mprotect": (10, 226), "munmap": (11, 215), "brk": (12, 214),
    "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139),
    "ioctl": (16, 29), "pread64": (17, 67), "readv": (19, 65), "writev": (20, 66),
    "sched_yield": (24, 124), "mremap": (25, 216), "madvise": (28, 233), "nanosleep": (35, 101),
    "getitimer": (36, 102), "getpid": (39, 172), "sendto": (44, 206), "recvfrom": (45, 207),
    "sendmsg": (46, 211), "recvmsg": (47, 212), "clone": (56, 220), "exit": (60, 93),
    "fcntl": (72, 25), "gettimeofday": (96, 169), "gettid": (186, 178), "futex": (202, 98),
    "sched_getaffinity": (204, 123), "clock_gettime": (228, 113), "clock_getres": (229, 114),
    "clock_nanosleep": (230, 115), "exit_group": (231, 94), "openat": (257, 56),
    "newfstatat": (262, 79), "ppoll": (271, 73), "set_robust_list": (273, 99),
    "eventfd2": (290, 19), "getcpu": (309, 168), "seccomp": (317, 277), "getrandom": (318, 278),
    "membarrier": (324, 283), "rseq": (334, 293), "clone3": (435, 435), "epoll_wait": (232, -1),
    "epoll_pwait": (281, 22), "epoll_ctl": (233, 21), "epoll_create1": (291, 20), "pipe2": (293, 59),
    "prctl": (157, 167), "sigaltstack": (131, 132), "setitimer": (38, 103), "kill": (62, 129),
    "tgkill": (234, 131), "socket": (41, 198), "connect": (42, 203), "execve": (59, 221),
    "wait4": (61, 260), "ptrace": (101, 117), "readlinkat": (267, 78), "getdents64": (217, 61),
    "uname": (63, 160), "sysinfo": (99, 179), "prlimit64": (302, 261), "memfd_create": (319, 279),
    "timer_create": (222, 107), "dup": (32, 23), "dup3": (292, 24), "open": (2, -1),
    "fork": (57, -1), "vfork": (58, -1), "readlink": (89, -1), "stat": (4, -1), "getppid": (110, 173),
}
# What the runner needs once the candidate is loaded (every backend)
RUN = ("read", "write", "readv", "writev", "pread64", "close", "fstat", "lseek", "recvfrom",
       "recvmsg", "sendto", "sendmsg", "poll", "ppoll", "mmap", "munmap", "mremap", "madvise", "brk",
       "mprotect", "futex", "sched_yield", "nanosleep", "clock_nanosleep", "clock_gettime",
       "clock_getres", "gettimeofday", "rt_sigprocmask", "rt_sigreturn", "getpid", "gettid",
       "getrandom", "getitimer", "exit", "exit_group", "fcntl", "sched_getaffinity", "getcpu",
       "membarrier", "rseq", "set_robust_list")
# ... and on cuda the driver's: its device files' ioctls, eventfds/epoll, and threads it starts
# lazily (cuda-*; the census in the supervisor tells them from a candidate's by name)
RUN_CUDA = ("ioctl", "eventfd2", "epoll_wait", "epoll_pwait", "epoll_ctl", "epoll_create1", "pipe2")
# ... and before the library is loaded, the dynamic loader's (read-only opens) and the second filter
LOAD = ("newfstatat", "seccomp")

_O_WRITE_FLAGS = 0o3 | 0o100 | 0o1000 | 0o2000 | 0o20000000 | 0o200  # ACCMODE CREAT TRUNC APPEND TMPFILE EXCL
_CLONE_THREAD = 0x10000
_ENOSYS = 38

# BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_JGE_K = 0x35
RET_ALLOW, RET_TRAP, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x00030000, 0x80000000, 0x00050000
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_PR_SET_NO_NEW_PRIVS = 38
EXIT_STATUS = 159  # the probe's SIGSYS handler exits with this status after reporting


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def arch() -> str | None:
    m = platform.machine()
    return {"AMD64": "x86_64", "arm64": "aarch64"}.get(m, m) if m in AUDIT_ARCH or m in ("AMD64", "arm64") else None


def enabled() -> bool:
    from kforge_tui.sandbox.settings import setting

    return (setting("KFORGE_SECCOMP") or "1") not in ("0", "off", "false") and arch() is not None


def _arg_lo(i: int) -> int:
    return 16 + 8 * i  # seccomp_data.args[i], low 32 bits (little-endian)


def program(names: tuple[str, ...], *, read_only_openat: bool = False, thread_clone: bool = False,
            default: int = RET_TRAP, pid: int | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for this machine's architecture.

    Plain allowed calls are one compare each; three calls are allowed with argument checks:
    rt_sigaction only when it installs nothing (act == NULL: reading a disposition), openat only
    without any write, create or truncate flag (`read_only_openat`), clone only for a thread
    (`thread_clone`: CLONE_THREAD set; the CUDA driver starts threads lazily), and tgkill only to
    this process (`pid`: abort() and a crash raise their signal that way; no other process can be
    signalled). clone3 hides its flags in memory, so it fails with ENOSYS and glibc falls back to
    clone."""
    a = arch()
    if a is None:
        raise OSError(f"no seccomp filter for {platform.machine()}")
    col = 0 if a == "x86_64" else 1
    nr = {n: v[col] for n, v in _NR.items() if v[col] >= 0}
    plain = sorted({nr[n] for n in names if n in nr})
    out: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, AUDIT_ARCH[a]),
                                            (_RET_K, 0, 0, RET_KILL_PROCESS), (_LD_W_ABS, 0, 0, 0)]
    if a == "x86_64":  # x32 system calls (nr | 0x40000000) are another table: refuse them all
        out += [(_JGE_K, 0, 1, X32_BIT), (_RET_K, 0, 0, RET_KILL_PROCESS)]
    # argument-checked calls: a compare that skips the body when the number differs (the
    # accumulator still holds it then); every path through a body returns
    bodies = [(nr["rt_sigaction"], [(_LD_W_ABS, 0, 0, _arg_lo(1)), (_JEQ_K, 0, 3, 0),
                                    (_LD_W_ABS, 0, 0, _arg_lo(1) + 4), (_JEQ_K, 0, 1, 0),
                                    (_RET_K, 0, 0, RET_ALLOW), (_RET_K, 0, 0, default)])]
    if read_only_openat:
        bodies.append((nr["openat"], [(_LD_W_ABS, 0, 0, _arg_lo(2)), (_JSET_K, 1, 0, _O_WRITE_FLAGS),
                                      (_RET_K, 0, 0, RET_ALLOW), (_RET_K, 0, 0, default)]))
    if thread_clone:
        bodies.append((nr["clone"], [(_LD_W_ABS, 0, 0, _arg_lo(0)), (_JSET_K, 0, 1, _CLONE_THREAD),
                                     (_RET_K, 0, 0, RET_ALLOW), (_RET_K, 0, 0, default)]))
    if pid is not None:
        bodies.append((nr["tgkill"], [(_LD_W_ABS, 0, 0, _arg_lo(0)), (_JEQ_K, 0, 3, pid),
                                      (_LD_W_ABS, 0, 0, _arg_lo(0) + 4), (_JEQ_K, 0, 1, 0),
                                      (_RET_K, 0, 0, RET_ALLOW), (_RET_K, 0, 0, default)]))
    for number, body in bodies:
        out.append((_JEQ_K, 0, len(body), number))
        out += body
    out.append((_JEQ_K, 0, 1, nr["clone3"]))
    out.append((_RET_K, 0, 0, RET_ERRNO | _ENOSYS))
    for i, number in enumerate(plain):
        left = len(plain) - i  # instructions after this compare until the allow: left - 1 compares + default
        out.append((_JEQ_K, left, 0, number))
    out.append((_RET_K, 0, 0, default))
    out.append((_RET_K, 0, 0, RET_ALLOW))
    return out


_no_new_privs = False


def install(names: tuple[str, ...], **kw) -> None:
    """Install a filter on every thread of this process (TSYNC); raises OSError when the kernel
    refuses. `no_new_privs` is set first (an unprivileged filter needs it)."""
    prog = program(names, **kw)
    arr = (_Filter * len(prog))(*[_Filter(c, jt, jf, k) for c, jt, jf, k in prog])
    fprog = _Prog(len(prog), arr)
    libc = ctypes.CDLL(None, use_errno=True)
    global _no_new_privs
    if not _no_new_privs:  # once: a filter already installed refuses prctl
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        _no_new_privs = True
    sys_nr = _NR["seccomp"][0 if arch() == "x86_64" else 1]
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(sys_nr), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog))
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"seccomp(SET_MODE_FILTER) returned {rc}")


def load_filter(backend: str, report: bool) -> None:
    """Before the candidate library is loaded."""
    import os

    install(RUN + (RUN_CUDA if backend == "cuda" else ()) + LOAD, read_only_openat=True,
            thread_clone=backend == "cuda", default=RET_TRAP if report else RET_KILL_PROCESS,
            pid=os.getpid())


def run_filter(backend: str, report: bool) -> None:
    """Once the candidate is loaded (C) or has made its first call (Triton)."""
    import os

    install(RUN + (RUN_CUDA if backend == "cuda" else ()), thread_clone=backend == "cuda",
            default=RET_TRAP if report else RET_KILL_PROCESS, pid=os.getpid())


_NAMES: dict[int, str] | None = None


def name(number: int) -> str:
    """`openat` for 257 on x86_64 (this machine's table; the kernel headers when present)."""
    global _NAMES
    if _NAMES is None:
        col = 0 if arch() == "x86_64" else 1
        _NAMES = {v[col]: n for n, v in _NR.items() if v[col] >= 0}
        for path in ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h",
                     "/usr/include/asm-generic/unistd.h"):
            if (arch() == "x86_64") != ("64.h" in path):
                continue
            try:
                for m in re.finditer(r"#define __NR3?2?_(\w+)\s+(\d+)", open(path).read()):
                    _NAMES.setdefault(int(m.group(2)), m.group(1))
            except OSError:
                continue
    return _NAMES.get(int(number), f"system call {number}")


def describe(number: int | None) -> str:
    """The one-line verdict for a runner the filter stopped."""
    if number is None:
        return ("the kernel made a system call the sandbox does not allow (its process was killed "
                "by the syscall filter; number not reported)")
    return (f"the kernel made a system call the sandbox does not allow: {name(number)} (number "
            f"{number}); its process was killed by the syscall filter")
