"""How the engine starts its helper processes (workers, the Triton compile-ahead server): as
`python -m MODULE` would, but dead with the process that started them."""
from __future__ import annotations

import os
import sys

# `python -c` trampoline: ask the kernel for SIGKILL when the parent dies (prctl 1 =
# PR_SET_PDEATHSIG), exit at once if the parent (argv[1]) is already gone, then run the module
# (argv[2]) as `-m` would. Linux only; elsewhere it just runs the module.
_DIE_WITH_PARENT = (
    "import os, runpy, signal, sys\n"
    "try:\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "sys.argv = sys.argv[2:]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def die_with_parent(module: str, *args: str) -> list[str]:
    """The command line that runs `module` as `python -m` would, killed when this process dies
    (an owner killed with `kill -9` left its workers running under init)."""
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), module, *args]
