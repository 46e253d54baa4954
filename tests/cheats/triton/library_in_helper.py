# expect: static:library | library calls only as top-level statements of kforge_launch (no loops, no helpers)
# Cheat: hide repeated library calls in a helper so a scan of the entry point misses them.
import torch
import triton


def helper(a, o):
    for _ in range(3):
        torch.mm(a, a, out=o)


def kforge_launch(inputs, outputs):
    helper(inputs[0], outputs[0])
    return 0
