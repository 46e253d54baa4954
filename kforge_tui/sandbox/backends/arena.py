"""Shared buffers between the supervisor (holds references, never loads candidates) and a runner
(loads one candidate, then exits).

Every input set's inputs and outputs live in one arena per task. The supervisor writes inputs,
poison and guards into it and reads the outputs back; the runner maps the same memory and only
calls the kernel on it. Expected outputs and the private copies of the inputs stay outside the
arena, in the supervisor's own memory.

  cpu:  an anonymous memfd (not limited by the size of /dev/shm), mmap'ed by both processes;
        the descriptor crosses to the runner with SCM_RIGHTS.
  cuda: one cuMemAlloc'ed block of its own (not carved from PyTorch's caching allocator, so no
        other tensor of the supervisor shares the exported allocation), exported with
        cuIpcGetMemHandle and opened in the runner with cuIpcOpenMemHandle. Both sides wrap
        the raw pointer in a tensor through __cuda_array_interface__. Measured on the H200
        (2026-11-30): a runner forked from a CUDA-free zygote initialises CUDA in 0.14-0.18 s
        and opens the handle; writes are visible to the other side after a synchronize.
"""
from __future__ import annotations

import base64
import ctypes
import mmap
import os

import torch


class HostArena:
    kind = "memfd"

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.fd = os.memfd_create("buf", getattr(os, "MFD_CLOEXEC", 1))  # a plain name (issue 21)
        try:
            os.ftruncate(self.fd, self.nbytes)
            self._mm = mmap.mmap(self.fd, self.nbytes)
        except OSError as e:
            os.close(self.fd)
            raise MemoryError(f"cannot map a {self.nbytes} byte arena: {e}") from None
        self.tensor = torch.frombuffer(self._mm, dtype=torch.uint8)

    def handle(self) -> tuple[dict, list[int]]:
        return {"kind": self.kind, "nbytes": self.nbytes}, [self.fd]

    def fd_target(self) -> str:
        """What the runner's descriptor of this arena reads as in /proc (python's mmap keeps one)."""
        try:
            return os.readlink(f"/proc/self/fd/{self.fd}")
        except OSError:
            return ""

    def close(self) -> None:
        self.tensor = None
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass  # views still alive: the mapping goes with them
        try:
            os.close(self.fd)
        except OSError:
            pass

    @staticmethod
    def attach(info: dict, fds: list[int]) -> torch.Tensor:
        n = int(info["nbytes"])
        mm = mmap.mmap(fds[0], n)
        os.close(fds[0])
        t = torch.frombuffer(mm, dtype=torch.uint8)
        t._kforge_mmap = mm  # keep the mapping alive with the tensor
        return t


# ------------------------------------------------------------------------------- cuda

class _CUipcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _DevicePointer:
    """Exposes a raw device allocation to torch.as_tensor without a copy."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


class Driver:
    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            cls._lib = ctypes.CDLL("libcuda.so.1")
        return cls._lib

    @classmethod
    def fn(cls, *names):
        lib = cls.lib()
        for n in names:
            f = getattr(lib, n, None)
            if f is not None:
                return f
        raise AttributeError(names[0])

    @classmethod
    def check(cls, rc: int, what: str) -> None:
        if rc == 0:
            return
        name = ctypes.c_char_p()
        try:
            cls.fn("cuGetErrorName")(rc, ctypes.byref(name))
            text = name.value.decode() if name.value else str(rc)
        except Exception:
            text = str(rc)
        if rc == 2:  # CUDA_ERROR_OUT_OF_MEMORY
            raise torch.OutOfMemoryError(f"{what}: {text}")
        raise RuntimeError(f"{what} failed: {text}")

    @classmethod
    def ensure_context(cls, device_index: int) -> None:
        torch.cuda.set_device(device_index)
        torch.cuda.init()
        torch.zeros(1, device=f"cuda:{device_index}")  # the primary context, current on this thread
        ctx = ctypes.c_void_p()
        cls.check(cls.fn("cuCtxGetCurrent")(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            cls.check(cls.fn("cuDeviceGet")(ctypes.byref(dev), device_index), "cuDeviceGet")
            cls.check(cls.fn("cuDevicePrimaryCtxRetain")(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            cls.check(cls.fn("cuCtxSetCurrent")(ctx), "cuCtxSetCurrent")


class CudaArena:
    kind = "cuda_ipc"

    def __init__(self, nbytes: int, device_index: int):
        self.nbytes = max(int(nbytes), 1)
        self.device_index = device_index
        Driver.ensure_context(device_index)
        self.ptr = self._alloc(self.nbytes, device_index)
        h = _CUipcMemHandle()
        try:
            Driver.check(Driver.fn("cuIpcGetMemHandle")(ctypes.byref(h), ctypes.c_uint64(self.ptr)),
                         "cuIpcGetMemHandle")
        except Exception:
            Driver.fn("cuMemFree_v2", "cuMemFree")(ctypes.c_uint64(self.ptr))
            raise
        self._handle = bytes(h)
        self.tensor = torch.as_tensor(_DevicePointer(self.ptr, self.nbytes), device=f"cuda:{device_index}")

    @staticmethod
    def _alloc(nbytes: int, device_index: int) -> int:
        """cuMemAlloc, once more after PyTorch's caching allocator gives back what it holds
        unused: the arena is allocated beside that allocator, so memory freed by tensors but
        kept in its cache (the previous, larger try's sets; a reference's temporaries) is free
        to PyTorch and not to the driver. A GiB-sized task's one set failed that way (H200)."""
        from kforge_tui.device import release_cached_memory

        alloc = Driver.fn("cuMemAlloc_v2", "cuMemAlloc")
        ptr = ctypes.c_uint64()
        rc = alloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        if rc == 2:  # CUDA_ERROR_OUT_OF_MEMORY
            release_cached_memory()
            rc = alloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        what = f"cuMemAlloc of {nbytes} bytes"
        if rc == 2:  # say whose memory it is: this worker's, or another process's
            gib = 2 ** 30
            free, total = torch.cuda.mem_get_info(device_index)
            held = torch.cuda.memory_allocated(device_index)
            cached = torch.cuda.memory_reserved(device_index) - held
            what = (f"cuMemAlloc of {nbytes / gib:.3g} GiB ({free / gib:.3g} of {total / gib:.3g} GiB free, "
                    f"{held / gib:.3g} GiB in this worker's tensors, {cached / gib:.3g} GiB cached)")
        Driver.check(rc, what)
        return ptr.value

    def handle(self) -> tuple[dict, list[int]]:
        return {"kind": self.kind, "nbytes": self.nbytes, "device": self.device_index,
                "handle": base64.b64encode(self._handle).decode()}, []

    def close(self) -> None:
        if self.ptr:
            torch.cuda.synchronize(self.device_index)
            self.tensor = None
            Driver.fn("cuMemFree_v2", "cuMemFree")(ctypes.c_uint64(self.ptr))
            self.ptr = 0

    @staticmethod
    def attach(info: dict, fds: list[int]) -> torch.Tensor:
        idx = int(info["device"])
        Driver.ensure_context(idx)
        h = _CUipcMemHandle.from_buffer_copy(base64.b64decode(info["handle"]))
        ptr = ctypes.c_uint64()
        # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
        Driver.check(Driver.fn("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle")(ctypes.byref(ptr), h, ctypes.c_uint(1)),
                     "cuIpcOpenMemHandle")
        return torch.as_tensor(_DevicePointer(ptr.value, int(info["nbytes"])), device=f"cuda:{idx}")


def attach(info: dict, fds: list[int]) -> torch.Tensor:
    if info["kind"] == HostArena.kind:
        return HostArena.attach(info, fds)
    if info["kind"] == CudaArena.kind:
        return CudaArena.attach(info, fds)
    raise ValueError(f"unknown arena kind {info['kind']!r}")


class LocalArena:
    """An arena that is not shared (tests, in-process use)."""

    kind = "local"

    def __init__(self, nbytes: int, device):
        self.nbytes = max(int(nbytes), 1)
        self.tensor = torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def handle(self):
        raise RuntimeError("a local arena cannot be shared")

    def close(self) -> None:
        self.tensor = None
