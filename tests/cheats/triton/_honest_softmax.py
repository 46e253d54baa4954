# expect: ok | an honest row softmax (the template the cheats below start from)
import triton
import triton.language as tl

BLOCK: tl.constexpr = 64


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
    rows, cols = x.shape
    softmax_rows[(rows,)](x, y, cols, BLOCK=BLOCK)
    return 0
