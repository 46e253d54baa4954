"""The judge: whether one output matches its reference, and in what words it does not.

Two yardsticks, stated once:
  * `compare`: against PyTorch's own result at the task dtype, within the per-OUTPUT-dtype
    tolerance table (an honest kernel rounds differently; integer and bool outputs must match
    exactly), naming the first reason in priority order (poison survived, NaN, values differ);
  * `judge_f64`: against a float64 run of the region, in ulps of the output dtype, for edge
    cases and one ordinary set (an ill-conditioned edge case is no yardstick at the task dtype);
    with no float64 run, against PyTorch's own result allowing its one-ulp sensitivity.
"""
from __future__ import annotations

import torch

from kforge_tui.regions.closeness import TOLERANCES, all_close, flat_chunks
from kforge_tui.sandbox.result import Mismatch

# TOLERANCES (dtype -> rtol, atol) live in regions/closeness.py: the pattern check shares them.
EXACT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")

# Edge-case judge against float64: an element passes when its error is within ULPS[dtype] ulps
# of the output dtype, or within EDGE_FACTOR x PyTorch's own error (that element's, or its worst
# relative error over the output), or below the smallest normal number (denormal flushing is
# tolerated). f32: an exp approximated by a cubic (~1e-4 relative, ~800 ulps) fails; __expf
# with +-100 arguments (<= ~50 ulps) passes.
ULPS = {"float32": 128, "float16": 4, "bfloat16": 4, "float64": 2**20}
EDGE_FACTOR = 8.0
# ... and never below SCALE_ULPS ulps of the output's largest finite value: an element near zero
# that is a difference of large terms (w * norm + b with +-100 weights) carries the rounding of
# those terms, as `compare`'s atol x max|ref| says for ordinary inputs.
SCALE_ULPS = 8.0
TINY = {"float32": torch.finfo(torch.float32).tiny, "float16": torch.finfo(torch.float16).tiny,
        "bfloat16": torch.finfo(torch.bfloat16).tiny, "float64": torch.finfo(torch.float64).tiny}
MANTISSA = {"float32": 23, "float16": 10, "bfloat16": 7, "float64": 52}

FIRST_N = 5  # mismatching elements listed in a report
CHUNK = 1 << 25  # elements compared at once (bounds the float64 scratch of a comparison)


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (0.0, 0.0))


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def is_oom(e: BaseException) -> bool:
    """An allocation failure of the harness (device or host), simulated ones included."""
    if isinstance(e, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                            or "cannot allocate memory" in text)


# ------------------------------------------------------------------------ comparison

def _label(input_set: str, j: int, n_out: int) -> str:
    return input_set if n_out <= 1 else f"{input_set} output {j}"


def compare(expected: torch.Tensor, got: torch.Tensor, dtype: str, input_set: str,
            poison: torch.Tensor | None = None) -> Mismatch | None:
    """None when `got` matches; else a Mismatch naming the first reason in priority order.

    `poison` (same logical shape) is what the output held before the call: mismatching elements
    that still hold it are reported as unwritten ("poison survived")."""
    total = expected.numel()
    if got.numel() != total:
        return Mismatch(input_set, float("inf"), float("inf"), total, total, [],
                        f"output has {got.numel()} elements, expected {total}")
    if total == 0:
        return None
    exact = dtype in EXACT_DTYPES
    rtol, atol = tolerance(dtype)
    # pass 1: the scale (max |finite reference|)
    scale = 0.0
    if not exact:
        for _, e in flat_chunks(expected, CHUNK):
            scale = max(scale, float(e.float().abs().nan_to_num_(0.0, 0.0, 0.0).max()))
        scale = scale or 1.0
    # the absolute bound never below the smallest normal number: a difference there is denormal
    # flushing (an FTZ multiply, exp2.approx.ftz), tolerated as judge_f64 does. On tiny and
    # denormal inputs an attention's output is itself denormal (max |ref| 5.3e-39): atol x
    # max|ref| was 5e-44, and every honest flash candidate failed (KernelBench 97 f32, H100,
    # 2026-12-07) while a zero anywhere a normal value is expected still fails
    abs_tol = 0.0 if exact else max(atol * scale, float(TINY.get(dtype, 0.0)))
    if not exact:
        # fast path (the common, passing case): one fused closeness test in the output's own
        # precision (f32 for 16-bit outputs), all finite; the float64 analysis below, which is
        # the judge (equal NaNs and infinities included), runs only when it fails
        if poison is None and all_close(expected, got, rtol, abs_tol, CHUNK):
            return None
    elif poison is None and torch.equal(expected, got.reshape(expected.shape) if got.shape != expected.shape
                                        else got):
        return None
    n_bad = survived = nan_new = nan_lost = 0
    max_abs = max_rel = 0.0
    nonfinite_bad = False
    first: list[dict] = []
    pchunks = flat_chunks(poison, CHUNK) if poison is not None and poison.numel() == total else None
    for (a, e), (_, g) in zip(flat_chunks(expected, CHUNK), flat_chunks(got, CHUNK)):
        p = next(pchunks)[1] if pchunks is not None else None
        # a snapshot: the buffer itself may still be changing (work left running elsewhere)
        if exact:
            gn = g.clone()
            bad = gn != e
            if p is not None:
                survived += int((bad & (p == gn)).sum())
                p = None
            g, e = gn.to(torch.float64), e.to(torch.float64)
        else:
            g = g.to(torch.float64, copy=True)
            e = e.to(torch.float64)
            e_nan, g_nan = torch.isnan(e), torch.isnan(g)
            diff = (g - e).abs()
            # rtol x |e| only where e is finite: inf <= inf would pass any finite value where
            # the reference is infinite
            close = (g == e) | (diff <= abs_tol + rtol * torch.where(torch.isfinite(e), e.abs(), 0.0))
            bad = ~(close | (e_nan & g_nan))
        nb = int(bad.sum())
        if not nb:
            continue
        n_bad += nb
        if p is not None:
            p = p.to(torch.float64)
            survived += int((bad & (p == g)).sum())
        if not exact:
            nan_new += int((g_nan & ~e_nan).sum())
            nan_lost += int((e_nan & ~g_nan).sum())
            fin = torch.isfinite(e) & torch.isfinite(g)
            both = bad & fin
            if bool(both.any()):
                # torch.where, not boolean indexing: masked selection is ~1000x slower on cpu
                d = torch.where(both, diff, 0.0)
                max_abs = max(max_abs, float(d.max()))
                max_rel = max(max_rel, float((d / e.abs().clamp_min(1e-30)).max()))
            if bool((bad & ~fin).any()):
                nonfinite_bad = True
        else:
            d = torch.where(bad, (g - e).abs(), 0.0)
            max_abs = max(max_abs, float(d.max()))
            max_rel = max(max_rel, float((d / e.abs().clamp_min(1)).max()))
        if len(first) < FIRST_N:
            idx = torch.nonzero(bad).reshape(-1)[:FIRST_N - len(first)].tolist()
            for flat in idx:
                first.append({"index": list(_unravel(a + flat, tuple(expected.shape))),
                              "expected": _num(e[flat]), "got": _num(g[flat])})
    if n_bad == 0:
        return None
    if survived:
        reason = f"unwritten elements (poison survived in {survived})"
    elif nan_new:
        reason = "NaN where the reference is finite (unwritten or computed NaN)"
    elif nan_lost:
        reason = "finite where the reference is NaN"
    else:
        reason = "values differ beyond tolerance"
    if nonfinite_bad and not max_abs:
        max_abs = max_rel = float("inf")
    tol = "exact match required" if exact else f"rtol {rtol:g}, atol {atol:g} x max|ref| {scale:.3g}" + (
        f", at least the smallest normal {abs_tol:.3g}" if abs_tol > atol * scale else "")
    return Mismatch(input_set, max_abs, max_rel, n_bad, total, first, f"{reason} ({tol})")


def _num(t: torch.Tensor) -> float | str:
    v = float(t)
    return v if v == v and abs(v) != float("inf") else str(v)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape or (1,)):
        out.append(flat % max(s, 1))
        flat //= max(s, 1)
    return tuple(reversed(out))


def _unravel_many(flat: torch.Tensor, shape: tuple) -> tuple:
    """Index tensors (one per dim) of logical flat positions."""
    out = []
    rest = flat.clone()
    for s in reversed(shape or (1,)):
        out.append(rest % max(s, 1))
        rest = rest // max(s, 1)
    return tuple(reversed(out)) if shape else (flat,)


def special_mismatch(input_set: str, total: int, reason: str) -> Mismatch:
    """A failure that is not about values (inputs changed, writes outside the output, state)."""
    return Mismatch(input_set, float("nan"), float("nan"), total, total, [], reason)


def ulp(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Spacing of `dtype` numbers at |x| (x float64), never below the smallest denormal."""
    m = MANTISSA[dtype]
    tiny = TINY[dtype]
    ax = x.abs().clamp_min(tiny)
    e = torch.floor(torch.log2(ax))
    return torch.exp2(e - m).clamp_min(tiny * 2.0 ** -m)


def _within_ulps(chunks, k: float, tiny: float, k_scale: float) -> bool:
    """Every element of got within max(k * |ref|, tiny, k_scale * max|ref|) of ref, all finite."""
    top = 0.0
    for (_, r), _, _, _ in chunks:
        top = max(top, float(r.abs().max()))
    floor = max(tiny, k_scale * top) if top == top and top != float("inf") else tiny
    for (_, r), _, (_, g), _ in chunks:
        d = g.to(torch.float64, copy=True).sub_(r).abs_()
        d.sub_(r.abs().mul_(k).clamp_min_(floor))
        if not float(d.max()) <= 0.0:  # NaN: not <=
            return False
    return True


def judge_f64(ref64: torch.Tensor, torch_out: torch.Tensor, got: torch.Tensor, dtype: str,
              label: str, pert: torch.Tensor | None = None,
              against: str = "the float64 reference") -> Mismatch | None:
    """Edge-case judge of one float output against the float64 run (see ULPS, EDGE_FACTOR).

    `pert` is PyTorch's output on the same inputs changed by about one ulp each: where the
    region is ill-conditioned (a layer_norm of a row of equal values divides rounding noise by
    sqrt(eps); a softmax of scores near 1e5 is one-hot), an honest kernel's rounding moves the
    result that far too, so EDGE_FACTOR x that sensitivity is allowed as well. PyTorch's own
    error can be zero there by luck of its summation order; the sensitivity cannot. `against`
    names `ref64` in the report: where a region has no float64 run, PyTorch's own result stands
    for it (verify's `_judge_sensitive`)."""
    total = ref64.numel()
    if total == 0 or dtype not in ULPS or dtype == "float64":
        return None
    rchunks = list(flat_chunks(ref64, CHUNK))
    chunks = list(zip(rchunks, flat_chunks(torch_out, CHUNK), flat_chunks(got, CHUNK),
                      flat_chunks(pert, CHUNK) if pert is not None else [(None, None)] * len(rchunks)))
    # fast path: every element within a bound no larger than the judge's own below (ULPS ulps
    # of the float64 result, floored at the smallest normal and at SCALE_ULPS ulps of the
    # output's largest value), all finite: one max per chunk. Anything else (a NaN, an
    # infinity, an element past it) goes to the full judgement.
    eps = 2.0 ** -MANTISSA[dtype]
    if _within_ulps(chunks, ULPS[dtype] * eps, TINY[dtype], SCALE_ULPS * eps):
        return None
    # pass 1: PyTorch's own worst relative error on this output (finite elements), and its
    # worst relative sensitivity to one-ulp input changes
    rel_t = rel_p = 0.0
    for (_, r), (_, t), _, (_, p) in chunks:
        r = r.to(torch.float64)
        for x, which in ((t, "t"), (p, "p")):
            if x is None:
                continue
            x = x.to(torch.float64)
            ok = torch.isfinite(r) & torch.isfinite(x) & (r.abs() > TINY[dtype])
            if bool(ok.any()):
                v = float(torch.where(ok, (x - r).abs() / r.abs().clamp_min(TINY[dtype]), 0.0).max())
                if which == "t":
                    rel_t = max(rel_t, v)
                else:
                    rel_p = max(rel_p, v)
    scale = 0.0
    for (_, r), _, _, _ in chunks:
        fin = torch.isfinite(r)
        if bool(fin.any()):
            scale = max(scale, float(r[fin].abs().max()))
    n_bad, worst_ulps, max_abs, first = 0, 0.0, 0.0, []
    for (a, r), (_, t), (_, g), (_, p) in chunks:
        r = r.to(torch.float64)
        t = t.to(torch.float64)
        g = g.to(torch.float64, copy=True)
        # an ulp of |x| is between eps/2 and eps times |x| (normal numbers): eps * |x| is the
        # unit here, floored at the smallest normal (denormal flushing is tolerated)
        u = (eps * r.abs()).clamp_min(TINY[dtype] * eps)
        err = (g - r).abs()
        # PyTorch's own error counts only where PyTorch is finite: where it is NaN or inf and the
        # float64 run is finite (exp(100) overflows in f32, inf * 0), its "error" is no bound,
        # and an honest kernel is judged like with like - equal to PyTorch's NaN/inf (below), or
        # within ulps of the float64 result (issue 21: a Mamba exp+neg+add region)
        err_t = torch.where(torch.isfinite(t), (t - r).abs(), 0.0)
        if p is not None:
            err_p = (p.to(torch.float64) - r).abs()
            err_t = torch.maximum(err_t, torch.where(torch.isfinite(err_p), err_p, 0.0))
        bound = torch.maximum(ULPS[dtype] * u,
                              EDGE_FACTOR * torch.maximum(err_t, max(rel_t, rel_p) * r.abs()))
        bound = bound.clamp_min(SCALE_ULPS * eps * scale)
        bound = bound.clamp_min(TINY[dtype])
        close = (err <= bound) | (g == t) | ((g - t).abs() <= ULPS[dtype] * eps * t.abs())
        # non-finite: must agree with PyTorch or with the float64 run. Where PyTorch's f32 run
        # overflowed itself (non-finite, the float64 run finite), any non-finite result is like
        # with like: which of inf and NaN an overflow ends in follows the order of the operations
        # ((elu(a) + 1) * exp(-c) * v at +-100: expm1f leaves 1e-44 where PyTorch's elu gives 0,
        # so the kernel's inf * 1e-44 = inf where PyTorch's inf * 0 = NaN)
        nf = ~(torch.isfinite(g) & torch.isfinite(r))
        same_nf = (torch.isnan(g) & (torch.isnan(t) | torch.isnan(r))) | \
                  (torch.isinf(g) & ((g == t) | (g == r))) | \
                  (~torch.isfinite(g) & ~torch.isfinite(t) & torch.isfinite(r))
        close = torch.where(nf, same_nf | (g == t), close)
        bad = ~close
        nb = int(bad.sum())
        if not nb:
            continue
        n_bad += nb
        fin = bad & torch.isfinite(g) & torch.isfinite(r)
        if bool(fin.any()):
            worst_ulps = max(worst_ulps, float(torch.where(fin, err / u, 0.0).max()))
            max_abs = max(max_abs, float(torch.where(fin, err, 0.0).max()))
        else:
            worst_ulps = max_abs = float("inf")
        if len(first) < FIRST_N:
            for flat in torch.nonzero(bad).reshape(-1)[:FIRST_N - len(first)].tolist():
                first.append({"index": list(_unravel(a + flat, tuple(ref64.shape))),
                              "expected": _num(r[flat]), "got": _num(g[flat]),
                              "pytorch": _num(t[flat])})
    if not n_bad:
        return None
    return Mismatch(label, max_abs, worst_ulps, n_bad, total, first,
                    f"edge-case inputs: error up to {worst_ulps:.3g} ulps of {dtype} against {against} "
                    f"(allowed {ULPS[dtype]} ulps, {SCALE_ULPS:g} ulps of the output's "
                    f"largest value, or {EDGE_FACTOR:g}x PyTorch's own error or its change under "
                    f"one-ulp input changes)")


