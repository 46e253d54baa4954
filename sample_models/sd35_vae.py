"""The Stable Diffusion 3.5 VAE decoder (diffusers AutoencoderKL, SD3.5 config, random weights).

The model returned is the library's own `Decoder` module (`vae.decoder`), the part that runs
every time an image is produced: 16 latent channels, block widths 128/256/512/512, GroupNorm
with 32 groups, 8× upsampling. Size "ci": one 8×8 latent → 64×64 image (float32, well under a
second on 2 CPU cores); "gpu": one 128×128 latent → 1024×1024 image, float32 as the SD3.5
pipelines run their VAE.
"""
from __future__ import annotations

try:
    from sample_models._common import seeded, size_for
except ImportError:
    from _common import seeded, size_for


def build(device: str = "cpu", size: str | None = None):
    import torch
    from diffusers import AutoencoderKL

    size = size_for(device, size)
    seeded()
    vae = AutoencoderKL(  # values of stabilityai/stable-diffusion-3.5-large vae/config.json
        in_channels=3, out_channels=3, latent_channels=16,
        block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        act_fn="silu", sample_size=1024, scaling_factor=1.5305, shift_factor=0.0609,
        use_quant_conv=False, use_post_quant_conv=False)
    decoder = vae.decoder.eval()
    side = 128 if size == "gpu" else 8
    latent = torch.randn(1, 16, side, side)
    return decoder.to(device), (latent.to(device),)
