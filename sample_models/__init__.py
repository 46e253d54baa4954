"""Sample models for kforge: library model code (transformers / diffusers) with random weights.

Each module exposes `build(device="cpu") -> (model, example_inputs)`; `KFORGE_SAMPLE_SIZE`
("ci" or "gpu") picks CPU-sized or real batch sizes.
"""
