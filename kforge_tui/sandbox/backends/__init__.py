"""Device backends of the sandbox (cpu, cuda): device, clock, cache flush, memory, arenas."""
from __future__ import annotations


def make_backend(name: str, device: int):
    """The device backend by name (cuda or cpu)."""
    if name == "cuda":
        from kforge_tui.sandbox.backends.cuda import CudaBackend

        return CudaBackend(device)
    from kforge_tui.sandbox.backends.cpu import CpuBackend

    return CpuBackend(device)


def device_kind(lang: str) -> str:
    """The device backend that runs a candidate language: cpu and cuda run themselves; Triton
    runs on cuda, or on the cpu under Triton's interpreter (TRITON_INTERPRET=1, set by the pool
    where no GPU is visible)."""
    if lang != "triton":
        return lang
    from kforge_tui.sandbox.triton_loader import interpreting

    return "cpu" if interpreting() else "cuda"


