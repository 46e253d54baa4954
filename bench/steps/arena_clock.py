"""arena-clock: does a kernel run slower on the sandbox's shared arena than on plain memory?

A candidate runs in a runner process on the task's arena: one device allocation of the
worker's, mapped in the runner too (sandbox/backends/arena.py), its tensors placed at random
64-byte shifts. The references (eager, torch.compile) run in the worker, on tensors it
allocated. Each placement here times one fixed memory-bound kernel (`torch.mul(x, 2, out=y)`,
CUDA events, median of 10), so a placement that costs bandwidth shows as a ratio above 1:

    python -m bench arena-clock                      # 256 MiB, 1 GiB and 6 GiB tensors
    python -m bench arena-clock --arena-sizes-mib 6144

Rows: the worker's caching-allocator memory; per sharing kind (cuda_vmm: the sandbox's default,
cuda_ipc: its fallback), the worker's arena at shift 0 and 64 bytes and the arena mapped in a
spawned process at shift 0 and 64; that process's own memory. Each ratio is to the first row of
its size. Why the step exists: on the H200 (2026-12-03) every candidate of KernelBench level-1
problems at 6-7 GiB a tensor, Inductor's own kernel included, read 1.9-2.1x the worker's
torch.compile; this step (2026-12-04) showed the cuda_ipc arena in another process at 1.97x
(6 GiB) and 1.53x (256 MiB), the shift and the process's own memory at 1.00.
"""
from __future__ import annotations

import queue
import sys

from bench.report import StepError, Table

HELP = "one memory-bound kernel on plain memory vs the sandbox's IPC-shared arena (GPU)"
COLUMNS = ["MiB a tensor", "placement", "median us", "p10 us", "p90 us", "GB/s", "vs worker memory"]
SIZES_MIB = (256, 1024, 6144)
REPS = 10


def add_arguments(g) -> None:
    g.add_argument("--arena-sizes-mib", default=",".join(map(str, SIZES_MIB)),
                   help="arena-clock: MiB per tensor (input and output each), comma-separated")


def _time(x, y) -> list[float]:
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    torch.mul(x, 2.0, out=y)  # warm
    for _ in range(REPS):
        torch.cuda.synchronize()
        a.record()
        torch.mul(x, 2.0, out=y)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return sorted(out)


def _pair(buf, nbytes: int, shift: int):
    """Input and output float32 tensors of nbytes each in a uint8 buffer, `shift` bytes in."""
    import torch

    x = buf[shift:shift + nbytes].view(torch.float32)
    at = shift + nbytes + 4096
    return x, buf[at:at + nbytes].view(torch.float32)


def _need(nbytes: int) -> int:
    return 2 * nbytes + 4096 + 128


def _child(info: dict, nbytes: int, conn, q) -> None:
    """In another process, as a runner: the arena mapped from what the worker shares (an IPC
    handle, or a descriptor sent over `conn`), then this process's own memory."""
    import torch
    from multiprocessing import reduction

    from kforge_tui.sandbox.backends.arena import CudaArena

    try:
        fds = [reduction.recv_handle(conn)] if info["kind"] == "cuda_vmm" else []
        mem = CudaArena.attach(info, fds)
        res = {f"{info['kind']} arena in another process, shift {s}": _time(*_pair(mem, nbytes, s)) for s in (0, 64)}
        own = torch.empty(_need(nbytes), dtype=torch.uint8, device="cuda")
        res[f"that process's own memory ({info['kind']} run)"] = _time(*_pair(own, nbytes, 0))
        q.put(res)
    except Exception as e:  # noqa: BLE001 - reported as the step's error
        q.put({"error": f"{type(e).__name__}: {e}"})


def _shared(kind: str, nbytes: int, spawn) -> dict:
    """One sharing kind: the worker's side of the arena, then a spawned process's."""
    import torch
    from multiprocessing import reduction

    from kforge_tui.sandbox.backends.arena import CudaArena

    res = {}
    arena = CudaArena(_need(nbytes), torch.cuda.current_device(), sharing=kind)
    try:
        arena.tensor.zero_()
        for s in (0, 64):
            res[f"worker's {kind} arena, shift {s}"] = _time(*_pair(arena.tensor, nbytes, s))
        torch.cuda.synchronize()
        info, fds = arena.handle()
        q = spawn.Queue()
        here, there = spawn.Pipe()
        p = spawn.Process(target=_child, args=(info, nbytes, there, q))
        p.start()
        for fd in fds:
            reduction.send_handle(here, fd, p.pid)
        try:
            got = q.get(timeout=300)
        except queue.Empty:
            got = {"error": f"no answer in 300 s (exit code {p.exitcode})"}
        p.join(timeout=60)
    finally:
        arena.close()
        torch.cuda.empty_cache()
    if "error" in got:
        raise StepError(f"arena-clock: the other process failed on the {kind} arena: {got['error']}")
    return {**res, **got}


def run(ctx) -> Table:
    if ctx.device != "cuda":
        raise StepError("arena-clock times CUDA memory: it needs a GPU", 2)
    import multiprocessing as mp

    import torch

    rows = []
    spawn = mp.get_context("spawn")
    for mib in (int(x) for x in ctx.args.arena_sizes_mib.split(",") if x):
        nbytes = mib << 20
        res = {}
        own = torch.empty(_need(nbytes), dtype=torch.uint8, device="cuda")
        res["worker's own memory (caching allocator)"] = _time(*_pair(own, nbytes, 0))
        del own
        torch.cuda.empty_cache()
        for kind in ("cuda_vmm", "cuda_ipc"):
            res.update(_shared(kind, nbytes, spawn))
        base = res["worker's own memory (caching allocator)"][REPS // 2]
        for name, ts in res.items():
            med = ts[REPS // 2]
            rows.append({"MiB a tensor": mib, "placement": name, "median us": round(med, 1),
                         "p10 us": round(ts[1], 1), "p90 us": round(ts[-2], 1),
                         "GB/s": round(2 * nbytes / (med * 1e-6) / 1e9), "vs worker memory": round(med / base, 3)})
        print(f"  {mib} MiB: done", flush=True, file=sys.stderr)
    return Table(COLUMNS, rows, [f"torch.mul(x, 2, out=y), float32, CUDA events, median of {REPS} (p10/p90)",
                                 "vs worker memory: median / the worker's own memory's median, same size",
                                 "cuda_vmm: cuMemCreate + a descriptor, mapped by each process (the sandbox's "
                                 "default); cuda_ipc: cuMemAlloc + cuIpcOpenMemHandle (its fallback)"],
                 {}, True)
