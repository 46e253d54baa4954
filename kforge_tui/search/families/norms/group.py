"""group_norm over many blocks per group: two_phase (partials through scratch, two launches) and
cluster_group (a thread-block cluster per group, one launch)."""
from __future__ import annotations

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import ELEM_BYTES, MAX_KEEP_KB, cdiv, cuda_head, entry, fill
from kforge_tui.regions.patterns import OpTask
from kforge_tui.search.families.norms.common import CUDA_NORM, rows_n, unit, vec16


# --- group_norm two_phase
_CUDA_GN2 = r"""
// Phase 1: block (s, ng) reduces split s of group ng to shifted (sum, sumsq); the shift is the
// group's first element, the same for every split so partials add up exactly.
template <int THREADS, int VEC>
__global__ void __launch_bounds__(THREADS) kf_gn_stats(const TI* __restrict__ x, float* __restrict__ part,
                                                      int64_t ge, int64_t chunk) {
  __shared__ float sh[32];
  constexpr int NW = THREADS / 32;
  const int64_t ng = blockIdx.y, lo = (int64_t)blockIdx.x * chunk;
  const int64_t hi = (lo + chunk < ge) ? lo + chunk : ge;
  const TI* xg = x + ng * ge;
  const float K = kf_f(xg[0]);
  float s = 0.f, q = 0.f;
  for (int64_t base = lo + (int64_t)threadIdx.x * VEC; base < hi; base += (int64_t)THREADS * VEC) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xg + base);
#pragma unroll
    for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
  }
  s = kf_block_sum<NW>(s, sh);
  q = kf_block_sum<NW>(q, sh);
  if (threadIdx.x == 0) {
    part[(ng * gridDim.x + blockIdx.x) * 2] = s;
    part[(ng * gridDim.x + blockIdx.x) * 2 + 1] = q;
  }
}

// Phase 2: block (s, ng) combines the group's partials (in double: they are few) and
// normalises split s with the per-channel affine folded into one multiply-add.
template <int THREADS, int VEC, bool REVERSE>
__global__ void __launch_bounds__(THREADS) kf_gn_apply(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, const float* __restrict__ part, int64_t ge, int64_t chunk,
    int64_t hw, int64_t cg, int64_t G, int splits, float eps) {
  __shared__ float stat[2];
  const int64_t nblk = (int64_t)gridDim.x * gridDim.y;
  int64_t lin = (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
  if (REVERSE) lin = nblk - 1 - lin;
  const int64_t ng = lin / gridDim.x, sidx = lin - ng * gridDim.x;
  const TI* xg = x + ng * ge;
  if (threadIdx.x < 32) {
    double s = 0.0, q = 0.0;
    for (int k = threadIdx.x; k < splits; k += 32) { s += part[(ng * splits + k) * 2]; q += part[(ng * splits + k) * 2 + 1]; }
    for (int o = 16; o > 0; o >>= 1) { s += __shfl_xor_sync(0xffffffffu, s, o); q += __shfl_xor_sync(0xffffffffu, q, o); }
    if (threadIdx.x == 0) {
      const double ms = s / (double)ge, var = q / (double)ge - ms * ms;
      stat[0] = (float)((double)kf_f(xg[0]) + ms);
      stat[1] = rsqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    }
  }
  __syncthreads();
  const float mean = stat[0], rstd = stat[1];
  const int64_t lo = sidx * chunk, hi = (lo + chunk < ge) ? lo + chunk : ge;
  const int64_t cbase = (ng % G) * cg;
  TO* yg = y + ng * ge;
  for (int64_t base = lo + (int64_t)threadIdx.x * VEC; base < hi; base += (int64_t)THREADS * VEC) {
    const int64_t c = cbase + base / hw;
    const float a = rstd * (w ? kf_f(w[c]) : 1.f);
    const float bb = (b ? kf_f(b[c]) : 0.f) - mean * a;
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xg + base);
    kf_pack<TO, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(kf_f(p.v[j]) * a + bb);
    kf_store<TO, VEC>(yg + base, o);
  }
}
"""

_CUDA_GN2_LAUNCH = r"""
  if (N <= 0 || C <= 0 || HxW <= 0) return 0;
  if (G <= 0 || C % G) return -1;
  const int64_t groups = N * G, ge = C / G * HxW;
  if (groups > 65535) {  // more groups than gridDim.y takes: one block per group
    kf_norm<@THREADS@, @THREADS@, 1, 0, 2, false, false, false, false><<<(unsigned)(groups < 2147483647 ? groups : 2147483647), @THREADS@, 0, stream>>>(
        x, weight, bias, y, groups, ge, eps, 0.f, HxW, C / G, G, 1.f / (float)ge);
    return (int)cudaGetLastError();
  }
  const int S = @SPLITS@;
  float* part = nullptr;
  cudaError_t err = cudaMallocAsync((void**)&part, (size_t)(groups * S * 2) * sizeof(float), stream);
  if (err != cudaSuccess) return (int)err;
  const dim3 grid((unsigned)S, (unsigned)groups);
  const bool fast = (HxW % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO));
  if (fast) {
    const int64_t chunk = ((ge + S - 1) / S + @VEC@ - 1) / @VEC@ * @VEC@;
    kf_gn_stats<@THREADS@, @VEC@><<<grid, @THREADS@, 0, stream>>>(x, part, ge, chunk);
    kf_gn_apply<@THREADS@, @VEC@, @REVERSE@><<<grid, @THREADS@, 0, stream>>>(x, weight, bias, y, part, ge, chunk, HxW, C / G, G, S, eps);
  } else {
    const int64_t chunk = (ge + S - 1) / S;
    kf_gn_stats<@THREADS@, 1><<<grid, @THREADS@, 0, stream>>>(x, part, ge, chunk);
    kf_gn_apply<@THREADS@, 1, @REVERSE@><<<grid, @THREADS@, 0, stream>>>(x, weight, bias, y, part, ge, chunk, HxW, C / G, G, S, eps);
  }
  cudaFreeAsync(part, stream);
  return (int)cudaGetLastError();
"""


def _gn2_default(task: OpTask) -> dict:
    groups, ge = rows_n(task)
    vec = vec16(task)
    splits = 1
    for s in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if groups * s <= 8 * 132 and ge // s >= 4096:
            splits = s
    return {"threads": 512 if ge // splits >= 512 * vec * 2 else 256, "vec": vec, "splits": splits,
            "reverse": 1}


def _gn2_valid(task: OpTask, p: dict) -> bool:
    groups, ge = rows_n(task)
    return (groups <= 65535 and unit(task) % p["vec"] == 0 and p["vec"] * ELEM_BYTES[task.dtype] <= 32
            and ge // p["splits"] >= p["threads"])


def _gn2_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_GN2_LAUNCH, SPLITS=p["splits"], VEC=p["vec"], THREADS=p["threads"],
                REVERSE="true" if p["reverse"] else "false")
    return cuda_head(task) + CUDA_NORM + _CUDA_GN2 + entry(task, "cuda", body)


register(Family("two_phase", ("group_norm",), "cuda",
                {"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8, 16),
                 "splits": (1, 2, 4, 8, 16, 32, 64, 128, 256), "reverse": (0, 1)},
                _gn2_default, _gn2_valid, _gn2_render,
                doc="partial sums over many blocks per group, then combine-and-apply"))


# --- group_norm cluster: one thread-block cluster per group (sm_90), no scratch, one launch
_CUDA_GNC = r"""
#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// (sum, sumsq) of the whole block in one shared-memory round: half the barriers of two sums.
template <int NW> __device__ __forceinline__ float2 kf_block_sum2(float s, float q, float2* sh) {
  s = kf_warp_sum(s, 32);
  q = kf_warp_sum(q, 32);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_float2(s, q);
  __syncthreads();
  if constexpr ((NW & (NW - 1)) == 0) {  // as kf_block_sum: log2(NW) shuffles reach every lane
    const float2 r = sh[threadIdx.x & (NW - 1)];
    return make_float2(kf_warp_sum(r.x, NW), kf_warp_sum(r.y, NW));
  }
  float2 r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : make_float2(0.f, 0.f);
  r.x = kf_warp_sum(r.x, 32);
  r.y = kf_warp_sum(r.y, 32);
  return r;
}

// Cluster rank r of group ng reduces its chunk to shifted (sum, sumsq) (shift = the group's first
// element, the same in every CTA, so partials add exactly), the cluster combines the partials
// through distributed shared memory, and each CTA normalises its own chunk. The first KEEPK
// sweeps of the chunk are kept in dynamic shared memory as they are read (each thread keeps the
// packs it will write, so no barrier is needed between keep and use); the rest is re-read,
// L2-resident for chunks of a few hundred KB, so DRAM sees most of x once.
template <int THREADS, int VEC, int UNROLL, int KEEPK>
__global__ void __launch_bounds__(THREADS) kf_gn_cluster(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, int64_t ge, int64_t chunk, int64_t hw, int64_t cg, int64_t G,
    float eps) {
  constexpr int NW = THREADS / 32;
  __shared__ float2 sh[32];
  __shared__ float2 part;
  __shared__ float stat[2];
  extern __shared__ __align__(16) unsigned char kf_keep_raw[];
  kf_pack<TI, VEC>* keep = reinterpret_cast<kf_pack<TI, VEC>*>(kf_keep_raw);
  kf_cg::cluster_group cl = kf_cg::this_cluster();
  const int csize = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int64_t ng = blockIdx.x / csize;
  const int64_t lo = (int64_t)rank * chunk, hi = (lo + chunk < ge) ? lo + chunk : ge;
  const TI* xg = x + ng * ge;
  const float K = kf_f(xg[0]);
  float s = 0.f, q = 0.f;
  constexpr int64_t STEP = (int64_t)THREADS * VEC;
  int64_t base = lo + (int64_t)threadIdx.x * VEC;
  int k = 0;  // sweep index of `base` within the chunk
  for (; base + (UNROLL - 1) * STEP < hi; base += UNROLL * STEP, k += UNROLL) {
    kf_pack<TI, VEC> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) p[u] = kf_load<TI, VEC>(xg + base + u * STEP);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (k + u < KEEPK) keep[(k + u) * THREADS + threadIdx.x] = p[u];
#pragma unroll
      for (int j = 0; j < VEC; ++j) { const float d = kf_f(p[u].v[j]) - K; s += d; q += d * d; }
    }
  }
  for (; base < hi; base += STEP, ++k) {
    kf_pack<TI, VEC> p = kf_load<TI, VEC>(xg + base);
    if (k < KEEPK) keep[k * THREADS + threadIdx.x] = p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
  }
  const float2 t = kf_block_sum2<NW>(s, q, sh);
  if (threadIdx.x == 0) part = t;
  cl.sync();  // every CTA's partial is visible cluster-wide
  if (threadIdx.x < 32) {
    double ds = 0.0, dq = 0.0;
    if ((int)threadIdx.x < csize) {
      const float2 o = *cl.map_shared_rank(&part, (unsigned)threadIdx.x);
      ds = o.x;
      dq = o.y;
    }
    for (int o = 16; o > 0; o >>= 1) { ds += __shfl_xor_sync(0xffffffffu, ds, o); dq += __shfl_xor_sync(0xffffffffu, dq, o); }
    if (threadIdx.x == 0) {
      const double ms = ds / (double)ge, var = dq / (double)ge - ms * ms;
      stat[0] = (float)((double)K + ms);
      stat[1] = rsqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    }
  }
  cl.sync();  // no CTA leaves (freeing its shared memory) while a peer may still read it
  const float mean = stat[0], rstd = stat[1];
  const int64_t cbase = (ng % G) * cg;
  TO* yg = y + ng * ge;
  // Backwards: what this CTA read last is the part most likely still in L2, and the kept
  // sweeps (the first ones) come last, when the re-read ones have been issued.
  int kk = (int)((hi - 1 - lo) / STEP);
  for (int64_t row0 = lo + (int64_t)kk * STEP; row0 >= lo; row0 -= STEP, --kk) {
    const int64_t bs = row0 + (int64_t)threadIdx.x * VEC;
    if (bs >= hi) continue;
    const int64_t c = cbase + bs / hw;
    const float a = rstd * (w ? kf_f(w[c]) : 1.f);
    const float bb = (b ? kf_f(b[c]) : 0.f) - mean * a;
    const kf_pack<TI, VEC> p = kk < KEEPK ? keep[kk * THREADS + threadIdx.x] : kf_load<TI, VEC>(xg + bs);
    kf_pack<TO, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(kf_f(p.v[j]) * a + bb);
    kf_store<TO, VEC>(yg + bs, o);
  }
}

template <int THREADS, int VEC, int UNROLL, int KEEPK>
inline int kf_gn_cluster_launch(const TI* x, const TI* w, const TI* b, TO* y, int64_t groups, int64_t ge,
                                int64_t chunk, int64_t hw, int64_t cg, int64_t G, float eps, int cl,
                                cudaStream_t stream) {
  const size_t smem = (size_t)KEEPK * THREADS * sizeof(kf_pack<TI, VEC>);
  return kf_launch_cluster(kf_gn_cluster<THREADS, VEC, UNROLL, KEEPK>, groups * cl, THREADS, cl, smem, stream,
                           x, w, b, y, ge, chunk, hw, cg, G, eps);
}
"""

_CUDA_GNC_LAUNCH = r"""
  if (N <= 0 || C <= 0 || HxW <= 0) return 0;
  if (G <= 0 || C % G) return -1;
  const int64_t groups = N * G, ge = C / G * HxW, CL = @CLUSTER@;
  if (groups * CL > 2147483647) {  // more CTAs than one launch takes: one block per group
    kf_norm<512, 512, 1, 0, 2, false, false, false, false><<<(unsigned)(groups < 2147483647 ? groups : 2147483647), 512, 0, stream>>>(
        x, weight, bias, y, groups, ge, eps, 0.f, HxW, C / G, G, 1.f / (float)ge);
    return (int)cudaGetLastError();
  }
  int rc;
  if ((HxW % @VEC@ == 0) && kf_aligned(x, @VEC@ * sizeof(TI)) && kf_aligned(y, @VEC@ * sizeof(TO))) {
    const int64_t chunk = ((ge + CL - 1) / CL + @VEC@ - 1) / @VEC@ * @VEC@;
    rc = kf_gn_cluster_launch<@THREADS@, @VEC@, @UNROLL@, @KEEPK@>(x, weight, bias, y, groups, ge, chunk, HxW, C / G, G, eps, (int)CL, stream);
  } else {
    const int64_t chunk = (ge + CL - 1) / CL;
    rc = kf_gn_cluster_launch<@THREADS@, 1, 1, 0>(x, weight, bias, y, groups, ge, chunk, HxW, C / G, G, eps, (int)CL, stream);
  }
  return rc ? rc : (int)cudaGetLastError();
"""



def _gnc_chunk(task: OpTask, p: dict) -> int:
    _, ge = rows_n(task)
    return cdiv(cdiv(ge, p["cluster"]), p["vec"]) * p["vec"]


def _gnc_keepk(task: OpTask, p: dict) -> int:
    """Sweeps (THREADS x VEC elements each) of a CTA's chunk kept in shared memory."""
    sweep = p["threads"] * p["vec"]
    return min(p["keep"] * 1024 // (sweep * ELEM_BYTES[task.dtype]), cdiv(_gnc_chunk(task, p), sweep))


def _gnc_default(task: OpTask) -> dict:
    """Enough CTAs for >= one per SM (132 on an H100/H200) with the group split evenly; the whole
    chunk kept on chip when two CTAs of it still fit on an SM (DRAM then reads x exactly once)."""
    groups, ge = rows_n(task)
    vec = vec16(task)
    cl = 1
    for c in (2, 4, 8):
        if groups * cl < 132 and ge // c >= 1024 * vec:
            cl = c
    cl = max(cl, 2)
    threads = 1024 if ge // cl >= 1024 * vec * 8 else 512
    if groups * ge * ELEM_BYTES[task.dtype] <= 40 * 2**20 and cl * threads > 4096:
        # H200, measured (bench/probe_clusters.py): clusters of more than 4096 threads do not all fit
        # at once (8 x 1024: 30 resident for 32 groups), so a small tensor would run in two waves
        threads = 4096 // cl
    p = {"cluster": cl, "threads": threads, "vec": vec, "unroll": 2, "keep": 0}
    need_kb = cdiv(_gnc_chunk(task, p) * ELEM_BYTES[task.dtype], 1024)
    for kb in _GNC_SPACE["keep"]:
        if need_kb <= kb <= 112:
            p["keep"] = kb
            break
    return p


def _gnc_valid(task: OpTask, p: dict) -> bool:
    groups, ge = rows_n(task)
    return (unit(task) % p["vec"] == 0 and p["vec"] * ELEM_BYTES[task.dtype] <= 16
            and ge // p["cluster"] >= p["threads"] * p["vec"] and groups * p["cluster"] < 2**31
            and p["keep"] <= MAX_KEEP_KB
            # a keep larger than the chunk is the same kernel as the smallest one that holds it
            and (p["keep"] == 0 or _gnc_keepk(task, {**p, "keep": _GNC_SPACE["keep"][
                _GNC_SPACE["keep"].index(p["keep"]) - 1]}) < _gnc_keepk(task, p)))


def _gnc_render(task: OpTask, p: dict) -> str:
    body = fill(_CUDA_GNC_LAUNCH, CLUSTER=p["cluster"], VEC=p["vec"], THREADS=p["threads"], UNROLL=p["unroll"],
                KEEPK=_gnc_keepk(task, p))
    return cuda_head(task) + CUDA_NORM + _CUDA_GNC + entry(task, "cuda", body)


_GNC_SPACE = {"cluster": (2, 4, 8, 16), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8),
              "unroll": (1, 2, 4), "keep": (0, 32, 64, 96, 128, 160, 192, 224)}
register(Family("cluster_group", ("group_norm",), "cuda", _GNC_SPACE, _gnc_default, _gnc_valid, _gnc_render,
                doc="sm_90 thread-block cluster per group: DSMEM stats exchange, one launch, no scratch, "
                    "`keep` KB of each CTA's chunk held in shared memory instead of re-read"))
