"""Shared buffers between the supervisor (holds references, never loads candidates) and a runner
(loads one candidate, then exits).

Every input set's inputs and outputs live in one arena per task. The supervisor writes inputs,
poison and guards into it and reads the outputs back; the runner maps the same memory and only
calls the kernel on it. Expected outputs and the private copies of the inputs stay outside the
arena, in the supervisor's own memory.

  cpu:  an anonymous memfd (not limited by the size of /dev/shm), mmap'ed by both processes;
        the descriptor crosses to the runner with SCM_RIGHTS.
  cuda: one device allocation of its own (not carved from PyTorch's caching allocator, so no
        other tensor of the supervisor shares the exported allocation). Both sides wrap the
        raw pointer in a tensor through __cuda_array_interface__; writes are visible to the
        other side after a synchronize.
        "cuda_vmm" (the default where the device supports it): cuMemCreate'd physical memory
        exported as a file descriptor (SCM_RIGHTS, like the cpu's memfd) and mapped by each
        side with cuMemMap at the allocation's recommended granularity.
        "cuda_ipc" (the fallback): cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle. On the
        H200 (2026-12-04, `python -m bench arena-clock`) a memory-bound kernel ran at half the
        bandwidth on memory opened this way in another process (6 GiB tensors: 6036 against
        3064 us on the exporter's or the importer's own memory; 256 MiB: 1.53x), which made
        every candidate of a GiB-sized task read ~2x torch.compile. A mapping the importer
        makes itself with cuMemMap does not have that cost (same step, "vmm" rows).
        A runner forked from a CUDA-free zygote initialises CUDA in 0.14-0.18 s (H200,
        2026-11-30) before it maps the arena.
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


class _CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _CUmemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", _CUmemLocation), ("flags", ctypes.c_int)]


# cuda.h values (driver API, stable since CUDA 10.2)
_ALLOCATION_TYPE_PINNED = 1
_HANDLE_TYPE_POSIX_FD = 1
_LOCATION_TYPE_DEVICE = 1
_ACCESS_READWRITE = 3
_GRANULARITY_RECOMMENDED = 1
_ATTR_VMM_SUPPORTED = 102
_ATTR_POSIX_FD_SUPPORTED = 103


class _Vmm:
    """The driver's virtual memory management calls the vmm arena needs, through ctypes like the
    rest of this module (cuda-python would be one more dependency on every GPU host for
    eight calls)."""

    @staticmethod
    def supported(device_index: int) -> bool:
        try:
            dev = ctypes.c_int()
            Driver.check(Driver.fn("cuDeviceGet")(ctypes.byref(dev), device_index), "cuDeviceGet")
            for attr in (_ATTR_VMM_SUPPORTED, _ATTR_POSIX_FD_SUPPORTED):
                v = ctypes.c_int()
                Driver.check(Driver.fn("cuDeviceGetAttribute")(ctypes.byref(v), attr, dev), "cuDeviceGetAttribute")
                if not v.value:
                    return False
            return True
        except (OSError, AttributeError, RuntimeError):
            return False

    @staticmethod
    def prop(device_index: int) -> _CUmemAllocationProp:
        p = _CUmemAllocationProp()
        p.type = _ALLOCATION_TYPE_PINNED
        p.requestedHandleTypes = _HANDLE_TYPE_POSIX_FD
        p.location = _CUmemLocation(_LOCATION_TYPE_DEVICE, device_index)
        return p

    @staticmethod
    def granularity(device_index: int) -> int:
        g = ctypes.c_size_t()
        Driver.check(Driver.fn("cuMemGetAllocationGranularity")(
            ctypes.byref(g), ctypes.byref(_Vmm.prop(device_index)), _GRANULARITY_RECOMMENDED),
            "cuMemGetAllocationGranularity")
        return int(g.value) or 2 << 20

    @staticmethod
    def map(handle: int, size: int, align: int, device_index: int) -> int:
        """Reserve an address range, map the physical allocation there, allow this device to read
        and write it; the range's address. Undone in reverse on failure."""
        ptr = ctypes.c_uint64()
        Driver.check(Driver.fn("cuMemAddressReserve")(ctypes.byref(ptr), ctypes.c_size_t(size),
                                                      ctypes.c_size_t(align), ctypes.c_uint64(0),
                                                      ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        try:
            Driver.check(Driver.fn("cuMemMap")(ctypes.c_uint64(ptr.value), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                               ctypes.c_ulonglong(handle), ctypes.c_ulonglong(0)), "cuMemMap")
            try:
                desc = _CUmemAccessDesc(_CUmemLocation(_LOCATION_TYPE_DEVICE, device_index), _ACCESS_READWRITE)
                Driver.check(Driver.fn("cuMemSetAccess")(ctypes.c_uint64(ptr.value), ctypes.c_size_t(size),
                                                         ctypes.byref(desc), ctypes.c_size_t(1)), "cuMemSetAccess")
            except Exception:
                Driver.fn("cuMemUnmap")(ctypes.c_uint64(ptr.value), ctypes.c_size_t(size))
                raise
        except Exception:
            Driver.fn("cuMemAddressFree")(ctypes.c_uint64(ptr.value), ctypes.c_size_t(size))
            raise
        return ptr.value

    @staticmethod
    def unmap(ptr: int, size: int) -> None:
        Driver.fn("cuMemUnmap")(ctypes.c_uint64(ptr), ctypes.c_size_t(size))
        Driver.fn("cuMemAddressFree")(ctypes.c_uint64(ptr), ctypes.c_size_t(size))


class CudaArena:
    """The task's device arena (module docstring: "cuda_vmm" where the device supports it, else
    "cuda_ipc"; `sharing` forces one, for arena-clock)."""

    KINDS = ("cuda_vmm", "cuda_ipc")

    def __init__(self, nbytes: int, device_index: int, sharing: str | None = None):
        if sharing is not None and sharing not in self.KINDS:
            raise ValueError(f"unknown cuda arena sharing {sharing!r} (one of {', '.join(self.KINDS)})")
        self.nbytes = max(int(nbytes), 1)
        self.device_index = device_index
        Driver.ensure_context(device_index)
        if sharing is None:
            sharing = "cuda_vmm" if _Vmm.supported(device_index) else "cuda_ipc"
        self.kind = sharing
        self.fd = -1
        self._mem_handle = 0
        self.size, self.gran = self.nbytes, 0  # the vmm path rounds size up to its granularity
        if sharing == "cuda_vmm":
            self.ptr = self._create_vmm(device_index)
        else:
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

    def _create_vmm(self, device_index: int) -> int:
        gran = _Vmm.granularity(device_index)
        self.size = -(-self.nbytes // gran) * gran
        handle = ctypes.c_ulonglong()
        self._allocate(lambda: Driver.fn("cuMemCreate")(ctypes.byref(handle), ctypes.c_size_t(self.size),
                                                        ctypes.byref(_Vmm.prop(device_index)), ctypes.c_ulonglong(0)),
                       self.size, device_index, "cuMemCreate")
        self._mem_handle = handle.value
        try:
            fd = ctypes.c_int(-1)
            Driver.check(Driver.fn("cuMemExportToShareableHandle")(ctypes.byref(fd), ctypes.c_ulonglong(handle.value),
                                                                   _HANDLE_TYPE_POSIX_FD, ctypes.c_ulonglong(0)),
                         "cuMemExportToShareableHandle")
            self.fd = fd.value
            self.gran = gran
            return _Vmm.map(handle.value, self.size, gran, device_index)
        except Exception:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            Driver.fn("cuMemRelease")(ctypes.c_ulonglong(handle.value))
            self._mem_handle = 0
            raise

    @staticmethod
    def _allocate(call, nbytes: int, device_index: int, name: str) -> None:
        """Run a driver allocation, once more after PyTorch's caching allocator gives back what
        it holds unused: the arena is allocated beside that allocator, so memory freed by tensors
        but kept in its cache (the previous, larger try's sets; a reference's temporaries) is free
        to PyTorch and not to the driver. A GiB-sized task's one set failed that way (H200).
        Still out of memory: the error says whose memory it is (this worker's or another
        process's)."""
        from kforge_tui.device import release_cached_memory

        rc = call()
        if rc == 2:  # CUDA_ERROR_OUT_OF_MEMORY
            release_cached_memory()
            rc = call()
        what = f"{name} of {nbytes} bytes"
        if rc == 2:
            gib = 2 ** 30
            free, total = torch.cuda.mem_get_info(device_index)
            held = torch.cuda.memory_allocated(device_index)
            cached = torch.cuda.memory_reserved(device_index) - held
            what = (f"{name} of {nbytes / gib:.3g} GiB ({free / gib:.3g} of {total / gib:.3g} GiB free, "
                    f"{held / gib:.3g} GiB in this worker's tensors, {cached / gib:.3g} GiB cached)")
        Driver.check(rc, what)

    @staticmethod
    def _alloc(nbytes: int, device_index: int) -> int:
        ptr = ctypes.c_uint64()
        alloc = Driver.fn("cuMemAlloc_v2", "cuMemAlloc")
        CudaArena._allocate(lambda: alloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), nbytes, device_index,
                            "cuMemAlloc")
        return ptr.value

    def handle(self) -> tuple[dict, list[int]]:
        info = {"kind": self.kind, "nbytes": self.nbytes, "device": self.device_index}
        if self.kind == "cuda_vmm":
            return {**info, "size": self.size, "granularity": self.gran}, [self.fd]
        return {**info, "handle": base64.b64encode(self._handle).decode()}, []

    def fd_target(self) -> str:
        """What the exported descriptor reads as in /proc (a runner's copy is closed once mapped;
        the census ignores it should the driver keep one)."""
        if self.fd < 0:
            return ""
        try:
            return os.readlink(f"/proc/self/fd/{self.fd}")
        except OSError:
            return ""

    def close(self) -> None:
        if self.ptr:
            torch.cuda.synchronize(self.device_index)
            self.tensor = None
            if self.kind == "cuda_vmm":
                _Vmm.unmap(self.ptr, self.size)
                Driver.fn("cuMemRelease")(ctypes.c_ulonglong(self._mem_handle))
                self._mem_handle = 0
            else:
                Driver.fn("cuMemFree_v2", "cuMemFree")(ctypes.c_uint64(self.ptr))
            self.ptr = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @staticmethod
    def attach(info: dict, fds: list[int]) -> torch.Tensor:
        idx = int(info["device"])
        Driver.ensure_context(idx)
        if info["kind"] == "cuda_vmm":
            handle = ctypes.c_ulonglong()
            try:
                Driver.check(Driver.fn("cuMemImportFromShareableHandle")(
                    ctypes.byref(handle), ctypes.c_void_p(fds[0]), _HANDLE_TYPE_POSIX_FD),
                    "cuMemImportFromShareableHandle")
            finally:
                os.close(fds[0])
            # the mapping keeps the physical memory alive; it lives as long as this process
            # (a runner maps one arena and exits)
            ptr = _Vmm.map(handle.value, int(info["size"]), int(info["granularity"]), idx)
            Driver.fn("cuMemRelease")(ctypes.c_ulonglong(handle.value))
        else:
            h = _CUipcMemHandle.from_buffer_copy(base64.b64decode(info["handle"]))
            p = ctypes.c_uint64()
            # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
            Driver.check(Driver.fn("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle")(ctypes.byref(p), h, ctypes.c_uint(1)),
                         "cuIpcOpenMemHandle")
            ptr = p.value
        return torch.as_tensor(_DevicePointer(ptr, int(info["nbytes"])), device=f"cuda:{idx}")


def attach(info: dict, fds: list[int]) -> torch.Tensor:
    if info["kind"] == HostArena.kind:
        return HostArena.attach(info, fds)
    if info["kind"] in CudaArena.KINDS:
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
