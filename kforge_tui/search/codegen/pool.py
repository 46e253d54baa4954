"""Generated kernels for pooling and gather compute regions.

Ops (as torch.compile's aten graph spells them):
  max pooling   prims._low_memory_max_pool_with_offsets (values, int8 window offsets: what
                Inductor emits for max_pool2d and for divisible adaptive_max_pool2d),
                prims._low_memory_max_pool_offsets_to_indices (offsets -> int64 indices),
                aten.max_pool{2,3}d_with_indices, aten.adaptive_max_pool{2,3}d
  avg pooling   aten.avg_pool{2,3}d (padding, ceil_mode, count_include_pad, divisor_override),
                aten._adaptive_avg_pool{2,3}d (1d pools arrive as 2d over an unsqueeze view)
  gathers       aten.embedding, aten.index.Tensor (one index tensor), aten.index_select,
                aten.gather
  copies        prims.rev / aten.flip, aten.cat, prims.iota (arange)
  scans         aten.cumsum, aten.cumprod (f64 accumulation on the cpu, as ATen; f32 on cuda)

Every output element is computed independently, in the output's memory order (so writes are
contiguous whatever the layout: NCHW or channels_last), reading the input through its strides.
Max pooling follows ATen exactly: a window element replaces the running maximum when it is
greater or NaN, the index starts at the first in-bounds element, padding is never a candidate.
Averages accumulate in f32 (f64 for f64) with ATen's divisor rules.

Designs:
  gen_pool_omp / gen_gather_omp     cpu: OpenMP over output rows (all dims but the innermost in
                                    memory order), `chunk` rows per scheduling unit.
  gen_pool_cuda / gen_gather_cuda   cuda: a thread per `ept` output elements, `threads` per block.
  gen_copy_omp / gen_copy_cuda      the same two layouts for flip, cat and iota.
  gen_scan_omp                      cpu: OpenMP over lines, a sequential scan along each line.
  gen_scan_cuda                     cuda: a warp per line, 32-element warp scans (shfl_up) chained
                                    by a carry; `warps` lines per block.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kforge_tui.search.csrc import OMP_MIN_WORK
from kforge_tui.search.codegen.compute.base import (
    FLOATS, Operand, OutRef, compute_design, analyze, entry_fill, fill, load, off_expr, prelude, store,
    usable)

_MAXP = {"prims._low_memory_max_pool_with_offsets.default": "lowmem",
         "aten.max_pool2d_with_indices.default": "with_indices",
         "aten.max_pool3d_with_indices.default": "with_indices"}
_AVGP = ("aten.avg_pool2d.default", "aten.avg_pool3d.default")
_ADAVG = ("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
_ADMAX = ("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
_O2I = "prims._low_memory_max_pool_offsets_to_indices.default"
_GATHER = ("aten.embedding.default", "aten.index.Tensor", "aten.index_select.default",
           "aten.gather.default")
_COPY = ("prims.rev.default", "aten.flip.default", "aten.cat.default", "prims.iota.default")
_SCAN = ("aten.cumsum.default", "aten.cumprod.default")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


def _lst(v, n: int, default=None) -> list | None:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return list(default) if default is not None else None
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    if len(v) == 1 and n > 1:
        v = v * n
    return v if len(v) == n else None


def _pad3(v, fill_value):
    return [fill_value] * (3 - len(v)) + list(v)


# ============================================================================ pooling windows

@dataclass
class PoolInfo:
    kind: str  # max | avg | adaptive_avg | adaptive_max | o2i
    lead: tuple  # leading (non-spatial) sizes of the output, 1 or 2 dims
    sp: tuple  # input spatial (D, H, W)
    osp: tuple  # output spatial (OD, OH, OW)
    ker: tuple
    stride: tuple
    pad: tuple
    dil: tuple
    x: Operand
    xs: tuple  # input strides (lead..., d, h, w) with lead padded to 2 dims
    val: OutRef | None  # values (max/avg) or the o2i output
    idx: OutRef | None  # offsets (int8) or indices (int64)
    idx_kind: str = ""  # "offset" | "index"
    count_include_pad: bool = True
    divisor: int | None = None
    nsp: int = 2

    def coords(self):
        """(name, size, [strides per output]) of every output dim, lead padded to (n, c)."""
        lead = (1,) * (2 - len(self.lead)) + tuple(self.lead)
        return [("n", lead[0]), ("c", lead[1]), ("od", self.osp[0]), ("oh", self.osp[1]),
                ("ow", self.osp[2])]


def _out_strides(o: OutRef, nsp: int) -> tuple:
    lead = len(o.shape) - nsp
    ls = (0,) * (2 - lead) + tuple(o.strides[:lead])
    return ls + tuple(_pad3(list(o.strides[lead:]), 0))


def pool_info(task) -> PoolInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None:
        return None
    t, a = R.target, R.args
    if t not in _MAXP and t not in _AVGP and t not in _ADAVG and t not in _ADMAX and t != _O2I:
        return None
    x = a.get("self")
    if not isinstance(x, Operand):
        return None
    if t == _O2I:
        if x.dtype not in INT_DTYPES or len(R.outs) != 1:
            return None
        nsp = len(a["kernel_size"])
    elif t in _ADAVG or t in _ADMAX:
        nsp = len(a["output_size"])
    else:
        nsp = len(a["kernel_size"])
    if nsp not in (1, 2, 3) or x.ndim - nsp not in (0, 1, 2):
        return None
    if t != _O2I and x.dtype not in FLOATS:
        return None
    lead = tuple(x.shape[: x.ndim - nsp])
    if t == _O2I:
        insz = list(a["input_size"])
        if len(insz) != nsp:
            return None
        sp = tuple(_pad3(insz, 1))
        osp = tuple(_pad3(list(x.shape[x.ndim - nsp:]), 1))
    else:
        sp = tuple(_pad3(list(x.shape[x.ndim - nsp:]), 1))
        o0 = R.out(0)
        if o0 is None and not R.outs:
            return None
        any_out = o0 or R.outs[0]
        osp = tuple(_pad3(list(any_out.shape[len(any_out.shape) - nsp:]), 1))
    for o in R.outs:
        if tuple(o.shape[: len(o.shape) - nsp]) != lead or len(o.shape) != x.ndim:
            return None
    xs = (0,) * (2 - len(lead)) + tuple(x.strides[: len(lead)]) + tuple(_pad3(list(x.strides[len(lead):]), 0))
    if t == _O2I:
        k = _lst(a["kernel_size"], nsp)
        s = _lst(a["stride"], nsp, k)
        p = _lst(a["padding"], nsp, [0] * nsp)
        d = _lst(a["dilation"], nsp, [1] * nsp)
        if None in (k, s, p, d) or R.outs[0].dtype != "int64":
            return None
        return PoolInfo("o2i", lead, sp, osp, tuple(_pad3(k, 1)), tuple(_pad3(s, 1)),
                        tuple(_pad3(p, 0)), tuple(_pad3(d, 1)), x, xs, R.outs[0], None, "", nsp=nsp)
    if t in _MAXP:
        k = _lst(a["kernel_size"], nsp)
        s = _lst(a.get("stride"), nsp, k)
        p = _lst(a.get("padding", 0), nsp, [0] * nsp)
        d = _lst(a.get("dilation", 1), nsp, [1] * nsp)
        if None in (k, s, p, d):
            return None
        val, idx = R.out(0), R.out(1)
        if any(o.item not in (0, 1) for o in R.outs):
            return None
        ik = "offset" if _MAXP[t] == "lowmem" else "index"
        if val is not None and val.dtype != x.dtype:
            return None
        if idx is not None and idx.dtype not in INT_DTYPES:
            return None
        if ik == "offset" and math.prod(k) > 127 and idx is not None and idx.dtype == "int8":
            return None
        return PoolInfo("max", lead, sp, osp, tuple(_pad3(k, 1)), tuple(_pad3(s, 1)),
                        tuple(_pad3(p, 0)), tuple(_pad3(d, 1)), x, xs, val, idx, ik, nsp=nsp)
    if t in _AVGP:
        k = _lst(a["kernel_size"], nsp)
        s = _lst(a.get("stride"), nsp, k)
        p = _lst(a.get("padding", 0), nsp, [0] * nsp)
        if None in (k, s, p) or len(R.outs) != 1 or R.outs[0].item != 0:
            return None
        div = a.get("divisor_override")
        if R.outs[0].dtype != x.dtype:
            return None
        return PoolInfo("avg", lead, sp, osp, tuple(_pad3(k, 1)), tuple(_pad3(s, 1)),
                        tuple(_pad3(p, 0)), (1, 1, 1), x, xs, R.outs[0], None, "",
                        bool(a.get("count_include_pad", True)), int(div) if div else None, nsp=nsp)
    if t in _ADAVG:
        if len(R.outs) != 1 or R.outs[0].item != 0 or R.outs[0].dtype != x.dtype:
            return None
        return PoolInfo("adaptive_avg", lead, sp, osp, (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1),
                        x, xs, R.outs[0], None, nsp=nsp)
    val, idx = R.out(0), R.out(1)
    if val is not None and val.dtype != x.dtype:
        return None
    if idx is not None and idx.dtype not in INT_DTYPES:
        return None
    return PoolInfo("adaptive_max", lead, sp, osp, (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1),
                    x, xs, val, idx, "index", nsp=nsp)


def _order(sizes: list, strides: list) -> list[int]:
    """Dims from innermost to outermost in memory order (size-1 dims last)."""
    dims = list(range(len(sizes)))
    return sorted(dims, key=lambda d: (sizes[d] == 1, abs(strides[d]), -d))


def _decomp(names: list, sizes: list, strides: list, var: str, indent: str = "    ") -> tuple[str, str]:
    """C lines defining every name from a linear index in memory order; also returns the
    innermost dim's name (what the cpu loop runs over)."""
    order = _order(sizes, strides)
    lines = [f"{indent}int64_t q_ = {var};"]
    for j, d in enumerate(order):
        if j == len(order) - 1:
            lines.append(f"{indent}const int64_t {names[d]} = q_;")
        else:
            lines.append(f"{indent}const int64_t {names[d]} = q_ % {sizes[d]}LL; q_ /= {sizes[d]}LL;")
    return "\n".join(lines), names[order[0]]


def _pool_one(pi: PoolInfo, backend: str) -> str:
    """Body of kf_one(P, n, c, od, oh, ow): computes and writes one output position."""
    acc = "double" if pi.x.dtype == "float64" else "float"
    D, H, W = pi.sp
    KD, KH, KW = pi.ker
    sd, sh, sw = pi.stride
    pd, ph, pw = pi.pad
    dd, dh, dw = pi.dil
    xs = pi.xs
    xb = f"{pi.x.ptr()} + {off_expr([('n', xs[0]), ('c', xs[1])])}"
    L = []
    L.append(f"  const kf_in{pi.x.index}_t* xp = {xb};")
    if pi.kind == "o2i":
        o = pi.val
        st = _out_strides(o, pi.nsp)
        L.append(f"  const int64_t off = (int64_t)(({pi.x.ptr()})[{off_expr([('n', xs[0]), ('c', xs[1]), ('od', xs[2]), ('oh', xs[3]), ('ow', xs[4])])}]);")
        L.append(f"  const int64_t kw = off % {KW}, kh = (off / {KW}) % {KH}, kd = off / {KW * KH};")
        L.append(f"  const int64_t id = od * {sd} - {pd} + kd * {dd}, ih = oh * {sh} - {ph} + kh * {dh}, "
                 f"iw = ow * {sw} - {pw} + kw * {dw};")
        L.append(f"  ((int64_t*)P.out[{o.index}])[{off_expr([('n', st[0]), ('c', st[1]), ('od', st[2]), ('oh', st[3]), ('ow', st[4])])}] = "
                 f"(id * {H} + ih) * {W} + iw;")
        return "\n".join(L)
    ld = lambda e: load(pi.x.dtype, backend, e, "acc_t")  # noqa: E731
    xoff = off_expr([("id", xs[2]), ("ih", xs[3]), ("iw", xs[4])])
    if pi.kind in ("max", "avg"):
        L.append(f"  const int64_t d0 = od * {sd} - {pd}, h0 = oh * {sh} - {ph}, w0 = ow * {sw} - {pw};")
    if pi.kind in ("adaptive_avg", "adaptive_max"):
        OD, OH, OW = pi.osp
        L.append(f"  const int64_t d0 = (od * {D}) / {OD}, d1 = ((od + 1) * {D} + {OD} - 1) / {OD};")
        L.append(f"  const int64_t h0 = (oh * {H}) / {OH}, h1 = ((oh + 1) * {H} + {OH} - 1) / {OH};")
        L.append(f"  const int64_t w0 = (ow * {W}) / {OW}, w1 = ((ow + 1) * {W} + {OW} - 1) / {OW};")
    if pi.kind in ("max", "adaptive_max"):
        L.append("  acc_t m = (acc_t)(-INFINITY);")
        L.append("  int64_t mi = -1;")
        if pi.kind == "max":
            L.append(f"  for (int kd = 0; kd < {KD}; ++kd) {{")
            L.append(f"    const int64_t id = d0 + kd * {dd}; if (id < 0 || id >= {D}) continue;")
            L.append(f"    for (int kh = 0; kh < {KH}; ++kh) {{")
            L.append(f"      const int64_t ih = h0 + kh * {dh}; if (ih < 0 || ih >= {H}) continue;")
            L.append(f"      for (int kw = 0; kw < {KW}; ++kw) {{")
            L.append(f"        const int64_t iw = w0 + kw * {dw}; if (iw < 0 || iw >= {W}) continue;")
            key = (f"((int64_t)kd * {KH} + kh) * {KW} + kw" if pi.idx_kind == "offset"
                   else f"(id * {H} + ih) * {W} + iw")
            L.append(f"        const int64_t key = {key};")
            L.append(f"        const acc_t v = {ld('xp[' + xoff + ']')};")
            L.append("        if (mi < 0) mi = key;")
            L.append("        if (v > m || v != v) { m = v; mi = key; }")
            L.append("      }\n    }\n  }")
        else:
            L.append("  for (int64_t id = d0; id < d1; ++id)")
            L.append("    for (int64_t ih = h0; ih < h1; ++ih)")
            L.append("      for (int64_t iw = w0; iw < w1; ++iw) {")
            L.append(f"        const int64_t key = (id * {H} + ih) * {W} + iw;")
            L.append(f"        const acc_t v = {ld('xp[' + xoff + ']')};")
            L.append("        if (mi < 0) mi = key;")
            L.append("        if (v > m || v != v) { m = v; mi = key; }")
            L.append("      }")
        if pi.val is not None:
            st = _out_strides(pi.val, pi.nsp)
            L.append(f"  ((kf_out{pi.val.index}_t*)P.out[{pi.val.index}])[{off_expr([('n', st[0]), ('c', st[1]), ('od', st[2]), ('oh', st[3]), ('ow', st[4])])}] = "
                     f"{store(pi.val.dtype, backend, 'm')};")
        if pi.idx is not None:
            st = _out_strides(pi.idx, pi.nsp)
            L.append(f"  ((kf_out{pi.idx.index}_t*)P.out[{pi.idx.index}])[{off_expr([('n', st[0]), ('c', st[1]), ('od', st[2]), ('oh', st[3]), ('ow', st[4])])}] = "
                     f"{store(pi.idx.dtype, backend, 'mi < 0 ? 0 : mi')};")
        return "\n".join(L)
    # averages
    L.append("  acc_t s = 0;")
    if pi.kind == "avg":
        L.append(f"  int64_t d1 = d0 + {KD}, h1 = h0 + {KH}, w1 = w0 + {KW};")
        L.append(f"  if (d1 > {D} + {pd}) d1 = {D} + {pd};")
        L.append(f"  if (h1 > {H} + {ph}) h1 = {H} + {ph};")
        L.append(f"  if (w1 > {W} + {pw}) w1 = {W} + {pw};")
        L.append("  const int64_t pool = (d1 - d0) * (h1 - h0) * (w1 - w0);")
        L.append("  const int64_t da = d0 < 0 ? 0 : d0, ha = h0 < 0 ? 0 : h0, wa = w0 < 0 ? 0 : w0;")
        L.append(f"  const int64_t db = d1 > {D} ? {D} : d1, hb = h1 > {H} ? {H} : h1, wb = w1 > {W} ? {W} : w1;")
        L.append("  for (int64_t id = da; id < db; ++id)")
        L.append("    for (int64_t ih = ha; ih < hb; ++ih)")
        L.append("      for (int64_t iw = wa; iw < wb; ++iw)")
        L.append(f"        s += {ld('xp[' + xoff + ']')};")
        if pi.divisor:
            L.append(f"  const acc_t div = (acc_t){pi.divisor};")
        elif pi.count_include_pad:
            L.append("  const acc_t div = (acc_t)pool;")
        else:
            L.append("  const acc_t div = (acc_t)((db - da) * (hb - ha) * (wb - wa));")
        L.append("  const acc_t r = (da < db && ha < hb && wa < wb) ? s / div : (acc_t)0;")
    else:
        L.append("  for (int64_t id = d0; id < d1; ++id)")
        L.append("    for (int64_t ih = h0; ih < h1; ++ih)")
        L.append("      for (int64_t iw = w0; iw < w1; ++iw)")
        L.append(f"        s += {ld('xp[' + xoff + ']')};")
        L.append("  const acc_t r = s / (acc_t)((d1 - d0) * (h1 - h0) * (w1 - w0));")
    st = _out_strides(pi.val, pi.nsp)
    L.append(f"  ((kf_out{pi.val.index}_t*)P.out[{pi.val.index}])[{off_expr([('n', st[0]), ('c', st[1]), ('od', st[2]), ('oh', st[3]), ('ow', st[4])])}] = "
             f"{store(pi.val.dtype, backend, 'r')};")
    return "\n".join(L)


def _pool_layout(pi: PoolInfo):
    names = [n for n, _ in pi.coords()]
    sizes = [s for _, s in pi.coords()]
    o = pi.val or pi.idx
    strides = list(_out_strides(o, pi.nsp))
    return names, sizes, strides


# ============================================================================ gathers

@dataclass
class GatherInfo:
    kind: str
    out: OutRef
    src: Operand
    idx: Operand
    dim: int  # the indexed dim of src
    src_expr: str = ""  # C offset of the element in src given coordinates o0..o{r-1} and `ix`
    idx_expr: str = ""  # C offset of the index element given the coordinates


def gather_info(task) -> GatherInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None or R.target not in _GATHER or len(R.outs) != 1 or R.outs[0].item != 0:
        return None
    a = R.args
    o = R.outs[0]
    r = len(o.shape)
    oc = [f"o{i}" for i in range(r)]
    t = R.target
    if t == "aten.embedding.default":
        w, idx = a["weight"], a["indices"]
        if not isinstance(w, Operand) or not isinstance(idx, Operand) or w.ndim != 2:
            return None
        k = idx.ndim
        if r != k + 1 or o.shape[:k] != idx.shape or o.shape[k] != w.shape[1]:
            return None
        src = off_expr([("ix", w.strides[0]), (oc[k], w.strides[1])])
        ie = off_expr(list(zip(oc[:k], idx.strides)))
        gi = GatherInfo("embedding", o, w, idx, 0, src, ie)
    elif t == "aten.index_select.default":
        x, idx = a["self"], a["index"]
        if not isinstance(x, Operand) or not isinstance(idx, Operand) or idx.ndim > 1:
            return None
        dim = int(a["dim"]) % max(1, x.ndim)
        if r != x.ndim:
            return None
        terms = [("ix" if d == dim else oc[d], x.strides[d]) for d in range(x.ndim)]
        gi = GatherInfo("index_select", o, x, idx, dim, off_expr(terms),
                        off_expr([(oc[dim], idx.strides[0] if idx.ndim else 0)]))
    elif t == "aten.gather.default":
        x, idx = a["self"], a["index"]
        if not isinstance(x, Operand) or not isinstance(idx, Operand):
            return None
        dim = int(a["dim"]) % max(1, x.ndim)
        if idx.ndim != x.ndim or tuple(o.shape) != idx.shape:
            return None
        terms = [("ix" if d == dim else oc[d], x.strides[d]) for d in range(x.ndim)]
        gi = GatherInfo("gather", o, x, idx, dim, off_expr(terms),
                        off_expr(list(zip(oc, idx.strides))))
    else:  # aten.index.Tensor with exactly one index tensor
        x, ids = a["self"], a["indices"]
        if not isinstance(x, Operand) or not isinstance(ids, (list, tuple)):
            return None
        pos = [i for i, v in enumerate(ids) if v is not None]
        if len(pos) != 1 or not isinstance(ids[pos[0]], Operand):
            return None
        p = pos[0]
        idx = ids[p]
        k = idx.ndim
        if r != x.ndim - 1 + k:
            return None
        terms = [(oc[d], x.strides[d]) for d in range(p)] + [("ix", x.strides[p])]
        terms += [(oc[d - 1 + k], x.strides[d]) for d in range(p + 1, x.ndim)]
        gi = GatherInfo("index", o, x, idx, p, off_expr(terms),
                        off_expr(list(zip(oc[p:p + k], idx.strides))))
    if gi.idx.dtype not in ("int64", "int32") or gi.src.dtype != o.dtype:
        return None
    return gi


def _gather_one(gi: GatherInfo, backend: str) -> str:
    o = gi.out
    n = gi.src.shape[gi.dim]
    oo = off_expr([(f"o{i}", s) for i, s in enumerate(o.strides)])
    return (f"  int64_t ix = (int64_t)({gi.idx.ptr()}[{gi.idx_expr}]);\n"
            f"  if (ix < 0) ix += {n}LL;\n"
            f"  ix = ix < 0 ? 0 : (ix >= {n}LL ? {n}LL - 1 : ix);\n"
            f"  ((kf_out{o.index}_t*)P.out[{o.index}])[{oo}] = {gi.src.ptr()}[{gi.src_expr}];")


def _gather_layout(gi: GatherInfo):
    o = gi.out
    return [f"o{i}" for i in range(len(o.shape))], list(o.shape), list(o.strides)


# ============================================================================ copies

@dataclass
class CopyInfo:
    kind: str
    out: OutRef
    body: str  # body of kf_one(P, o0, ...); `@LD@`/`@ST@` free (dtypes are equal)


def copy_info(task) -> CopyInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None or R.target not in _COPY or len(R.outs) != 1 or R.outs[0].item != 0:
        return None
    a, o = R.args, R.outs[0]
    r = len(o.shape)
    oc = [f"o{i}" for i in range(r)]
    oo = off_expr(list(zip(oc, o.strides)))
    dst = f"((kf_out{o.index}_t*)P.out[{o.index}])[{oo}]"
    if R.target in ("prims.rev.default", "aten.flip.default"):
        x = a.get("a", a.get("self"))
        dims = a.get("dims")
        if not isinstance(x, Operand) or x.dtype != o.dtype or x.shape != tuple(o.shape):
            return None
        dims = {int(d) % max(1, r) for d in dims}
        terms = [(f"{x.shape[d] - 1}LL - {oc[d]}" if d in dims else oc[d], x.strides[d]) for d in range(r)]
        return CopyInfo("flip", o, f"  {dst} = {x.ptr()}[{off_expr(terms)}];")
    if R.target == "aten.cat.default":
        xs = a["tensors"]
        if not xs or not all(isinstance(x, Operand) for x in xs):
            return None
        dim = int(a.get("dim", 0)) % max(1, r)
        lines, start = [], 0
        for x in xs:
            if x.ndim == 1 and x.shape == (0,):  # legacy empty tensors are skipped by cat
                continue
            if x.dtype != o.dtype or x.ndim != r:
                return None
            if any(x.shape[d] != o.shape[d] for d in range(r) if d != dim):
                return None
            n = x.shape[dim]
            if n == 0:
                continue
            terms = [(f"{oc[d]} - {start}LL" if d == dim else oc[d], x.strides[d]) for d in range(r)]
            lines.append(f"  if ({oc[dim]} < {start + n}LL) {{ {dst} = {x.ptr()}[{off_expr(terms)}]; return; }}")
            start += n
        if start != o.shape[dim]:
            return None
        return CopyInfo("cat", o, "\n".join(lines))
    # iota
    if r != 1 or a.get("dtype") != o.dtype:
        return None
    st, step = a.get("start", 0), a.get("step", 1)
    if not all(isinstance(v, int) for v in (st, step)):
        return None
    return CopyInfo("iota", o, "")


def render_copy(task, p: dict) -> str:
    ci = copy_info(task)
    o = ci.out
    names = [f"o{i}" for i in range(len(o.shape))] or ["o0"]
    sizes = list(o.shape) or [1]
    strides = list(o.strides) or [1]
    body = ci.body
    if ci.kind == "iota":
        body = f"  {'((kf_out%d_t*)P.out[%d])' % (o.index, o.index)}[{off_expr([('o0', strides[0])])}] = " \
               f"({_ctype_of(o.dtype, task.backend)})(" + _iota_expr(task) + ");"
    return _render(task.backend, names, sizes, strides, body, "float", p)


def _ctype_of(dtype: str, backend: str) -> str:
    from kforge_tui.regions.abi import ctype

    return ctype(dtype, backend)


def _iota_expr(task) -> str:
    R = analyze(task)
    o = R.outs[0]
    st, step = R.args.get("start", 0), R.args.get("step", 1)
    v = f"(int64_t){st}LL + (int64_t){step}LL * o0"
    if o.dtype in INT_DTYPES:
        return v
    return store(o.dtype, task.backend, f"(double)({v})")


# ============================================================================ scans

@dataclass
class ScanInfo:
    op: str  # "sum" | "prod"
    x: Operand
    out: OutRef
    dim: int
    acc: dict  # backend -> accumulator C type


def scan_info(task) -> ScanInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None or R.target not in _SCAN or len(R.outs) != 1 or R.outs[0].item != 0:
        return None
    x, o = R.args["self"], R.outs[0]
    if not isinstance(x, Operand) or x.shape != tuple(o.shape):
        return None
    if x.dtype not in FLOATS + INT_DTYPES + ("bool",) or o.dtype not in FLOATS + ("int64",):
        return None
    dim = int(R.args["dim"]) % max(1, x.ndim) if x.ndim else 0
    if o.dtype in FLOATS:
        acc = {"cpu": "double", "cuda": "double" if "float64" in (x.dtype, o.dtype) else "float"}
    else:
        acc = {"cpu": "int64_t", "cuda": "int64_t"}
    return ScanInfo("sum" if "cumsum" in R.target else "prod", x, o, dim, acc)


_CPU_SCAN = r"""
typedef @ACC@ acc_t;
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
@FILL@
  const int64_t lines = @LINES@LL, n = @N@LL;
  if (lines * n == 0) return 0;
#pragma omp parallel for schedule(static, @CHUNK@) if(lines > 1 && lines * n >= @OMP_MIN@)
  for (int64_t line = 0; line < lines; ++line) {
@DECOMP@
    const kf_in@XI@_t* xp = @XP@ + @XOFF@;
    kf_out@OI@_t* yp = (kf_out@OI@_t*)P.out[@OI@] + @OOFF@;
    acc_t a = @INIT@;
    for (int64_t i = 0; i < n; ++i) {
      a = a @OP@ @LDX@;
      yp[i * @OS@LL] = @STY@;
    }
  }
  return 0;
}
"""

_CUDA_SCAN = r"""
typedef @ACC@ acc_t;
#define WARPS @WARPS@
__global__ void __launch_bounds__(WARPS * 32) kf_scan(kf_ptrs P) {
  const int lane = threadIdx.x % 32;
  const int64_t line = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
  if (line >= @LINES@LL) return;
@DECOMP@
  const kf_in@XI@_t* xp = @XP@ + @XOFF@;
  kf_out@OI@_t* yp = (kf_out@OI@_t*)P.out[@OI@] + @OOFF@;
  acc_t carry = @INIT@;
  for (int64_t base = 0; base < @N@LL; base += 32) {
    const int64_t i = base + lane;
    acc_t v = i < @N@LL ? (acc_t)@LDX@ : (acc_t)@INIT@;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const acc_t u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v = v @OP@ u;
    }
    v = carry @OP@ v;
    if (i < @N@LL) yp[i * @OS@LL] = @STY@;
    carry = __shfl_sync(0xffffffffu, v, 31);
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  if (@LINES@LL * @N@LL == 0) return 0;
  const int64_t blocks = (@LINES@LL + WARPS - 1) / WARPS;
  kf_scan<<<(unsigned)blocks, WARPS * 32, 0, stream>>>(P);
  return (int)cudaGetLastError();
}
"""


def render_scan(task, p: dict) -> str:
    si = scan_info(task)
    x, o, dim = si.x, si.out, si.dim
    b = task.backend
    r = x.ndim
    other = [d for d in range(r) if d != dim]
    names = [f"o{d}" for d in other]
    if other:
        dec, _ = _decomp(names, [x.shape[d] for d in other], [o.strides[d] for d in other], "line")
    else:
        dec = "    (void)line;" if b == "cpu" else "  (void)line;"
    xoff = off_expr([(f"o{d}", x.strides[d]) for d in other])
    ooff = off_expr([(f"o{d}", o.strides[d]) for d in other])
    acc = si.acc[b]
    ldx = load(x.dtype, b, f"xp[i * {x.strides[dim] if r else 0}LL]", "acc_t")
    fields = dict(ACC=acc, FILL=entry_fill(b), LINES=math.prod(x.shape[d] for d in other) if other else 1,
                  N=x.shape[dim] if r else 1, DECOMP=dec, XI=x.index, XP=x.ptr(), XOFF=xoff, OI=o.index,
                  OOFF=ooff, INIT="0" if si.op == "sum" else "1", OP="+" if si.op == "sum" else "*",
                  LDX=ldx, OS=o.strides[dim] if r else 0,
                  STY=store(o.dtype, b, "a" if b == "cpu" else "v"))
    if b == "cpu":
        return prelude("cpu") + fill(_CPU_SCAN, CHUNK=p["chunk"], OMP_MIN=OMP_MIN_WORK, **fields)
    return prelude("cuda") + fill(_CUDA_SCAN, WARPS=p["warps"], **fields)


# ============================================================================ kernels

_CPU_KERNEL = r"""
typedef @ACC@ acc_t;
KF_DEV void kf_one(const kf_ptrs& P, @ARGS@) {
@BODY@
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
@FILL@
  const int64_t rows = @ROWS@LL, inner = @INNER@LL;
  if (rows * inner == 0) return 0;
#pragma omp parallel for schedule(static, @CHUNK@) if(rows > 1 && rows * inner >= @OMP_MIN@)
  for (int64_t row = 0; row < rows; ++row) {
@DECOMP@
    for (int64_t @IN@ = 0; @IN@ < inner; ++@IN@) kf_one(P, @CALL@);
  }
  return 0;
}
"""

_CUDA_KERNEL = r"""
typedef @ACC@ acc_t;
#define THREADS @THREADS@
#define EPT @EPT@
KF_DEV void kf_one(const kf_ptrs& P, @ARGS@) {
@BODY@
}

__global__ void __launch_bounds__(THREADS) kf_elems(kf_ptrs P) {
  const int64_t total = @TOTAL@LL;
  for (int64_t base = (int64_t)blockIdx.x * THREADS * EPT + threadIdx.x; base < total;
       base += (int64_t)gridDim.x * THREADS * EPT) {
#pragma unroll
    for (int e = 0; e < EPT; ++e) {
      const int64_t t = base + (int64_t)e * THREADS;
      if (t >= total) break;
@DECOMP@
      kf_one(P, @CALL@);
    }
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  const int64_t total = @TOTAL@LL;
  if (total == 0) return 0;
  int64_t blocks = (total + THREADS * EPT - 1) / (THREADS * EPT);
  if (blocks > 2147483647LL) blocks = 2147483647LL;
  kf_elems<<<(unsigned)blocks, THREADS, 0, stream>>>(P);
  return (int)cudaGetLastError();
}
"""


def _render(backend: str, names, sizes, strides, body: str, acc: str, p: dict) -> str:
    args = ", ".join(f"int64_t {n}" for n in names)
    call = ", ".join(names)
    total = math.prod(sizes)
    if backend == "cpu":
        order = _order(sizes, strides)
        inner_d = order[0]
        rest = [d for d in range(len(names)) if d != inner_d]
        if rest:
            dec, _ = _decomp([names[d] for d in rest], [sizes[d] for d in rest],
                             [strides[d] for d in rest], "row")
        else:
            dec = "    (void)row;"
        return prelude("cpu") + fill(_CPU_KERNEL, OMP_MIN=OMP_MIN_WORK, ACC=acc, ARGS=args, BODY=body, FILL=entry_fill("cpu"),
                                     ROWS=total // max(1, sizes[inner_d]), INNER=sizes[inner_d],
                                     CHUNK=p["chunk"], DECOMP=dec, IN=names[inner_d], CALL=call)
    dec, _ = _decomp(names, sizes, strides, "t", indent="      ")
    return prelude("cuda") + fill(_CUDA_KERNEL, ACC=acc, ARGS=args, BODY=body, FILL=entry_fill("cuda"),
                                  THREADS=p["threads"], EPT=p["ept"], TOTAL=total, DECOMP=dec, CALL=call)


def render_pool(task, p: dict) -> str:
    pi = pool_info(task)
    names, sizes, strides = _pool_layout(pi)
    acc = "double" if pi.x.dtype == "float64" else "float"
    return _render(task.backend, names, sizes, strides, _pool_one(pi, task.backend), acc, p)


def render_gather(task, p: dict) -> str:
    gi = gather_info(task)
    names, sizes, strides = _gather_layout(gi)
    return _render(task.backend, names, sizes, strides, _gather_one(gi, task.backend), "float", p)


_CPU_SPACE = {"chunk": (1, 4, 16, 64, 256)}
_CUDA_SPACE = {"threads": (64, 128, 256, 512), "ept": (1, 2, 4)}


def _cpu_default(rows: int) -> dict:
    c = 1
    for v in _CPU_SPACE["chunk"]:
        if rows >= v * 64:
            c = v
    return {"chunk": c}


def _pool_extent(task):
    pi = pool_info(task)
    return (math.prod(pi.lead) if pi.lead else 1, math.prod(pi.osp))


def _gather_extent(task):
    gi = gather_info(task)
    s = gi.out.shape
    return (math.prod(s[:-1]) if len(s) > 1 else 1, s[-1] if s else 1)


def _pool_designs(task) -> list:
    pi = pool_info(task)
    if pi is None:
        return []
    total = math.prod(s for _, s in pi.coords())
    if task.backend == "cpu":
        d = compute_design("gen_pool_omp", "cpu", _CPU_SPACE, "pool",
                      lambda t: _cpu_default(max(1, total // max(1, pi.osp[2]))),
                      lambda t, p: pool_info(t) is not None, render_pool, _pool_extent,
                      "pooling window per output element, OpenMP over output rows")
    else:
        d = compute_design("gen_pool_cuda", "cuda", _CUDA_SPACE, "pool",
                      lambda t: {"threads": 256, "ept": 1 if total < 1 << 20 else 2},
                      lambda t, p: pool_info(t) is not None, render_pool, _pool_extent,
                      "pooling window per output element, a thread per EPT outputs")
    return [d] if usable(d, task) else []


def _copy_designs(task) -> list:
    ci = copy_info(task)
    if ci is None:
        return []
    s = ci.out.shape
    total = math.prod(s) if s else 1
    if task.backend == "cpu":
        d = compute_design("gen_copy_omp", "cpu", _CPU_SPACE, "copy",
                      lambda t: _cpu_default(max(1, total // max(1, s[-1] if s else 1))),
                      lambda t, p: copy_info(t) is not None, render_copy, _copy_extent,
                      "flip / cat / iota element by element, OpenMP over output rows")
    else:
        d = compute_design("gen_copy_cuda", "cuda", _CUDA_SPACE, "copy",
                      lambda t: {"threads": 256, "ept": 1 if total < 1 << 20 else 4},
                      lambda t, p: copy_info(t) is not None, render_copy, _copy_extent,
                      "flip / cat / iota, a thread per EPT output elements")
    return [d] if usable(d, task) else []


def _copy_extent(task):
    s = copy_info(task).out.shape
    return (math.prod(s[:-1]) if len(s) > 1 else 1, s[-1] if s else 1)


def _scan_extent(task):
    si = scan_info(task)
    n = si.x.shape[si.dim] if si.x.ndim else 1
    return (max(1, si.x.numel // max(1, n)), n)


def _scan_designs(task) -> list:
    si = scan_info(task)
    if si is None:
        return []
    lines, n = _scan_extent(task)
    if task.backend == "cuda" and {si.x.dtype, si.out.dtype} & {"float16", "bfloat16"}:
        # ATen's CUDA scan accumulates 16-bit floats in their own type (CUB over bf16/f16): over
        # a long line its result random-walks away from the exact sum by more than the dtype's
        # tolerance, and no other summation order can reproduce it (seen on the H200: cumsum of
        # 300 bf16 values off by 1.25 at 35). An honest kernel would fail verification there.
        if n > 8:
            return []
    if task.backend == "cpu":
        d = compute_design("gen_scan_omp", "cpu", _CPU_SPACE, "scan",
                      lambda t: _cpu_default(lines), lambda t, p: scan_info(t) is not None,
                      render_scan, _scan_extent, "sequential scan per line, OpenMP over lines")
    else:
        d = compute_design("gen_scan_cuda", "cuda", {"warps": (1, 2, 4, 8)}, "scan",
                      lambda t: {"warps": 4}, lambda t, p: scan_info(t) is not None,
                      render_scan, _scan_extent, "a warp per line: shfl_up scans chained by a carry")
    return [d] if usable(d, task) else []


def _gather_designs(task) -> list:
    gi = gather_info(task)
    if gi is None:
        return []
    total = math.prod(gi.out.shape)
    if task.backend == "cpu":
        d = compute_design("gen_gather_omp", "cpu", _CPU_SPACE, "gather",
                      lambda t: _cpu_default(max(1, total // max(1, gi.out.shape[-1] if gi.out.shape else 1))),
                      lambda t, p: gather_info(t) is not None, render_gather, _gather_extent,
                      "indexed copy, OpenMP over output rows")
    else:
        d = compute_design("gen_gather_cuda", "cuda", _CUDA_SPACE, "gather",
                      lambda t: {"threads": 256, "ept": 1 if total < 1 << 20 else 4},
                      lambda t, p: gather_info(t) is not None, render_gather, _gather_extent,
                      "indexed copy, a thread per EPT output elements")
    return [d] if usable(d, task) else []


def generate(task) -> list:
    """Every generated pooling / gather design for this task ([] when none fits; never raises)."""
    try:
        if task.kind != "compute" or task.backend not in ("cpu", "cuda"):
            return []
        R = analyze(task)
        if R is None:
            return []
        if R.target in _GATHER:
            return _gather_designs(task)
        if R.target in _COPY:
            return _copy_designs(task)
        if R.target in _SCAN:
            return _scan_designs(task)
        return _pool_designs(task)
    except Exception:
        return []

