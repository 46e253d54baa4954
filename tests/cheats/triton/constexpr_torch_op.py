# expect: runtime:torch_op | an op computed by Triton's constexpr operator method is still the candidate's PyTorch op
# Guard regression (class 6 of issue 21): the launcher makes PyTorch compute exp(x) as e ** x
# behind `tl.constexpr` operator methods, so the aten op is issued from a frame of Triton's
# language module, never from the candidate's own line. Accepted under the interpreter before:
# the op guard attributed the op to Triton's innermost frame. (The kernel below still computes
# the softmax itself: a launcher cannot hand the constexpr's tensor to a kernel without `.value`,
# which the AST check refuses - so this file tests the guard, it is not counted as a cheat that
# wins.) Rejected by the loader's op guard, which now decides by what the candidate's code
# caused: a candidate frame on the stack and no Triton launch machinery in between.
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
    rows, cols = x.shape
    e = tl.constexpr(2.718281828459045) ** tl.constexpr(x)  # aten pow, from Triton's frame
    softmax_rows[(rows,)](x, y, cols, BLOCK=64)
    return 0 if e is not None else 1
