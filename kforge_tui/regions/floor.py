"""The floor of a region: the least time any kernel could take, from bytes and FLOPs.

Memory bound: every input read once (a table read only through indices is left out: its
gathered elements are the output's) and every output written once, over the measured copy
bandwidth. Compute bound (matmul, convolution, attention): the multiply-adds over the peak
matrix rate. The floor is the larger of the two and `bound` says which one it is. A timed candidate below the floor is
impossible and rejected (sandbox/bench.py), not celebrated.
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
    """Every input read once and every output written once, except a table the region reads
    only through indices (an embedding, index_select, gather): how much of it a kernel must
    read depends on the index values (repeated indices read a row once), and counting it whole
    put the floor above an honest kernel's time (GPT-2's wte: 180 us against 7.5 us eager), so
    that kernel was rejected as impossible (sandbox/supervisor.py). Its bytes are left out:
    the gathered elements are written to the output, which is counted, so the floor stays a
    lower bound."""
    tables = gathered_inputs(task)
    return sum(m.nbytes for k, m in enumerate(task.inputs) if m.present and k not in tables) \
        + sum(m.nbytes for m in task.outputs if m.present)


# Ops whose first argument is a table read where the indices point.
GATHER_OPS = {"embedding", "index_select", "gather", "index", "_unsafe_index", "take",
              "take_along_dim"}


def gathered_inputs(task) -> set[int]:
    """Positions of the region inputs read only through the table argument of gather ops
    (views between them allowed). An input read any other way (whole, as indices, returned,
    through an op that is not a gather) is not one."""
    nodes = task.graph.get("nodes", [])
    if not any(_op(n) in GATHER_OPS for n in nodes):
        return set()
    returned = set(_refs(task.graph.get("outputs", [])))
    uses: dict[str, list] = {}
    for n in nodes:
        args = n["args"]
        table = args[0]["ref"] if args and isinstance(args[0], dict) and "ref" in args[0] else None
        for r in _refs([args[1:], n.get("kwargs", {})]):
            uses.setdefault(r, []).append((n, False))
        if table is not None:
            uses.setdefault(table, []).append((n, True))
    out = set()
    for k, name in enumerate(task.graph.get("inputs", [])):
        gathers, todo, seen = 0, [name], set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in returned:
                break
            bad = False
            for n, as_table in uses.get(v, []):
                if as_table and _op(n) in VIEW_OPS:
                    todo.append(n["name"])
                elif as_table and _op(n) in GATHER_OPS:
                    gathers += 1
                else:
                    bad = True
            if bad:
                break
        else:
            if gathers:
                out.add(k)
    return out


def _op(node) -> str:
    t = node["target"]
    return t.split(".")[1] if t.count(".") == 2 else t


def _refs(a):
    """The value names an argument (nested lists and dicts) refers to."""
    if isinstance(a, dict):
        if "ref" in a:
            yield a["ref"]
        else:
            for v in a.values():
                yield from _refs(v)
    elif isinstance(a, (list, tuple)):
        for x in a:
            yield from _refs(x)


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
    dense = sum(m.nbytes for m in list(task.inputs) + list(task.outputs) if m.present)
    how = "inputs read once" + (", tables read through indices left out" if b < dense else "")
    return Floor(mem_us, "memory", b, f,
                 f"{b / 1e6:.3g} MB ({how}, outputs written once) at "
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
