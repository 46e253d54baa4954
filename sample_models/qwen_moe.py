"""A Qwen3-MoE decoder (transformers, Qwen3-30B-A3B dims, random weights), one forward pass.

Real widths: hidden 2048, 32 query / 4 KV heads of dim 128, 151,936-token vocabulary and the
real router: 128 experts, top-8, normalised top-k. 2 layers instead of 48. Attention is eager,
so the attention softmax is visible next to the router softmax.

Size "ci" shrinks the expert MLP width from 768 to 64: at 768 the two layers' 2×128 experts
hold 1.2 B parameters (4.8 GB in float32), four times the rest of the model, too much memory
and random-init time for a 2-core CI box; the router, attention and norms (the target ops)
keep their real shapes. Batch 1, 32 tokens, float32. "gpu": real expert width 768, 4×1024
tokens, bfloat16.

Weights: torch's default init is skipped and the library's own `init_weights()` runs once
(building the 151,936×2048 embeddings twice over was most of the build time).
"""
from __future__ import annotations

try:
    from sample_models._common import seeded, size_for
except ImportError:
    from _common import seeded, size_for


def build(device: str = "cpu", size: str | None = None):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.initialization import no_init_weights

    size = size_for(device, size)
    seeded()
    config = Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768 if size == "gpu" else 64, num_hidden_layers=2,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    dtype = torch.bfloat16 if size == "gpu" else torch.float32
    with torch.device(device), no_init_weights():  # skip torch's default init ...
        model = Qwen3MoeForCausalLM(config)
    model.init_weights()  # ... and run the library's own init once (2x faster build)
    model = model.to(dtype).eval()
    batch, seq = (4, 1024) if size == "gpu" else (1, 32)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    return model, {"input_ids": input_ids, "logits_to_keep": 1, "use_cache": False}
