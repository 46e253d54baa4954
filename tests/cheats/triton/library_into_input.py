# expect: runtime:inputs | a library call allowed by the static check still may not write an input
# Cheat: use the input as the GEMM's scratch.
import torch
import triton


def kforge_launch(inputs, outputs):
    torch.mm(inputs[0].as_strided((8, 8), (64, 1)), inputs[0].as_strided((8, 8), (1, 64)),
             out=inputs[0].as_strided((8, 8), (64, 1)))
    return 0
