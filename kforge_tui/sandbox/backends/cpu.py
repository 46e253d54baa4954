"""The cpu backend of the worker: wall-clock timing, LLC flush, memcpy bandwidth, no stream.

Candidates are C++ compiled with -fopenmp; their DT_NEEDED libgomp.so.1 resolves to the
runtime torch already loaded (same soname). The worker sets OMP_NUM_THREADS and
OMP_THREAD_LIMIT to one count before torch is imported (worker.thread_env()), so torch and candidates
use the same cores and a candidate's `num_threads(64)` cannot grow the thread pool: the runner
warms the pool to that size before the candidate loads, and any thread that appears afterwards
is the candidate's (sandbox/backends/probe.py).
"""
from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import torch

# Flushing a buffer of 2x the LLC each call is the textbook recipe, but VMs report odd LLC
# sizes (this CI box says 300 MB for 2 cores) and a flush that large would dominate a batch;
# 32 MiB exceeds any per-core share of a real LLC. KFORGE_CPU_FLUSH_BYTES overrides.
MAX_FLUSH = 32 * 2**20


def available_bytes() -> int:
    """MemAvailable (what can be allocated without swapping), else total RAM."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def llc_bytes() -> int:
    """The last-level cache: KFORGE_CPU_LLC_BYTES, else the largest cache sysfs lists for cpu0
    (a VM may list its host's, or none: 32 MiB then). It sets the flush buffer and when a set
    is too big for rotating sets to matter (supervisor.plan_sets)."""
    from kforge_tui.sandbox.settings import setting

    if setting("KFORGE_CPU_LLC_BYTES"):
        return int(setting("KFORGE_CPU_LLC_BYTES"))
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        try:
            best = max(best, int(size.rstrip("KMG")) * mult)
        except ValueError:
            pass
    return best or 32 * 2**20


class CpuBackend:
    # Calls are synchronous: the wall time of the call is all there is (host and compute).
    clock = "wall"
    name = "cpu"
    has_stream = False

    def __init__(self, device_index: int = 0):
        self.device = torch.device("cpu")
        self.threads = torch.get_num_threads()
        self.llc = llc_bytes()
        self.cache_bytes = self.llc
        from kforge_tui.sandbox.settings import setting

        nbytes = int(setting("KFORGE_CPU_FLUSH_BYTES") or min(2 * self.llc, MAX_FLUSH))
        self._flush_buf = torch.zeros(nbytes // 4, dtype=torch.float32)
        self.flush_bytes = nbytes

    def setup(self) -> None:
        os.environ["OMP_NUM_THREADS"] = str(self.threads)

    def describe(self) -> str:
        from kforge_tui.device import device_info

        return f"{device_info('cpu').name}, {self.threads} threads"

    def arch(self) -> str:
        return "native"

    # -- calls
    def stream_handle(self):
        return None

    def stream_context(self):
        import contextlib

        return contextlib.nullcontext()

    def sync(self) -> None:
        """Nothing is asynchronous on the cpu: a candidate's call has returned when we look."""

    def check_device(self) -> None:
        """No device context that a candidate can corrupt on the cpu."""

    def sync_all(self) -> None:
        """Everything is synchronous on the cpu."""

    # -- memory (issue 14: the number of input sets follows free memory)
    def free_bytes(self) -> int:
        return available_bytes()

    def total_bytes(self) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def reserve_bytes(self, spares: int = 1) -> int:
        """Kept free: the runner processes (forked, copy-on-write) and the OS."""
        return 512 * 2**20 * (1 + spares) + self.total_bytes() // 20

    def new_arena(self, nbytes: int):
        from kforge_tui.sandbox.backends.arena import HostArena

        return HostArena(nbytes)

    def empty_cache(self) -> None:
        pass

    def error_name(self, rc: int) -> str:
        return f"{rc}"

    # -- timing
    def flush(self) -> None:
        self._flush_buf.add_(1.0)

    def start(self):
        return time.perf_counter_ns()

    def end(self, tok) -> float:
        """Calls are synchronous on the cpu: the time is known at once."""
        return (time.perf_counter_ns() - tok) / 1e3

    def elapsed(self, tok: float) -> float:
        return tok

    def stop(self, tok) -> float:
        return self.elapsed(self.end(tok))

    def timing_method(self, sets: int) -> str:
        return (f"wall clock (perf_counter_ns), {self.flush_bytes // 2**20} MiB cache flush, "
                f"{sets} input sets rotated, {self.threads} threads")


    # -- roofline
    def bandwidth_key(self) -> str:
        return f"cpu:{self.describe()}"

    def measure_bandwidth(self) -> tuple[float, str]:
        """The floor's bandwidth: device.cpu_bandwidth at this worker's thread count."""
        from kforge_tui.device import cpu_bandwidth

        return cpu_bandwidth(self.threads)


def load_library(path: str):
    return ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
