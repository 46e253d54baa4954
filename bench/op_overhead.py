"""Step `op-overhead`: what one kforge region call costs the host, next to an Inductor kernel.

A model of K independent tiny regions (`relu` of K small inputs) is compiled three ways and
timed back to back in one process:

  * inductor:     torch.compile (default mode): K Triton (cpu: C++) kernels of Inductor's;
  * kforge C++:   the kforge backend with every region replaced by the region op around a
                  trivial relu kernel, called through the C++ op (no Python on the call path);
  * kforge Python: the same kernels registered with the Python path (what kforge did before
                  issue 26: ctypes from a Python custom op).

The kernels do almost nothing, so the forward is host-bound and wall time per forward over K is
the cost of one call. The figure to read is the ratio of kforge's per-call time to Inductor's
(issue 26: within 2x). Run: `python -m bench op-overhead [--device cuda] [--k 64]`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

CUDA_RELU = r'''#include "kforge_region.h"
__global__ void kf_relu(const kf_in0_t* x, kf_out0_t* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
  long long n = KF_IN0_NUMEL;
  kf_relu<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const kf_in0_t*)inputs[0], (kf_out0_t*)outputs[0], n);
  return (int)cudaGetLastError();
}
'''

CPU_RELU = r'''#include "kforge_region.h"
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
  const kf_in0_t* x = (const kf_in0_t*)inputs[0];
  kf_out0_t* y = (kf_out0_t*)outputs[0];
  for (long long i = 0; i < KF_IN0_NUMEL; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
'''


class _Model:
    """K independent relus: Inductor cannot fuse them into one kernel (no shared iteration)."""

    def __new__(cls, k: int):
        import torch

        class M(torch.nn.Module):
            def forward(self, *xs):
                return tuple(torch.relu(x) for x in xs)

        return M()


def _kernels(model, inputs, backend: str, cache: Path):
    from kforge_tui.device import device_info
    from kforge_tui.integrate.patch import spec_for
    from kforge_tui.integrate import runtime as rt
    from kforge_tui.regions.build import tasks_of
    from kforge_tui.sandbox.compile import compile_candidate_sync

    tasks = tasks_of(model, inputs, backend)
    arch = device_info(backend).arch
    specs = []
    for t in tasks:
        res = compile_candidate_sync(CUDA_RELU if backend == "cuda" else CPU_RELU, backend, arch, cache,
                                     300.0, header=t.header())
        if not res.ok:
            raise SystemExit(f"op-overhead: the relu kernel did not compile: {res.message}")
        specs.append(spec_for(t.to_json(), str(res.lib_path), {}))
    return [rt.Kernel(s) for s in specs]


def _time(fn, inputs, sync, iters: int, rounds: int) -> list[float]:
    """Wall time per forward (us), back to back with a sync at the end of each round."""
    out = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*inputs)
        sync()
        out.append((time.perf_counter() - t0) / iters * 1e6)
    return out


def run(device: str = "cuda", k: int = 64, numel: int = 4096, iters: int = 200, rounds: int = 7,
        out_dir: str | None = None) -> dict:
    import torch

    from kforge_tui.integrate import runtime as rt

    backend = "cuda" if device == "cuda" else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # the two kforge variants get inputs of different sizes (numel and numel + 64): one process
    # finds a kernel by its region's key, and the same key in two runtimes would be one kernel
    sizes = {"inductor": numel, "kforge C++": numel, "kforge Python": numel + 64}
    ins = {n: tuple(torch.randn(s, device=device) for _ in range(k)) for n, s in sizes.items()}
    cache = Path(out_dir or ".") / "op_overhead_cache"
    cache.mkdir(parents=True, exist_ok=True)

    fns = {}
    with torch.inference_mode():
        ind = torch.compile(_Model(k), dynamic=False)
        ind(*ins["inductor"])
        fns["inductor"] = ind
        for label, native in (("kforge C++", None), ("kforge Python", False)):
            model, inputs = _Model(k), ins[label]
            runtime = rt.Runtime(_kernels(model, inputs, backend, cache), native=native)
            rt.install(model, runtime, backend)
            model(*inputs)
            assert sum(runtime.counts.values()) == k, (label, runtime.counts, runtime.fallbacks)
            for got, x in zip(model(*inputs), inputs):
                torch.testing.assert_close(got, torch.relu(x))
            fns[label] = model
        times = {name: [] for name in fns}
        for _ in range(3):  # alternated, so drift hits every variant alike
            for name, fn in fns.items():
                times[name] += _time(fn, ins[name], sync, iters, max(1, rounds // 3))
    status = rt.native_status()
    rows = []
    base = statistics.median(times["inductor"]) / k
    for name, ts in times.items():
        med = statistics.median(ts) / k
        spread = (max(ts) - min(ts)) / statistics.median(ts)
        rows.append({"variant": name, "us_per_call": med, "calls_per_s": 1e6 / med,
                     "vs_inductor": med / base, "spread": spread, "samples": len(ts)})
    result = {"step": "op-overhead", "device": _device_name(device), "date": time.strftime("%Y-%m-%d"),
              "k": k, "numel": numel, "iters": iters, "native": status, "rows": rows,
              "torch": torch.__version__}
    print(f"op-overhead on {result['device']} ({result['date']}), {k} regions of {numel} elements, "
          f"median of {len(times['inductor'])} rounds of {iters} forwards, alternated")
    print(f"{'variant':<15} {'us/call':>9} {'calls/s':>11} {'vs inductor':>12} {'spread':>7}")
    for r in rows:
        print(f"{r['variant']:<15} {r['us_per_call']:>9.2f} {r['calls_per_s']:>11.0f} "
              f"{r['vs_inductor']:>11.2f}x {r['spread']:>6.0%}")
    if out_dir:
        Path(out_dir, "op_overhead.json").write_text(json.dumps(result, indent=1))
    return result


def _device_name(device: str) -> str:
    from kforge_tui.device import device_info

    return device_info("cuda" if device == "cuda" else "cpu").name


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(prog="python -m bench op-overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--k", type=int, default=64, help="regions in the model")
    ap.add_argument("--numel", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=None, help="directory for op_overhead.json")
    a = ap.parse_args(argv)
    run(a.device, a.k, a.numel, a.iters, out_dir=a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
