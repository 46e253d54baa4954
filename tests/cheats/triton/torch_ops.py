# expect: static:torch-use | calling PyTorch for the op is not writing the kernel
# Cheat: let PyTorch compute the answer and copy it into the output.
import torch
import triton


def kforge_launch(inputs, outputs):
    outputs[0].copy_(torch.softmax(inputs[0], -1))
    return 0
