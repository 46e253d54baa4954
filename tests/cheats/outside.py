"""Run one cheat from this corpus plainly - no sandbox: built with g++ and no checks, loaded with
ctypes into this ordinary process, called on ordinary tensors - and show that it cheats here.

    python3 tests/cheats/outside.py NAME [NAME ...]      # prints one JSON line per cheat

A cheat's third header line says what to show (`// outside: wrong | replay`):
  wrong   40 calls back to back on one set of buffers, new input values each time (buffers have
          room after them, as a caching allocator's blocks do); cheats when any call's output
          differs from PyTorch's softmax.
  replay  the same inputs 20 times, then 20 new inputs; cheats when the repeated calls are at least
          twice as fast (a result cache the timing loop would feed).
Issue 21: a cheat counts only when it is shown to cheat outside the sandbox.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import torch  # noqa: E402

from kforge_tui.regions.build import task_of  # noqa: E402


def task():
    return task_of(lambda x: torch.softmax(x, -1), (torch.randn(32, 256),), backend="cpu")


def build(path: Path, t) -> str:
    d = Path(tempfile.mkdtemp())
    (d / "kforge_region.h").write_text(t.header())
    (d / "k.cpp").write_text(path.read_text())
    subprocess.run(["g++", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                    str(d / "k.cpp"), "-o", str(d / "k.so")], check=True, capture_output=True)
    return str(d / "k.so")


def show(name: str) -> dict:
    path = HERE / f"{name}.cpp"
    m = re.search(r"^//\s*outside:\s*(\w+)", path.read_text(), re.M)
    kind = m.group(1) if m else ""
    t = task()
    lib = ctypes.CDLL(build(path, t))
    fn = lib.kforge_launch
    sig = t.signature()
    fn.restype, fn.argtypes = ctypes.c_int, sig.argtypes()
    x = torch.randn(32, 256)
    ystore = torch.zeros(32 * 256 + 65536)  # room after the output
    y = ystore[:32 * 256].view(32, 256)
    args = sig.call_args([x], [y], None)
    if kind == "wrong":
        bad = 0
        for i in range(40):
            x.copy_(torch.randn(32, 256) * 3)
            y.fill_(0.0)
            fn(*args)
            time.sleep(0.0005 if i % 2 else 0.0)
            if not torch.allclose(y, torch.softmax(x, -1), rtol=1e-4, atol=1e-5):
                bad += 1
        return {"cheat": name, "kind": kind, "cheats": bad > 0, "wrong_calls": bad, "calls": 40}
    if kind == "replay":
        def times(fresh: bool) -> list[float]:
            out = []
            for _ in range(20):
                if fresh:
                    x.copy_(torch.randn(32, 256))
                t0 = time.perf_counter()
                fn(*args)
                out.append(time.perf_counter() - t0)
                assert torch.allclose(y, torch.softmax(x, -1), rtol=1e-4, atol=1e-5)
            return out
        same, new = statistics.median(times(False)), statistics.median(times(True))
        return {"cheat": name, "kind": kind, "cheats": same * 2 <= new, "repeat_us": same * 1e6,
                "new_us": new * 1e6, "speedup_on_repeats": new / max(same, 1e-12)}
    return {"cheat": name, "kind": kind, "cheats": False, "error": "no `// outside:` line"}


if __name__ == "__main__":
    os.environ.pop("KFORGE_WORKER_PROCESS", None)
    for n in sys.argv[1:]:
        print(json.dumps(show(n)), flush=True)
