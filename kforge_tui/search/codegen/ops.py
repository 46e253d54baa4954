"""C expressions for pointwise aten ops, with PyTorch's semantics.

`emit(em, val, idx)` returns (expression, exact): the node's value at `idx` in the compute type
of its dtype (float for float32/float16/bfloat16, double for float64, the integer type itself,
bool), and whether it is an exact copy of an operand of the same dtype (then no 16-bit rounding
is needed). Type promotion follows torch (`torch._prims_common.elementwise_dtypes`): 16-bit
floats compute in float and the Emitter rounds every 16-bit node like eager does; Python scalars
enter arithmetic unrounded (ATen's opmath scalars) and comparisons in the compared dtype.
"""
from __future__ import annotations

import math

import torch

from kforge_tui.search.codegen.cexpr import (COMPUTE_C, FLOATS, HALF, INTS, Ref, broadcast_idx, cast,
                                             literal)
from kforge_tui.search.codegen.sym import Unsupported

# op packet -> handler name; kept explicit so `known` can answer without emitting
_UNARY_MATH = {"exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
               "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "sin": "sin", "cos": "cos",
               "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
               "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
               "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "lgamma": "lgamma", "floor": "floor",
               "ceil": "ceil", "trunc": "trunc", "round": "nearbyint"}
_MATH_OPS = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
             "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
             "erfinv", "lgamma", "sigmoid", "silu", "gelu", "elu", "softplus", "mish", "pow",
             "logaddexp", "atan2", "hypot", "logit", "xlogy", "log_sigmoid"}
_BINARY = {"add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod",
           "pow", "minimum", "maximum", "fmin", "fmax", "atan2", "hypot", "copysign", "eq", "ne",
           "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
           "bitwise_or", "bitwise_xor", "clamp_min", "clamp_max", "xlogy"}
_UNARY = set(_UNARY_MATH) | {"neg", "abs", "reciprocal", "rsqrt", "sigmoid", "relu", "silu", "gelu",
                             "sign", "sgn", "signbit", "frac", "isnan", "isinf", "isfinite",
                             "isposinf", "isneginf", "logical_not", "bitwise_not", "square",
                             "hardsigmoid", "hardswish", "mish", "relu6", "positive", "bitwise_not",
                             "nan_to_num", "hardtanh", "leaky_relu", "elu", "softplus", "threshold",
                             "clamp", "_to_copy", "convert_element_type", "hardshrink", "logit"}
_OTHER = {"where", "masked_fill", "lerp", "addcmul", "addcdiv"}


def known(target: str) -> bool:
    ns, op, ov = target.split(".")
    if ns == "prims" and op == "convert_element_type":
        return True
    if ns != "aten":
        return False
    if op in ("round",) and ov == "decimals":
        return False
    return op in _UNARY or op in _BINARY or op in _OTHER


def has_math(target: str) -> bool:
    return target.split(".")[1] in _MATH_OPS


def _promote(em, v, keys) -> str:
    """torch's computation dtype for the operands `keys` of node v (DEFAULT promotion)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    args = []
    for k in keys:
        a = v.a.get(k)
        if isinstance(a, Ref):
            ov = em.R.vals[a.name]
            args.append(torch.empty(ov.shape, dtype=getattr(torch, ov.dtype), device="meta"))
        elif isinstance(a, (bool, int, float)):
            args.append(a)
    if not args:
        return v.dtype
    try:
        _, res = elementwise_dtypes(*args, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"type promotion of {v.target}: {e}") from e
    return str(res).replace("torch.", "")


class _Op:
    """Operands of one node at one index, cast on demand."""

    def __init__(self, em, v, idx):
        self.em, self.v, self.idx = em, v, idx
        self.out = v.dtype
        self._cache = {}

    def t(self, key):
        """(expr, dtype) of a tensor operand; (scalar, None) for a Python scalar."""
        if key not in self._cache:
            a = self.v.a.get(key)
            if isinstance(a, Ref):
                ov = self.em.R.vals[a.name]
                self._cache[key] = (self.em.value(a.name, broadcast_idx(self.idx, ov.shape)), ov.dtype)
            else:
                self._cache[key] = (a, None)
        return self._cache[key]

    def x(self, key, dt: str, scalar_dt: str | None = None) -> str:
        """Operand `key` as a compute value of dtype dt (scalars: literal in scalar_dt or dt)."""
        e, src = self.t(key)
        if src is None:
            if e is None:
                raise Unsupported(f"missing operand {key} of {self.v.target}")
            return literal(e, scalar_dt or dt)
        return cast(e, src, dt)

    def is_scalar(self, key) -> bool:
        return not isinstance(self.v.a.get(key), Ref)

    def fn(self, name: str, T: str) -> str:
        """The C math function `name` for compute dtype T under the emitter's math mode."""
        em = self.em
        if T == "float64":
            return name
        if em.backend == "cuda" and em.math == "fast":
            fast = {"exp": "__expf", "log": "__logf", "sin": "__sinf", "cos": "__cosf", "tan": "__tanf",
                    "pow": "__powf", "log2": "__log2f", "log10": "__log10f"}
            if name in fast:
                return fast[name]
        if em.backend == "cpu" and em.math == "poly":
            poly = {"exp": "kf_pexp", "tanh": "kf_ptanh", "erf": "kf_perf"}
            if name in poly:
                return poly[name]
        if name == "erfinv" and em.backend == "cpu":
            raise Unsupported("erfinv has no C library function on the cpu backend")
        return name + "f"


def _ct(dt: str) -> str:
    """Arithmetic dtype of a result dtype: 16-bit floats compute in float32."""
    return "float32" if dt in HALF else dt


def emit(em, v, idx) -> tuple[str, bool]:
    op = v.target.split(".")[1]
    ov = v.target.split(".")[2]
    o = _Op(em, v, idx)
    out = v.dtype
    T = _ct(out)
    C = COMPUTE_C[T]
    isf = T in FLOATS

    # ------------------------------------------------------------ conversions / copies
    if op in ("_to_copy", "convert_element_type", "positive"):
        e, src = o.t("self") if op != "convert_element_type" else o.t("a")
        if src is None:
            return literal(e, out), True
        return cast(e, src, out), src == out or (src in HALF and out == "float32")
    # ------------------------------------------------------------ arithmetic
    if op in ("add", "sub", "rsub"):
        ct = _ct(_promote(em, v, ["self", "other"]))
        a, b = o.x("self", ct), o.x("other", ct)
        alpha = v.a.get("alpha", 1)
        if alpha is not None and alpha != 1:
            b = f"({literal(alpha, ct)} * {b})" if op != "rsub" else b
            if op == "rsub":
                a = f"({literal(alpha, ct)} * {a})"
        if ct == "bool":
            return f"({a} || {b})" if op == "add" else f"({a} != {b})", False
        if op == "add":
            return f"({a} + {b})", False
        if op == "sub":
            return f"({a} - {b})", False
        return f"({b} - {a})", False
    if op == "mul":
        ct = _ct(_promote(em, v, ["self", "other"]))
        a, b = o.x("self", ct), o.x("other", ct)
        if ct == "bool":
            return f"({a} && {b})", False
        return f"({a} * {b})", False
    if op in ("div", "true_divide", "floor_divide"):
        mode = v.a.get("rounding_mode") if op == "div" else ("floor" if op == "floor_divide" else None)
        ct = _ct(_promote(em, v, ["self", "other"])) if mode else T
        a, b = o.x("self", ct), o.x("other", ct)
        if mode is None:
            if em.backend == "cuda" and em.math == "fast" and ct == "float32":
                return f"__fdividef({a}, {b})", False
            return f"({a} / {b})", False
        if ct in FLOATS:
            if mode == "trunc":
                return f"{o.fn('trunc', ct)}({a} / {b})", False
            return f"kf_fdivfloor<{COMPUTE_C[ct]}>({a}, {b})", False
        if mode == "trunc":
            return f"({a} / {b})", False
        return f"kf_idivfloor<{COMPUTE_C[ct]}>({a}, {b})", False
    if op in ("remainder", "fmod"):
        ct = _ct(_promote(em, v, ["self", "other"]))
        a, b = o.x("self", ct), o.x("other", ct)
        if ct in FLOATS:
            if op == "fmod":
                return f"{o.fn('fmod', ct)}({a}, {b})", False
            return f"kf_fremainder<{COMPUTE_C[ct]}>({a}, {b})", False
        if op == "fmod":
            return f"({a} % {b})", False
        return f"kf_iremainder<{COMPUTE_C[ct]}>({a}, {b})", False
    if op == "pow":
        return _pow(o, v, ov, T), False
    if op in ("minimum", "maximum", "fmin", "fmax"):
        ct = _ct(_promote(em, v, ["self", "other"]))
        a, b = o.x("self", ct), o.x("other", ct)
        if ct == "bool":
            return (f"({a} && {b})" if op in ("minimum", "fmin") else f"({a} || {b})"), False
        if op in ("fmin", "fmax") and ct in FLOATS:
            return f"{o.fn(op, ct)}({a}, {b})", False
        f = "kf_min" if op in ("minimum", "fmin") else "kf_max"
        return f"{f}<{COMPUTE_C[ct]}>({a}, {b})", False
    if op in ("clamp_min", "clamp_max"):
        bound = "min" if op == "clamp_min" else "max"
        key = "min" if "min" in v.a else ("max" if "max" in v.a else "other")
        ct = _ct(_promote(em, v, ["self", key]))
        a, b = o.x("self", ct), o.x(key, ct)
        if bound == "min":
            return f"({a} < {b} ? {b} : {a})", False
        return f"({a} > {b} ? {b} : {a})", False
    if op in ("clamp", "hardtanh"):
        if op == "hardtanh":
            lo, hi = v.a.get("min_val"), v.a.get("max_val")
            lo_k, hi_k = "min_val", "max_val"
        else:
            lo, hi = v.a.get("min"), v.a.get("max")
            lo_k, hi_k = "min", "max"
        ct = T
        x = o.x("self", ct)
        tmp = x
        if lo is not None:
            lb = o.x(lo_k, ct)
            tmp = f"({tmp} < {lb} ? {lb} : {tmp})"
        if hi is not None:
            hb = o.x(hi_k, ct)
            tmp = f"({tmp} > {hb} ? {hb} : {tmp})"
        if isf:
            return f"({x} != {x} ? {x} : {tmp})", False
        return tmp, False
    if op in ("atan2", "hypot", "copysign"):
        a, b = o.x("self", T), o.x("other", T)
        return f"{o.fn(op, T)}({a}, {b})", False
    if op == "xlogy":
        a, b = o.x("self", T), o.x("other", T)
        return f"({b} != {b} ? {b} : ({a} == 0 ? ({C})0 : {a} * {o.fn('log', T)}({b})))", False
    # ------------------------------------------------------------ comparisons and logic
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        ct = _promote(em, v, ["self", "other"])
        cc = _ct(ct)
        a = o.x("self", cc, ct)
        b = o.x("other", cc, ct)
        sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
        return f"({a} {sym} {b})", False
    if op in ("logical_and", "logical_or", "logical_xor"):
        a, b = o.x("self", "bool"), o.x("other", "bool")
        sym = {"logical_and": "&&", "logical_or": "||", "logical_xor": "!="}[op]
        return cast(f"({a} {sym} {b})", "bool", out), False
    if op == "logical_not":
        return cast(f"(!{o.x('self', 'bool')})", "bool", out), False
    if op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        ct = _promote(em, v, ["self", "other"])
        if ct in FLOATS:
            raise Unsupported("bitwise op on floats")
        a, b = o.x("self", ct), o.x("other", ct)
        sym = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}[op]
        if ct == "bool":
            return f"(bool)({a} {sym} {b})", False
        return f"({a} {sym} {b})", False
    if op == "bitwise_not":
        a = o.x("self", out)
        return (f"(!{a})" if out == "bool" else f"(~{a})"), False
    if op == "where":
        c = o.x("condition", "bool")
        ct = _ct(out)
        a, b = o.x("self", ct), o.x("other", ct)
        return f"({c} ? {a} : {b})", False
    if op == "masked_fill":
        c = o.x("mask", "bool")
        x = o.x("self", T)
        val = o.x("value", T, out)
        return f"({c} ? {val} : {x})", False
    # ------------------------------------------------------------ unary
    if op == "neg":
        return (f"(!{o.x('self', T)})" if T == "bool" else f"(-{o.x('self', T)})"), False
    if op == "abs":
        x = o.x("self", T)
        if isf:
            return f"{o.fn('fabs', T)}({x})", False
        return (x if T in ("bool", "uint8") else f"({x} < 0 ? -{x} : {x})"), False
    if op == "reciprocal":
        return f"(({C})1 / {o.x('self', T)})", False
    if op == "rsqrt":
        x = o.x("self", T)
        if em.backend == "cuda" and em.math == "fast" and T == "float32":
            return f"rsqrtf({x})", False
        return f"(({C})1 / {o.fn('sqrt', T)}({x}))", False
    if op == "sqrt":
        return f"{o.fn('sqrt', T)}({o.x('self', T)})", False
    if op == "square":
        x = o.x("self", T)
        return f"({x} * {x})", False
    if op in ("floor", "ceil", "trunc", "round"):
        x = o.x("self", T)
        if not isf:
            return x, True
        return f"{o.fn(_UNARY_MATH[op], T)}({x})", False
    if op == "frac":
        x = o.x("self", T)
        return f"({x} - {o.fn('trunc', T)}({x}))", False
    if op in _UNARY_MATH:
        if not isf:
            raise Unsupported(f"{op} with a non-float result")
        return f"{o.fn(_UNARY_MATH[op], T)}({o.x('self', T)})", False
    if op == "sigmoid":
        x = o.x("self", T)
        return _fdiv(em, T, f"({C})1", f"(({C})1 + {o.fn('exp', T)}(-{x}))"), False
    if op == "silu":
        x = o.x("self", T)
        return _fdiv(em, T, x, f"(({C})1 + {o.fn('exp', T)}(-{x}))"), False
    if op == "log_sigmoid":
        raise Unsupported("log_sigmoid")
    if op == "logit":
        if v.a.get("eps") is not None:
            raise Unsupported("logit with eps")
        x = o.x("self", T)
        return f"{o.fn('log', T)}({x} / (({C})1 - {x}))", False
    if op == "mish":
        x = o.x("self", T)
        sp = f"({x} > ({C})20 ? {x} : {o.fn('log1p', T)}({o.fn('exp', T)}({x})))"
        return f"({x} * {o.fn('tanh', T)}{sp})", False
    if op == "gelu":
        x = o.x("self", T)
        if v.a.get("approximate", "none") == "tanh":
            k0, k1 = literal(math.sqrt(2 / math.pi), T), literal(0.044715, T)
            inner = f"({k0} * ({x} + {k1} * {x} * {x} * {x}))"
            return f"(({C})0.5 * {x} * (({C})1 + {o.fn('tanh', T)}{inner}))", False
        return f"(({C})0.5 * {x} * (({C})1 + {o.fn('erf', T)}({x} * {literal(0.7071067811865476, T)})))", False
    if op == "relu":
        x = o.x("self", T)
        if T == "bool":
            return x, True
        return f"({x} < 0 ? ({C})0 : {x})", False
    if op == "relu6":
        x = o.x("self", T)
        return f"({x} != {x} ? {x} : ({x} < 0 ? ({C})0 : ({x} > 6 ? ({C})6 : {x})))", False
    if op == "leaky_relu":
        x = o.x("self", T)
        s = o.x("negative_slope", T)
        return f"({x} > 0 ? {x} : {x} * {s})", False
    if op == "elu":
        x = o.x("self", T)
        al, sc, isc = o.x("alpha", T), o.x("scale", T), o.x("input_scale", T)
        return f"({x} > 0 ? {x} * {sc} : {al} * {sc} * {o.fn('expm1', T)}({x} * {isc}))", False
    if op == "softplus":
        x = o.x("self", T)
        be, th = o.x("beta", T), o.x("threshold", T)
        return (f"({x} * {be} > {th} ? {x} : {o.fn('log1p', T)}({o.fn('exp', T)}({x} * {be})) / {be})"), False
    if op == "threshold":
        x = o.x("self", T)
        th, val = o.x("threshold", T), o.x("value", T)
        return f"({x} <= {th} ? {val} : {x})", False
    if op == "hardshrink":
        x = o.x("self", T)
        la = o.x("lambd", T)
        return f"(({x} >= -{la} && {x} <= {la}) ? ({C})0 : {x})", False
    if op == "hardsigmoid":
        x = o.x("self", T)
        t = f"({x} + ({C})3)"
        return f"({x} != {x} ? {x} : ({t} < 0 ? ({C})0 : ({t} > 6 ? ({C})6 : {t})) / ({C})6)", False
    if op == "hardswish":
        x = o.x("self", T)
        t = f"({x} + ({C})3)"
        return f"({x} * ({t} < 0 ? ({C})0 : ({t} > 6 ? ({C})6 : {t})) / ({C})6)", False
    if op in ("sign", "sgn"):
        x = o.x("self", T)
        if T == "bool":
            return x, True
        return f"(({C})((0 < {x}) - ({x} < 0)))", False
    if op == "signbit":
        e, src = o.t("self")
        if src in FLOATS:
            return f"(bool)signbit({cast(e, src, _ct(src))})", False
        return f"({e} < 0)", False
    if op in ("isnan", "isinf", "isfinite", "isposinf", "isneginf"):
        e, src = o.t("self")
        if src not in FLOATS:
            return ("true" if op == "isfinite" else "false"), False
        x = cast(e, src, _ct(src))
        return {"isnan": f"({x} != {x})", "isinf": f"({x} == INFINITY || {x} == -INFINITY)",
                "isfinite": f"({x} == {x} && {x} != INFINITY && {x} != -INFINITY)",
                "isposinf": f"({x} == INFINITY)", "isneginf": f"({x} == -INFINITY)"}[op], False
    if op == "nan_to_num":
        x = o.x("self", T)
        if not isf:
            return x, True
        fi = torch.finfo(getattr(torch, out))
        nan = v.a.get("nan") if v.a.get("nan") is not None else 0.0
        pinf = v.a.get("posinf") if v.a.get("posinf") is not None else fi.max
        ninf = v.a.get("neginf") if v.a.get("neginf") is not None else fi.min
        return (f"({x} != {x} ? {literal(nan, out)} : ({x} == INFINITY ? {literal(pinf, out)} : "
                f"({x} == -INFINITY ? {literal(ninf, out)} : {x})))"), False
    if op == "lerp":
        a, b = o.x("self", T), o.x("end", T)
        w = o.x("weight", T)
        return f"kf_lerp<{C}>({a}, {b}, {w})", False
    if op in ("addcmul", "addcdiv"):
        s, t1, t2 = o.x("self", T), o.x("tensor1", T), o.x("tensor2", T)
        val = o.x("value", T)
        sym = "*" if op == "addcmul" else "/"
        return f"({s} + {val} * ({t1} {sym} {t2}))", False
    raise Unsupported(f"op {v.target} has no generated form")


def _fdiv(em, T: str, a: str, b: str) -> str:
    """a / b, the approximate division in cuda fast-math mode."""
    if em.backend == "cuda" and em.math == "fast" and T == "float32":
        return f"__fdividef({a}, {b})"
    return f"({a} / {b})"


def _pow(o: _Op, v, ov: str, T: str) -> str:
    C = COMPUTE_C[T]
    if ov == "Scalar":  # scalar base, tensor exponent
        e = o.x("exponent", T)
        base = v.a.get("self")
        if T not in FLOATS:
            return f"kf_ipow<{C}>({literal(base, T)}, (int64_t){e})"
        if float(base) == 2.0:
            return f"{o.fn('exp2', T)}({e})"
        return f"{o.fn('pow', T)}({literal(base, T)}, {e})"
    x = o.x("self", T)
    if ov == "Tensor_Scalar":
        p = v.a.get("exponent")
        if T not in FLOATS:
            if isinstance(p, float) and not p.is_integer():
                raise Unsupported("integer tensor to a fractional power")
            return f"kf_ipow<{C}>({x}, (int64_t){int(p)})"
        p = float(p)
        if p == 0:
            return f"(({C})1)"
        if p == 1:
            return x
        if p == 2:
            return f"({x} * {x})"
        if p == 3:
            return f"({x} * {x} * {x})"
        if p == 0.5:
            return f"{o.fn('sqrt', T)}({x})"
        if p == -0.5:
            return f"(({C})1 / {o.fn('sqrt', T)}({x}))"
        if p == -1:
            return f"(({C})1 / {x})"
        if p == -2:
            return f"(({C})1 / ({x} * {x}))"
        return f"{o.fn('pow', T)}({x}, {literal(p, T)})"
    e = o.x("exponent", T)
    if T not in FLOATS:
        return f"kf_ipow<{C}>({x}, (int64_t){e})"
    return f"{o.fn('pow', T)}({x}, {e})"


def source(em, v, idx) -> str:
    """A constant-producing node (full, zeros, arange, ...) at index idx."""
    t = v.target
    out = v.dtype
    a = v.a
    if t in ("aten.full.default", "aten.full_like.default"):
        return literal(a["fill_value"], out)
    if t == "aten.fill.Scalar":
        return literal(a["value"], out)
    if t == "aten.scalar_tensor.default":
        return literal(a["s"], out)
    if t in ("aten.zeros.default", "aten.zeros_like.default"):
        return literal(0, out)
    if t in ("aten.ones.default", "aten.ones_like.default"):
        return literal(1, out)
    if t.startswith("aten.arange") or t == "prims.iota.default":
        if t == "prims.iota.default":
            start, step = a["start"], a["step"]
        else:
            start = a.get("start") if t != "aten.arange.default" else 0
            step = a.get("step", 1) if t == "aten.arange.start_step" else 1
            start = start or 0
        i = idx[0].c()
        C = COMPUTE_C[_ct(out)]
        if out in INTS:
            return f"(({C})({int(start)} + {int(step)} * {i}))"
        return cast(f"(({C})({float(start)!r} + {float(step)!r} * (double)({i})))", _ct(out), out)
    raise Unsupported(f"source {t}")
