"""The kernel-quality cases of issue 7 as tiny models, one op each, at the sample models' real shapes.

Each `name()` returns `(model, example_inputs)` (the MODEL-spec `file.py:callable` form), so
`kforge optimize bench/cases.py:softmax_gemma_logits --ops softmax` searches exactly that op
through the product's normal path (profile, capture, MCTS, sandbox, store). `CASES` maps each
case to its op, for bench/kernel_quality.py. The models are what the sample models run at GPU
size; here they stand alone so one case can be searched and timed in isolation.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda" if torch.cuda.is_available() else "cpu"


class _Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class _SiluMul(nn.Module):
    """Gated MLP activation: a and b are the two halves of one projection output."""

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b


class ReferenceRMSNorm(nn.Module):
    """The Llama/Qwen spelling (class name ends in RMSNorm, so capture treats it as rms_norm)."""

    def __init__(self, n, eps=1e-6, dtype=torch.bfloat16):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def _gn(c, shape, dtype):
    m = nn.GroupNorm(32, c, eps=1e-6).to(DEV, dtype)
    with torch.no_grad():
        m.weight.normal_(1.0, 0.1)
        m.bias.normal_(0.0, 0.1)
    return m, (_randn(*shape, dtype=dtype),)


def pool_resnet50():
    return nn.AdaptiveAvgPool2d((1, 1)).to(DEV), (_randn(32, 2048, 7, 7),)


def group_norm_vae_512_f32():
    return _gn(512, (1, 512, 128, 128), torch.float32)


def group_norm_vae_512_bf16():
    return _gn(512, (1, 512, 128, 128), torch.bfloat16)


def group_norm_vae_256_f32():
    return _gn(256, (1, 256, 512, 512), torch.float32)


def group_norm_vae_256_bf16():
    return _gn(256, (1, 256, 512, 512), torch.bfloat16)


def softmax_gemma_logits():
    return _Softmax().to(DEV), (_randn(8, 262144) * 4,)


def softmax_qwen_router():
    return _Softmax().to(DEV), (_randn(4096, 256),)


def softmax_attention_bf16():
    return _Softmax().to(DEV), (_randn(1, 8, 2048, 2048, dtype=torch.bfloat16) * 3,)


def layer_norm_bf16():
    m = nn.LayerNorm(4096, eps=1e-5).to(DEV, torch.bfloat16)
    with torch.no_grad():
        m.weight.normal_(1.0, 0.1)
        m.bias.normal_(0.0, 0.1)
    return m, (_randn(8192, 4096, dtype=torch.bfloat16),)


def rms_norm_bf16():
    m = ReferenceRMSNorm(4096).to(DEV)
    with torch.no_grad():
        m.weight.normal_(1.0, 0.1)
    return m, (_randn(8192, 4096, dtype=torch.bfloat16),)


def silu_mul_bf16():
    return _SiluMul().to(DEV), (_randn(8192, 2 * 8192, dtype=torch.bfloat16),)


class _Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def sdpa_sd35_vae_f32():
    """SD3.5 VAE's mid-block self-attention: one head of dim 512 over the 128x128 latent, float32
    (no fused PyTorch kernel has a tensor-core path there). Not in the zoo (no Liger rival):
    `python -m bench regions --cases sdpa_sd35_vae_f32 --no-quality`."""
    return _Attention().to(DEV), tuple(_randn(1, 1, 16384, 512) for _ in range(3))


# case -> (op searched, floor note)
CASES = {
    "pool_resnet50": "adaptive_avg_pool2d",
    "group_norm_vae_512_f32": "group_norm",
    "group_norm_vae_512_bf16": "group_norm",
    "group_norm_vae_256_f32": "group_norm",
    "group_norm_vae_256_bf16": "group_norm",
    "softmax_gemma_logits": "softmax",
    "softmax_qwen_router": "softmax",
    "softmax_attention_bf16": "softmax",
    "layer_norm_bf16": "layer_norm",
    "rms_norm_bf16": "rms_norm",
    "silu_mul_bf16": "silu_mul",
}


class Zoo(nn.Module):
    """Every case (or the `names` given) in one model, each op on its own input: one `kforge
    optimize` run searches all of them concurrently (one GPU worker, compiles spread over the
    host's cores)."""

    def __init__(self, names=None):
        super().__init__()
        self.parts = nn.ModuleDict()
        self.example = {}
        for name in names or CASES:
            model, (x,) = globals()[name]()
            self.parts[name] = model
            self.example[name] = x

    def forward(self, **xs):
        return {name: self.parts[name](x) for name, x in xs.items()}


def _zoo(names=None):
    m = Zoo(names)
    return m, dict(m.example)


# The zoo in two halves, for GPU calls too short to search all eleven cases with the full budget.
ZOO_A = ["pool_resnet50", "group_norm_vae_512_f32", "group_norm_vae_512_bf16", "group_norm_vae_256_f32",
         "group_norm_vae_256_bf16", "softmax_gemma_logits"]


def zoo():
    return _zoo()


def zoo_a():
    return _zoo(ZOO_A)


def zoo_b():
    return _zoo([n for n in CASES if n not in ZOO_A])


class _Small(nn.Module):
    """CPU-sized stand-ins, one per op kind of the zoo (`python -m bench regions --small`)."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(768)
        self.rms = ReferenceRMSNorm(512, dtype=torch.float32)
        self.gn = nn.GroupNorm(8, 64)

    def forward(self, a, b, c, d, e):
        return (torch.softmax(a, -1), self.ln(b), self.rms(c), _SiluMul()(d), self.gn(e))


def small():
    m = _Small()
    return m, (torch.randn(64, 1024), torch.randn(64, 768), torch.randn(64, 512), torch.randn(64, 2048),
               torch.randn(1, 64, 16, 16))
