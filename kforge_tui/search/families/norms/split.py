"""Few long rows: `kf_norm_split` cuts each row over several CTAs, as a cluster per row
(cluster_row) or as one cooperative grid (coop_row)."""
from __future__ import annotations

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import (CUDA_COOP_SPLIT, ELEM_BYTES, KEEP_KB, MAX_KEEP_KB, cdiv,
                                                cuda_head, entry, fill, keep_for, keep_sweeps)
from kforge_tui.regions.patterns import OpTask
from kforge_tui.search.families.norms.common import KIND, ROW_OPS, CUDA_NORM, rows_n, round2, unit, vec16


# --- split rows: a row (or group) over several CTAs, for few long rows
_CUDA_NSPLIT = r"""
#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// One output pack: the normalised values with the op's affine (KIND as in kf_norm).
template <int KIND, bool ROUND2, int VEC>
__device__ __forceinline__ kf_pack<TO, VEC> kf_norm_pack(const kf_pack<TI, VEC>& xp, int64_t base, float mean,
    float rstd, const TI* __restrict__ w, const TI* __restrict__ b, float woff, int64_t cbase, int64_t hw) {
  float r[VEC];
  if constexpr (KIND == 2) {
    const int64_t c = cbase + base / hw;
    const float a = rstd * (w ? kf_f(w[c]) : 1.f);
    const float bb = (b ? kf_f(b[c]) : 0.f) - mean * a;
#pragma unroll
    for (int j = 0; j < VEC; ++j) r[j] = kf_f(xp.v[j]) * a + bb;
  } else if constexpr (KIND == 0) {
    kf_pack<TI, VEC> pw, pb;
    if (w) pw = kf_load<TI, VEC>(w + base);
    if (b) pb = kf_load<TI, VEC>(b + base);
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      r[j] = fmaf((kf_f(xp.v[j]) - mean) * rstd, w ? kf_f(pw.v[j]) : 1.f, b ? kf_f(pb.v[j]) : 0.f);
  } else {
    kf_pack<TI, VEC> pw;
    if (w) pw = kf_load<TI, VEC>(w + base);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float h = kf_f(xp.v[j]) * rstd;
      if (ROUND2) r[j] = w ? kf_f(pw.v[j]) * kf_f(kf_to<TO>(h)) : h;
      else r[j] = w ? h * (kf_f(pw.v[j]) + woff) : h;
    }
  }
  return kf_to_pack<TO, VEC>(r);
}

// (sum, sumsq) of the whole block in one shared-memory round.
template <int NW> __device__ __forceinline__ float2 kf_split_sum2(float s, float q, float2* sh) {
  s = kf_warp_sum(s, 32);
  q = kf_warp_sum(q, 32);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_float2(s, q);
  __syncthreads();
  float2 r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : make_float2(0.f, 0.f);
  r.x = kf_warp_sum(r.x, 32);
  r.y = kf_warp_sum(r.y, 32);
  return r;
}

// A row (group) split over C CTAs, each owning a chunk of `chunk` elements. Phase 1 reads the
// chunk once, keeping its first KEEPK sweeps in shared memory (each thread the packs it will
// write), and reduces it to shifted (sum, sumsq) (shift = the row's first element, the same in
// every CTA, so partials add exactly). The row's partials are combined in double:
//   COOP = false: the C CTAs are one thread-block cluster (sm_90), through distributed shared
//                 memory; CTA r of cluster q is chunk r of row q.
//   COOP = true:  a cooperative grid (every CTA resident): CTA i is chunk i % C of row i / C,
//                 partials go through the first 8 * gridDim.x bytes of y (scratch that the
//                 write phase overwrites) between two grid-wide barriers.
// Phase 2 normalises the chunk backwards (the last-read part is likeliest in L2; kept sweeps,
// the first ones, come last). One launch, no allocation.
template <int THREADS, int VEC, int UNROLL, int KEEPK, int KIND, bool ROUND2, bool COOP>
__global__ void __launch_bounds__(THREADS) kf_norm_split(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, int64_t n, int64_t C, int64_t chunk, float eps, float woff,
    int64_t hw, int64_t cg, int64_t G) {
  constexpr int NW = THREADS / 32;
  __shared__ float2 sh[32];
  __shared__ float2 part;
  __shared__ float stat[2];
  extern __shared__ __align__(16) unsigned char kf_keep_raw[];
  kf_pack<TI, VEC>* keep = reinterpret_cast<kf_pack<TI, VEC>*>(kf_keep_raw);
  int64_t c;
  if constexpr (COOP) {
    c = blockIdx.x % C;
  } else {
    kf_cg::cluster_group cl = kf_cg::this_cluster();
    C = (int64_t)cl.num_blocks();
    c = (int64_t)cl.block_rank();
  }
  const int64_t row = blockIdx.x / C;
  const int64_t lo = c * chunk, hi = (lo + chunk < n) ? lo + chunk : n;
  const TI* xr = x + row * n;
  const float K = (KIND != 1) ? kf_f(xr[0]) : 0.f;
  float s = 0.f, q = 0.f;
  constexpr int64_t STEP = (int64_t)THREADS * VEC;
  int64_t base = lo + (int64_t)threadIdx.x * VEC;
  int k = 0;  // sweep index of `base` within the chunk
  for (; base + (UNROLL - 1) * STEP < hi; base += UNROLL * STEP, k += UNROLL) {
    kf_pack<TI, VEC> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) p[u] = kf_load<TI, VEC>(xr + base + u * STEP);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (k + u < KEEPK) keep[(k + u) * THREADS + threadIdx.x] = p[u];
#pragma unroll
      for (int j = 0; j < VEC; ++j) { const float d = kf_f(p[u].v[j]) - K; s += d; q += d * d; }
    }
  }
  for (; base < hi; base += STEP, ++k) {
    const kf_pack<TI, VEC> p = kf_load<TI, VEC>(xr + base);
    if (k < KEEPK) keep[k * THREADS + threadIdx.x] = p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
  }
  const float2 t = kf_split_sum2<NW>(s, q, sh);
  double ds = 0.0, dq = 0.0;
  if constexpr (COOP) {
    if (threadIdx.x == 0) reinterpret_cast<float2*>(y)[blockIdx.x] = t;
    kf_cg::this_grid().sync();  // every chunk's partial is in the scratch
    if (threadIdx.x < 32) {
      const float2* sc = reinterpret_cast<const float2*>(y) + row * C;
      for (int64_t i = threadIdx.x; i < C; i += 32) {
        const float2 o = __ldcg(sc + i);  // written by other SMs: read at L2, not from L1
        ds += o.x;
        dq += o.y;
      }
    }
  } else {
    kf_cg::cluster_group cl = kf_cg::this_cluster();
    if (threadIdx.x == 0) part = t;
    cl.sync();  // every CTA's partial is visible cluster-wide
    if ((int64_t)threadIdx.x < C) {
      const float2 o = *cl.map_shared_rank(&part, threadIdx.x);
      ds = o.x;
      dq = o.y;
    }
  }
  if (threadIdx.x < 32) {
    for (int o = 16; o > 0; o >>= 1) { ds += __shfl_xor_sync(0xffffffffu, ds, o); dq += __shfl_xor_sync(0xffffffffu, dq, o); }
    if (threadIdx.x == 0) {
      const double ms = ds / (double)n, var = dq / (double)n - ms * ms;
      stat[0] = (float)((double)K + ms);
      stat[1] = KIND == 1 ? rsqrtf((float)(dq / (double)n) + eps) : rsqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    }
  }
  if constexpr (COOP) kf_cg::this_grid().sync();  // every CTA has read the scratch before any writes over it
  else kf_cg::this_cluster().sync();  // no CTA leaves (freeing its shared memory) while a peer may read it
  __syncthreads();
  const float mean = stat[0], rstd = stat[1];
  const int64_t cbase = (KIND == 2) ? (row % G) * cg : 0;
  TO* yr = y + row * n;
  int kk = (int)((hi - 1 - lo) / STEP);
  for (int64_t r0 = lo + (int64_t)kk * STEP; hi > lo && r0 >= lo; r0 -= STEP, --kk) {
    const int64_t bs = r0 + (int64_t)threadIdx.x * VEC;
    if (bs >= hi) continue;
    const kf_pack<TI, VEC> p = kk < KEEPK ? keep[kk * THREADS + threadIdx.x] : kf_load<TI, VEC>(xr + bs);
    kf_store<TO, VEC>(yr + bs, kf_norm_pack<KIND, ROUND2, VEC>(p, bs, mean, rstd, w, b, woff, cbase, hw));
  }
}
"""

_CUDA_NSPLIT_LAUNCH = r"""
  if (@ROWS@ <= 0 || @N@ <= 0) return 0;
  @CHECK@
  const int64_t kr = @ROWS@, nn = @N@;
  const bool fast = (@UNIT@ % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO)) &&
                    kf_aligned(y, 8) && (@KIND@ == 2 || ((!@W@ || kf_aligned(@W@, @VEC@ * sizeof(TI))) &&
                                                        (!@B@ || kf_aligned(@B@, @VEC@ * sizeof(TI)))));
  const size_t smem = (size_t)@KEEPK@ * @THREADS@ * sizeof(kf_pack<TI, @VEC@>);
  if (fast) {
@SPLIT@
  }
  // misaligned, more rows than the split takes, or no cooperative launch: one block per row
  kf_norm<@THREADS@, @THREADS@, 1, 0, @KIND@, @ROUND2@, false, false, false><<<(unsigned)(kr < 2147483647 ? kr : 2147483647), @THREADS@, 0, stream>>>(
      x, @W@, @B@, y, kr, nn, eps, @WOFF@, @HW@, @CG@, @G@, 1.f / (float)nn);
  return (int)cudaGetLastError();
"""

_COOP_SPLIT = r"""
    auto kern = kf_norm_split<@THREADS@, @VEC@, @UNROLL@, @KEEPK@, @KIND@, @ROUND2@, true>;
    const int64_t cap = kf_coop_capacity(kern, @THREADS@, smem);
    int64_t nch = 0;  // chunks per row (not `C`: group_norm's entry point has a parameter C)
    const int64_t chunk = kf_coop_chunks(kr, nn, cap, (int64_t)@THREADS@ * @VEC@, @VEC@, &nch);
    // the partials' scratch (8 bytes a CTA) must fit in y
    if (chunk > 0 && (double)kr * nch * 8 <= (double)kr * nn * sizeof(TO)) {
      const int rc = kf_launch_coop(kern, kr * nch, @THREADS@, smem, stream, x, @W@, @B@, y, nn, nch, chunk, eps,
                                    @WOFF@, (int64_t)@HW@, (int64_t)@CG@, (int64_t)@G@);
      return rc ? rc : (int)cudaGetLastError();
    }
"""

_CLUSTER_SPLIT = r"""
    const int64_t CL = @CLUSTER@;
    if (kr * CL <= 2147483647) {
      const int64_t chunk = ((nn + CL - 1) / CL + @VEC@ - 1) / @VEC@ * @VEC@;
      const int rc = kf_launch_cluster(kf_norm_split<@THREADS@, @VEC@, @UNROLL@, @KEEPK@, @KIND@, @ROUND2@, false>,
                                       kr * CL, @THREADS@, (int)CL, smem, stream, x, @W@, @B@, y, nn, CL, chunk, eps,
                                       @WOFF@, (int64_t)@HW@, (int64_t)@CG@, (int64_t)@G@);
      return rc ? rc : (int)cudaGetLastError();
    }
"""


def _split_render(task: OpTask, p: dict, coop: bool) -> str:
    op = task.op
    if op == "group_norm":
        names = dict(ROWS="(N * G)", N="(C / G * HxW)", UNIT="HxW", W="weight", B="bias", WOFF="0.f",
                     HW="HxW", CG="(C / G)", G="G", CHECK="if (G <= 0 || C % G) return -1;")
    elif op == "layer_norm":
        names = dict(ROWS="rows", N="n", UNIT="n", W="weight", B="bias", WOFF="0.f", HW="1", CG="1", G="1",
                     CHECK="")
    else:
        names = dict(ROWS="rows", N="n", UNIT="n", W="weight", B="(const TI*)nullptr", WOFF="weight_offset",
                     HW="1", CG="1", G="1", CHECK="")
    split = _COOP_SPLIT if coop else _CLUSTER_SPLIT.replace("@CLUSTER@", str(p["cluster"]))
    body = fill(_CUDA_NSPLIT_LAUNCH.replace("@SPLIT@", split.strip("\n")), THREADS=p["threads"], VEC=p["vec"],
                UNROLL=p["unroll"], KEEPK=keep_sweeps(task.dtype, p), KIND=KIND[op], ROUND2=round2(task),
                **names)
    head = cuda_head(task) + (CUDA_COOP_SPLIT if coop else "")
    return head + CUDA_NORM + _CUDA_NSPLIT + entry(task, "cuda", body)


def _nsplit_valid(task: OpTask, p: dict) -> bool:
    _, n = rows_n(task)
    return (unit(task) % p["vec"] == 0 and p["vec"] * ELEM_BYTES[task.dtype] <= 16 and n >= 2048
            and p["keep"] <= MAX_KEEP_KB and (p["keep"] == 0 or keep_sweeps(task.dtype, p) >= 1))


def _coop_default(task: OpTask) -> dict:
    """512 threads, 4 packs in flight each, up to 96 KB kept per CTA (two CTAs per SM): the whole
    chunk when the tensor fits on chip over 132 SMs x 2 CTAs, else 96 KB of each chunk."""
    rows, n = rows_n(task)
    # unroll 4: on the H200 group_norm [1,512,128,128] f32 28.3 us, [1,512,256,512] bf16 109 us
    p = {"threads": 512, "vec": vec16(task), "unroll": 4, "keep": 0}
    p["keep"] = keep_for(task.dtype, cdiv(rows * n, 264), 96)
    if keep_sweeps(task.dtype, p) < 1:
        p["keep"] = 0
    return p


def _coop_valid(task: OpTask, p: dict) -> bool:
    rows, _ = rows_n(task)
    return rows <= 2048 and _nsplit_valid(task, p)


register(Family("coop_row", ROW_OPS + ("group_norm",), "cuda",
                {"threads": (256, 512, 1024), "vec": (1, 2, 4, 8), "unroll": (1, 2, 4), "keep": KEEP_KB},
                _coop_default, _coop_valid, lambda t, p: _split_render(t, p, True),
                doc="few long rows (groups) over the whole GPU: a cooperative grid, each CTA one chunk "
                    "(`keep` KB of it held in shared memory), partial sums combined between two grid "
                    "barriers through scratch in y; one launch, no allocation"))


def _ncluster_default(task: OpTask) -> dict:
    """Rows x cluster about one CTA per SM (132) for few rows; for many long rows a 16-CTA
    cluster per row whose chunks (up to 96 KB) stay on chip, so x is read from DRAM once."""
    rows, n = rows_n(task)
    vec = vec16(task)
    cl = 2
    for c in (4, 8, 16):
        if (rows * c <= 132 or n * ELEM_BYTES[task.dtype] >= c * 32 * 1024) and n // c >= 1024 * vec:
            cl = c
    p = {"cluster": cl, "threads": 1024 if n // cl >= 1024 * vec * 4 else 512, "vec": vec, "unroll": 2, "keep": 0}
    if rows * cl > 132:  # waves of clusters: DRAM re-reads are what keeping on chip saves
        # 512 x unroll 4: best on the H200 for layer_norm [1024, 131072] f32 and softmax
        # [2048, 262144] f32 (16-CTA clusters of 1024 threads do not all fit at once)
        p.update(threads=512, unroll=4, keep=keep_for(task.dtype, cdiv(n, cl), 96))
        if keep_sweeps(task.dtype, p) < 1 or n // cl < 512 * vec:
            p["keep"] = 0
    return p


def _ncluster_valid(task: OpTask, p: dict) -> bool:
    _, n = rows_n(task)
    return n // p["cluster"] >= p["threads"] * p["vec"] and _nsplit_valid(task, p)


register(Family("cluster_row", ROW_OPS, "cuda",
                {"cluster": (2, 4, 8, 16), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8),
                 "unroll": (1, 2, 4), "keep": KEEP_KB},
                _ncluster_default, _ncluster_valid, lambda t, p: _split_render(t, p, False),
                doc="sm_90 thread-block cluster per long row: DSMEM exchange of partial sums, one launch; "
                    "`keep` KB of each CTA's chunk held in shared memory instead of re-read"))
