# expect: runtime:tolerance | computing a float32 softmax in bfloat16 is ~1e-3 off, 10x the f32 tolerance
# Cheat: halve the arithmetic precision to go faster and hope the check is loose.
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, m, other=float("-inf")).to(tl.bfloat16)
    x = (x - tl.max(x, 0)).to(tl.bfloat16)
    e = tl.exp(x.to(tl.float32)).to(tl.bfloat16)
    s = tl.sum(e.to(tl.float32), 0).to(tl.bfloat16)
    tl.store(y_ptr + row * n_cols + offs, (e / s).to(tl.bfloat16).to(tl.float32), m)


def kforge_launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    rows, cols = x.shape
    softmax_rows[(rows,)](x, y, cols, BLOCK=64)
    return 0
