"""The floor of a region: the least time any kernel could take, from bytes and FLOPs.

Memory bound: every input read once and every output written once, over the measured copy
bandwidth. Compute bound (matmul, convolution, attention): the multiply-adds over the peak
matrix rate. The floor is the larger of the two and `bound` says which one it is. A timed
candidate below the floor is impossible and rejected (sandbox/bench.py), not celebrated.
"""
from __future__ import annotations

from dataclasses import dataclass

from kforge_tui.regions.meta import DTYPE_BYTES


@dataclass(frozen=True)
class Floor:
    us: float
    bound: str  # "memory" | "compute"
    bytes: int
    flops: int
    note: str


def bytes_moved(task) -> int:
    return sum(m.numel * DTYPE_BYTES.get(m.dtype, 4) for m in list(task.inputs) + list(task.outputs)
               if m.present)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def flops(task) -> int:
    """Multiply-add FLOPs (2 per MAC) of the matrix and convolution ops in the region."""
    total = 0
    for n in task.graph.get("nodes", []):
        op = n["target"].split(".")[1] if n["target"].count(".") == 2 else n["target"]
        meta = _arg_shapes(task, n)
        try:
            if op in ("mm", "addmm", "bmm", "baddbmm") and len(meta) >= 2:
                a, b = (meta[-2], meta[-1])
                total += 2 * _prod(a) * b[-1]
            elif op == "convolution" and len(meta) >= 2:
                x, w = meta[0], meta[1]
                # output spatial size is not in the args; approximate with the input's (stride 1)
                total += 2 * _prod(w) * x[0] * _prod(x[2:]) // max(1, _stride_prod(n))
            elif op.startswith("_scaled_dot_product") and len(meta) >= 3:
                q, k = meta[0], meta[1]
                total += 4 * _prod(q[:-1]) * k[-2] * q[-1]
        except (IndexError, TypeError, ValueError):
            continue
    return total


def _stride_prod(node) -> int:
    args = node["args"]
    st = args[3] if len(args) > 3 and isinstance(args[3], list) else [1]
    return _prod(st) if st else 1


def _arg_shapes(task, node) -> list:
    """Shapes of the node's tensor arguments that are region inputs (others are unknown here)."""
    by_name = {name: m for name, m in zip(task.graph.get("inputs", []), task.inputs)}
    out = []
    for a in node["args"]:
        if isinstance(a, dict) and "ref" in a and a["ref"] in by_name and by_name[a["ref"]].present:
            out.append(tuple(by_name[a["ref"]].shape))
    return out


def floor(task, bandwidth_gbs: float, peak_tflops: float | None = None) -> Floor:
    b = bytes_moved(task)
    mem_us = b / (bandwidth_gbs * 1e9) * 1e6 if bandwidth_gbs > 0 else 0.0
    f = flops(task)
    comp_us = f / (peak_tflops * 1e12) * 1e6 if (peak_tflops and f) else 0.0
    if comp_us > mem_us:
        return Floor(comp_us, "compute", b, f,
                     f"{f / 1e9:.3g} GFLOP at {peak_tflops:g} TFLOP/s (compute bound; "
                     f"memory floor {mem_us:.3g} us)")
    return Floor(mem_us, "memory", b, f,
                 f"{b / 1e6:.3g} MB (inputs read once, outputs written once) at "
                 f"{bandwidth_gbs:.0f} GB/s (memory bound)")


# A bare GEMM or convolution (the op and the views that feed it): what torch.compile hands to
# the vendor library (cuBLAS, cuDNN; oneDNN/MKL on the cpu), which already runs at that
# library's roofline. With an epilogue in the region (partition rule 2) it is not bare.
VENDOR_OPS = {"mm": "GEMM", "addmm": "GEMM", "bmm": "GEMM", "baddbmm": "GEMM",
              "convolution": "convolution", "_convolution": "convolution"}
VIEW_OPS = {"view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand", "unsqueeze",
            "squeeze", "alias", "slice", "select"}


def vendor_op(task) -> str:
    """"GEMM" / "convolution" when the region is that op alone (with the views feeding it),
    else "": a bare vendor-library call."""
    from kforge_tui.regions.graph import ops_of

    ops = ops_of(task.graph)
    main = [o for o in ops if o not in VIEW_OPS]
    return VENDOR_OPS.get(main[0], "") if len(main) == 1 else ""


def headroom(compiled_us: float | None, floor_us: float | None, calls: int) -> float:
    """What a kernel could win over torch.compile in one forward: (compile - floor) x calls."""
    if not compiled_us or calls <= 0:
        return 0.0
    return max(0.0, compiled_us - (floor_us or 0.0)) * calls


AT_FLOOR = 1.1  # torch.compile within 10 % of the floor: nothing left to win
