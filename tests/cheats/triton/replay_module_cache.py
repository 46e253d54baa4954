# expect: static:module-state | a module-level dict would carry results from one call to the next
# Cheat: remember each output by the input's address and copy it back on later calls, so a
# verification that reuses buffers sees the first result again (a replay cache).
import triton
import triton.language as tl

CACHE = {}


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
    key = x.data_ptr()
    if key in CACHE:
        return 0  # "already computed": leaves whatever the output holds
    CACHE[key] = True
    softmax_rows[(rows,)](x, y, cols, BLOCK=64)
    return 0
