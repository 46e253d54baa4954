"""The regions where an LLM decoder's fused time goes, at CPU sizes (issue 27).

Each fixture is the library's own code for the piece (transformers' Llama/Qwen3/Gemma3 modules,
written out as plain functions so a transformers release that renames a class does not move the
graph) with random inputs: `FIXTURES[name]() -> (fn, args)`. `tasks(name, backend)` captures the
regions kforge sees in it (graph capture + partition, as `kforge optimize` does).

A small local harness runs a candidate on CPU tensors (Triton under TRITON_INTERPRET=1, or a
g++-built C++ kernel through ctypes) and judges it against the region's PyTorch reference with
poisoned outputs and guard zones: tests/test_llm_regions.py uses it on Inductor's seed and on the
built-in proposer's designs; the sandbox (sandbox/verify.py) is the real judge.
"""
from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

B, S, H, KV, D = 2, 16, 4, 2, 16  # batch, tokens, query heads, KV heads (GQA), head dim
HIDDEN = H * D
MIN = torch.finfo(torch.float32).min


def _inv_freq(dim=D, base=10000.0):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_tables():
    """LlamaRotaryEmbedding.forward: the inv_freq x position_ids product (a K=1 matmul), the
    cat of the two halves, cos and sin scaled, in the activations' dtype."""
    inv_freq = _inv_freq()

    def f(x, position_ids):
        inv = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv.float() @ pos.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * 1.0).to(x.dtype), (emb.sin() * 1.0).to(x.dtype)

    pos = torch.arange(S)[None].expand(B, S).contiguous()
    return f, (torch.randn(B, S, HIDDEN), pos)


def rope_apply():
    """apply_rotary_pos_emb on q and k (GQA: fewer KV heads) straight out of the projections."""
    def f(q_lin, k_lin, cos, sin):
        q = q_lin.view(B, S, H, D).transpose(1, 2)
        k = k_lin.view(B, S, KV, D).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    return f, (torch.randn(B * S, H * D), torch.randn(B * S, KV * D), torch.randn(B, S, D),
               torch.randn(B, S, D))


def qk_norm_rope():
    """Qwen3/Gemma3 attention: RMSNorm over the head dim of q and k, the head transpose, then
    RoPE with rotate-half (one region per projection, several outputs)."""
    wq, wk = 1 + 0.1 * torch.randn(D), 1 + 0.1 * torch.randn(D)

    def rms(x, w):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    def f(q_lin, k_lin, cos, sin):
        q = rms(q_lin.view(B, S, H, D), wq).transpose(1, 2)
        k = rms(k_lin.view(B, S, KV, D), wk).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    return f, (torch.randn(B * S, H * D), torch.randn(B * S, KV * D), torch.randn(B, S, D),
               torch.randn(B, S, D))


def _mask(attention_mask, window=None):
    """transformers' masking_utils for eager attention: causal (and sliding) index comparisons
    and the padding mask, as an additive float mask [B, 1, S, S]."""
    q_idx = torch.arange(S)[:, None]
    kv_idx = torch.arange(S)[None, :]
    keep = kv_idx <= q_idx
    if window is not None:
        keep = keep & (kv_idx > q_idx - window)
    keep = keep[None, None] & attention_mask[:, None, None, :].bool()
    return torch.where(keep, torch.tensor(0.0), torch.tensor(MIN))


def causal_mask():
    def f(attention_mask):
        return _mask(attention_mask)

    am = torch.ones(B, S, dtype=torch.int64)
    am[0, :3] = 0  # left padding in the first sequence
    return f, (am,)


def sliding_mask():
    def f(attention_mask):
        return _mask(attention_mask, window=4)

    return f, (torch.ones(B, S, dtype=torch.int64),)


def masked_softmax():
    """Eager attention: scaled scores plus the causal/padding mask, softmax in float32 (the
    mask built in the same region, as Inductor sees it)."""
    def f(scores, attention_mask):
        return torch.softmax(scores * D ** -0.5 + _mask(attention_mask), dim=-1, dtype=torch.float32)

    am = torch.ones(B, S, dtype=torch.int64)
    am[1, :5] = 0
    return f, (torch.randn(B, H, S, S), am)


def moe_router():
    """Qwen3-MoE routing: softmax in float32, top-k, the normalised top-k weights."""
    def f(router_logits):
        p = F.softmax(router_logits, dtype=torch.float, dim=-1)
        w, idx = torch.topk(p, 2, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        return w.to(router_logits.dtype), idx

    return f, (torch.randn(B * S, 8),)


def moe_sort():
    """Grouped-GEMM expert dispatch (transformers' grouped_mm_experts_forward): the flattened
    top-k expert ids sorted, for the permutation that groups tokens by expert. Inductor runs
    aten.sort for it at qwen_moe's size (4096 tokens × top-8): node zero is that call into the
    outputs. (Short rows get Inductor's bitonic Triton sort instead, which only a GPU runs:
    the interpreter cannot.)"""
    def f(top_k_index):
        return torch.sort(top_k_index.reshape(-1))

    return f, (torch.randint(0, 128, (4096, 8)),)


def moe_expert_act():
    """The experts' gated activation on the grouped projection: padding rows masked out, the
    gate and up halves by chunk, silu(gate) * up."""
    def f(proj, pad):
        proj = proj.masked_fill(pad, 0.0)
        gate, up = proj.chunk(2, dim=-1)
        return F.silu(gate) * up

    pad = torch.zeros(B * S, 1, dtype=torch.bool)
    pad[-3:] = True
    return f, (torch.randn(B * S, 2 * 48), pad)


def repeat_kv():
    """GQA: key/value heads repeated for the query heads (expand + reshape), then the scores."""
    def f(k_lin, q):
        k = k_lin.view(B, S, KV, D).transpose(1, 2)
        k = k[:, :, None].expand(B, KV, H // KV, S, D).reshape(B, H, S, D)
        return torch.matmul(q, k.transpose(2, 3))

    return f, (torch.randn(B * S, KV * D), torch.randn(B, H, S, D))


def residual_rms_norm():
    """The residual add and the next RMSNorm: two outputs (the residual stream, the normed
    value the next projections read)."""
    w = 1 + 0.1 * torch.randn(HIDDEN)

    def f(x, residual):
        h = residual + x
        n = h.float()
        n = n * torch.rsqrt(n.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h, w * n.to(h.dtype)

    return f, (torch.randn(B, S, HIDDEN), torch.randn(B, S, HIDDEN))


FIXTURES = {f.__name__: f for f in (rope_tables, rope_apply, qk_norm_rope, causal_mask, sliding_mask,
                                     masked_softmax, moe_router, moe_sort, moe_expert_act, repeat_kv,
                                     residual_rms_norm)}


def tasks(name: str, backend: str = "cpu") -> tuple:
    """The region tasks of one fixture, patterns matched as the capture matches them (under the
    partition settings in force: KFORGE_FUSE_CAT and KFORGE_EPILOGUES change the regions)."""
    import os

    return _tasks(name, backend, os.environ.get("KFORGE_FUSE_CAT", ""), os.environ.get("KFORGE_EPILOGUES", ""))


@lru_cache(maxsize=None)
def _tasks(name: str, backend: str, fuse_cat: str, epilogues: str) -> tuple:
    from dataclasses import replace

    from kforge_tui.regions import patterns
    from kforge_tui.regions.build import tasks_of

    fn, args = FIXTURES[name]()
    out = []
    for t in tasks_of(fn, args, backend):
        b = patterns.match(t)
        if b is not None:
            t = replace(t, op=b.op_task.op, pattern=b.op_task.op, params={"binding": b.to_json()})
        out.append(t)
    return tuple(out)


# ------------------------------------------------------------------------------ the harness

GUARD = 256
TOL = {"float32": (1e-4, 1e-5), "float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 8e-3),
       "float64": (1e-9, 1e-10)}


def inputs_for(task, seed: int) -> list:
    """Random inputs in the task's layouts (integers in [0, 8): masks and position ids)."""
    from kforge_tui.search.inductor_seed import example_inputs

    return example_inputs(task, "cpu", seed)


class _Out:
    """An output inside a larger buffer, so writes past either end are seen."""

    def __init__(self, meta):
        from kforge_tui.regions.meta import storage_span

        self.dtype = getattr(torch, meta.dtype)
        self.span = storage_span(meta.shape, meta.strides)
        self.base = torch.zeros(self.span + 2 * GUARD, dtype=self.dtype)
        self.t = self.base[GUARD:GUARD + self.span].as_strided(tuple(meta.shape), tuple(meta.strides))

    def poison(self, nan: bool):
        self.base.fill_(7 if not self.dtype.is_floating_point else 7.0)
        if self.dtype.is_floating_point:
            self.base[GUARD:GUARD + self.span].fill_(float("nan") if nan else -12288.0)
        else:
            self.base[GUARD:GUARD + self.span].fill_(-7 if self.dtype != torch.bool else True)

    def guards_ok(self) -> bool:
        head, tail = self.base[:GUARD], self.base[GUARD + self.span:]
        return bool((head == 7).all()) and bool((tail == 7).all())


def judge(task, launch, sets: int = 2) -> str | None:
    """None when `launch(inputs, outputs)` matches the reference on `sets` input draws, each
    with two poisons (the outputs must be written everywhere, nowhere else, inputs kept)."""
    outs = [_Out(m) for m in task.outputs]
    for s in range(sets):
        ins = inputs_for(task, 100 + s)
        ref = task.reference([x.clone() if x is not None else None for x in ins])
        saved = [x.clone() if x is not None else None for x in ins]
        for nan in (False, True):
            for o in outs:
                o.poison(nan)
            rc = launch(ins, [o.t for o in outs])
            if rc not in (0, None):
                return f"rc {rc}"
            if not all(o.guards_ok() for o in outs):
                return "wrote outside an output"
            if any(a is not None and not torch.equal(a, b) for a, b in zip(ins, saved)):
                return "modified an input"
            for k, (o, r) in enumerate(zip(outs, ref)):
                g, e = o.t, r.reshape(o.t.shape) if r.shape != o.t.shape else r
                if not e.dtype.is_floating_point:
                    if not torch.equal(g, e):
                        return f"output {k}: {int((g != e).sum())} elements differ"
                    continue
                g, e = g.double(), e.double()
                if bool((torch.isnan(g) & ~torch.isnan(e)).any()):
                    return f"output {k}: unwritten or NaN where the reference is not"
                rtol, atol = TOL[task.outputs[k].dtype]
                fin = e[torch.isfinite(e)]
                scale = float(fin.abs().max()) if fin.numel() else 1.0
                ok = (g == e) | ((g - e).abs() <= atol * scale + rtol * e.abs()) | \
                    (torch.isnan(g) & torch.isnan(e))
                if not bool(ok.all()):
                    return f"output {k}: max error {float((g - e).abs().nan_to_num(0).max()):.3g}"
    return None


def run_triton(task, source: str, tmp: Path, sets: int = 2) -> str | None:
    """Check, load and judge a Triton candidate under the interpreter (TRITON_INTERPRET=1 must
    be set by the caller)."""
    from kforge_tui.sandbox import triton_loader

    outs = [_Out(m) for m in task.outputs]
    e = triton_loader.worker_entry(source, tmp, inputs_for(task, 1), [o.t for o in outs],
                                   sync=lambda: None)
    if e.status != "ok":
        return f"{e.status}: {e.message}"
    return judge(task, e.launch, sets)


GXX = shutil.which("g++")


def run_cpu(task, source: str, tmp: Path, sets: int = 2) -> str | None:
    """Build a C++ candidate with the sandbox's flags and judge it through ctypes."""
    h = hashlib.sha1((source + task.header("cpu")).encode()).hexdigest()[:16]
    d = tmp / h
    d.mkdir(parents=True, exist_ok=True)
    (d / "kforge_region.h").write_text(task.header("cpu"))
    (d / "k.cpp").write_text(source)
    r = subprocess.run([GXX, "-O2", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                        "k.cpp", "-o", "k.so"], cwd=d, capture_output=True, text=True)
    if r.returncode:
        return "g++: " + (r.stderr.strip().splitlines() or ["failed"])[0][:300]
    lib = ctypes.CDLL(str(d / "k.so"))
    fn = lib.kforge_launch
    fn.restype = ctypes.c_int
    sig = task.signature("cpu")
    fn.argtypes = sig.argtypes()
    return judge(task, lambda ins, outs: fn(*sig.call_args(ins, outs)), sets)
