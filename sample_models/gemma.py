"""One decoding step of a Gemma 3 text decoder (transformers, Gemma 3 1B dims, random weights).

Real widths: hidden 1152, MLP 6912, 4 query heads / 1 KV head of dim 256, 262,144-token
vocabulary; 2 layers instead of 26. Attention is the library's eager implementation so the
attention softmax is a visible op.

`GemmaStep` exists because generation's sampling softmax is not part of the HF module: as
`generate()` does, it runs the decoder on the prompt keeping only the last position's logits,
copies them to float32, and takes the softmax that sampling draws from. The wrapper only calls
the library model; it changes nothing inside it.

Size "ci": batch 2, 32 tokens, float32; "gpu": batch 8, 512 tokens, bfloat16 (as Gemma 3 runs).
Weights: torch's default init is skipped and the library's own `init_weights()` runs once
(initialising the 262,144×1152 embedding three times over was most of the build time).
"""
from __future__ import annotations

try:
    from sample_models._common import seeded, size_for
except ImportError:
    from _common import seeded, size_for

import torch


class GemmaStep(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask=None):
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1,
                      use_cache=False)
        next_token_logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        return torch.nn.functional.softmax(next_token_logits, dim=-1)


def build(device: str = "cpu", size: str | None = None):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from transformers.initialization import no_init_weights

    size = size_for(device, size)
    seeded()
    config = Gemma3TextConfig(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32768,
        sliding_window=512, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
        layer_types=["sliding_attention", "full_attention"])
    config._attn_implementation = "eager"
    dtype = torch.bfloat16 if size == "gpu" else torch.float32
    with torch.device(device), no_init_weights():  # skip torch's default init ...
        lm = Gemma3ForCausalLM(config)
    lm.init_weights()  # ... and run the library's own init once (2x faster build)
    lm = lm.to(dtype)
    model = GemmaStep(lm).eval()
    batch, seq = (8, 512) if size == "gpu" else (2, 32)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    return model, {"input_ids": input_ids}
