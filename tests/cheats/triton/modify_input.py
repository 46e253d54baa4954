# expect: runtime:inputs | the kernel overwrites its input (in-place exp), which the region must not do
# Cheat: reuse the input as scratch to save an allocation.
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, m, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(x_ptr + row * n_cols + offs, e, m)
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, 0), m)


def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    rows, cols = x.shape
    softmax_rows[(rows,)](x, y, cols, BLOCK=64)
    return 0
