# expect: static:import | a kernel has no business reading the environment (or anything in os)
# Cheat: behave differently when the harness's variables say "timing" (e.g. skip work).
import os

import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, m, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, 0)
    e = tl.exp(x)
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, 0), m)


def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    if os.environ.get("KFORGE_TIMING"):
        return 0
    rows, cols = x.shape
    softmax_rows[(rows,)](x, y, cols, BLOCK=64)
    return 0
