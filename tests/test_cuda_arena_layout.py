"""The cuda arena's driver calls go through ctypes (sandbox/backends/arena.py): its structures and
constants must be cuda.h's, or cuMemCreate / cuMemSetAccess read garbage on the GPU. Checked
here against the real header with the host compiler, no GPU needed: sizes, field offsets and the
enum values the arena passes."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from kforge_tui.sandbox.backends import arena


def _cuda_include() -> Path | None:
    nvcc = shutil.which("nvcc")
    for root in ([Path(nvcc).resolve().parents[1]] if nvcc else []) + [Path("/usr/local/cuda")]:
        if (root / "include" / "cuda.h").is_file():
            return root / "include"
    return None


PROGRAM = r"""
#include <cuda.h>
#include <stddef.h>
#include <stdio.h>
int main(void) {
  printf("prop_size %zu\n", sizeof(CUmemAllocationProp));
  printf("prop_location %zu\n", offsetof(CUmemAllocationProp, location));
  printf("prop_win32 %zu\n", offsetof(CUmemAllocationProp, win32HandleMetaData));
  printf("prop_flags %zu\n", offsetof(CUmemAllocationProp, allocFlags));
  printf("access_size %zu\n", sizeof(CUmemAccessDesc));
  printf("access_flags %zu\n", offsetof(CUmemAccessDesc, flags));
  printf("location_size %zu\n", sizeof(CUmemLocation));
  printf("ipc_size %zu\n", sizeof(CUipcMemHandle));
  printf("PINNED %d\n", (int)CU_MEM_ALLOCATION_TYPE_PINNED);
  printf("POSIX_FD %d\n", (int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  printf("DEVICE %d\n", (int)CU_MEM_LOCATION_TYPE_DEVICE);
  printf("READWRITE %d\n", (int)CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  printf("RECOMMENDED %d\n", (int)CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  printf("VMM_ATTR %d\n", (int)CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  printf("FD_ATTR %d\n", (int)CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
  return 0;
}
"""


def test_the_arena_structures_and_constants_are_cuda_h_s(tmp_path):
    inc = _cuda_include()
    cc = shutil.which("cc") or shutil.which("gcc")
    if inc is None or cc is None:
        pytest.skip("needs cuda.h (a CUDA toolkit) and a host C compiler")
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text(PROGRAM)
    subprocess.run([cc, f"-I{inc}", str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                       text=True).stdout.splitlines())
    got = {k: int(v) for k, v in got.items()}
    P, A = arena._CUmemAllocationProp, arena._CUmemAccessDesc
    assert ctypes.sizeof(P) == got["prop_size"]
    assert P.location.offset == got["prop_location"]
    assert P.win32HandleMetaData.offset == got["prop_win32"]
    assert P.compressionType.offset == got["prop_flags"]
    assert ctypes.sizeof(A) == got["access_size"] and A.flags.offset == got["access_flags"]
    assert ctypes.sizeof(arena._CUmemLocation) == got["location_size"]
    assert ctypes.sizeof(arena._CUipcMemHandle) == got["ipc_size"]
    assert (arena._ALLOCATION_TYPE_PINNED, arena._HANDLE_TYPE_POSIX_FD, arena._LOCATION_TYPE_DEVICE,
            arena._ACCESS_READWRITE, arena._GRANULARITY_RECOMMENDED) == (
        got["PINNED"], got["POSIX_FD"], got["DEVICE"], got["READWRITE"], got["RECOMMENDED"])
    assert (arena._ATTR_VMM_SUPPORTED, arena._ATTR_POSIX_FD_SUPPORTED) == (got["VMM_ATTR"], got["FD_ATTR"])


def test_arena_kinds_are_routed_and_an_unknown_one_is_refused():
    assert set(arena.CudaArena.KINDS) == {"cuda_vmm", "cuda_ipc"}
    with pytest.raises(ValueError, match="unknown arena kind"):
        arena.attach({"kind": "cuda_magic"}, [])
    with pytest.raises(ValueError, match="unknown cuda arena sharing"):
        arena.CudaArena(4096, 0, sharing="cuda_magic")  # refused before any CUDA call


def test_an_allocation_out_of_memory_is_retried_once_and_another_failure_is_named():
    rcs = [2, 0]  # out of memory, then fine after PyTorch's cache went back
    arena.CudaArena._allocate(lambda: rcs.pop(0), 1 << 20, 0, "cuMemCreate")
    assert rcs == []
    calls = []
    with pytest.raises(RuntimeError, match="cuMemAlloc of 4096 bytes failed"):
        arena.CudaArena._allocate(lambda: calls.append(1) or 1, 4096, 0, "cuMemAlloc")  # 1: invalid value
    assert len(calls) == 1  # only out-of-memory is retried
