"""regions/closeness.py: the chunked comparison the judge and the pattern check share.

Chunks are forced small (a few elements) so that every test runs several of them: a mismatch
must be found whichever chunk holds it, and pieces of two tensors must pair the same elements."""
from __future__ import annotations

import pytest
import torch

from kforge_tui.regions.closeness import all_close, all_match, finite_abs_max, flat_chunks

NAN, INF = float("nan"), float("inf")
# (rtol, atol) of the judge's table (regions/closeness.py TOLERANCES)
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 8e-3)}
BOTH = pytest.mark.parametrize("close", [all_close, all_match], ids=["all_close", "all_match"])


# ------------------------------------------------------------------------ flat_chunks

@pytest.mark.parametrize("shape,chunk", [((100,), 7), ((9, 11), 25), ((3, 4, 5), 7), ((2, 3, 50), 16),
                                         ((4, 6), 1000), ((), 3), ((0,), 3)])
def test_flat_chunks_cover_the_row_major_flattening_in_bounded_pieces(shape, chunk):
    t = torch.arange(max(1, torch.Size(shape).numel()), dtype=torch.float32)[:torch.Size(shape).numel()]
    t = t.reshape(shape)
    pieces = list(flat_chunks(t, chunk))
    assert all(p.numel() <= max(chunk, 1) or t.numel() <= chunk for _, p in pieces)
    flat = torch.cat([p for _, p in pieces]) if pieces else torch.empty(0)
    assert torch.equal(flat, t.reshape(-1))
    offsets = [a for a, _ in pieces]
    assert offsets == [sum(p.numel() for _, p in pieces[:i]) for i in range(len(pieces))]
    if t.numel() > chunk:
        assert len(pieces) > 1


def test_flat_chunks_of_a_non_contiguous_tensor_pair_with_its_contiguous_copy():
    t = torch.randn(40, 30).t()  # [30, 40], column-major strides
    assert not t.is_contiguous()
    c = t.contiguous()
    pairs = list(zip(flat_chunks(t, 50), flat_chunks(c, 50)))
    assert len(pairs) > 1
    for (a, p), (b, q) in pairs:
        assert a == b and p.numel() <= 50 and torch.equal(p, q)


# ------------------------------------------------------------------------ chunk boundaries

@BOTH
@pytest.mark.parametrize("shape,chunk,where", [
    ((100,), 7, 0), ((100,), 7, 52), ((100,), 7, 99),  # first, a middle, the last partial chunk
    ((9, 11), 25, 50), ((9, 11), 25, 98),  # 2 rows a piece: a middle piece, the last (one row)
    ((3, 4, 5), 7, 33), ((3, 4, 5), 7, 59),  # rows longer than a chunk: split within the row
])
def test_a_single_mismatch_is_found_in_whichever_chunk_holds_it(close, shape, chunk, where):
    e = torch.randn(shape)
    assert close(e, e.clone(), 1e-4, 1e-5, chunk)
    g = e.clone()
    g.view(-1)[where] += 1.0
    assert len(list(flat_chunks(e, chunk))) > 2
    assert not close(e, g, 1e-4, 1e-5, chunk)
    assert not close(e, g, 1e-4, 1e-5)  # the default chunk (one piece) agrees


@BOTH
def test_chunked_and_whole_comparisons_agree(close):
    gen = torch.Generator().manual_seed(0)
    e = torch.randn(13, 17, generator=gen)
    for scale in (1e-6, 1e-4, 1e-3):
        g = e + scale * torch.randn(13, 17, generator=gen)
        assert close(e, g, 1e-4, 1e-5, 5) == close(e, g, 1e-4, 1e-5, 1 << 24)
    g = e.clone()
    g[12, 16] *= 1.01  # just past rtol, last element
    assert not close(e, g, 1e-4, 0.0, 5)
    g[12, 16] = e[12, 16] * (1 + 5e-5)  # within rtol
    assert close(e, g, 1e-4, 0.0, 5)


# ------------------------------------------------------------------------ NaN and infinities

def test_nan_in_the_same_place_matches_only_in_all_match():
    e = torch.randn(50)
    e[30] = NAN
    # all_close is a fast path that never says "close" about a NaN: the caller's full analysis does
    assert not all_close(e, e.clone(), 1e-4, 1e-5, 7)
    assert all_match(e, e.clone(), 1e-4, 1e-5, 7)


@BOTH
@pytest.mark.parametrize("side", ["got", "expected"])
def test_nan_on_one_side_only_is_a_mismatch(close, side):
    e = torch.randn(50)
    g = e.clone()
    (g if side == "got" else e)[44] = NAN
    assert not close(e, g, 1e-4, 1e-5, 7)


def test_infinities():
    e = torch.randn(50)
    e[8], e[45] = INF, -INF
    same = e.clone()
    assert all_match(e, same, 1e-4, 1e-5, 7)  # the same infinity matches
    assert not all_close(e, same, 1e-4, 1e-5, 7)  # the fast path defers any infinity
    g = e.clone()
    g[20] = INF  # infinite where the reference is finite
    assert not all_match(e, g, 1e-4, 1e-5, 7) and not all_close(e, g, 1e-4, 1e-5, 7)
    g = e.clone()
    g[8] = NAN  # NaN where the reference is infinite
    assert not all_match(e, g, 1e-4, 1e-5, 7)
    # a finite value, or the other infinity, where the reference is infinite: no match (an
    # unbounded rtol x |inf| let any value stand for an infinity)
    for v in (1.0, -INF, 3.4e38):
        g = e.clone()
        g[8] = v
        assert not all_match(e, g, 1e-4, 1e-5, 7) and not all_close(e, g, 1e-4, 1e-5, 7), v


# ------------------------------------------------------------------------ layouts and shapes

@BOTH
def test_non_contiguous_inputs_pair_logical_elements(close):
    e = torch.randn(30, 40)
    g = e.t().contiguous().t()  # same values, column-major
    assert not g.is_contiguous()
    assert close(e, g, 1e-4, 1e-5, 64) and close(g, e, 1e-4, 1e-5, 64)
    g[29, 3] += 1.0
    assert not close(e, g, 1e-4, 1e-5, 64)
    assert not close(e, e.t().contiguous(), 1e-4, 1e-5, 64)  # transposed values: not the same output


@BOTH
def test_shapes_and_element_counts(close):
    e = torch.randn(6, 5)
    assert close(e, e.reshape(30), 1e-4, 1e-5, 4)  # same elements row-major, another shape
    assert not close(e, e.t().reshape(30), 1e-4, 1e-5, 4)
    assert not close(e, e.reshape(30)[:29], 1e-4, 1e-5, 4)  # element counts differ
    assert close(torch.empty(0), torch.empty(0), 1e-4, 1e-5, 4)


# ------------------------------------------------------------------------ dtypes

@BOTH
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_16_and_32_bit_dtypes_at_their_tolerances(close, dtype):
    rtol, atol = TOL[dtype]
    e = (1.0 + torch.rand(200, generator=torch.Generator().manual_seed(1))).to(dtype)  # in [1, 2)
    assert close(e, e.clone(), rtol, atol, 16)
    ok = (e.double() * (1 + 0.4 * rtol)).to(dtype)  # within rtol (about one ulp for 16-bit types)
    assert close(e, ok, rtol, 0.0, 16)
    bad = e.clone()
    bad[150] = (e[150].double() * (1 + 4 * rtol)).to(dtype)
    assert not close(e, bad, rtol, 0.0, 16)
    assert close(e, bad, rtol, 1.0, 16)  # the absolute term covers it


def test_all_close_compares_16_bit_outputs_in_float32():
    # |got - expected| is 2^-10 (one f16 ulp at 1) and rtol x |expected| just below it: rounded to
    # float16, rtol x |expected| would become 2^-10 and the element would pass
    e = torch.tensor([1.0, 1.5], dtype=torch.float16)
    g = torch.tensor([1.0 + 2**-10, 1.5], dtype=torch.float16)
    assert not all_close(e, g, 9.7655e-4, 0.0, 1)
    assert not all_match(e, g, 9.7655e-4, 0.0, 1)
    assert all_close(e, g, 9.77e-4, 0.0, 1) and all_match(e, g, 9.77e-4, 0.0, 1)
    assert all_close(e, g.float(), 9.77e-4, 0.0, 1)  # got of another dtype is cast
    assert not all_close(e, g.float(), 9.7655e-4, 0.0, 1)


# ------------------------------------------------------------------------ finite_abs_max

def test_finite_abs_max_ignores_nan_and_infinities_across_chunks():
    t = torch.randn(5, 9)
    t[0, 0], t[2, 2], t[4, 8] = NAN, INF, -INF
    t[3, 7] = -50.0
    assert finite_abs_max(t, 4) == 50.0
    assert finite_abs_max(t.t(), 4) == 50.0
    assert finite_abs_max(torch.tensor([NAN, INF]), 1) is None
    assert finite_abs_max(torch.empty(0), 4) is None
    assert finite_abs_max(torch.zeros(3), 1) == 0.0
