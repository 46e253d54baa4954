"""The supervisor <-> runner channel: one JSON object per message over a SOCK_SEQPACKET socket
(never pickle: the runner runs untrusted code), descriptors alongside with SCM_RIGHTS."""
from __future__ import annotations

import json
import socket

MSG_MAX = 1 << 22


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


