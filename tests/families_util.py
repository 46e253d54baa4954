"""Test-local helpers for the kernel-family tests: pattern tasks built like capture builds them,
batched nvcc compiles, the static check on the source the sandbox really sees (the family render
adapted to the region entry point), and a ctypes runner for cpu kernels in a child process.

Nothing here depends on the sandbox worker (being rewritten); the tolerance table is a copy of
the per-dtype one verification uses. Pattern tasks at any shape: `make(op, shape, dtype, backend,
**params)` and `make_rows(op, rows, n, dtype)` (bench/shape_sweep.py's builders, no allocation).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from kforge_tui.regions import patterns
from kforge_tui.regions.patterns import OpTask

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)
GXX = shutil.which("g++")
DTYPES = ("float32", "float16", "bfloat16")
TD = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# (rtol, atol relative to the reference's largest magnitude), per output dtype
TOL = {"float32": (1e-4, 1e-5), "float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 8e-3)}


# Tasks at any shape, built as capture builds them but without allocating (bench/shape_sweep.py
# owns the builders so that the tests check exactly the sweep's tasks).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from shape_sweep import make_task as make  # noqa: E402
from shape_sweep import point_task as make_rows  # noqa: E402,F401


# ---------------------------------------------------------------- compile


def compile_one(src: str, backend: str, workdir: Path, name: str, shared: bool = True,
                device_only: bool = False) -> tuple[int, str, Path]:
    """Compile one source: a shared library, an object (`shared=False`), or for cuda with
    `device_only` a cubin (nvcc's front end still checks the host code and instantiates every
    kernel the launchers name; the host compiler pass is skipped: about a third less time)."""
    ext = ".cu" if backend == "cuda" else ".cpp"
    path = workdir / f"{name}{ext}"
    path.write_text(src)
    out = workdir / (f"{name}.so" if shared else f"{name}.cubin" if device_only else f"{name}.o")
    if backend == "cuda" and device_only:
        cmd = [NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-cubin", str(path), "-o", str(out)]
    elif backend == "cuda":
        cmd = [NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
               *(["-shared"] if shared else ["-c"]), str(path), "-o", str(out)]
    else:
        cmd = [GXX, "-O3", "-march=native", "-fopenmp", "-fPIC", "-std=c++17",
               *(["-shared"] if shared else ["-c"]), str(path), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    return r.returncode, (r.stdout + r.stderr)[-4000:], out


_INCLUDE = re.compile(r"^\s*#\s*include\s*<[^>]+>\s*$", re.M)


def batch_cuda(sources: list[str]) -> str:
    """Several family renders as one translation unit: each inside its own namespace, its entry
    point renamed kforge_launch_<i> (still extern "C"), the #includes hoisted to the top. nvcc's
    fixed cost (headers, host pass: ~1.5 s a file) is paid once for the batch."""
    incs: list[str] = []
    parts = []
    for i, src in enumerate(sources):
        for m in _INCLUDE.findall(src):
            if m.strip() not in incs:
                incs.append(m.strip())
        body = _INCLUDE.sub("", src)
        decl = f'extern "C" int {patterns.ENTRY}('
        assert body.count(decl) == 1, "a family render must define the entry point once"
        body = body.replace(decl, f'extern "C" int {patterns.ENTRY}_{i}(')
        parts.append(f"namespace kfb{i} {{\n{body}\n}}  // namespace kfb{i}\n")
    return "\n".join(incs) + "\n" + "\n".join(parts)


def compile_cuda_batches(jobs: list[tuple[str, str]], workdir: Path, per_batch: int = 12,
                         threads: int | None = None, device_only: bool = False) -> list[str]:
    """jobs: [(label, cuda source)] -> failure strings. Compile-only (-c, or -cubin with
    `device_only`), `per_batch` sources per translation unit."""
    threads = threads or max(1, os.cpu_count() or 2)
    batches = [jobs[i:i + per_batch] for i in range(0, len(jobs), per_batch)]

    def one(ib):
        i, b = ib
        rc, log, _ = compile_one(batch_cuda([s for _, s in b]), "cuda", workdir, f"batch{i}", shared=False,
                                 device_only=device_only)
        if rc == 0:
            return []
        # name the failing kernels: the log's line numbers fall inside their namespaces
        return [f"batch {i} ({', '.join(lbl for lbl, _ in b)}):\n{log}"]

    with ThreadPoolExecutor(threads) as ex:
        return [f for r in ex.map(one, enumerate(batches)) for f in r]


# ---------------------------------------------------------------- static check (adapted source)


def adapted(task: OpTask, src: str) -> tuple[str, object]:
    """The family source as the sandbox receives it for a region whose inputs are the pattern's
    inputs in order (patterns.adapt), and the region signature to check it against."""
    from types import SimpleNamespace

    from kforge_tui.regions import abi

    present = [m for m in task.inputs]
    inputs = {m.name: ([i, 0] if m.present else None) for i, m in enumerate(present)}
    if task.op == "silu_mul":  # a and b are the halves of one region input
        cols = task.inputs[0].shape[-1]
        inputs = {"a": [0, 0], "b": [0, cols]}
    b = patterns.Binding(task, inputs)
    region = SimpleNamespace(backend=task.backend)
    sig = abi.Signature(task.backend, tuple(task.inputs), (task.output,))
    return patterns.adapt(src, b, region), sig


def static_problems(task: OpTask, src: str) -> str | None:
    from kforge_tui.sandbox.static import check_source

    text, sig = adapted(task, src)
    rep = check_source(text, sig)
    return None if rep.ok else "; ".join(d.text() for d in rep.diagnostics)


# ---------------------------------------------------------------- cpu kernels against the reference

_CHILD = textwrap.dedent(r'''
    # Runs candidate libraries in a throwaway process: a crash here cannot take pytest down.
    import ctypes, json, sys, torch
    from kforge_tui.regions import patterns
    from kforge_tui.regions.patterns import OpTask
    TD = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    TOL = json.loads(sys.argv[1])
    for line in sys.stdin:
        spec = json.loads(line)
        task = OpTask.from_json(spec["task"])
        fn = getattr(ctypes.CDLL(spec["so"]), patterns.ENTRY)
        fn.restype = ctypes.c_int
        sig = patterns.signature(task)
        fn.argtypes = sig.argtypes()
        sizes = patterns.scalar_args(task)
        out = []
        for seed in range(spec["trials"]):
            g = torch.Generator().manual_seed(seed)
            inputs, whole = {}, None
            for m in task.inputs:
                if not m.present:
                    inputs[m.name] = None
                elif task.op == "silu_mul":
                    if whole is None:
                        whole = (torch.randn(m.shape[0], 2 * m.shape[1], generator=g) * 3).to(TD[m.dtype])
                    inputs[m.name] = whole[:, : m.shape[1]] if m.name == "a" else whole[:, m.shape[1]:]
                else:
                    t = torch.randn(m.shape, generator=g) * 2 + (0.5 if m.name == "x" else 1.0)
                    inputs[m.name] = t.to(TD[m.dtype])
            before = {k: (v.clone() if v is not None else None) for k, v in inputs.items()}
            ref = patterns.reference(task, inputs)
            y = torch.full(task.output.shape, float("nan"), dtype=TD[task.output.dtype])
            rc = fn(*sig.call_args(inputs, y, sizes))
            rtol, atol = TOL[task.output.dtype]
            e, gq = ref.float(), y.float()
            scale = e.abs().max().item() if e.numel() else 1.0
            diff = (gq - e).abs()
            bad = ~((gq == e) | (diff <= atol * scale + rtol * e.abs()))
            changed = any(v is not None and not torch.equal(v, before[k]) for k, v in inputs.items())
            out.append({"rc": rc, "bad": int(bad.sum()), "max_abs": float(diff.nan_to_num(1e30).max()),
                        "changed": changed})
        print(json.dumps({"label": spec["label"], "results": out}), flush=True)
''')


def run_cpu_many(jobs, workdir: Path, trials: int = 2) -> dict[str, list[dict]]:
    """jobs: [(label, task, source)]. Compile in parallel, run all in one child process."""
    distinct = list(dict.fromkeys(src for _, _, src in jobs))  # each source compiled once

    def build(i_src):
        i, src = i_src
        rc, log, so = compile_one(src, "cpu", workdir, f"c{i}")
        return src, (rc, log, so)

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as ex:
        built = dict(ex.map(build, enumerate(distinct)))
    specs = []
    for label, task, src in jobs:
        rc, log, so = built[src]
        assert rc == 0, f"{label}: {log}"
        specs.append(json.dumps({"label": label, "task": task.to_json(), "so": str(so), "trials": trials}))
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(TOL)], input="\n".join(specs) + "\n",
                       capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "2"})
    done = [json.loads(x) for x in r.stdout.strip().splitlines() if x.startswith("{")]
    if r.returncode != 0:
        nxt = jobs[len(done)][0] if len(done) < len(jobs) else "?"
        raise AssertionError(f"child died ({r.returncode}) running {nxt}: {r.stderr[-2000:]}")
    return {d["label"]: d["results"] for d in done}


def failures(res: dict[str, list[dict]]) -> list[str]:
    return [f"{label}: {r}" for label, rs in res.items() for r in rs if r["rc"] != 0 or r["bad"] or r["changed"]]
