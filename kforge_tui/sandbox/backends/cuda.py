"""The cuda backend of the worker: a private non-default stream, events, L2 flush, D2D bandwidth.

Everything the harness does (poison, flush, candidate launch, checks) is enqueued on the
worker's own stream; `sync()` waits for that stream only, so a candidate that moves its work to
another stream is still running when its output is checked. `check_device()` then synchronises
the whole device so asynchronous faults (illegal address, trap) surface on *this* candidate; a
fault there is sticky, so the worker reports it as fatal and exits to be restarted.

Candidates run in a runner process of their own (sandbox/worker.py), with its own CUDA context:
a sticky fault, a hang or a leftover thread dies with the runner. The supervisor's context holds
the references and is never touched by candidate code.
"""
from __future__ import annotations

import ctypes

import torch


class FatalDeviceError(Exception):
    """The CUDA context is unusable (sticky error): report, then exit so the pool restarts us."""


class CudaBackend:
    name = "cuda"
    has_stream = True
    # What the events measure: the device time of the call. Before each start event the stream
    # gets a spin kernel longer than the call's host time (keep_ahead), so the call's launches
    # are all queued when the start event fires and host time (Python, dynamo guards, a
    # launcher) never shows as idle device time inside the window. A candidate, eager and
    # Inductor's kernels for the region are all timed so: one clock (issue 26).
    clock = "device"

    def __init__(self, device_index: int = 0):
        torch.cuda.set_device(device_index)
        self.device = torch.device("cuda", device_index)
        self.index = device_index
        self.props = torch.cuda.get_device_properties(device_index)
        self.stream = torch.cuda.Stream(device=self.device)  # non-default, ours alone
        l2 = int(getattr(self.props, "L2_cache_size", 0) or 0) or 50 * 2**20
        self.cache_bytes = l2
        # >= 2x L2, written between calls so neither inputs nor outputs stay resident.
        self._flush_buf = torch.empty(2 * l2 // 4 + 1024, dtype=torch.float32, device=self.device)
        self.flush_bytes = self._flush_buf.numel() * 4
        self._lead_cycles = 0
        self._cycles_per_us = 0.0

    def setup(self) -> None:
        pass

    def describe(self) -> str:
        return f"{self.props.name} (sm_{self.props.major}{self.props.minor}), device {self.index}"

    def arch(self) -> str:
        return f"sm_{self.props.major}{self.props.minor}"

    # -- calls
    def stream_handle(self) -> int:
        return self.stream.cuda_stream

    def stream_context(self):
        return torch.cuda.stream(self.stream)

    def sync(self) -> None:
        self.stream.synchronize()

    def check_device(self) -> None:
        try:
            torch.cuda.synchronize(self.device)
            torch.zeros(1, device=self.device).add_(1).item()
        except Exception as e:  # torch raises RuntimeError/AcceleratorError for CUDA faults
            raise FatalDeviceError(f"CUDA error: {str(e).splitlines()[0]}") from None

    def sync_all(self) -> None:
        torch.cuda.synchronize(self.device)

    # -- memory (issue 14: the number of input sets follows free memory)
    def free_bytes(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free)

    def total_bytes(self) -> int:
        return int(self.props.total_memory)

    def reserve_bytes(self, spares: int = 2) -> int:
        """Kept free: one CUDA context and flush buffer per runner (the live one and the
        spares), and a margin for candidates' stream-ordered scratch."""
        per_runner = 768 * 2**20 + self.flush_bytes
        return per_runner * (1 + spares) + 2 * 2**30 + self.total_bytes() // 25

    def new_arena(self, nbytes: int):
        from kforge_tui.sandbox.backends.arena import CudaArena

        return CudaArena(nbytes, self.index)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def error_name(self, rc: int) -> str:
        try:
            lib = ctypes.CDLL("libcudart.so", mode=ctypes.RTLD_GLOBAL)
        except OSError:
            try:
                rt = torch.cuda.cudart()
                return f"{rc} ({rt.cudaGetErrorString(rc)})"
            except Exception:
                return str(rc)
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        return f"{rc} ({lib.cudaGetErrorName(rc).decode()})"

    # -- timing
    def flush(self) -> None:
        self._flush_buf.zero_()

    def keep_ahead(self, host_s: float) -> None:
        """Spin the stream for about 1.5x `host_s` (+20 us) before every start event from now
        on: longer than the host needs to enqueue the call, so the device never waits on it."""
        if self._cycles_per_us <= 0:
            self._cycles_per_us = self._calibrate()
        us = 1.5 * host_s * 1e6 + 20.0
        self._lead_cycles = int(min(us, 20_000.0) * self._cycles_per_us)

    def _calibrate(self) -> float:
        """Spin-kernel cycles per microsecond on this device (torch.cuda._sleep counts clocks)."""
        with torch.cuda.stream(self.stream):
            best = 0.0
            for _ in range(3):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record(self.stream)
                torch.cuda._sleep(1_000_000)
                b.record(self.stream)
                b.synchronize()
                us = a.elapsed_time(b) * 1e3
                best = max(best, 1_000_000 / us if us > 0 else 0.0)
        return best or 1000.0

    def start(self):
        """The start marker, then a wait on it: a kernel launched with programmatic dependent
        launch may begin before the kernel ahead of it in the stream has finished (issue 21), but
        not across an event wait - so none of the candidate's work runs before the start marker."""
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        if self._lead_cycles:
            with torch.cuda.stream(self.stream):
                torch.cuda._sleep(self._lead_cycles)
        a.record(self.stream)
        self.stream.wait_event(a)
        return a, b

    def end(self, tok):
        """Record the end marker without waiting (the harness reads it later with elapsed())."""
        a, b = tok
        b.record(self.stream)
        return a, b

    def elapsed(self, tok) -> float:
        a, b = tok
        b.synchronize()
        return a.elapsed_time(b) * 1e3

    def stop(self, tok) -> float:
        return self.elapsed(self.end(tok))

    def timing_method(self, sets: int) -> str:
        return (f"device time: cuda events on the worker stream with the host kept ahead by a "
                f"spin, {self.flush_bytes // 2**20} MiB L2 flush, {sets} input sets rotated")


    # -- roofline
    def bandwidth_key(self) -> str:
        return f"cuda:{self.props.name}:{self.index}"

    def measure_bandwidth(self) -> tuple[float, str]:
        """A 1 GiB device-to-device copy (bytes read + written), best of 10 event-timed runs."""
        n = 2**28  # float32: 1 GiB
        src = torch.ones(n, device=self.device)
        dst = torch.empty_like(src)
        best = 0.0
        with torch.cuda.stream(self.stream):
            dst.copy_(src)
            for _ in range(10):
                tok = self.start()
                dst.copy_(src)
                us = self.stop(tok)
                best = max(best, 2 * n * 4 / (us * 1e-6) / 1e9)
        del src, dst
        torch.cuda.empty_cache()
        return best, f"device-to-device copy {best:.0f} GB/s (1 GiB, read + write, best of 10)"

    def measure_peak(self, dtype: str):
        """(TFLOP/s, note): best of 5 event-timed 8192^3 matrix products in `dtype` (f32: the
        better of full f32 and TF32, so the floor never exceeds what a kernel could reach)."""
        if dtype not in ("float32", "float16", "bfloat16", "float64"):
            return None
        dt = getattr(torch, dtype)
        n = 8192 if dtype != "float64" else 4096
        a = torch.randn(n, n, device=self.device).to(dt)
        b = torch.randn(n, n, device=self.device).to(dt)
        best = 0.0
        modes = [False, True] if dtype == "float32" else [None]
        old = torch.backends.cuda.matmul.allow_tf32
        try:
            with torch.cuda.stream(self.stream):
                for tf32 in modes:
                    if tf32 is not None:
                        torch.backends.cuda.matmul.allow_tf32 = tf32
                    a @ b
                    for _ in range(5):
                        tok = self.start()
                        a @ b
                        us = self.stop(tok)
                        best = max(best, 2 * n ** 3 / (us * 1e-6) / 1e12)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        del a, b
        torch.cuda.empty_cache()
        return best, f"{dtype} matrix product {best:.0f} TFLOP/s ({n}^3, best of 5)"
