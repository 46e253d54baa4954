# expect: static:library | a library GEMM's result kept in Python and handed on: only calls into a given buffer
# Cheat: let the library allocate and compute, then copy the answer out with PyTorch.
import torch
import triton


def kforge_launch(inputs, outputs):
    y = torch.mm(inputs[0], inputs[0].as_strided((64, 8), (1, 64)))
    outputs[0].copy_(y[:, :1])
    return 0
