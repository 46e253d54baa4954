"""What every compute generator shares: the region's one compute op analysed through its views
(`analyze`: for each tensor argument, which region input it reads, with which shape, strides and
storage offset), and the C helpers (dtype loads and stores, the pointer struct, the entry point,
the finishing step) every source is built with. pool.py uses them too."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from kforge_tui.regions.abi import INCLUDE_LINE
from kforge_tui.regions.graph import GETITEM, resolve_target
from kforge_tui.search.codegen.kbuild import GenDesign
from kforge_tui.search.csrc import CPU_HALF_CONVERSIONS

FLOATS = ("float32", "float16", "bfloat16", "float64")
HALVES = ("float16", "bfloat16")
ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
         "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


# =============================================================================== analysis

@dataclass(frozen=True)
class Operand:
    """A region input as the compute op sees it, through the region's views."""

    index: int  # region input index (inputs[index] in the ABI)
    shape: tuple
    strides: tuple
    offset: int  # storage offset in elements from the input's data pointer
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def ptr(self, backend: str = "") -> str:
        """C expression: typed pointer to element (0, ..., 0)."""
        off = f" + {self.offset}" if self.offset else ""
        return f"((const kf_in{self.index}_t*)P.in[{self.index}]{off})"


@dataclass(frozen=True)
class OutRef:
    """A region output: which result of the compute op it is, and its meta."""

    index: int  # region output index
    item: int  # result index of the compute op (0 for single-result ops)
    shape: tuple
    strides: tuple
    dtype: str


@dataclass
class Region:
    target: str
    args: dict  # bound by the op's schema: Operand for tensors, lists of Operand/None, values
    outs: list  # OutRef per region output (ABI order)

    def out(self, item: int) -> OutRef | None:
        return next((o for o in self.outs if o.item == item), None)


_cache: dict = {}
_cache_lock = threading.Lock()


def _is_view_target(op) -> bool:
    try:
        from kforge_tui.regions.partition import _is_view
        return bool(_is_view(op))
    except Exception:  # pragma: no cover - partition always importable in practice
        rets = getattr(getattr(op, "_schema", None), "returns", None)
        return bool(rets) and rets[0].alias_info is not None


def bind(target: str, args: list, kwargs: dict) -> dict:
    """The op's arguments by schema name (defaults filled in)."""
    op = resolve_target(target)
    schema = op._schema
    out = {}
    pos = list(args)
    for i, a in enumerate(schema.arguments):
        if a.kwarg_only:
            if a.name in kwargs:
                out[a.name] = kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            continue
        if i < len(pos):
            out[a.name] = pos[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            raise ValueError(f"{target}: missing argument {a.name}")
    return out


def analyze(task) -> Region | None:
    """The region's one compute op with its operands seen through the views (None: not a
    single-op region this module can read). Cached per task key."""
    key = task.key
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    try:
        r = _analyze(task)
    except Exception:
        r = None
    with _cache_lock:
        if len(_cache) > 512:
            _cache.clear()
        _cache[key] = r
    return r


def _ensure_prims() -> None:
    try:  # Inductor's prims (the low-memory max pool) resolve only once Inductor registered them
        import torch._inductor.inductor_prims  # noqa: F401
    except Exception:
        pass


def _analyze(task) -> Region | None:
    import torch

    if any(n["target"].startswith("prims.") for n in task.graph["nodes"]):
        _ensure_prims()

    g = task.graph
    env: dict = {}
    metas: dict = {}  # name -> (meta tensor, root input index, root base tensor)
    for i, name in enumerate(g["inputs"]):
        m = task.inputs[i]
        if not m.present:
            env[name] = None
            continue
        span = 1 + sum((s - 1) * st for s, st in zip(m.shape, m.strides)) if all(m.shape) else 1
        base = torch.empty(max(span, 1), dtype=getattr(torch, m.dtype), device="meta")
        t = base.as_strided(tuple(m.shape), tuple(m.strides), 0)
        env[name] = Operand(i, tuple(m.shape), tuple(m.strides), 0, m.dtype)
        metas[name] = (t, i, base)
    main = None
    items: dict = {}
    for n in g["nodes"]:
        tgt = n["target"]
        if tgt == GETITEM:
            src = n["args"][0]["ref"]
            if main is None or src != main["name"]:
                return None
            items[n["name"]] = int(n["args"][1])
            continue
        op = resolve_target(tgt)
        if _is_view_target(op) or tgt in ("aten._unsafe_view.default", "aten.reshape.default"):
            refs = arg_refs(n["args"]) + arg_refs(list(n["kwargs"].values()))
            if len(refs) != 1 or refs[0] not in metas:
                return None
            t, root, base = metas[refs[0]]

            def dec(a):
                if isinstance(a, dict) and "ref" in a:
                    return t
                if isinstance(a, list):
                    return [dec(x) for x in a]
                if isinstance(a, dict) and "tuple" in a:
                    return tuple(dec(x) for x in a["tuple"])
                if isinstance(a, dict) and "float" in a:
                    return float(a["float"])
                if isinstance(a, dict):
                    raise ValueError("tagged argument in a view")
                return a

            r = op(*dec(n["args"]), **{k: dec(v) for k, v in n["kwargs"].items()})
            if not isinstance(r, torch.Tensor) or not torch._C._is_alias_of(r, base):
                return None
            metas[n["name"]] = (r, root, base)
            env[n["name"]] = Operand(root, tuple(int(s) for s in r.shape),
                                     tuple(int(s) for s in r.stride()), int(r.storage_offset()),
                                     str(r.dtype).replace("torch.", ""))
            continue
        if main is not None:
            return None
        main = n
    if main is None:
        return None

    def dec2(a):
        if isinstance(a, dict) and "ref" in a:
            v = env.get(a["ref"], "missing")
            if v == "missing":
                raise ValueError("argument is not an input or a view of one")
            return v
        if isinstance(a, list):
            return [dec2(x) for x in a]
        if isinstance(a, dict) and "tuple" in a:
            return tuple(dec2(x) for x in a["tuple"])
        if isinstance(a, dict) and "float" in a:
            return float(a["float"])
        if isinstance(a, dict) and "dtype" in a:
            return a["dtype"]
        if isinstance(a, dict):
            return None
        return a

    args = bind(main["target"], dec2(main["args"]), {k: dec2(v) for k, v in main["kwargs"].items()})
    outs = []
    for j, o in enumerate(g["outputs"]):
        ref = o.get("ref") if isinstance(o, dict) else None
        if ref == main["name"]:
            item = 0
        elif ref in items:
            item = items[ref]
        else:
            return None
        m = task.outputs[j]
        outs.append(OutRef(j, item, tuple(m.shape), tuple(m.strides), m.dtype))
    return Region(main["target"], args, outs)


def arg_refs(a) -> list:
    """The node names an encoded argument (regions/graph.encode_arg) refers to, in order."""
    if isinstance(a, dict) and "ref" in a:
        return [a["ref"]]
    if isinstance(a, list):
        return [r for x in a for r in arg_refs(x)]
    if isinstance(a, dict) and "tuple" in a:
        return arg_refs(a["tuple"])
    return []


def bcast_strides(op: Operand, shape: tuple) -> tuple | None:
    """Strides that read `op` broadcast to `shape` (numpy rules; 0 on broadcast dims)."""
    if op.ndim > len(shape):
        return None
    pad = len(shape) - op.ndim
    st = [0] * pad
    for d in range(op.ndim):
        s, want = op.shape[d], shape[pad + d]
        if s == want:
            st.append(op.strides[d] if want != 1 else 0)
        elif s == 1:
            st.append(0)
        else:
            return None
    return tuple(st)


# =============================================================================== C helpers

_CPU_CVT = r"""#include <string.h>
#include <stdlib.h>
#include <math.h>
// 16-bit floats arrive as raw bits (uint16_t); conversions round to nearest even, NaN kept.
""" + CPU_HALF_CONVERSIONS

_CUDA_CVT = r"""template <typename T, int V> struct alignas(sizeof(T) * V) kf_pk { T v[V]; };
inline bool kf_aligned(const void* p, int bytes) { return ((uintptr_t)p % (uintptr_t)bytes) == 0; }
"""


def ptrs_struct() -> str:
    return ("struct kf_ptrs { const void* in[KF_NUM_INPUTS > 0 ? KF_NUM_INPUTS : 1]; "
            "void* out[KF_NUM_OUTPUTS]; };\n")


def entry_fill(backend: str) -> str:
    """Entry-point lines that copy the pointer arrays into a kf_ptrs P."""
    return ("  kf_ptrs P;\n"
            "  for (int i = 0; i < KF_NUM_INPUTS; ++i) P.in[i] = inputs[i];\n"
            "  for (int i = 0; i < KF_NUM_OUTPUTS; ++i) P.out[i] = outputs[i];\n")


def finish(src: str, backend: str) -> str:
    """Final spelling: `KF_DEV` (the templates' device-function marker) becomes the backend's
    qualifiers. Written out rather than #defined: the static check parses the source as it
    stands, and macros named KF_* belong to the ABI header."""
    return src.replace("KF_DEV", "__device__ __forceinline__" if backend == "cuda" else "inline")


def prelude(backend: str) -> str:
    head = INCLUDE_LINE + "\n"
    if backend == "cuda":
        return head + _CUDA_CVT + ptrs_struct()
    return head + _CPU_CVT + ptrs_struct()


def load(dtype: str, backend: str, expr: str, acc: str = "float") -> str:
    """C expression converting one stored element `expr` to the accumulator type."""
    if dtype == "bfloat16":
        f = f"__bfloat162float({expr})" if backend == "cuda" else f"kf_bf2f({expr})"
    elif dtype == "float16":
        f = f"__half2float({expr})" if backend == "cuda" else f"kf_h2f({expr})"
    elif dtype == "bool":
        f = f"(({expr}) ? 1.0f : 0.0f)"
    else:
        f = f"({expr})"
    return f"(({acc}){f})"


def store(dtype: str, backend: str, expr: str) -> str:
    """C expression converting an accumulator value to the stored type of `dtype`."""
    if dtype == "bfloat16":
        return f"__float2bfloat16_rn((float)({expr}))" if backend == "cuda" else f"kf_f2bf((float)({expr}))"
    if dtype == "float16":
        return f"__float2half_rn((float)({expr}))" if backend == "cuda" else f"kf_f2h((float)({expr}))"
    if dtype == "float32":
        return f"((float)({expr}))"
    if dtype == "float64":
        return f"((double)({expr}))"
    if dtype == "bool":
        return f"(({expr}) != 0)"
    ct = {"int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
          "uint8": "uint8_t"}[dtype]
    return f"(({ct})({expr}))"


def raw_zero(dtype: str, backend: str) -> str:
    if backend == "cuda" and dtype == "bfloat16":
        return "__ushort_as_bfloat16((unsigned short)0)"
    if backend == "cuda" and dtype == "float16":
        return "__ushort_as_half((unsigned short)0)"
    if dtype in HALVES:
        return "((uint16_t)0)"
    return "0"


def flit(x) -> str:
    """A float literal for C (double precision text; finite values only)."""
    x = float(x)
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    if math.isnan(x):
        return "NAN"
    return repr(x)


def fill(src: str, **kw) -> str:
    for k, v in kw.items():
        src = src.replace(f"@{k}@", str(v))
    if "@" in src.replace("@@", ""):
        i = src.find("@")
        raise ValueError(f"unfilled placeholder near {src[max(0, i - 40): i + 40]!r}")
    return src


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def off_expr(terms) -> str:
    """`a*b + c*d` from (index expression, stride) pairs; zero strides dropped."""
    parts = [f"({i}) * {s}LL" if s != 1 else f"({i})" for i, s in terms if s != 0]
    return " + ".join(parts) if parts else "0"


def otype(j: int) -> str:
    return f"kf_out{j}_t"


# =============================================================================== designs

def compute_design(*args, **kwargs) -> GenDesign:
    """A shared GenDesign (kbuild.py) whose renders get this module's `finish` step."""
    return GenDesign(*args, finish=finish, **kwargs)



def usable(d: GenDesign, task) -> bool:
    try:
        return d.valid(task, d.default(task))
    except Exception:
        return False
