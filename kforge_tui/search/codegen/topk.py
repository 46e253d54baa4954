"""Generated top-k over the last dim (MoE routing's `torch.topk(router_probs, k)`), cpu.

A region that is one `aten.topk` (values, indices or both; any outer strides, the selected dim
the last, contiguous or strided). The kernel is ATen's own CPU algorithm
(ATen/native/TopKImpl.h) written out per row: (value, index) pairs in index order,
`std::partial_sort` when k * 64 <= n, else `std::nth_element` then `std::sort` of the first
k - 1, with NaN ordered above every number. Following it exactly is what makes ties (all-equal
rows, zeros) come out in the order the reference gives them, index for index; the rows run in
parallel under OpenMP.

On a GPU the search starts from Inductor's fallback call (search/seed_rewrite.py: the same
`torch.topk` into the outputs), and PyTorch's CUDA top-k orders ties its own way, so there is
no cuda design here.

Design `gen_topk_omp`: `chunk` rows per OpenMP scheduling unit.
"""
from __future__ import annotations

from kforge_tui.search.csrc import OMP_MIN_WORK
from kforge_tui.search.codegen.compute.base import (
    FLOATS, analyze, compute_design, entry_fill, fill, load, off_expr, prelude, store, usable)

_TOPK = "aten.topk.default"

_CPU = r"""
#include <vector>
#include <algorithm>
#include <utility>
#include <cmath>

typedef std::pair<double, int64_t> kf_elem;

static inline bool kf_before(const kf_elem& x, const kf_elem& y) {
  return @BEFORE@;
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
@ENTRY@
  const int64_t rows = @ROWS@LL, n = @N@LL, k = @K@LL;
  #pragma omp parallel for schedule(static, @CHUNK@) if (rows * n >= @OMP_MIN@)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<kf_elem> q((size_t)n);
    int64_t rem = r;
@UNRAVEL@
    const kf_in@XI@_t* x = @XPTR@ + (@XOFF@);
    for (int64_t j = 0; j < n; ++j) q[(size_t)j] = kf_elem(@LOADX@, j);
    if (k * 64 <= n) {
      std::partial_sort(q.begin(), q.begin() + k, q.end(), kf_before);
    } else {
      std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), kf_before);
@SORT@
    }
    for (int64_t j = 0; j < k; ++j) {
@WRITE@
    }
  }
  return 0;
}
"""


def _info(task):
    R = analyze(task)
    if R is None or R.target != _TOPK:
        return None
    x = R.args.get("self")
    k = R.args.get("k")
    if x is None or not isinstance(k, int) or x.dtype not in FLOATS or x.ndim < 1:
        return None
    dim = R.args.get("dim", -1)
    if not isinstance(dim, int) or dim % x.ndim != x.ndim - 1:
        return None
    n = x.shape[-1]
    if not 1 <= k <= n or n > 1 << 24:
        return None
    largest, is_sorted = R.args.get("largest", True), R.args.get("sorted", True)
    if not isinstance(largest, bool) or not isinstance(is_sorted, bool):
        return None
    for o in R.outs:
        if tuple(o.shape) != tuple(x.shape[:-1]) + (k,):
            return None
    return R, x, k, largest, is_sorted


def _render(task, p) -> str:
    R, x, k, largest, is_sorted = _info(task)
    outer = x.shape[:-1]
    rows = 1
    for s in outer:
        rows *= s
    unravel = []
    for d in range(len(outer) - 1, -1, -1):
        unravel.append(f"    const int64_t i{d} = rem % {outer[d]}LL; rem /= {outer[d]}LL;")
    unravel.append("    (void)rem;")
    xoff = off_expr([(f"i{d}", x.strides[d]) for d in range(len(outer))])
    before = ("(std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first)" if largest else
              "(!std::isnan(x.first) && std::isnan(y.first)) || (x.first < y.first)")
    sort = ("      std::sort(q.begin(), q.begin() + (k - 1), kf_before);" if is_sorted else "")
    write = []
    for o in R.outs:
        ooff = off_expr([(f"i{d}", o.strides[d]) for d in range(len(outer))] +
                        [("j", o.strides[-1])])
        val = "q[(size_t)j].first" if o.item == 0 else "q[(size_t)j].second"
        write.append(f"      ((kf_out{o.index}_t*)P.out[{o.index}])[{ooff}] = "
                     f"{store(o.dtype, 'cpu', val)};")
    return prelude("cpu") + fill(
        _CPU, BEFORE=before, ENTRY=entry_fill("cpu").rstrip("\n"), ROWS=rows, N=x.shape[-1], K=k,
        CHUNK=p["chunk"], OMP_MIN=OMP_MIN_WORK, UNRAVEL="\n".join(unravel), XI=x.index,
        XPTR=x.ptr("cpu"), XOFF=xoff, LOADX=load(x.dtype, "cpu", f"x[j * {x.strides[-1]}LL]", "double"),
        SORT=sort, WRITE="\n".join(write))


def _extent(task):
    _, x, _, _, _ = _info(task)
    rows = 1
    for s in x.shape[:-1]:
        rows *= s
    return rows, x.shape[-1]


def generate(task) -> list:
    """The top-k design of a cpu task that is one top-k over its last dim ([] otherwise)."""
    try:
        if task.kind != "compute" or task.backend != "cpu" or _info(task) is None:
            return []
        d = compute_design("gen_topk_omp", "cpu", {"chunk": (1, 4, 16, 64)}, "topk",
                           lambda t: {"chunk": 4}, lambda t, p: _info(t) is not None, _render,
                           _extent, doc="top-k over the last dim, ATen's CPU algorithm per row")
        return [d] if usable(d, task) else []
    except Exception:
        return []
