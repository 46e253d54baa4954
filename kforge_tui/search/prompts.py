"""Prompts for LLM proposers, and pulling the one kernel source back out of an answer.

A prompt carries everything a kernel engineer would want before writing one candidate: the
region's own PyTorch code (its aten graph, as torch.compile captured it) as the reference, the
generic entry point with the task's ABI header (every input and output with shape, strides and
dtype), where in the model it comes from, the machine, the floor (memory or compute bound) and
the eager / torch.compile times, the
parent's source with its measured time and resources, the failure report when repairing, and
one line per sibling so the model tries something different. Plain text, no Jinja: the
structure is fixed and a dependency would buy nothing.
"""
from __future__ import annotations

import json
import re

from kforge_tui.search.proposers.base import NodeView, ProposalContext

ENTRY = "kforge_launch"
MAX_SOURCE_CHARS = 16000  # parent source beyond this is cut (the model sees head and tail)
MAX_LOG_CHARS = 4000
MAX_SIBLINGS = 8

SYSTEM = (
    "You are an expert performance engineer who writes {lang} kernels that beat PyTorch. "
    "You answer with exactly one fenced code block containing one complete, self-contained "
    "source file, optionally preceded by at most three sentences on the idea. Never more than "
    "one code block.")

RULES_COMMON = [
    "One self-contained source file that defines exactly the entry point given below, with C "
    "linkage (extern \"C\"), returning 0 on success.",
    "No torch, ATen, c10, pybind11, cuBLAS or cuDNN headers or calls; only standard C/C++ "
    "headers{extra_headers}.",
    "No static or global mutable state (no non-const `static` variables, no writable globals, "
    "no thread_local): every call must compute its result from its inputs alone.",
    "No files, processes, sockets, environment variables, dlopen or inline host assembly.",
    "inputs[i] / outputs[j] point at element 0 of the i-th input / j-th output, laid out with "
    "exactly the strides in the header; write every element of every output; do not modify "
    "the inputs; an input marked absent is NULL.",
    "It must be correct for exactly these shapes and dtypes, within float tolerance of the "
    "reference, on the captured tensors and on fresh random tensors of the same shapes.",
]
RULES_CUDA = [
    "Launch on the given `stream` only; no stream, event or graph creation, no "
    "cudaDeviceSynchronize, no thread creation; return (int)cudaGetLastError() after launching.",
    "Scratch memory only through cudaMallocAsync/cudaFreeAsync on the given stream "
    "(never cudaMalloc, cudaMallocManaged or host-pinned allocations).",
    "Element types: float, __half (cuda_fp16.h), __nv_bfloat16 (cuda_bf16.h); accumulate in "
    "float. The region header includes cuda_fp16.h / cuda_bf16.h only when a tensor has that "
    "type: include them yourself to use them otherwise. Inline PTX is allowed in __device__ code.",
]
RULES_CPU = [
    "Plain C++17 compiled with `g++ -O3 -march=native -fopenmp`; OpenMP pragmas and "
    "immintrin.h intrinsics are allowed; no std::thread, std::async or pthreads.",
    "float16/bfloat16 tensors arrive as uint16_t raw bits: convert to and from float yourself "
    "(round to nearest even when writing); accumulate in float.",
    "malloc/free for scratch are allowed; free everything before returning.",
]


RULES_TRITON = [
    "One self-contained Python file: `@triton.jit` kernels and exactly the entry point below, "
    "which launches them and returns 0.",
    "Imports: only `triton`, `triton.language as tl`, `from triton.language.extra import "
    "libdevice`, `math` and `torch` (torch only for dtypes such as torch.float32 and for "
    "declared scratch).",
    "inputs[i] / outputs[j] are torch tensors with exactly the shapes, strides and dtypes listed "
    "(None for an absent input); pass them to kernels as pointers. In the launcher, touch them "
    "only through .shape, .stride(), .numel(), .dtype, .device, .data_ptr() (and .zero_() / "
    ".fill_() to initialise before atomics): no torch operations, no copies, no .contiguous() "
    "— every value is computed by your kernels.",
    "Scratch memory only as top-level statements of kforge_launch with literal sizes: "
    "`buf = torch.empty_strided((n0, n1), (s0, s1), dtype=torch.float32, "
    "device=outputs[0].device)` (or torch.empty / torch.zeros).",
    "A GEMM may be a vendor-library call, as a top-level statement writing into a given buffer: "
    "`torch.mm(a, b, out=buf)` (also torch.addmm / torch.bmm / torch.baddbmm; operands viewed "
    "with `.as_strided(size, stride)`); the rest of the region is your kernels.",
    "No module-level state: module-level code is imports, functions and constants "
    "(`BLOCK: tl.constexpr = 1024`, literals, tuples); no lists/dicts at module level, no "
    "`global`, no attributes stored on functions or kernels, no mutable default arguments, no "
    "classes, no try/with.",
    "No os, sys, subprocess, ctypes, threads, files, printing, eval/exec, getattr, dunder or "
    "private attributes; decorators only triton.jit, triton.autotune, triton.heuristics.",
    "Write every element of every output; do not modify the inputs. It must be correct for "
    "exactly these shapes and dtypes, within float tolerance of the reference, on the captured "
    "tensors and on fresh random tensors of the same shapes; accumulate in float32.",
    "Launch with kernel[grid](...) on the current stream (the default); Triton's JIT compile "
    "time counts in the candidate's latency, so keep the number of distinct kernels and "
    "autotune configs small.",
]


def _triton_header(task: dict) -> str:
    """The Python ABI block of a triton task (regions/abi.py python_header)."""
    from kforge_tui.regions import abi
    from kforge_tui.regions.meta import TensorMeta

    ins = [TensorMeta.from_json(m) for m in task.get("inputs", [])]
    outs = [TensorMeta.from_json(m) for m in task.get("outputs", [])]
    return abi.python_header(ins, outs)


def _inductor_start(task: dict) -> str | None:
    """Inductor's own kernel for the region on the candidate ABI (search/inductor_seed.py), or
    None when Inductor's code for it cannot be rewritten (cached per task)."""
    try:
        from kforge_tui.regions.task import Task
        from kforge_tui.search import inductor_seed

        return inductor_seed.seed_source(Task.from_json(dict(task, backend="triton")))
    except Exception:
        return None


def _inductor_config(task: dict) -> str:
    """Inductor's launch config of each seed kernel (the autotuner's choice on a GPU, else its
    first heuristic config) and the candidates it had: where a tuning move starts."""
    try:
        from kforge_tui.regions.task import Task
        from kforge_tui.search import inductor_seed

        seed = inductor_seed.seed_for(Task.from_json(dict(task, backend="triton")))
    except Exception:
        return ""
    if seed is None:
        return ""

    def cfg(c: dict) -> str:
        kw = ", ".join(f"{k}={v}" for k, v in sorted((c.get("kwargs") or {}).items()))
        return f"{kw + ', ' if kw else ''}num_warps={c.get('num_warps')}, num_stages={c.get('num_stages')}"

    lines = []
    for k in seed.kernels.values():
        if k.generated:
            continue
        how = "autotuned on the GPU" if k.chosen else "Inductor's first heuristic config"
        lines.append(f"- `{k.name}` ({k.kind}, {k.grid_type}): {cfg(k.default_config)} ({how})")
        others = [cfg(c) for c in k.configs if c != k.default_config][:4]
        if others:
            lines.append("  other configs Inductor considered: " + "; ".join(others))
    for lib in seed.libraries:
        lines.append(f"- a `torch.{lib}` library call (cuBLAS on the GPU) for the GEMM")
    return "\n".join(lines)


def prompt_language(ctx: ProposalContext) -> str:
    """The language this proposal is written in: the parent's (improving Inductor's Triton seed
    in an `auto` run stays Triton), Triton for a first kernel when the run searches it and
    Inductor's kernel exists, else the task's backend."""
    from kforge_tui.search.languages import language_of

    task_b = ctx.task.get("backend", ctx.device.get("backend", "cuda"))
    langs = list(ctx.languages or [])
    if ctx.parent.source:
        lang = language_of(ctx.parent.source, task_b)
        return lang if lang == task_b or lang in langs else task_b
    if "triton" in langs and task_b != "triton" and _inductor_start(ctx.task):
        return "triton"
    return task_b


def _fmt_us(x: float | None) -> str:
    return f"{x:.2f} us" if x is not None else "not measured"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


def _lang(backend: str) -> tuple[str, str]:
    if backend == "triton":
        return "Triton", "python"
    return ("CUDA", "cuda") if backend == "cuda" else ("C++", "cpp")


def describe_device(device: dict) -> str:
    if device.get("backend") == "cuda":
        bw = device.get("bandwidth_gbs") or device.get("peak_bandwidth_gbs")
        parts = [device.get("name", "GPU"),
                 f"compute capability {device.get('compute_capability', '?')} "
                 f"({device.get('arch', '')})",
                 f"{device.get('sms', '?')} SMs"]
        if device.get("l2_bytes"):
            parts.append(f"L2 {device['l2_bytes'] // 2**20} MiB")
        if device.get("memory_gb"):
            parts.append(f"{device['memory_gb']:.0f} GB memory")
        if bw:
            parts.append(f"memory bandwidth {bw:.0f} GB/s"
                         + (" (measured copy)" if device.get("bandwidth_gbs") else " (peak)"))
        return ", ".join(parts)
    s = f"CPU {device.get('name', '?')}, {device.get('sms', '?')} logical cores"
    if device.get("bandwidth_gbs"):
        s += f", measured copy bandwidth {device['bandwidth_gbs']:.0f} GB/s"
    return s


def describe_task(task: dict) -> str:
    lines = [f"region: {task.get('op')} ({task.get('kind', '?')}), dtype {task.get('dtype', '')}"]
    if task.get("source") or task.get("module"):
        lines.append(f"  from the model: {task.get('source') or '?'}"
                     + (f"  [module {task['module']}]" if task.get("module") else ""))
    for kind in ("inputs", "outputs"):
        for k, m in enumerate(task.get(kind, [])):
            if m.get("shape") is None:
                lines.append(f"  {kind}[{k}]: absent (NULL pointer)")
            else:
                lines.append(f"  {kind}[{k}]: shape {m['shape']} dtype {m['dtype']} "
                             f"stride {m.get('stride')}")
    if task.get("pattern"):
        lines.append(f"  it computes the named pattern `{task['pattern']}`")
    if task.get("calls"):
        lines.append(f"  the model runs it {task['calls']} times per forward pass")
    return "\n".join(lines)


def summarize_node(n: NodeView) -> str:
    """One line per attempt, so the model sees what was tried and how it went."""
    head = (n.source or "").strip().splitlines()
    idea = n.action
    what = f"#{n.node_id} {idea}: {n.status}"
    if n.status == "ok":
        what += f", {_fmt_us(n.time_us)}"
        if n.speedup:
            what += f" ({n.speedup:.2f}x eager)"
    elif n.message:
        what += f" - {n.message[:160]}"
    if n.resources.get("registers"):
        what += f", {n.resources['registers']} regs"
    if head:
        what += f"; {len(head)} lines"
    return what


def _resources(r: dict) -> str:
    keys = ("registers", "smem_bytes", "spill_stores", "spill_loads", "stack_bytes")
    got = [f"{k}={r[k]}" for k in keys if r.get(k) is not None]
    return ", ".join(got) if got else "not reported"


def build_messages(ctx: ProposalContext) -> list[dict]:
    """System + user messages for one proposal (mode root / improve / repair)."""
    backend = prompt_language(ctx)
    lang, fence = _lang(backend)
    extra = (", cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, cooperative_groups, cub block "
             "primitives" if backend == "cuda" else ", omp.h, immintrin.h")
    rules = [r.format(extra_headers=extra) for r in RULES_COMMON]
    rules += RULES_CUDA if backend == "cuda" else RULES_CPU
    if backend == "triton":
        rules = list(RULES_TRITON)
    p = ctx.parent
    out: list[str] = []
    out.append(f"# Task: a faster {lang} kernel for the region `{ctx.task.get('op')}` of a "
               "PyTorch model\n")
    out.append("## The PyTorch reference (what correct means)\n"
               "The region's own graph, as torch.compile captures it (aten ops, run by PyTorch "
               "eager; `in0`, `in1`, ... are the inputs in order, the returned tuple the outputs "
               "in order):\n"
               f"```python\n{ctx.reference.strip()}\n```\n")
    out.append("## The region's tensors (captured from the real model)\n" + describe_task(ctx.task) + "\n")
    if backend == "triton":
        out.append("## Entry point (define exactly this)\n"
                   f"```python\n{_triton_header(ctx.task).strip()}\n"
                   "def kforge_launch(inputs, outputs):\n    ...\n    return 0\n```\n"
                   "The harness calls it with lists of torch tensors in this order, on the GPU's "
                   "current stream; outputs are allocated by the harness with exactly these "
                   "strides.\n")
    else:
        out.append("## Entry point (define exactly this, parameter types must match)\n"
                   f"```{fence}\n{ctx.signature.strip()};\n```\n"
                   'Start the file with `#include "kforge_region.h"`: the harness writes that header '
                   "beside your file; for this task it is:\n"
                   f"```c\n{ctx.canonical.strip()}\n```\n")
    out.append("## Machine\n" + describe_device(ctx.device) + "\n")
    out.append("## Times to beat (median per call)\n"
               f"- PyTorch eager: {_fmt_us(ctx.eager_us)}\n"
               f"- torch.compile: {_fmt_us(ctx.compiled_us)}\n"
               f"- floor (bytes moved / bandwidth, or FLOPs / peak for matrix work): "
               f"{_fmt_us(ctx.floor_us)}; a time below it is impossible and is rejected as a "
               "measurement error.\n"
               "Beating torch.compile is the goal: it already fuses this region into one kernel.\n")
    if ctx.best is not None and ctx.best.node_id != p.node_id and ctx.best.time_us:
        out.append(f"Best verified candidate so far: #{ctx.best.node_id} "
                   f"{_fmt_us(ctx.best.time_us)}"
                   + (f" ({ctx.best.speedup:.2f}x eager)" if ctx.best.speedup else "") + ".\n")
    if ctx.mode == "repair" and p.source:
        out.append(f"## The candidate to repair (#{p.node_id}, {p.action}) FAILED: {p.status}\n"
                   f"{p.message}\n")
        if p.error_log:
            out.append("Error report:\n```text\n" + _cut(p.error_log.strip(), MAX_LOG_CHARS)
                       + "\n```\n")
        out.append(f"Its source:\n```{fence}\n{_cut(p.source.rstrip(), MAX_SOURCE_CHARS)}\n```\n")
        ask = ("Fix the failure above with the smallest change that makes it correct, keeping "
               "its performance idea.")
    elif p.source:
        line = f"measured {_fmt_us(p.time_us)}"
        if p.speedup:
            line += f" = {p.speedup:.2f}x eager"
        out.append(f"## Current candidate (#{p.node_id}, {p.action}): {line}\n"
                   f"Resources: {_resources(p.resources)}\n"
                   f"```{fence}\n{_cut(p.source.rstrip(), MAX_SOURCE_CHARS)}\n```\n")
        ask = ("Write a faster kernel than this one. Name its bottleneck against the floor "
               "(memory traffic, occupancy, launch shape, reductions, vector width) and change "
               "the approach accordingly.")
    else:
        ask = ("Write a first kernel that is correct and fast: aim at the memory-roofline "
               "floor (coalesced, vectorised loads; one pass over the data where possible).")
        start = _inductor_start(ctx.task) if backend == "triton" else None
        if start:
            out.append("## Starting point: torch.compile's own kernel for this region\n"
                       "Inductor generated this Triton code for exactly this region (rewritten to "
                       "the entry point above); it is what torch.compile runs, so its time is the "
                       "torch.compile time. It is correct: keep its semantics and make it faster "
                       "(block sizes, num_warps/num_stages, persistent vs looped reduction, "
                       "splitting long rows over more programs, fewer passes over memory).\n"
                       f"```python\n{_cut(start.rstrip(), MAX_SOURCE_CHARS)}\n```\n")
            ask = ("Write a kernel that beats the starting point above; name what limits it "
                   "against the floor and change that.")
    if backend == "triton" and (not p.source or p.action.startswith("seed:")):
        conf = _inductor_config(ctx.task)
        if conf:
            out.append("## Inductor's config for its kernels (where tuning starts)\n" + conf + "\n")
    if ctx.ancestors:
        chain = [a for a in ctx.ancestors if a.source]
        if chain:
            out.append("## How we got here (root first)\n"
                       + "\n".join("- " + summarize_node(a) for a in chain[-MAX_SIBLINGS:]) + "\n")
    if ctx.siblings:
        sib = ctx.siblings[-MAX_SIBLINGS:]
        out.append("## Already tried from this same starting point (do something different)\n"
                   + "\n".join("- " + summarize_node(s) for s in sib) + "\n")
    out.append("## Rules (checked before compiling; a violation fails the candidate)\n"
               + "\n".join(f"- {r}" for r in rules) + "\n")
    out.append(f"## What to do\n{ask}\nAnswer with exactly one fenced ```{fence} code block "
               f"holding the whole source file, which must define `{ENTRY}`.")
    return [{"role": "system", "content": SYSTEM.format(lang=lang)},
            {"role": "user", "content": "\n".join(out)}]


def render_prompt(messages: list[dict]) -> str:
    """The messages as one text, as stored with the node and shown in the TUI."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


# ------------------------------------------------------------------------ extraction

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*$", re.M)
_DEFINES_ENTRY = re.compile(ENTRY + r"\s*\(")
_DEFINES_PY_ENTRY = re.compile(r"^\s*def\s+" + ENTRY + r"\s*\(", re.M)
_PY_FENCES = ("python", "py", "python3", "triton")
_LOOKS_LIKE_SOURCE = re.compile(r"^\s*(#include|extern\s+\"C\"|#pragma|template\s*<|__global__"
                                r"|import triton|from triton|@triton\.jit)")


def extract_code(text: str | None, finish_reason: str | None = None) -> tuple[str | None, str | None]:
    """(source, None) or (None, one-line reason). Picks the last complete fenced block that
    defines the entry point; accepts ```cuda / ```cpp / ```c++ / ``` fences (or ~~~), and
    ```python fences (Triton) when they define `def kforge_launch(...)`. An answer that is
    nothing but a source file (no fence) is accepted too."""
    if not text or not text.strip():
        return None, "empty answer"
    blocks: list[str] = []
    langs: list[str] = []
    open_fence = False
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            break
        mark = m.group(1)
        close = re.compile(r"^[ \t]*" + re.escape(mark[0]) + "{" + str(len(mark)) + r",}[ \t]*$",
                           re.M)
        c = close.search(text, m.end())
        if c is None:
            open_fence = True
            break
        blocks.append(text[m.end() + 1:c.start()])
        langs.append(m.group(2).lower())
        pos = c.end()
    # a Python (Triton) block must *define* the entry point (`def kforge_launch(`), not call it
    usable = [b for b, lang in zip(blocks, langs)
              if _DEFINES_PY_ENTRY.search(b) or (lang not in _PY_FENCES and _DEFINES_ENTRY.search(b)
                                                 and not re.search(r"^\s*(import|from)\s+\w", b, re.M))]
    if usable:
        return usable[-1].strip("\n") + "\n", None
    truncated = open_fence or finish_reason == "length"
    if truncated:
        return None, ("truncated answer (the code block never closes"
                      + (", finish_reason=length)" if finish_reason == "length" else ")"))
    if blocks:
        return None, f"no code block defines {ENTRY} ({len(blocks)} block(s) in the answer)"
    if _LOOKS_LIKE_SOURCE.match(text) and (_DEFINES_PY_ENTRY.search(text) or (
            not text.lstrip().startswith(("import", "from", "@")) and _DEFINES_ENTRY.search(text))):
        return text.strip("\n") + "\n", None
    return None, "no code in the answer (prose only)"
