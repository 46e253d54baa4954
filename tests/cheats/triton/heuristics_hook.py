# expect: static:torch-use | host code hidden in a decorator argument still may not compute with PyTorch
# Cheat: a triton.heuristics lambda runs on the host before the launch: let it fill the output.
import triton
import triton.language as tl


@triton.heuristics({"BLOCK": lambda args: args["y_ptr"].copy_(args["x_ptr"].softmax(-1)) and 64})
@triton.jit
def noop(x_ptr, y_ptr, BLOCK: tl.constexpr):
    pass


def kforge_launch(inputs, outputs):
    noop[(1,)](inputs[0], outputs[0])
    return 0
