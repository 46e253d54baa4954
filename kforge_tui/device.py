"""Facts about the machine the kernels are for: which backend, which GPU, which compiler target.

Read once per process and cached. Importing torch is deferred so `kforge --help` stays fast.
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
from dataclasses import asdict, dataclass

from kforge_tui.errors import UsageError


@dataclass(frozen=True)
class DeviceInfo:
    backend: str  # "cuda" | "cpu"
    name: str
    arch: str  # "sm_90" for cuda, "native" for cpu
    sms: int = 0  # multiprocessors (cuda) or logical cores (cpu)
    compute_capability: str = ""
    memory_gb: float = 0.0
    l2_bytes: int = 0
    peak_bandwidth_gbs: float = 0.0  # datasheet-ish lead; the worker measures the real one

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.backend == "cuda":
            return (f"{self.name} (sm_{self.compute_capability.replace('.', '')}, {self.sms} SMs, "
                    f"{self.memory_gb:.0f} GB, L2 {self.l2_bytes // 2**20} MB)")
        return f"{self.name} ({self.sms} cores)"


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def release_cached_memory() -> None:
    """Give the device memory this process's PyTorch keeps cached back to the driver. The
    sandbox's workers are other processes: what the caching allocator holds here after the
    profile is not free to them (a 6-7 GiB KernelBench task's capture and profile left 107-138
    of 140 GiB held in the engine, and the workers' baselines ran out of memory: H200)."""
    import gc
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    gc.collect()
    torch.cuda.empty_cache()


def default_backend() -> str:
    """DESIGN.md: --device defaults to cuda when a GPU is visible, else cpu."""
    return "cuda" if cuda_available() else "cpu"


def resolve_backend(requested: str | None) -> str:
    if requested in (None, "", "auto"):
        return default_backend()
    if requested not in ("cuda", "cpu"):
        raise UsageError(f"--device must be cuda or cpu, not {requested!r}")
    if requested == "cuda" and not cuda_available():
        raise UsageError("--device cuda asked for, but no CUDA GPU is visible to torch "
                         "(install a CUDA build of torch, check nvidia-smi, or use --device cpu)")
    return requested


@functools.lru_cache(maxsize=None)
def device_info(backend: str) -> DeviceInfo:
    if backend == "cuda":
        import torch

        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        cc = f"{p.major}.{p.minor}"
        l2 = int(getattr(p, "L2_cache_size", 0) or 0)
        return DeviceInfo("cuda", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, cc,
                          p.total_memory / 1e9, l2, 0.0)
    return DeviceInfo("cpu", _cpu_name(), "native", os.cpu_count() or 1, "", 0.0, 0, 0.0)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvcc_path() -> str | None:
    for cand in (os.environ.get("KFORGE_NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


def cxx_path() -> str | None:
    for cand in (os.environ.get("KFORGE_CXX"), os.environ.get("CXX"), shutil.which("g++"),
                 shutil.which("c++"), shutil.which("clang++")):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def cpu_bandwidth(threads: int) -> tuple[float, str]:
    """This cpu's bandwidth in GB/s as a floor's lower bound, and how it was read: the best of a
    256 MiB copy (read + write bytes), a 256 MiB read-only sum and a 1 MiB copy that stays in
    cache (one thread, scaled by `threads`) - best run of each.

    A floor must never be above what an honest kernel can reach. On a cpu the cache flush is
    not guaranteed to evict everything (VMs misreport the LLC, a 32 MiB flush is a compromise)
    and a busy box measures DRAM bandwidth low, so the cache-resident rate bounds it: the cpu
    floor then only catches the grossly impossible (an empty timed region), which is what it is
    for. The sandbox's floor and the profile's (headroom, "at its floor") are this one figure:
    a DRAM copy alone put the profile's floors above eager times (an add of 49.7 us at 76.1)."""
    import time

    import torch

    def best(n_floats: int, reps: int, fn) -> float:
        src = torch.ones(n_floats, dtype=torch.float32)
        dst = torch.empty_like(src)
        fn(src, dst)
        top = 0.0
        for _ in range(reps):
            t = time.perf_counter()
            nbytes = fn(src, dst)
            top = max(top, nbytes / (time.perf_counter() - t) / 1e9)
        return top

    def copy(src, dst):
        dst.copy_(src)
        return 2 * src.numel() * 4

    def read(src, dst):
        src.sum()
        return src.numel() * 4

    big = 64 * 2**20  # float32 elements: 256 MiB
    dram_copy, dram_read = best(big, 5, copy), best(big, 5, read)
    # cache-resident: one thread (no wake-ups to measure), scaled by the thread count
    hot = best(256 * 1024, 50, lambda src, dst: (dst.numpy().__setitem__(slice(None), src.numpy()),
                                                 2 * src.numel() * 4)[1]) * threads
    gbs = max(dram_copy, dram_read, hot)
    return gbs, (f"cpu bandwidth {gbs:.1f} GB/s (best of 256 MiB copy {dram_copy:.1f}, read "
                 f"{dram_read:.1f}, cache-resident 1 MiB copy {hot:.1f} (1 thread x {threads}); {threads} threads)")
