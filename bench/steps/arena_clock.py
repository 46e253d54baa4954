"""arena-clock: does a kernel run slower on the sandbox's shared arena than on plain memory?

A candidate runs in a runner process on the task's arena: one cuMemAlloc'ed block of the
worker's, opened in the runner with cuIpcOpenMemHandle (sandbox/backends/arena.py), its
tensors placed at random 64-byte shifts. The references (eager, torch.compile) run in the
worker, on tensors it allocated. On the H200 (2026-12-03) every candidate of KernelBench 23,
24, 26, 35 and 36 at their own sizes (6-7 GiB a tensor, one input set), Inductor's own kernel
rewritten as a candidate included, was timed at 1.9-2.1x the worker's torch.compile of the same
region, while at small sizes candidates and references agree. This step times one fixed
memory-bound kernel (`torch.mul(x, 2, out=y)`) on each placement, same clock (CUDA events,
median of 10), to tell whether the memory, the shift or the process is the cause:

    python -m bench arena-clock                      # 256 MiB, 1 GiB and 6 GiB tensors
    python -m bench arena-clock --arena-sizes-mib 6144

Rows: the worker's caching-allocator memory, the worker's arena (shift 0 and 64 bytes), the
arena opened in another process (shift 0 and 64), and that process's own memory. Each ratio is
to the first row of its size; 1.00 everywhere means placement is not the cause.
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


def _child(info: dict, nbytes: int, q) -> None:
    """In another process, as a runner: the arena through its IPC handle, then own memory."""
    import torch

    from kforge_tui.sandbox.backends.arena import CudaArena

    try:
        mem = CudaArena.attach(info, [])
        res = {f"arena in another process, shift {s}": _time(*_pair(mem, nbytes, s)) for s in (0, 64)}
        own = torch.empty(_need(nbytes), dtype=torch.uint8, device="cuda")
        res["that process's own memory"] = _time(*_pair(own, nbytes, 0))
        q.put(res)
    except Exception as e:  # noqa: BLE001 - reported as the step's error
        q.put({"error": f"{type(e).__name__}: {e}"})


def run(ctx) -> Table:
    if ctx.device != "cuda":
        raise StepError("arena-clock times CUDA memory: it needs a GPU", 2)
    import multiprocessing as mp

    import torch

    from kforge_tui.sandbox.backends.arena import CudaArena

    rows = []
    spawn = mp.get_context("spawn")
    for mib in (int(x) for x in ctx.args.arena_sizes_mib.split(",") if x):
        nbytes = mib << 20
        res = {}
        own = torch.empty(_need(nbytes), dtype=torch.uint8, device="cuda")
        res["worker's own memory (caching allocator)"] = _time(*_pair(own, nbytes, 0))
        del own
        torch.cuda.empty_cache()
        arena = CudaArena(_need(nbytes), torch.cuda.current_device())
        try:
            arena.tensor.zero_()
            for s in (0, 64):
                res[f"worker's arena, shift {s}"] = _time(*_pair(arena.tensor, nbytes, s))
            torch.cuda.synchronize()
            q = spawn.Queue()
            p = spawn.Process(target=_child, args=(arena.handle()[0], nbytes, q))
            p.start()
            try:
                got = q.get(timeout=300)
            except queue.Empty:
                got = {"error": f"no answer in 300 s (exit code {p.exitcode})"}
            p.join(timeout=60)
        finally:
            arena.close()
            torch.cuda.empty_cache()
        if "error" in got:
            raise StepError(f"arena-clock: the other process failed: {got['error']}")
        res.update(got)
        base = res["worker's own memory (caching allocator)"][REPS // 2]
        for name, ts in res.items():
            med = ts[REPS // 2]
            rows.append({"MiB a tensor": mib, "placement": name, "median us": round(med, 1),
                         "p10 us": round(ts[1], 1), "p90 us": round(ts[-2], 1),
                         "GB/s": round(2 * nbytes / (med * 1e-6) / 1e9), "vs worker memory": round(med / base, 3)})
        print(f"  {mib} MiB: done", flush=True, file=sys.stderr)
    return Table(COLUMNS, rows, [f"torch.mul(x, 2, out=y), float32, CUDA events, median of {REPS} (p10/p90)",
                                 "vs worker memory: median / the worker's own memory's median, same size"],
                 {}, True)
