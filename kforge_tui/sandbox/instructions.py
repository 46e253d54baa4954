"""The instruction check: what the built code can execute, read from the compiled artifact.

What the built code itself can execute, read from the compiled artifact rather than the source
text (issue 21): a clock read or a system call has many spellings in C++ (intrinsics, macros,
builtins, bytes in an array called through a cast) but one form in the binary.
  host code (every executable section of the library, disassembled with binutils' objdump):
    rdtsc/rdtscp/rdpmc (clocks a kernel could tell a measured call from a real one with) and
    syscall/sysenter/int $0x80 (system calls; the runner's seccomp filter stops them anyway);
  device code (the PTX nvcc generated from the source, asm included: every SASS instruction
    comes from it through ptxas): %clock, %clock64, %globaltimer reads, and module-scope
    .global variables - a __device__ variable, const or not, lives in writable device memory
    (a cast writes a `__device__ const` one), so it is state that outlives a call; only
    __constant__ (.const: device code cannot store to it) is read-only.
Not seen: bytes that decode to such an instruction only from the middle of another one,
reached through a computed jump (x86 has variable-length instructions); the seccomp filter
covers the system-call half of that.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

_HOST_INSNS = re.compile(r"\t(rdtscp?|rdpmc|syscall|sysenter|int\s+\$0x80)\b")
_HOST_WHY = {"rdtsc": "it reads the time-stamp counter (a clock)", "rdtscp": "it reads the time-stamp counter (a clock)",
             "rdpmc": "it reads a performance counter (a clock)", "syscall": "it makes a raw system call",
             "sysenter": "it makes a raw system call", "int": "it makes a raw system call (int $0x80)"}
_PTX_CLOCK = re.compile(r"%(clock64|clock|globaltimer(?:_lo|_hi)?)\b")
_PTX_GLOBAL_VAR = re.compile(r"^(?:\.visible\s+|\.weak\s+|\.extern\s+)?\.global\s+[^;=]*?\.(\w+)\s+"
                             r"([\w$]+)(?:\[(\d*)\])?\s*(?:=|;)", re.M)
# CCCL's tag and customization-point objects (cuda::std::in_place, ranges::begin, thrust::seq):
# empty 1-byte __device__ constexpr objects its headers instantiate in every file that includes
# them (a 1-byte object in those namespaces is the residual: a candidate could declare its own)
_CCCL_EMPTY = re.compile(r"(?:4cuda3std|6thrust|3cub)\d")


def _objdump() -> str | None:
    return shutil.which(os.environ.get("KFORGE_OBJDUMP") or "objdump")


def check(lib_path: str | Path, backend: str, keep_dir: str | Path | None = None) -> list[str]:
    """Problems with what the built code executes (see the comment block above), one line each."""
    out: list[str] = []
    tool = _objdump()
    if tool is None:
        return ["the built library could not be disassembled (objdump not found): its instructions "
                "are unchecked"]
    try:
        dis = subprocess.run([tool, "-d", "--no-show-raw-insn", str(lib_path)], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return [f"the built library could not be disassembled: {e}"]
    if dis.returncode != 0:
        return [f"the built library could not be disassembled: {dis.stderr.strip()[:200]}"]
    found = sorted({m.group(1).split()[0] for m in _HOST_INSNS.finditer(dis.stdout)})
    for insn in found:
        out.append(f"the library's code contains the instruction {insn}: {_HOST_WHY[insn]}, which a "
                   "kernel has no reason to")
    if backend == "cuda" and keep_dir is not None:
        ptx = "\n".join(p.read_text(errors="replace") for p in sorted(Path(keep_dir).glob("*.ptx")))
        clocks = sorted({m.group(1) for m in _PTX_CLOCK.finditer(ptx)})
        if clocks:
            out.append(f"the device code reads a clock (%{', %'.join(clocks)}): a kernel has no reason to "
                       "time itself (timing is the harness's job)")
        for m in _PTX_GLOBAL_VAR.finditer(ptx):
            if m.group(1) == "b8" and m.group(3) == "1" and _CCCL_EMPTY.search(m.group(2)):
                continue
            out.append(f"mutable device state: the __device__ variable {m.group(2)} lives in writable "
                       "global memory (device code can write it, const or not; use __constant__ for "
                       "read-only tables)")
    return out
