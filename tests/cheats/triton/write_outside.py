# expect: runtime:outside | a marker stored past the end of the output (to replay later) hits the guard zone
# Cheat: leave a note after the output buffer that a later call could read back.
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, n_rows, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, m, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, 0)
    e = tl.exp(x)
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, 0), m)
    tl.store(y_ptr + n_rows * n_cols + row, 1.0)


def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    rows, cols = x.shape
    softmax_rows[(rows,)](x, y, cols, rows, BLOCK=64)
    return 0
