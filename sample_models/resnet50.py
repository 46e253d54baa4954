"""ResNet-50 (transformers' ResNet, random weights) on 224×224 images.

All 16 bottleneck blocks at the real widths (64→2048 channels), ending in the
AdaptiveAvgPool2d that reduces [N, 2048, 7, 7] to [N, 2048, 1, 1].
torchvision is not used because it does not import with the torch this project pins.
Size "ci": batch 2, float32 (a forward takes ~0.3 s on 2 CPU cores); "gpu": batch 32, float32.
"""
from __future__ import annotations

try:
    from sample_models._common import seeded, size_for
except ImportError:  # loaded as a plain file by `kforge profile sample_models/resnet50.py`
    from _common import seeded, size_for


def build(device: str = "cpu", size: str | None = None):
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    size = size_for(device, size)
    seeded()
    config = ResNetConfig(  # the ResNet-50 layout
        num_channels=3, embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
        layer_type="bottleneck", hidden_act="relu", num_labels=1000)
    model = ResNetForImageClassification(config).eval()
    batch = 32 if size == "gpu" else 2
    pixel_values = torch.randn(batch, 3, 224, 224)
    return model.to(device), (pixel_values.to(device),)
