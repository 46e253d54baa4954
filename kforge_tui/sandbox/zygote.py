"""The zygote: forked from the supervisor right after imports, before any OpenMP thread, CUDA
context or task data exists (GNU OpenMP and CUDA do not survive a fork once used); it makes
itself look like any Python process (issue 21: no sandbox word in argv, environment or stack) and
forks one runner per candidate (sandbox/runner.py)."""
from __future__ import annotations

import os
import re
import select
import signal
import socket
import sys
import time
import traceback

from kforge_tui.sandbox.channel import RunnerGone, recv, send

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
        self.dying: list[int] = []  # runners killed without waiting (`RunnerHandle.kill(wait=False)`)

    def reap_dying(self) -> None:
        """Wait until every runner killed without waiting is gone (its CUDA context torn down:
        a process ends only after its files, the driver's among them, are released)."""
        while self.dying:
            self.status(self.dying.pop())

    def spawn(self, args: dict):
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


# Words that name the sandbox: none may be in a runner's command line, environment or stack,
# or a kernel could tell the harness from a real forward by looking (issue 21).
SANDBOX_WORDS = re.compile(r"kforge|sandbox|zygote|runner|supervisor|harness|verif|cheat|candidate",
                           re.IGNORECASE)


def _plain_process() -> None:
    """Make the zygote (and so every runner) look like any Python process: variables whose
    name or value names the sandbox leave the environment (the KFORGE_* settings are kept in
    sandbox/settings.py first), the others are re-set so libc's environment points at copies, and the
    original argument and environment strings at the top of the stack are zeroed, argv reading
    "python3" (/proc/self/cmdline, a scan of the stack)."""
    import ctypes

    from kforge_tui.sandbox import settings

    settings.keep()
    for k in list(os.environ):
        if SANDBOX_WORDS.search(k) or SANDBOX_WORDS.search(os.environ.get(k, "")):
            del os.environ[k]
    for k, v in list(os.environ.items()):
        os.environ[k] = v  # setenv: a heap copy; the stack's string is no longer referenced
    fields = _stat_fields("self")
    if not fields or len(fields) < 49:
        return  # no /proc, or a kernel older than 3.5 (no arg_start..env_end)
    # 0-based from `state` (field 3): arg_start is field 48
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    if env_end > env_start:
        ctypes.memset(env_start, 0, env_end - env_start)
    if arg_end > arg_start:
        ctypes.memset(arg_start, 0, arg_end - arg_start)
        name = b"python3"
        ctypes.memmove(arg_start, name, min(len(name), arg_end - arg_start - 1))
    sys.argv[:] = ["python3"]
    try:
        sys.orig_argv[:] = ["python3"]
    except (AttributeError, TypeError):
        pass


def _zygote_main(sock: socket.socket, backend: str, device: int) -> None:
    _plain_process()
    statuses: dict[int, int] = {}
    live: set[int] = set()  # runners forked and not yet reaped
    try:
        _serve(sock, backend, device, statuses, live)
    finally:
        # The worker is gone (its socket closed) or this loop failed: no runner may outlive
        # it. A spare the worker stopped for a timed window (SIGSTOP, `RunnerHandle.pause`)
        # would otherwise wait stopped forever, under init, for a SIGCONT no one sends; a busy
        # one would finish its candidate for no one. SIGKILL ends a stopped process too.
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _serve(sock: socket.socket, backend: str, device: int, statuses: dict[int, int],
           live: set[int]) -> None:
    """Fork a runner per `spawn`, report a runner's exit status per `status`, until the
    worker's socket closes."""
    from kforge_tui.sandbox.runner import _runner_main

    def reap(block_pid: int | None = None) -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            statuses[pid] = os.waitstatus_to_exitcode(st)
            live.discard(pid)
        if block_pid is not None and block_pid not in statuses:
            try:
                _, st = os.waitpid(block_pid, 0)
                statuses[block_pid] = os.waitstatus_to_exitcode(st)
            except ChildProcessError:
                pass
            live.discard(block_pid)

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
            live.add(pid)
            for fd in fds:
                os.close(fd)
            send(sock, {"pid": pid})
        elif req.get("cmd") == "status":
            pid = int(req["pid"])
            reap(pid)
            send(sock, {"status": statuses.pop(pid, None)})



def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and parentheses),
    from `state` on; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _proc_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, T ...), None when it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


class RunnerHandle:
    def __init__(self, pid: int, sock: socket.socket, zygote: Zygote):
        self.pid = pid
        self.sock = sock
        self.zygote = zygote
        self.ready = False
        self.error = ""
        self.started = time.perf_counter()

    def poll_ready(self) -> bool:
        """Whether the runner has finished starting, without waiting (its start message, or its
        failure, is then read by `wait_ready`)."""
        if self.ready:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True  # a closed socket: `wait_ready` reports it
        return bool(readable) and self.wait_ready(1.0)

    def pause(self, wait_s: float = 0.2) -> bool:
        """Stop a runner that is still starting (`Worker._spares_paused`): SIGSTOP, then wait
        until the kernel shows it stopped (a signal is delivered asynchronously: until then it
        still runs). False when it has already ended."""
        try:
            os.kill(self.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        end = time.perf_counter() + wait_s
        while True:
            state = _proc_state(self.pid)
            if state in ("T", "t", "Z", "X", None) or time.perf_counter() > end:
                return state not in ("Z", "X", None)
            time.sleep(0.0002)

    def resume(self) -> None:
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

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

    def kill(self, wait: bool = True) -> int | None:
        """SIGKILL; with wait, its exit status once it is gone. Without, the zygote reaps it
        later (`Zygote.reap_dying`, before anything is timed): a used runner's teardown (a CUDA
        context: tens of ms) then overlaps the next candidate's load instead of delaying it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        if not wait:
            self.zygote.dying.append(self.pid)
            return None
        return self.zygote.status(self.pid)

    def exit_status(self) -> int | None:
        try:
            self.sock.close()
        except OSError:
            pass
        st = self.zygote.status(self.pid)
        return st


