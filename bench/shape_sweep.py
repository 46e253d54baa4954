"""Shape sweep of the kernel families against eager PyTorch, torch.compile and the floor (H200).

    python3 bench/shape_sweep.py --quick                 # ~36 points, < 6 minutes on an H200
    python3 bench/shape_sweep.py --ops softmax,layer_norm --dtypes float32 --budget 6
    python3 bench/shape_sweep.py --points softmax:float32:16:4194304,relu:bfloat16:1:1000

Coordinates: every family op at (rows, n) = (independent rows, elements per row) - softmax and
the norms [rows, n]; group_norm rows = N*G groups of n elements (C/G channels of H*W); pool rows
= N*C channels, an n-element window, output 1x1; elementwise rows*n elements; silu(a)*b [rows, n]
with a, b the halves of one [rows, 2n] tensor (row stride 2n: the strided layout the silu*b
family takes; the other families take contiguous inputs only, so there is no strided column).
The full grid: rows 1..10^6 and n 16..10^7, log-spaced, f32/bf16/f16, points whose input
exceeds --max-gib (4) skipped.

"Best" at a point is the best of a fixed, small built-in search, `--budget N` kernels per point
(quick: 4, else 6), chosen with the built-in proposer's own priors (search/proposers/builtin.py)
and without the engine: the default point of every family that serves the task, highest
`_family_prior` first; then one-step neighbours of those defaults (`BuiltinProposer._neighbours`:
one parameter moved one value up or down) in order of family prior x move prior (`_set_prior`);
the first N distinct points. Each is rendered by its family, compiled by nvcc (all points up
front, in parallel), loaded with ctypes (its own `kforge_launch(<pattern signature>)`) and
checked against `patterns.reference` (per-dtype tolerance); a wrong or failing kernel is reported
and never "best". The sweep is therefore also a GPU correctness check of every family's default
at every point.

Timing (one process, side by side): eager (`patterns.reference`), torch.compile (default mode,
static shapes: dynamic=False, as a fixed-shape model gets; compiled once before timing) and every
verified kernel are timed in --rounds interleaved rounds of up to --reps calls each: CUDA events
around each call, a 256 MB L2 flush (zero fill) before each; each batch of calls is queued behind
a GPU sleep, so the times are device times for everyone (host launch overhead - a few us for a
ctypes call, tens of us for torch.compile's Python path - never leaves the GPU idle inside a
timed call; without it the compile column swung 2x between two H200 machines); median and spread
((p90-p10)/median) over all calls. The floor: bytes of every input read once plus the output written once, over the
device-to-device copy bandwidth measured at the start of the run.

Output: one table (point, best family/params, best us, eager, compile, floor, best/compile,
best/floor), two summary lines (share of points where the best beats torch.compile; share within
1.25x of the floor among points whose floor is >= 10 us), and JSON under
runs/shape_sweep/ (or --out DIR), rewritten after every point. `python -m bench sweep` runs it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge_tui.regions import patterns  # noqa: E402
from kforge_tui.regions.meta import DTYPE_BYTES, TensorMeta  # noqa: E402
from kforge_tui.regions.patterns import OpTask  # noqa: E402

OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "adaptive_avg_pool2d", "gelu",
       "silu", "relu", "silu_mul")
DTYPES = ("float32", "bfloat16", "float16")
GRID_ROWS = (1, 10, 100, 1000, 10_000, 100_000, 1_000_000)
GRID_N = (16, 128, 1024, 8192, 65536, 524_288, 4_194_304, 10_000_000)
GRID_NUMEL = (16, 1000, 100_000, 1_000_000, 10_000_000, 100_000_000, 1_000_000_000)  # elementwise
MAX_GIB = 4.0

# The --quick preset: (op, dtype, rows, n). Chosen to cover every family op at the extremes of
# the grid (many tiny rows, few huge rows, multi-GiB tensors, launch-bound tiny tensors).
QUICK = [
    ("softmax", "float32", 1_000_000, 16),
    ("softmax", "bfloat16", 65536, 128),
    ("softmax", "float16", 8192, 1024),
    ("softmax", "bfloat16", 128, 65536),
    ("softmax", "float32", 16, 4_194_304),
    ("softmax", "float32", 1, 10_000_000),
    ("softmax", "float32", 2048, 262_144),
    ("log_softmax", "float32", 8192, 1024),
    ("log_softmax", "bfloat16", 64, 1_048_576),
    ("layer_norm", "float32", 16, 4_194_304),
    ("layer_norm", "bfloat16", 1_000_000, 64),
    ("layer_norm", "bfloat16", 8192, 4096),
    ("layer_norm", "float16", 1, 10_000_000),
    ("layer_norm", "float32", 1024, 131_072),
    ("rms_norm", "bfloat16", 1_000_000, 128),
    ("rms_norm", "float16", 4096, 8192),
    ("rms_norm", "float32", 16, 1_048_576),
    ("group_norm", "float32", 32, 262_144),
    ("group_norm", "bfloat16", 32, 2_097_152),
    ("group_norm", "float32", 32768, 64),
    ("group_norm", "float16", 1024, 16384),
    ("adaptive_avg_pool2d", "float32", 65536, 49),
    ("adaptive_avg_pool2d", "bfloat16", 1_000_000, 16),
    ("adaptive_avg_pool2d", "float32", 16, 1_048_576),
    ("adaptive_avg_pool2d", "float16", 2048, 65536),
    ("gelu", "float32", 1, 16),
    ("gelu", "bfloat16", 1000, 1000),
    ("gelu", "float32", 16384, 16384),
    ("silu", "bfloat16", 100_000, 10_000),
    ("silu", "float16", 4096, 4096),
    ("relu", "float32", 1_000_000, 1000),
    ("relu", "bfloat16", 1, 1000),
    ("silu_mul", "bfloat16", 1_000_000, 16),
    ("silu_mul", "bfloat16", 8192, 8192),
    ("silu_mul", "float32", 16, 1_048_576),
]


# ---------------------------------------------------------------- tasks at sweep coordinates


def _meta_task(op, inputs: dict, params: dict, out_shape, out_dtype, backend) -> OpTask:
    metas = []
    for name, v in inputs.items():
        if v is None:
            metas.append(TensorMeta(name, None, out_dtype))
        else:
            shape, dtype, stride = v
            metas.append(TensorMeta(name, tuple(shape), dtype, tuple(stride) if stride else None))
    return OpTask(op=op, dtype=metas[0].dtype, inputs=tuple(metas), output=TensorMeta("y", tuple(out_shape), out_dtype),
                  params=dict(params), backend=backend)


def make_task(op: str, shape, dtype: str, backend: str = "cuda", out_dtype: str | None = None, **params) -> OpTask:
    """A pattern task at `shape`, as capture would build it (no tensor is allocated).

    silu_mul: shape = (rows, cols), a and b the two halves of one [rows, 2*cols] tensor;
    group_norm: [N, C, H, W] with groups=G; adaptive_avg_pool2d: output_size=[OH, OW]."""
    shape = tuple(int(s) for s in shape)
    odt = out_dtype or dtype
    if op == "silu_mul":
        rows, cols = shape
        st = (2 * cols, 1)
        return _meta_task(op, {"a": ((rows, cols), dtype, st), "b": ((rows, cols), dtype, st)}, params,
                          (rows, cols), odt, backend)
    inputs = {"x": (shape, dtype, None)}
    out_shape = shape
    if op == "layer_norm":
        n = shape[-1]
        params.setdefault("normalized_shape", [n])
        params.setdefault("eps", 1e-5)
        nob = params.pop("no_bias", False)
        inputs["weight"] = ((n,), dtype, None)
        inputs["bias"] = None if nob else ((n,), dtype, None)
    elif op == "rms_norm":
        n = shape[-1]
        params.setdefault("normalized_shape", [n])
        params.setdefault("eps", 1e-6)
        params.setdefault("variant", "llama")
        inputs["weight"] = None if params.pop("no_weight", False) else ((n,), dtype, None)
    elif op == "group_norm":
        params.setdefault("eps", 1e-5)
        inputs["weight"] = ((shape[1],), dtype, None)
        inputs["bias"] = ((shape[1],), dtype, None)
    elif op == "adaptive_avg_pool2d":
        out_shape = shape[:-2] + tuple(params["output_size"])
    elif op in ("softmax", "log_softmax"):
        params.setdefault("dim", -1)
    elif op == "gelu":
        params.setdefault("approximate", "none")
    return _meta_task(op, inputs, params, out_shape, odt, backend)


def _hw(n: int) -> tuple[int, int]:
    """h x w = n, h the largest divisor of n not above sqrt(n)."""
    h = int(math.isqrt(n))
    while h > 1 and n % h:
        h -= 1
    return h, n // h


def point_task(op: str, rows: int, n: int, dtype: str, backend: str = "cuda", **params) -> OpTask:
    """The task of `op` with `rows` independent rows of `n` elements (see the module docstring)."""
    if op in ("softmax", "log_softmax", "layer_norm", "rms_norm", "silu_mul"):
        return make_task(op, (rows, n), dtype, backend, **params)
    if op == "group_norm":
        g = next(c for c in (32, 16, 8, 4, 2, 1) if rows % c == 0)
        cpg = next((c for c in (16, 8, 4, 2) if n % c == 0 and n // c >= 16), 1)
        h, w = _hw(n // cpg)
        return make_task(op, (rows // g, g * cpg, h, w), dtype, backend, groups=g, **params)
    if op == "adaptive_avg_pool2d":
        h, w = _hw(n)
        n1, c = (rows // 64, 64) if rows % 64 == 0 and rows >= 64 else (1, rows)
        return make_task(op, (n1, c, h, w), dtype, backend, output_size=[1, 1], **params)
    if op in ("gelu", "silu", "relu"):
        return make_task(op, (rows, n) if rows > 1 else (n,), dtype, backend, **params)
    raise ValueError(f"unknown op {op!r}")


def input_bytes(task: OpTask) -> int:
    if task.op == "silu_mul":  # a and b share one [rows, 2*cols] tensor
        a = task.inputs[0]
        return a.numel * 2 * DTYPE_BYTES[a.dtype]
    return sum(m.numel * DTYPE_BYTES[m.dtype] for m in task.inputs if m.present)


def floor_bytes(task: OpTask) -> int:
    """Every input read once plus the output written once (regions/floor.py's memory floor)."""
    return input_bytes(task) + task.output.numel * DTYPE_BYTES[task.output.dtype]


def grid_points(ops=OPS, dtypes=DTYPES, rows=GRID_ROWS, ns=GRID_N, max_gib: float = MAX_GIB) -> list[tuple]:
    """(op, dtype, rows, n) of the full sweep; elementwise ops over GRID_NUMEL (rows x n of the
    same numel time the same), points above `max_gib` of input skipped."""
    out = []
    for op in ops:
        for dt in dtypes:
            if op in ("gelu", "silu", "relu"):
                cells = [(1, m) if m <= 10_000_000 else (m // 10_000_000, 10_000_000) for m in GRID_NUMEL]
            else:
                cells = [(r, n) for r in rows for n in ns]
            for r, n in cells:
                t = point_task(op, r, n, dt)
                if input_bytes(t) <= max_gib * 2**30:
                    out.append((op, dt, r, n))
    return out


# ---------------------------------------------------------------- the short built-in search


class _Fam:
    """A family seen through the Design interface the proposer's priors read."""

    def __init__(self, fam, op):
        self.family, self.name, self.space, self.op = fam, fam.name, fam.space, op

    def extent(self, task):
        from kforge_tui.search.designs import pattern_extent

        return pattern_extent(task)

    def valid(self, task, p):
        return self.family.valid(task, p)


def parse_try(spec: str) -> list[tuple[str, dict]]:
    """--try 'coop_row:unroll=4/keep=192;vec_grid:grid=flat' -> [(family, overrides)]."""
    out = []
    for part in filter(None, spec.split(";")):
        name, _, kv = part.partition(":")
        over = {}
        for item in filter(None, kv.split("/")):
            k, _, v = item.partition("=")
            over[k] = int(v) if v.lstrip("-").isdigit() else v
        out.append((name, over))
    return out


def candidates(task: OpTask, budget: int, device: dict, tries=()) -> list[tuple[object, dict, float]]:
    """[(family, params, score)]: family defaults by prior, then one-step neighbours by
    family prior x move prior (see the module docstring), `budget` distinct points at most;
    then the --try points (overrides of a family's default) wherever they are valid."""
    from kforge_tui.search.families import families_for
    from kforge_tui.search.proposers.builtin import BuiltinProposer

    bp = BuiltinProposer()
    ctx = SimpleNamespace(device=device)
    fams = [f for f in families_for(task) if f.backend == "cuda"]
    scored = []
    for f in fams:
        fd = _Fam(f, task.op)
        scored.append((bp._family_prior(task, fd, ctx), f, fd))
    scored.sort(key=lambda t: -t[0])
    out, seen = [], set()

    def add(f, p, score):
        key = (f.name, json.dumps(p, sort_keys=True))
        if key not in seen and len(out) < budget:
            seen.add(key)
            out.append((f, p, score))

    for prior, f, _ in scored:
        add(f, f.default(task), prior)
    nb = []
    for prior, f, fd in scored:
        d = f.default(task)
        for k, v, q in BuiltinProposer._neighbours(task, fd, d):
            nb.append((prior * bp._set_prior(task, fd, d, k, v, ctx), f, q))
    nb.sort(key=lambda t: -t[0])
    for score, f, q in nb:
        add(f, q, score)
    for name, over in tries:
        for _, f, _ in scored:
            q = {**f.default(task), **over}
            if f.name == name and set(over) <= set(f.space) and f.valid(task, q):
                key = (f.name, json.dumps(q, sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    out.append((f, q, 0.0))
    return out


# ---------------------------------------------------------------- GPU side


def _nvcc(src: str, work: Path, name: str, arch: str) -> tuple[str | None, str]:
    cu, so = work / f"{name}.cu", work / f"{name}.so"
    cu.write_text(src)
    r = subprocess.run(["nvcc", f"-arch={arch}", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", str(cu),
                        "-o", str(so)], capture_output=True, text=True)
    return (str(so) if r.returncode == 0 else None), (r.stdout + r.stderr)[-1500:]


def _tensors(task: OpTask, torch, seed: int) -> dict:
    td = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    g = torch.Generator(device="cuda").manual_seed(seed)
    out, whole = {}, None
    for m in task.inputs:
        if not m.present:
            out[m.name] = None
        elif task.op == "silu_mul":
            if whole is None:
                whole = torch.randn(m.shape[0], 2 * m.shape[1], device="cuda", generator=g, dtype=td[m.dtype]) * 3
            out[m.name] = whole[:, : m.shape[1]] if m.name == "a" else whole[:, m.shape[1]:]
        elif len(m.shape) == 1 and m.name in ("weight", "bias"):
            out[m.name] = (torch.randn(m.shape, device="cuda", generator=g) * 0.2 + (1.0 if m.name == "weight" else 0.0)).to(td[m.dtype])
        else:
            scale = 4.0 if task.op in ("softmax", "log_softmax") else 1.0
            t = torch.randn(m.shape, device="cuda", generator=g, dtype=td[m.dtype])
            out[m.name] = t.mul_(scale).add_(0.3)
    return out


TOL = {"float32": (1e-4, 1e-5), "float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 8e-3)}


def _check(out, ref) -> str | None:
    """None when `out` matches `ref` elementwise within the per-dtype tolerance (the sandbox's
    rule: |d| <= atol * max|ref| + rtol * |ref|), checked in slices to bound the memory."""
    import torch

    rtol, atol = TOL[str(ref.dtype).replace("torch.", "")]
    e, g = ref.reshape(-1), out.reshape(-1)
    scale = float(e.abs().max().float())
    bad, worst, step = 0, 0.0, 1 << 26
    for i in range(0, e.numel(), step):
        ef, gf = e[i:i + step].float(), g[i:i + step].float()
        d = (gf - ef).abs()
        ok = (gf == ef) | (d <= atol * scale + rtol * ef.abs())
        bad += int((~ok).sum())
        worst = max(worst, float(d.nan_to_num(1e30).max()))
    del e, g
    torch.cuda.synchronize()
    return None if bad == 0 else f"{bad}/{out.numel()} wrong, max abs {worst:.3g}"


# Host time allowed per queued call when the GPU is held back (see _time_rounds); generous: a
# torch.compile call (guards, Triton launcher) costs tens of microseconds of Python.
HOST_US_PER_CALL = 150.0
GPU_HZ = 2.0e9  # the sleep is in cycles; a slower clock only makes it longer


def _time_rounds(fns: dict, flush, rounds: int, reps: int, torch) -> dict[str, list[float]]:
    """{name: [us per call]}: `rounds` rounds, each callable `reps` calls per round, interleaved;
    events recorded around every call, L2 flushed before each, one synchronisation per batch.
    Each batch starts with a GPU sleep long enough for the host to queue all its calls first, so
    the events measure device time for every callable alike: neither our ctypes call (~µs) nor
    torch.compile's Python launch path (tens of µs) can leave the GPU idle inside a timed call."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            torch.cuda._sleep(int(reps * HOST_US_PER_CALL * 1e-6 * GPU_HZ))
            for s, e in ev:
                flush.zero_()
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            times[name] += [s.elapsed_time(e) * 1000.0 for s, e in ev]
    return times


def _stats(ts: list[float]) -> tuple[float, float]:
    ts = sorted(ts)
    med = statistics.median(ts)
    p10, p90 = ts[int(0.1 * (len(ts) - 1))], ts[int(0.9 * (len(ts) - 1))]
    return med, (p90 - p10) / med if med > 0 else 0.0


def _compiled_fn(task: OpTask, i: int, torch):
    """torch.compile of the point's reference with its own code object (dynamo caches per code
    object, so points do not share one cache entry and hit its recompile limit)."""
    ns = {"ref": patterns.reference, "task": task}
    exec(f"def point_{i}(d):\n    return ref(task, d)\n", ns)
    return torch.compile(ns[f"point_{i}"], dynamic=False)


def run(points: list[tuple], budget: int, rounds: int, reps: int, out_dir: Path, jobs: int,
        with_compile: bool = True, tries=()) -> int:
    import torch
    import torch._dynamo

    for k, v in (("recompile_limit", 64), ("accumulated_recompile_limit", 100_000), ("cache_size_limit", 64),
                 ("accumulated_cache_size_limit", 100_000)):
        if hasattr(torch._dynamo.config, k):
            setattr(torch._dynamo.config, k, v)
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    cc = f"{props.major}.{props.minor}"
    device = {"sms": props.multi_processor_count, "compute_capability": cc,
              "l2_bytes": getattr(props, "L2_cache_size", 50 * 2**20)}
    arch = f"sm_{props.major}{props.minor}"
    flush = torch.empty(2**26, dtype=torch.float32, device="cuda")
    a = torch.empty(2**28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    bw_us, _ = _stats(_time_rounds({"copy": lambda: b.copy_(a)}, flush, 2, 10, torch)["copy"])
    bw = 2 * a.numel() * 4 / (bw_us * 1e-6) / 1e9
    del a, b
    print(f"# {props.name} ({device['sms']} SMs, cc {cc})  copy {bw:.0f} GB/s  torch {torch.__version__}  "
          f"{len(points)} points, budget {budget}", flush=True)

    # 1. render every point's candidates and compile them all, in parallel, while torch.compile
    #    compiles every point's reference in this thread
    tasks = [point_task(op, r, n, dt) for op, dt, r, n in points]
    work = Path(tempfile.mkdtemp(prefix="kforge_sweep_"))
    cand = []  # per point: [(family name, params, source key)]
    sources: dict[str, str] = {}
    for task in tasks:
        row = []
        for f, p, _ in candidates(task, budget, device, tries):
            try:
                src = f.render(task, p)
            except Exception as e:  # a family that cannot render here is reported, not fatal
                row.append((f.name, p, None, f"render: {e}"))
                continue
            key = f"k{len(sources)}"
            sources[key] = src
            row.append((f.name, p, key, None))
        cand.append(row)
    pool = ThreadPoolExecutor(jobs)
    futs = {k: pool.submit(_nvcc, src, work, k, arch) for k, src in sources.items()}
    compiled = {}
    if with_compile:
        for i, task in enumerate(tasks):
            try:
                inp = _tensors(task, torch, seed=i)
                fn = _compiled_fn(task, i, torch)
                fn(inp)
                compiled[i] = fn
                del inp
            except Exception as e:
                compiled[i] = f"{type(e).__name__}: {str(e)[:200]}"
            torch.cuda.empty_cache()
        print(f"# torch.compile done for {len(tasks)} points in {time.time() - t0:.0f}s", flush=True)
    built = {k: f.result() for k, f in futs.items()}
    pool.shutdown()
    nok = sum(1 for so, _ in built.values() if so)
    print(f"# nvcc: {nok}/{len(built)} kernels built; {time.time() - t0:.0f}s so far", flush=True)

    # 2. per point: check every candidate, then time everything side by side
    results = []
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    jpath = out_dir / f"sweep-{stamp}.json"
    for i, ((op, dt, r, n), task) in enumerate(zip(points, tasks)):
        label = f"{op} {dt} {r}x{n}"
        rec = {"op": op, "dtype": dt, "rows": r, "n": n, "shape": list(task.shape), "task_id": task.task_id,
               "floor_bytes": floor_bytes(task), "candidates": []}
        try:
            inp = _tensors(task, torch, seed=i)
            ref = patterns.reference(task, inp)
            y = torch.empty_like(ref)
            fns = {"eager": lambda inp=inp: patterns.reference(task, inp)}
            cf = compiled.get(i)
            if callable(cf):
                fns["compile"] = lambda cf=cf, inp=inp: cf(inp)
            elif cf:
                rec["compile_error"] = cf
            sig = patterns.signature(task, "cuda")
            scal = patterns.scalar_args(task)
            stream = torch.cuda.current_stream().cuda_stream
            for fname, p, key, err in cand[i]:
                c = {"family": fname, "params": p}
                rec["candidates"].append(c)
                if err or key is None:
                    c["error"] = err
                    continue
                so, log = built[key]
                if so is None:
                    c["error"] = "compile: " + log.strip().splitlines()[-1][:200] if log.strip() else "compile failed"
                    continue
                fn = getattr(ctypes.CDLL(so), patterns.ENTRY)
                fn.restype = ctypes.c_int
                fn.argtypes = sig.argtypes()
                args = sig.call_args(inp, y, scal, stream)
                y.fill_(float("nan"))
                rc = fn(*args)
                torch.cuda.synchronize()
                bad = f"rc={rc}" if rc else _check(y, ref)
                if bad:
                    c["error"] = "wrong: " + bad
                    print(f"  {label}: {fname} {p}: {c['error']}", flush=True)
                    continue
                fns[f"k{len(fns)}"] = (lambda fn=fn, args=args: fn(*args))
                c["slot"] = f"k{len(fns) - 1}"
            # reps so that one callable's round takes ~30 ms (5..25 calls)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns["eager"]()
            e.record()
            torch.cuda.synchronize()
            est = s.elapsed_time(e) * 1000.0 + 80.0
            nrep = max(5, min(reps, int(30_000 / est)))
            times = _time_rounds(fns, flush, rounds, nrep, torch)
            st = {k: _stats(v) for k, v in times.items()}
            rec["eager_us"], rec["eager_spread"] = st["eager"]
            if "compile" in st:
                rec["compile_us"], rec["compile_spread"] = st["compile"]
            best = None
            for c in rec["candidates"]:
                if "slot" in c:
                    c["us"], c["spread"] = st[c.pop("slot")]
                    if best is None or c["us"] < best["us"]:
                        best = c
            rec["best"] = best
            rec["floor_us"] = rec["floor_bytes"] / (bw * 1e9) * 1e6
            del inp, ref, y, fns
        except Exception as ex:  # report the point, keep sweeping
            rec["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
            print(f"  {label}: POINT FAILED {rec['error']}", flush=True)
        torch.cuda.empty_cache()
        results.append(rec)
        _line(rec, flush_=True)
        jpath.write_text(json.dumps({"device": props.name, "sms": device["sms"], "copy_gbs": bw,
                                     "torch": torch.__version__, "budget": budget,
                                     "timing": "device time: CUDA events, 256 MB L2 flush before each call, "
                                               "host queued ahead behind a GPU sleep; median of rounds x reps",
                                     "points": results}, indent=1))
    _table(results, bw)
    print(f"# wall {time.time() - t0:.0f}s; JSON: {jpath}", flush=True)
    return 0


def _fmt_params(c: dict) -> str:
    return c["family"] + " " + ",".join(f"{k}={v}" for k, v in c["params"].items())


def _line(rec: dict, flush_: bool = False) -> None:
    b = rec.get("best")
    tag = f"{rec['op']} {rec['dtype']} {rec['rows']}x{rec['n']}"
    if rec.get("error") or b is None:
        print(f"  {tag}: {rec.get('error') or 'no verified kernel'}", flush=flush_)
        return
    print(f"  {tag}: best {b['us']:.1f} us ({_fmt_params(b)}), eager {rec['eager_us']:.1f}, compile "
          f"{rec.get('compile_us', float('nan')):.1f}, floor {rec['floor_us']:.1f}", flush=flush_)


def _table(results: list[dict], bw: float) -> None:
    print(f"\n{'point':36s} {'best family/params':48s} {'best':>8s} {'eager':>8s} {'compile':>8s} {'floor':>8s} "
          f"{'b/comp':>6s} {'b/flr':>6s}")
    beat = n_comp = near = n_floor = 0
    for rec in results:
        tag = f"{rec['op']} {rec['dtype'][:4]} {rec['rows']}x{rec['n']}"
        b = rec.get("best")
        if b is None:
            print(f"{tag:36s} {(rec.get('error') or 'no verified kernel')[:48]:48s}")
            continue
        comp = rec.get("compile_us", float("nan"))
        fl = rec["floor_us"]
        print(f"{tag:36s} {_fmt_params(b)[:48]:48s} {b['us']:8.1f} {rec['eager_us']:8.1f} {comp:8.1f} {fl:8.1f} "
              f"{b['us'] / comp:6.2f} {b['us'] / fl:6.2f}")
        if comp == comp:
            n_comp += 1
            beat += b["us"] < comp
        if fl >= 10.0:
            n_floor += 1
            near += b["us"] <= 1.25 * fl
    print(f"beats torch.compile: {beat}/{n_comp} points ({100.0 * beat / max(1, n_comp):.0f} %)")
    print(f"within 1.25x of the floor (floor >= 10 us): {near}/{n_floor} points "
          f"({100.0 * near / max(1, n_floor):.0f} %)  [copy {bw:.0f} GB/s]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the QUICK preset (~36 points, < 6 min on an H200)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--rows", default="", help="comma-separated rows (default: the grid's)")
    ap.add_argument("--n", default="", help="comma-separated row lengths (default: the grid's)")
    ap.add_argument("--points", default="", help="explicit op:dtype:rows:n,... (overrides the grid)")
    ap.add_argument("--only", default="", help="keep points whose 'op dtype rowsxn' contains one of these (|-separated)")
    ap.add_argument("--budget", type=int, default=0, help="kernels per point (default: quick 4, else 6)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=25, help="at most this many calls per callable per round")
    ap.add_argument("--max-gib", type=float, default=MAX_GIB)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 8, help="parallel nvcc processes")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "shape_sweep")
    ap.add_argument("--try", dest="tries", default="",
                    help="extra points wherever valid: 'family:k=v/k=v;family:k=v' (overrides of its default)")
    ap.add_argument("--list", action="store_true", help="print the points and their candidates, then exit (no GPU)")
    a = ap.parse_args()
    if a.points:
        pts = []
        for s in a.points.split(","):
            op, dt, r, n = s.split(":")
            pts.append((op, dt, int(r), int(n)))
    elif a.quick:
        pts = list(QUICK)
    else:
        rows = tuple(int(v) for v in a.rows.split(",")) if a.rows else GRID_ROWS
        ns = tuple(int(v) for v in a.n.split(",")) if a.n else GRID_N
        pts = grid_points(tuple(a.ops.split(",")), tuple(a.dtypes.split(",")), rows, ns, a.max_gib)
    if a.only:
        pts = [p for p in pts if any(o in f"{p[0]} {p[1]} {p[2]}x{p[3]}" for o in a.only.split("|"))]
    budget = a.budget or (4 if a.quick else 6)
    if a.list:
        dev = {"sms": 132, "compute_capability": "9.0", "l2_bytes": 50 * 2**20}
        for op, dt, r, n in pts:
            t = point_task(op, r, n, dt)
            cs = candidates(t, budget, dev, parse_try(a.tries))
            print(f"{op} {dt} {r}x{n} {list(t.shape)}: " + "; ".join(f"{_fmt_params({'family': f.name, 'params': p})}"
                                                                    for f, p, _ in cs))
        print(f"{len(pts)} points")
        return 0
    return run(pts, budget, a.rounds, a.reps, a.out, a.jobs, not a.no_compile, parse_try(a.tries))


if __name__ == "__main__":
    sys.exit(main())
