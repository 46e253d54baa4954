"""The Triton backend on the CPU: static check, loader, Inductor seeds, cheats (issue 13).

Kernels run under Triton's interpreter (TRITON_INTERPRET=1: numpy on CPU tensors). Timing needs
the GPU (bench/triton_throughput.py). Shapes are tiny on purpose: the interpreter runs
`tl.reduce` with a Python combine function element by element.

The verification here is a small stand-in for sandbox/verify.py (being rewritten for
multi-output regions): outputs poisoned with a finite sentinel and then NaN, guard zones around
every output, inputs compared bitwise after each run, and a replay pass (new values in the same
buffers).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from kforge_tui.regions.build import task_of  # noqa: E402
from kforge_tui.regions.task import Task  # noqa: E402
from kforge_tui.sandbox import triton_check, triton_loader  # noqa: E402
from kforge_tui.search import inductor_seed  # noqa: E402

HERE = Path(__file__).parent
CHEATS = HERE / "cheats" / "triton"
FIXTURES = HERE / "fixtures" / "inductor"
SENTINEL = -12288.0
GUARD = 1024  # elements either side of an output
TOL = {"float32": (1e-4, 1e-5), "float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 8e-3),
       "float64": (1e-9, 1e-10)}


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# ----------------------------------------------------------------------------- a small harness

class Out:
    """An output tensor inside a larger buffer, so writes past either end are seen."""

    def __init__(self, meta):
        from kforge_tui.regions.meta import storage_span

        self.dtype = getattr(torch, meta.dtype)
        span = storage_span(meta.shape, meta.strides)
        self.base = torch.zeros(span + 2 * GUARD, dtype=self.dtype)
        self.t = self.base[GUARD:GUARD + span].as_strided(tuple(meta.shape), tuple(meta.strides))
        self.span = span

    def poison(self, v):
        self.base.fill_(0 if not self.dtype.is_floating_point else 7.0)
        self.base[GUARD:GUARD + self.span].fill_(v if self.dtype.is_floating_point else -7)

    def guards_ok(self):
        head, tail = self.base[:GUARD], self.base[GUARD + self.span:]
        want = 0 if not self.dtype.is_floating_point else 7.0
        return bool((head == want).all()) and bool((tail == want).all())


def draw(task: Task, seed: int) -> list:
    return inductor_seed.example_inputs(task, "cpu", seed=seed)


def judge(task: Task, launch, ins: list, outs: list[Out]) -> str | None:
    """None when the candidate matches the reference on `ins`; else the reason."""
    ref = task.reference([x.clone() if x is not None else None for x in ins])
    saved = [x.clone() if x is not None else None for x in ins]
    for poison in (SENTINEL, float("nan")):
        for o in outs:
            o.poison(poison)
        rc = launch(ins, [o.t for o in outs])
        if rc != 0:
            return f"rc {rc}"
        for o in outs:
            if not o.guards_ok():
                return "wrote outside the output (guard zone changed)"
        for a, b in zip(ins, saved):
            if a is not None and not torch.equal(a, b):
                return "inputs modified"
        for k, (o, r) in enumerate(zip(outs, ref)):
            g, e = o.t.double(), r.double()
            if g.shape != e.shape:
                e = e.reshape(g.shape)
            if poison == SENTINEL and bool(((g == SENTINEL) & (e != SENTINEL)).any()):
                return f"output {k}: unwritten elements (poison survived)"
            if bool((torch.isnan(g) & ~torch.isnan(e)).any()):
                return f"output {k}: unwritten elements (NaN poison survived or computed NaN)"
            rtol, atol = TOL.get(task.outputs[k].dtype, (0, 0))
            fin = e[torch.isfinite(e)]
            scale = float(fin.abs().max()) if fin.numel() else 1.0
            close = (g == e) | ((g - e).abs() <= atol * scale + rtol * e.abs()) | \
                (torch.isnan(g) & torch.isnan(e))
            if not bool(close.all()):
                return f"output {k}: values differ beyond tolerance " \
                       f"(max abs {float((g - e).abs().nan_to_num(0).max()):.3g})"
    return None


def verify(task: Task, entry, sets: int = 2) -> str | None:
    """Every set twice (sentinel then NaN poison), then set 1's values in set 0's buffers."""
    outs = [Out(m) for m in task.outputs]
    bufs = draw(task, 100)
    for s in range(sets):
        vals = draw(task, 100 + s)
        for b, v in zip(bufs, vals):
            if b is not None:
                b.copy_(v)  # same buffers, new values: a replay of an earlier result fails
        why = judge(task, entry.launch, bufs, outs)
        if why:
            return why
    return None


def load_run(task: Task, source: str, tmp_path, name="cand"):
    outs = [Out(m) for m in task.outputs]
    ins = draw(task, 1)
    entry = triton_loader.worker_entry(source, tmp_path / name, ins, [o.t for o in outs],
                                       sync=lambda: None)
    return entry


# ----------------------------------------------------------------------------- tasks

def softmax_task(rows=8, cols=64):
    return task_of(lambda x: torch.softmax(x, -1), (torch.randn(rows, cols),), backend="triton")


def layer_norm_task():
    return task_of(lambda x, w, b: torch.nn.functional.layer_norm(x, (32,), w, b),
                   (torch.randn(16, 32), torch.randn(32), torch.randn(32)), backend="triton")


def chain_task():
    return task_of(lambda x, y: torch.nn.functional.gelu(x * 2 + y).sigmoid() * torch.tanh(x),
                   (torch.randn(33, 100), torch.randn(100)), backend="triton")


def rowsum_task():
    return task_of(lambda x: x.sum(-1), (torch.randn(12, 3000),), backend="triton")


def fullsum_task():
    return task_of(lambda x: x.sum(), (torch.randn(1 << 16),), backend="triton")


def transpose_task():
    return task_of(lambda x, y: x.t() + y, (torch.randn(64, 32), torch.randn(32, 64)),
                   backend="triton")


def rms_bf16_task():
    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w

    return task_of(rms, (torch.randn(8, 128).bfloat16(), torch.randn(128).bfloat16()),
                   backend="triton")


HONEST = (CHEATS / "_honest_softmax.py").read_text()


# ----------------------------------------------------------------------------- static rules

def rules_of(src: str) -> set[str]:
    return {d.rule for d in triton_check.check_source(src).diagnostics}


LAUNCH = '''
def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    rows, cols = x.shape
    softmax_rows[(rows,)](x, y, cols, BLOCK=64)
    return 0
'''


def with_launcher(body: str, pre: str = "", kernel_extra: str = "") -> str:
    """The honest template with its launcher body (and module prelude) replaced."""
    head = HONEST.split("def kforge_launch")[0]
    head = head.replace("import triton\n", "import triton\n" + pre, 1)
    if kernel_extra:
        head = head.replace("    row = tl.program_id(0)\n", "    row = tl.program_id(0)\n"
                            + kernel_extra, 1)
    return head + "def kforge_launch(inputs, outputs):\n" + body


BAD = {
    # rule: (why, source)
    "parse": "def kforge_launch(inputs, outputs:\n    return 0\n",
    "empty": "   \n",
    "entry": HONEST.replace("def kforge_launch(inputs, outputs)", "def kforge_launch(inputs, outputs, cache=None)"),
    "import": with_launcher("    return 0\n", pre="import subprocess\n"),
    "module-state": HONEST.replace("BLOCK: tl.constexpr = 64", "BLOCK: tl.constexpr = 64\nSEEN = []"),
    "global-state": with_launcher("    global BLOCK\n    return 0\n"),
    "attribute-state": with_launcher("    softmax_rows.cache = inputs[0]\n    return 0\n"),
    "function-state": HONEST + "\n\ndef helper(x, memo={}):\n    return x\n",
    "dunder": with_launcher("    t = inputs.__class__\n    return 0\n"),
    "forbidden-name": with_launcher("    f = open('/etc/passwd')\n    return 0\n"),
    "module-attribute": with_launcher("    triton.runtime.driver.active.synchronize()\n    return 0\n"),
    "decorator": HONEST.replace("@triton.jit", "@staticmethod\n@triton.jit"),
    "torch-use": with_launcher("    outputs[0].copy_(inputs[0])\n    return 0\n"),
    "host-code": with_launcher("    t = inputs[0].T\n    return 0\n"),
    "host-write": with_launcher("    outputs[0][0] = 1.0\n    return 0\n"),
    "scratch": with_launcher("    for i in range(2):\n        b = torch.empty((4,), dtype=torch.float32,"
                             " device=inputs[0].device)\n    return 0\n", pre="import torch\n"),
    "launch": with_launcher("    len[(1,)](inputs[0])\n    return 0\n"),
    "control": with_launcher("    try:\n        pass\n    except Exception:\n        pass\n    return 0\n"),
    "shadowing": with_launcher("    tl = 3\n    return 0\n"),
}


def test_honest_template_passes_the_static_check():
    rep = triton_check.check_source(HONEST)
    assert rep.ok, rep.text()
    assert rep.kernels == ("softmax_rows",)


@pytest.mark.parametrize("rule", sorted(BAD))
def test_static_rule(rule):
    """Each rule fires on its own example (and the template it is built from passes)."""
    rep = triton_check.check_source(BAD[rule])
    assert not rep.ok
    assert rule in {d.rule for d in rep.diagnostics}, rep.text()
    d = next(d for d in rep.diagnostics if d.rule == rule)
    assert d.line >= 1 and d.message and re.match(r"L\d+:\d+ \[", d.text())


@pytest.mark.parametrize("src,rule", [
    ("import os\n" + HONEST, "import"),
    ("import triton.runtime as rt\n" + HONEST, "import"),
    ("from triton.language import core\n" + HONEST, "import"),
    ("from . import x\n" + HONEST, "import"),
    ("from triton.language import *\n" + HONEST, "import"),
    (HONEST.replace("BLOCK: tl.constexpr = 64", "BLOCK = len([64])"), "module-state"),
    (HONEST + "\nclass K:\n    pass\n", "module-state"),
    (HONEST + "\nif True:\n    X = 1\n", "module-state"),
    (with_launcher("    e = eval('1')\n    return 0\n"), "forbidden-name"),
    (with_launcher("    g = getattr(triton, 'jit')\n    return 0\n"), "forbidden-name"),
    (with_launcher("    print(1)\n    return 0\n"), "forbidden-name"),
    (with_launcher("    b = __builtins__\n    return 0\n"), "dunder"),
    (with_launcher("    p = inputs[0]._cdata\n    return 0\n"), "dunder"),
    (with_launcher("    return 0\n", kernel_extra="    c = tl.core\n"), "module-attribute"),
    (with_launcher("    return 0\n", kernel_extra="    c = tl.core.tensor\n"), "module-attribute"),
    # tl.constexpr(...) defaults only where the compiler reads them (a @triton.jit function)
    (HONEST + "\n\ndef helper(x, memo=tl.constexpr(0)):\n    return x\n", "function-state"),
    (HONEST + "\n\n@triton.jit\ndef helper(x, memo=tl.constexpr([])):\n    return x\n", "function-state"),
    (with_launcher("    triton.knobs.cache.dir = 'x'\n    return 0\n"), "attribute-state"),
    (with_launcher("    k = softmax_rows.fn\n    return 0\n"), "host-code"),
    (with_launcher("    s = inputs[0].sum()\n    return 0\n"), "torch-use"),
    (with_launcher("    s = torch.softmax(inputs[0], -1)\n    return 0\n", pre="import torch\n"), "torch-use"),
    (with_launcher("    return 0\n", pre="import torch\n", kernel_extra="    z = torch.float32\n"), "torch-use"),
    (with_launcher("    b = torch.empty((n,), dtype=torch.float32, device=inputs[0].device)\n"
                   "    return 0\n", pre="import torch\n"), "scratch"),
    (with_launcher("    with x:\n        pass\n    return 0\n"), "control"),
    (with_launcher("    def f():\n        nonlocal x\n    return 0\n"), "global-state"),
    (with_launcher("    softmax_rows(inputs[0])\n    return 0\n"), "launch"),
    (with_launcher("    return 0\n", kernel_extra="    tl.device_print('x', row)\n"), "forbidden-name"),
])
def test_static_rule_variants(src, rule):
    assert rule in rules_of(src), triton_check.check_source(src).text()


def test_static_allows_what_kernels_need():
    src = '''"""doc"""
import math
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

N: tl.constexpr = 3000
EPS = 1e-5
SCALE = math.sqrt(2.0) if False else 1.0
CONFIGS = (triton.Config({"XBLOCK": 8}, num_warps=4),)


@triton.autotune(configs=[triton.Config({"R": 64}, num_warps=2)], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % 64 == 0})
@triton.jit
def k(x_ptr, y_ptr, n, R: tl.constexpr, EVEN: tl.constexpr):
    input = tl.load(x_ptr + tl.arange(0, R), eviction_policy="evict_last")
    y = libdevice.rsqrt(input * input + EPS) + tl.math.exp(input) + tl.extra.cuda.libdevice.tanh(input)
    tl.store(y_ptr + tl.arange(0, R), y.to(y_ptr.dtype.element_ty))


def grid(n):
    return (triton.cdiv(n, 64),)


def kforge_launch(inputs, outputs):
    buf = torch.empty_strided((12, 4), (4, 1), dtype=torch.float32, device=inputs[0].device)
    acc = torch.zeros((64,), dtype=torch.float32, device=outputs[0].device)
    x, y = inputs[0], outputs[0]
    y.zero_()
    n = x.numel() if x.is_contiguous() else x.shape[0] * x.stride(0)
    for _ in range(1):
        k[grid(n)](x, y, n)
    return 0
'''
    rep = triton_check.check_source(src)
    assert rep.ok, rep.text()
    assert rep.scratch_bytes == 12 * 4 * 4 + 64 * 4


def test_tl_submodule_list_covers_installed_triton():
    """Every module reachable as tl.<name> is on the internals list (or the language's math)."""
    import types

    import triton.language as tl

    mods = {k for k, v in vars(tl).items() if isinstance(v, types.ModuleType)
            and not k.startswith("_")}
    assert mods <= triton_check._TL_SUBMODULES, mods - triton_check._TL_SUBMODULES


# ----------------------------------------------------------------------------- loader

def test_loader_runs_honest_candidate_and_times_first_call(tmp_path):
    task = softmax_task()
    entry = load_run(task, HONEST, tmp_path)
    assert entry.status == "ok", entry.message
    assert entry.jit_s > 0 and entry.load_s > 0
    assert Path(entry.path).read_text() == HONEST
    assert Path(entry.cache_dir).parent == tmp_path / "cand"
    assert verify(task, entry) is None


def test_loader_refuses_unchecked_source_and_reports_import_errors(tmp_path):
    task = softmax_task()
    e = load_run(task, BAD["import"], tmp_path, "a")
    assert e.status == "static_error" and "subprocess" in e.message
    e = load_run(task, HONEST.replace("import triton\n", "import triton\nX: tl.constexpr = 1\n"),
                 tmp_path, "b")
    assert e.status == "load_error" and "NameError" in e.message


def test_loader_reports_kernel_errors(tmp_path):
    src = with_launcher("    softmax_rows[(1,)](inputs[0], outputs[0], 64, BLOCK=63)\n    return 0\n")
    e = load_run(softmax_task(), src, tmp_path)
    assert e.status in ("compile_error", "launch_error"), (e.status, e.message)
    assert e.message


def test_loader_cache_dir_is_per_candidate_and_reusable(tmp_path):
    a = triton_loader.load(HONEST, tmp_path / "a")
    b = triton_loader.load(HONEST, tmp_path / "b", reuse_cache_from=[a.cache_dir])
    assert a.cache_dir != b.cache_dir and a.status == b.status == "ok"
    # a fake compiled-kernel directory is linked, not shared
    (Path(a.cache_dir) / "KEY").mkdir()
    (Path(a.cache_dir) / "KEY" / "k.cubin").write_bytes(b"x")
    c = triton_loader.load(HONEST, tmp_path / "c", reuse_cache_from=[a.cache_dir])
    assert (Path(c.cache_dir) / "KEY" / "k.cubin").read_bytes() == b"x"


def test_guard_allows_scratch_and_fills_but_not_torch_compute(tmp_path):
    ok = with_launcher("    buf = torch.empty((8,), dtype=torch.float32, device=outputs[0].device)\n"
                       "    buf.zero_()\n    x, y = inputs[0], outputs[0]\n"
                       "    softmax_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=64)\n    return 0\n",
                       pre="import torch\n")
    task = softmax_task()
    e = load_run(task, ok, tmp_path, "ok")
    assert e.status == "ok", e.message
    assert e.scratch_bytes == 32
    assert verify(task, e) is None


def test_loader_refuses_a_call_that_reshapes_the_tensors_it_was_given(tmp_path, monkeypatch):
    """The values of a resized output verify (same memory), but inside the model the launch is
    traced into the graph, which then returns a tensor of the wrong shape (gemma's linear+gelu
    seed, `mm(out=outputs[0])` at [4096, 6912] for an [8, 512, 6912] output, H100 2026-12-06)."""
    monkeypatch.setenv("KFORGE_EPILOGUES", "1")  # matmul + relu: one region, as on a GPU
    task = task_of(lambda a, b: torch.relu(a @ b), (torch.randn(2, 4, 8), torch.randn(8, 8)), backend="triton")
    assert [tuple(m.shape) for m in task.outputs] == [(2, 4, 8)]
    a = next(i for i, m in enumerate(task.inputs) if len(m.shape) == 3)
    src = ("import torch\nimport triton\nimport triton.language as tl\n\n\n"
           "@triton.jit\ndef relu_inplace(y, N: tl.constexpr):\n    i = tl.arange(0, N)\n"
           "    tl.store(y + i, tl.maximum(tl.load(y + i), 0.0))\n\n\n"
           "def kforge_launch(inputs, outputs):\n"
           f"    torch.mm(inputs[{a}].as_strided((8, 8), (8, 1)), inputs[{1 - a}], out={{out}})\n"
           "    relu_inplace[(1,)](outputs[0], N=64)\n    return 0\n")
    ok = load_run(task, src.format(out="outputs[0].as_strided((8, 8), (8, 1))"), tmp_path, "view")
    assert ok.status == "ok", ok.message
    assert verify(task, ok) is None
    e = load_run(task, src.format(out="outputs[0]"), tmp_path, "resize")
    assert e.status == "launch_error" and "changed output 0 itself (its shape [2, 4, 8] -> [8, 8]" in e.message, \
        (e.status, e.message)


# ----------------------------------------------------------------------------- Inductor seeds

SEED_TASKS = {
    "softmax": lambda: softmax_task(4, 16),
    "layer_norm": layer_norm_task,
    "pointwise_chain": chain_task,
    "row_sum": rowsum_task,
    "full_sum_split": fullsum_task,
    "transpose_tile": transpose_task,
    "rms_bf16": rms_bf16_task,
}


@pytest.mark.parametrize("name", sorted(SEED_TASKS))
def test_inductor_seed_is_an_honest_candidate(name, tmp_path):
    task = SEED_TASKS[name]()
    seed = inductor_seed.generate(task, "cpu")
    src = seed.render()
    rep = triton_check.check_source(src)
    assert rep.ok, rep.text() + "\n" + src
    assert "triton_heuristics" not in src and "torch._inductor" not in src
    e = load_run(task, src, tmp_path)
    assert e.status == "ok", f"{e.status}: {e.message}\n{src}"
    assert verify(task, e) is None


def test_seed_with_scratch_declares_it(tmp_path):
    seed = inductor_seed.generate(fullsum_task(), "cpu")
    assert len(seed.kernels) == 2 and seed.scratch
    rep = triton_check.check_source(seed.render())
    assert rep.ok and rep.scratch_bytes > 0


def test_seed_maps_inputs_by_identity_not_position(tmp_path):
    """dynamo orders graph inputs by first use: y is used before x here."""
    task = task_of(lambda x, y: torch.relu(y) + x[:, :1], (torch.randn(8, 4), torch.randn(8, 16)),
                   backend="triton")
    seed = inductor_seed.generate(task, "cpu")
    e = load_run(task, seed.render(), tmp_path)
    assert e.status == "ok", e.message
    assert verify(task, e) is None


def test_seed_moves_render_valid_candidates(tmp_path):
    from kforge_tui.search.codegen import triton_seed

    task = rowsum_task()
    ds = triton_seed.generate(task)
    assert ds and ds[0].name == "inductor" and ds[0].backend == "triton"
    d = ds[0]
    p0 = d.default(task)
    assert d.valid(task, p0)
    moved = dict(p0, R0_BLOCK=512, num_warps=2, num_stages=2, evict="stream")
    assert d.valid(task, moved)
    src = d.render(task, moved)
    assert "R0_BLOCK=512" in src and "num_warps=2" in src and "evict_first" in src
    e = load_run(task, src, tmp_path)
    assert e.status == "ok", e.message
    assert verify(task, e) is None
    assert not d.valid(task, dict(p0, XBLOCK=4096))  # taller than the 12 rows
    assert triton_seed.generate(task.with_backend("cuda")) == []


def test_seed_variants_looped_and_cooperative_render():
    from kforge_tui.search.codegen import triton_seed

    task = softmax_task(4, 2048)
    names = {d.name: d for d in triton_seed.generate(task)}
    assert "inductor" in names and "inductor_coop" in names
    coop = names["inductor_coop"]
    src = coop.render(task, coop.default(task))
    assert "launch_cooperative_grid=True" in src and ".zero_()" in src
    assert triton_check.check_source(src).ok
    # a grid barrier needs every program resident: no move may lower Inductor's occupancy
    p0 = coop.default(task)
    assert coop.valid(task, p0)
    assert not coop.valid(task, dict(p0, num_warps=p0["num_warps"] * 2))
    assert not coop.valid(task, dict(p0, num_stages=p0["num_stages"] + 1))
    if p0["num_warps"] > 1:
        assert coop.valid(task, dict(p0, num_warps=p0["num_warps"] // 2))


def test_unsupported_region_says_why():
    """A region Inductor hands to PyTorch's own kernel (a fallback) has no seed, and says so."""
    task = task_of(lambda x: torch.histc(x, bins=8, min=0, max=7), (torch.randn(32),),
                   backend="triton")
    with pytest.raises(inductor_seed.SeedUnsupported) as ei:
        inductor_seed.generate(task, "cpu")
    assert "aten.histc" in str(ei.value) and "fallback" in str(ei.value)


def test_gemm_seed_is_the_library_call(tmp_path):
    """Inductor's mm is a cuBLAS call: the seed makes the same call into the output buffer."""
    task = task_of(lambda a, b: a @ b.t(), (torch.randn(16, 8), torch.randn(12, 8)), backend="triton")
    seed = inductor_seed.generate(task, "cpu")
    src = seed.render()
    assert "torch.mm(" in src and "out=outputs[0]" in src and ".as_strided(" in src
    assert triton_check.check_source(src).ok
    e = load_run(task, src, tmp_path)
    assert e.status == "ok", e.message
    assert verify(task, e) is None


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_recorded_cuda_inductor_output_rewrites_and_runs(fixture, tmp_path):
    """Inductor's output recorded on the H200 (CUDA wrapper: empty_strided_cuda, device guard,
    raw streams, its autotuner's chosen configs), rewritten here and run under the interpreter."""
    rec = json.loads((FIXTURES / fixture).read_text())
    task = Task.from_json(rec["task"])
    seed = inductor_seed.rewrite(rec["wrapper"], task, rec["input_order"], rec["chosen"],
                                 device="cuda")
    src = seed.render()
    assert triton_check.check_source(src).ok
    for name, cfg in rec["chosen"].items():
        if name in seed.kernels:
            assert f"num_warps={cfg['num_warps']}" in src
    e = load_run(task, src, tmp_path)
    assert e.status == "ok", e.message
    assert verify(task, e) is None


# ----------------------------------------------------------------------------- prompts

def test_prompt_for_triton_offers_inductor_kernel_and_python_abi():
    from kforge_tui.search import prompts
    from kforge_tui.search.proposers.base import NodeView, ProposalContext

    task = chain_task()
    ctx = ProposalContext(task=task.to_json(), signature="def kforge_launch(inputs, outputs)",
                          canonical="", reference=task.code(), device={"backend": "cuda"},
                          eager_us=10, compiled_us=5, floor_us=1, parent=NodeView(0, None, "root", None),
                          ancestors=[], siblings=[], tried=[], mode="root")
    text = prompts.build_messages(ctx)[1]["content"]
    assert "Triton" in text and "```python" in text and "inputs[0] in0: float32 [33, 100]" in text
    assert "Starting point: torch.compile's own kernel" in text and "@triton.jit" in text
    assert "## Inductor's config for its kernels" in text and "num_warps=" in text  # where tuning starts
    src, err = prompts.extract_code("idea\n```python\n" + HONEST + "```\n")
    assert err is None and "def kforge_launch" in src
    src, err = prompts.extract_code("```python\nkforge_launch(inputs, outputs)\n```")
    assert src is None


# ----------------------------------------------------------------------------- cheats

def cheat_files():
    return sorted(p for p in CHEATS.glob("*.py") if not p.name.startswith("_"))


def expectation(path: Path) -> tuple[str, str, str]:
    m = re.match(r"#\s*expect:\s*(static|runtime):(\S+)\s*\|\s*(.+)", path.read_text().splitlines()[0])
    assert m, f"{path.name}: first line must be '# expect: static:RULE | why' or 'runtime:WHAT | why'"
    return m.group(1), m.group(2), m.group(3)


def test_there_are_enough_cheats():
    assert len(cheat_files()) >= 6


@pytest.mark.parametrize("path", cheat_files(), ids=lambda p: p.stem)
def test_cheat_is_rejected_for_its_reason(path, tmp_path):
    kind, what, why = expectation(path)
    src = path.read_text()
    rep = triton_check.check_source(src)
    if kind == "static":
        assert not rep.ok, f"{path.name} passed the static check ({why})"
        assert what in {d.rule for d in rep.diagnostics}, rep.text()
        return
    assert rep.ok, f"{path.name} should reach the runtime checks: {rep.text()}"
    task = softmax_task()
    entry = load_run(task, src, tmp_path)
    if what == "torch_op":
        assert entry.status == "torch_op", (entry.status, entry.message)
        return
    assert entry.status == "ok", entry.message
    reason = verify(task, entry)
    assert reason is not None, f"{path.name} passed verification ({why})"
    words = {"unwritten": "unwritten", "tolerance": "tolerance", "inputs": "inputs modified",
             "outside": "outside the output"}
    assert words[what.split()[0]] in reason, reason


def test_honest_template_is_not_a_cheat(tmp_path):
    task = softmax_task()
    e = load_run(task, HONEST, tmp_path)
    assert e.status == "ok" and verify(task, e) is None


def test_interpreter_env_is_what_loader_sees():
    assert triton_loader.interpreting() == (os.environ.get("TRITON_INTERPRET") == "1")
