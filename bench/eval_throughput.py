"""Evaluation throughput: distinct honest softmax candidates end to end through the pool
(static check, compile + binary check in parallel, a fresh kernel process each: load, verify
with edge cases and replay checks, every timed call checked on fresh inputs), as the search
would submit them, on a region task.

    python bench/eval_throughput.py --backend cpu|cuda|triton [--n 20] [--shape 4096,256]
        [--in-flight K] [--warm-compile] [--json out.json]
    python bench/eval_throughput.py --backend cpu --cluster ray [--nodes 1,2]   # through Ray

Prints candidates per minute, source-to-result latency and one line per stage (median, p90 and
mean seconds; the worker's stages run one candidate at a time per worker, so their means add up
to what bounds the rate); the last line is a short table the bench step reads. Stages, in order:
queue (waiting for a compile slot, then for a worker), static, compile, binary_check (the ELF
and instruction checks on the built library), prepare (the task's input sets, references and
baselines: once per task and worker), runner (waiting for a started runner), load, verify,
spares (stopping spare runners still starting, and reaping used ones, before the timing loop),
time, baselines (eager and torch.compile timed next to the candidate), other (the worker's time
outside those: setting up the checks, ending the runner), channel (the request's way to the
worker and back); Triton: compile_ahead (its kernels compiled before it queues for the worker,
sandbox/triton_precompile.py) and jit (the first call inside load: a cache load after a compile
ahead, else the whole compile).
The compile cache is a fresh temp directory, so every compile is real; --warm-compile compiles
every candidate once first, so the figure is the evaluation path alone (what the sandbox
runtime costs). --in-flight K submits K candidates at a time (a search with K expansions in
flight); 0, the default, submits all at once.
Issue 20's bar on one H200: cuda >= 200 candidates/min with a median latency <= 2 s, triton
>= 120/min.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kforge_tui.regions.build import task_of  # noqa: E402
from kforge_tui.sandbox.pool import EvaluatorPool  # noqa: E402

STAGES = ("queue", "static", "compile", "compile_ahead", "binary_check", "prepare", "runner", "load", "jit", "verify",
          "spares", "time", "baselines", "other", "channel")
WORKER_STAGES = ("prepare", "runner", "load", "verify", "spares", "time", "baselines", "other", "channel")

CPU_TEMPLATE = """// softmax variant {tag}
#include "kforge_region.h"
#include <float.h>
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {{
    const float* x = (const float*)inputs[0];
    float* y = (float*)outputs[0];
    const int64_t n = KF_IN0_SIZE_1, outer = KF_IN0_NUMEL / KF_IN0_SIZE_1, inner = 1;
#pragma omp parallel for schedule({sched})
    for (int64_t r = 0; r < outer * inner; ++r) {{
        const int64_t o = r / inner, i = r % inner;
        const float* xr = x + o * n * inner + i;
        float* yr = y + o * n * inner + i;
        float m = -FLT_MAX, s = 0.f;
        for (int64_t j = 0; j < n; ++j) m = fmaxf(m, xr[j * inner]);
        {body}
    }}
    return 0;
}}
"""
CPU_BODIES = {
    "store-exp": "for (int64_t j = 0; j < n; ++j) { float e = expf(xr[j * inner] - m); yr[j * inner] = e; s += e; }\n"
                 "        const float inv = 1.f / s;\n"
                 "        for (int64_t j = 0; j < n; ++j) yr[j * inner] *= inv;",
    "recompute": "for (int64_t j = 0; j < n; ++j) s += expf(xr[j * inner] - m);\n"
                 "        for (int64_t j = 0; j < n; ++j) yr[j * inner] = expf(xr[j * inner] - m) / s;",
    "double-acc": "double d = 0.0;\n"
                  "        for (int64_t j = 0; j < n; ++j) { float e = expf(xr[j * inner] - m); yr[j * inner] = e; d += e; }\n"
                  "        const float inv = (float)(1.0 / d); (void)s;\n"
                  "        for (int64_t j = 0; j < n; ++j) yr[j * inner] *= inv;",
    "online": "float mm = -FLT_MAX; (void)m;\n"
              "        for (int64_t j = 0; j < n; ++j) { float v = xr[j * inner]; if (v > mm) { s = s * expf(mm - v) + 1.f; mm = v; } else s += expf(v - mm); }\n"
              "        for (int64_t j = 0; j < n; ++j) yr[j * inner] = expf(xr[j * inner] - mm) / s;",
}
CPU_SCHEDS = ["static", "dynamic", "guided", "static, 4", "dynamic, 16"]

CUDA_TEMPLATE = """// softmax variant {tag}
#include "kforge_region.h"
#include <float.h>
constexpr int kThreads = {threads};
__device__ __forceinline__ float wmax(float v) {{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}}
__device__ __forceinline__ float wsum(float v) {{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}}
__device__ float block_reduce(float v, bool is_max) {{
    __shared__ float red[kThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = is_max ? wmax(v) : wsum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = threadIdx.x < kThreads / 32 ? red[threadIdx.x] : (is_max ? -FLT_MAX : 0.f);
    if (warp == 0) v = is_max ? wmax(v) : wsum(v);
    if (threadIdx.x == 0) red[0] = v;
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}}
__global__ void __launch_bounds__(kThreads) softmax_kernel(const float* __restrict__ x,
        float* __restrict__ y, int64_t n, int64_t inner) {{
    const int64_t row = blockIdx.x, o = row / inner, i = row % inner;
    const float* xr = x + o * n * inner + i;
    float* yr = y + o * n * inner + i;
    float m = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, {load});
    m = block_reduce(m, true);
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < n; j += kThreads) s += {exp}({load} - m);
    s = block_reduce(s, false);
    const float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < n; j += kThreads) yr[j * inner] = {exp}({load} - m) * inv;
}}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {{
    const int64_t n = KF_IN0_SIZE_1, outer = KF_IN0_NUMEL / KF_IN0_SIZE_1;
    softmax_kernel<<<(unsigned)outer, kThreads, 0, stream>>>((const float*)inputs[0], (float*)outputs[0], n, 1);
    return (int)cudaGetLastError();
}}
"""



TRITON_TEMPLATE = """# softmax variant {tag}
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, m, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, 0)
    e = {exp}
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, 0), m)


def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    rows, cols = x.shape
    softmax_rows[(rows,)](x, y, cols, BLOCK=triton.next_power_of_2(cols), num_warps={warps},
                          num_stages={stages})
    return 0
"""


def variants(backend: str, n: int) -> list[str]:
    out = []
    if backend == "cpu":
        for k, (body, sched) in enumerate(itertools.product(CPU_BODIES, CPU_SCHEDS)):
            out.append(CPU_TEMPLATE.format(tag=f"{k} {body} {sched}", sched=sched, body=CPU_BODIES[body]))
    elif backend == "triton":
        for k, (warps, stages, exp) in enumerate(itertools.product(
                (1, 2, 4, 8, 16), (1, 2, 3), ("tl.exp(x)", "tl.exp2(x * 1.4426950408889634)"))):
            out.append(TRITON_TEMPLATE.format(tag=f"{k} w{warps} s{stages}", warps=warps, stages=stages, exp=exp))
    else:
        for k, (threads, load, exp) in enumerate(itertools.product(
                (64, 128, 256, 512, 1024), ("xr[j * inner]", "__ldg(xr + j * inner)"), ("expf", "__expf"))):
            out.append(CUDA_TEMPLATE.format(tag=f"{k} t{threads} {exp}", threads=threads, load=load, exp=exp))
    if n > len(out):  # more than the distinct designs: copies that differ by a comment
        base = list(out)
        out += [src.replace(" variant ", f" variant (copy {i // len(base) + 1}) ", 1)
                for i, src in enumerate(base * (n // len(base) + 1))][: n - len(base)]
    return out[:n]


def stage_table(results) -> dict:
    """Per stage: median, p90 and mean seconds over the candidates (0 where a candidate had no
    such stage; "queue" is the compile queue and the worker queue together)."""
    def val(r, k):
        st = r.stage_s or {}
        return st.get("compile_queue", 0.0) + st.get("queue", 0.0) if k == "queue" else st.get(k, 0.0)

    out = {}
    for k in STAGES:
        xs = sorted(val(r, k) for r in results)
        if not any(xs):
            continue
        out[k] = {"median": statistics.median(xs), "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
                  "mean": statistics.fmean(xs)}
    return out


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "cuda", "triton"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--shape", default=None, help="rows,cols (default 4096,256 on a GPU, 256,1024 on the cpu)")
    ap.add_argument("--compile-jobs", type=int, default=None)
    ap.add_argument("--in-flight", type=int, default=0, help="candidates submitted at a time (0: all at once)")
    ap.add_argument("--warm-compile", action="store_true",
                    help="compile every candidate first (measure the evaluation path alone)")
    ap.add_argument("--json", default=None, help="write the figures and per-stage table here")
    ap.add_argument("--cluster", choices=("ray",), default=None,
                    help="evaluate through the Ray executor (kforge_tui/cluster): the cluster of "
                         "RAY_ADDRESS, else a local one of max(--nodes) CPU nodes started here")
    ap.add_argument("--nodes", default="1,2",
                    help="with --cluster: node counts to measure, one figure each (default 1,2)")
    args = ap.parse_args()
    if args.cluster and args.warm_compile:
        ap.error("--warm-compile measures the local pool's evaluation path; not with --cluster")
    gpu = torch.cuda.is_available()
    shape = tuple(int(s) for s in (args.shape or ("4096,256" if gpu else "256,1024")).split(","))
    if args.backend == "triton" and not gpu and args.shape is None:
        shape = (64, 256)  # Triton's interpreter on the cpu: a smoke-sized region
    args.shape = ",".join(map(str, shape))
    x = torch.randn(*shape)
    task = task_of(lambda x: torch.softmax(x, -1), (x,), backend=args.backend)
    srcs = variants(args.backend, args.n)
    if not args.cluster:
        with tempfile.TemporaryDirectory() as tmp:
            pool = EvaluatorPool(args.backend, cache_dir=Path(tmp) / "cache", compile_jobs=args.compile_jobs)
            return await measure(args, task, srcs, pool, tmp, "local pool")
    counts = [int(k) for k in args.nodes.split(",")]
    with _ray_cluster(args.backend, max(counts)):
        rc = 0
        for k in counts:
            from kforge_tui.cluster.executor import RayEvaluator

            # the nodes' compile cache is theirs, not a temp dir: other sources for every count
            mine = [f"{s}\n// ray, {k} nodes\n" for s in srcs]
            with tempfile.TemporaryDirectory() as tmp:
                ev = RayEvaluator("ray", args.backend, max_nodes=k, log=lambda m, lvl: print(f"  {m}"))
                rc |= await measure(args, task, mine, ev, tmp, f"ray, {k} node{'s' * (k > 1)}")
        return rc


class _ray_cluster:
    """RAY_ADDRESS's cluster as it is, or a local one started here: a head that evaluates
    nothing and `nodes` worker nodes (two CPUs each: a slot and a build), each its own processes."""

    def __init__(self, backend: str, nodes: int):
        self.backend, self.nodes, self.cluster = backend, nodes, None

    def __enter__(self):
        import os

        if os.environ.get("RAY_ADDRESS"):
            return self
        if self.backend != "cpu":
            raise SystemExit("--cluster ray on a GPU: start the cluster (ray start) and set RAY_ADDRESS")
        from ray.cluster_utils import Cluster

        os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        for _ in range(self.nodes):
            self.cluster.add_node(num_cpus=2)
        self.cluster.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = self.cluster.address
        return self

    def __exit__(self, *exc):
        if self.cluster is not None:
            import os

            os.environ.pop("RAY_ADDRESS", None)
            self.cluster.shutdown()


async def measure(args, task, srcs, pool, tmp, label: str) -> int:
    """Start `pool` (an EvaluatorPool or a RayEvaluator), time its baseline, then the candidates
    (--in-flight at a time); print the figures, the stage table and the one-line table row.
    0 when every candidate passed."""
    try:
        t = time.perf_counter()
        await pool.start()
        b = await pool.baseline(task.to_json(), tmp)
        warm = time.perf_counter() - t
        print(f"[{label}] start + baseline: {warm:.1f} s; eager {b.eager.median_us:.1f} us, floor "
              f"{b.floor_us:.2f} us; {b.sets} input sets; {len(srcs)} candidates, "
              f"compile_jobs={getattr(pool, 'compile_jobs', None) or 'Ray tasks'}, "
              f"in flight {args.in_flight or len(srcs)}")
        if args.warm_compile and args.backend != "triton":
            from kforge_tui.sandbox.compile import compile_candidate

            t = time.perf_counter()
            await asyncio.gather(*(compile_candidate(s, args.backend, pool.arch, pool.cache_dir,
                                                     header=task.header(args.backend)) for s in srcs))
            print(f"compiled {len(srcs)} candidates first in {time.perf_counter() - t:.1f} s")
        lat = []
        gate = asyncio.Semaphore(args.in_flight or len(srcs))

        async def one(src):
            async with gate:
                t0 = time.perf_counter()
                r = await pool.evaluate(task.to_json(), tmp, src)
                lat.append(time.perf_counter() - t0)
                return r

        t = time.perf_counter()
        results = await asyncio.gather(*(one(s) for s in srcs))
        wall = time.perf_counter() - t
    finally:
        await pool.close()
    ok = [r for r in results if r.ok]
    for r in results:
        if not r.ok:
            print(f"  FAILED {r.status}: {r.message}")
    per_min = len(results) / wall * 60
    stages = stage_table(results)
    worker_s = sum(stages.get(k, {}).get("mean", 0.0) for k in WORKER_STAGES)
    best = max((r.speedup or 0) for r in results)
    print(f"{len(ok)}/{len(results)} ok in {wall:.1f} s: {per_min:.1f} candidates/min; latency median "
          f"{statistics.median(lat):.2f} s (min {min(lat):.2f}, max {max(lat):.2f}); best speedup {best:.2f}x")
    print(f"stage         median s    p90 s   mean s   (worker stages' means add up to {worker_s:.3f} s "
          f"a candidate: at most {60 / max(worker_s, 1e-9):.0f}/min per worker)")
    for k, v in stages.items():
        print(f"  {k:<12} {v['median']:8.3f} {v['p90']:8.3f} {v['mean']:8.3f}")
    med = {k: stages.get(k, {}).get("median", 0.0) for k in STAGES}
    print("median s/stage: " + ", ".join(f"{k} {med[k]:.3f}" for k in STAGES if k in stages))
    med_us = statistics.median([r.timing.median_us for r in ok]) if ok else float("nan")
    timed = statistics.median([r.checks.get("timed_checks", 0) for r in ok]) if ok else 0
    print(f"timed median of medians {med_us:.1f} us; timed calls (all checked) per candidate, median "
          f"{timed:g}; checks per candidate: {ok[0].checks if ok else {}}")
    workers = sorted({r.worker.split("/")[0] for r in results if getattr(r, "worker", None)})
    if args.json:
        out = Path(args.json)
        prev = json.loads(out.read_text()) if out.exists() and args.cluster else {}
        prev[label] = {
            "backend": args.backend, "shape": [int(v) for v in args.shape.split(",")], "n": len(results), "ok": len(ok),
            "wall_s": wall, "per_min": per_min, "latency_median_s": statistics.median(lat),
            "latency_max_s": max(lat), "in_flight": args.in_flight or len(srcs), "stages": stages,
            "worker_s": worker_s, "timed_calls_median": timed, "best_speedup": best,
            "nodes_used": len(workers)}
        out.write_text(json.dumps(prev if args.cluster else prev[label], indent=1))
    print(f"| {label} | backend {args.backend} | shape {args.shape} | n {len(results)} | ok {len(ok)} | "
          f"cand/min {per_min:.1f} | latency med {statistics.median(lat):.2f} s | compile med "
          f"{med['compile']:.2f} s | verify med {med['verify']:.2f} s | time med {med['time']:.2f} s | "
          f"worker mean {worker_s:.2f} s | nodes used {len(workers)} |")
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
