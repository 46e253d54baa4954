// The removed cluster_ring family (bench/NOTES.md round 4), rendered for group_norm [1,512,128,128]
// f32 at its default point. The shared helpers that preceded it (kf_pack, kf_load/kf_store, kf_warp_sum,
// kf_block_sum, kf_launch_cluster, kf_block_sum2, ...) were those of kforge_tui/search/families/_common.py
// and norms.py at commit fe23645; they are left out here.

// 16-byte global -> shared copies that do not pass through registers (cp.async.cg, sm_80+), so a
// thread can have a whole group's chunk in flight; other pack sizes copy through registers.
template <typename T, int V> __device__ __forceinline__ void kf_cp_async(kf_pack<T, V>* dst, const T* src) {
  if constexpr (sizeof(kf_pack<T, V>) == 16) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  } else {
    *dst = kf_load<T, V>(src);
  }
}
__device__ __forceinline__ void kf_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void kf_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Cluster `cid` normalises groups cid, cid + ncl, ... (`per` of them). Each CTA owns the same
// chunk (rank * chunk ..) of every group and keeps it in a ring of NBUF shared-memory slots: the
// chunks of the next NBUF - 1 groups are in flight (cp.async) while this group's statistics are
// combined through DSMEM and its output written, so DRAM reads of one group overlap the writes
// of another instead of every group reading, then writing, in lock-step. x is read once. A thread
// reads back only the packs it copied, so the ring needs no block barrier.
template <int THREADS, int VEC, int NBUF>
__global__ void __launch_bounds__(THREADS, 1) kf_gn_ring(const TI* __restrict__ x, const TI* __restrict__ w,
    const TI* __restrict__ b, TO* __restrict__ y, int64_t groups, int64_t ge, int64_t chunk, int sweeps, int per,
    int64_t hw, int64_t cg, int64_t G, float eps) {
  constexpr int NW = THREADS / 32;
  constexpr int64_t STEP = (int64_t)THREADS * VEC;
  __shared__ float2 sh[32];
  __shared__ float2 part[2];     // by group parity: a peer may still read the previous one
  __shared__ float stat[2][2];
  extern __shared__ __align__(16) unsigned char kf_ring_raw[];
  kf_pack<TI, VEC>* ring = reinterpret_cast<kf_pack<TI, VEC>*>(kf_ring_raw);
  kf_cg::cluster_group cl = kf_cg::this_cluster();
  const int csize = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int64_t cid = blockIdx.x / csize, ncl = gridDim.x / csize;
  const int64_t lo = (int64_t)rank * chunk, hi = (lo + chunk < ge) ? lo + chunk : ge;
  const int64_t slot = (int64_t)sweeps * THREADS;
  auto issue = [&](int k) {  // group k's chunk into slot k % NBUF; one commit per k, even if empty
    const int64_t g = (int64_t)k * ncl + cid;
    if (k < per && g < groups) {
      const TI* src = x + g * ge;
      kf_pack<TI, VEC>* dst = ring + (k % NBUF) * slot + threadIdx.x;
      for (int s = 0; s < sweeps; ++s) {
        const int64_t e = lo + s * STEP + (int64_t)threadIdx.x * VEC;
        if (e < hi) kf_cp_async<TI, VEC>(dst + s * THREADS, src + e);
      }
    }
    kf_cp_commit();
  };
#pragma unroll
  for (int k = 0; k < NBUF - 1; ++k) issue(k);
  for (int k = 0; k < per; ++k) {
    const int64_t g = (int64_t)k * ncl + cid;  // the same in every CTA of the cluster
    if (g >= groups) break;
    issue(k + NBUF - 1);  // into the slot group k - 1 used: this thread has finished with it
    const TI* xg = x + g * ge;
    const float K = kf_f(xg[0]);  // shift, the same in every CTA so partials add exactly
    kf_cp_wait<NBUF - 1>();       // this thread's copies of group k have landed
    const kf_pack<TI, VEC>* buf = ring + (k % NBUF) * slot + threadIdx.x;
    float s = 0.f, q = 0.f;
    for (int sw = 0; sw < sweeps; ++sw) {
      if (lo + sw * STEP + (int64_t)threadIdx.x * VEC < hi) {
        const kf_pack<TI, VEC> p = buf[sw * THREADS];
#pragma unroll
        for (int j = 0; j < VEC; ++j) { const float d = kf_f(p.v[j]) - K; s += d; q += d * d; }
      }
    }
    const float2 t = kf_block_sum2<NW>(s, q, sh);
    if (threadIdx.x == 0) part[k & 1] = t;
    cl.sync();  // every CTA's partial of group k is visible cluster-wide (and `sh` is free again)
    if (threadIdx.x < 32) {
      double ds = 0.0, dq = 0.0;
      if ((int)threadIdx.x < csize) {
        const float2 o = *cl.map_shared_rank(&part[k & 1], (unsigned)threadIdx.x);
        ds = o.x;
        dq = o.y;
      }
      for (int o = 16; o > 0; o >>= 1) { ds += __shfl_xor_sync(0xffffffffu, ds, o); dq += __shfl_xor_sync(0xffffffffu, dq, o); }
      if (threadIdx.x == 0) {
        const double ms = ds / (double)ge, var = dq / (double)ge - ms * ms;
        stat[k & 1][0] = (float)((double)K + ms);
        stat[k & 1][1] = rsqrtf((float)(var > 0.0 ? var : 0.0) + eps);
      }
    }
    __syncthreads();
    const float mean = stat[k & 1][0], rstd = stat[k & 1][1];
    const int64_t cbase = (g % G) * cg;
    TO* yg = y + g * ge;
    for (int sw = 0; sw < sweeps; ++sw) {
      const int64_t e = lo + sw * STEP + (int64_t)threadIdx.x * VEC;
      if (e < hi) {
        // a group has < 2^31 elements (checked at launch): 32-bit division, not a 64-bit call
        const int64_t c = cbase + (int64_t)((unsigned)e / (unsigned)hw);
        const float a = rstd * (w ? kf_f(w[c]) : 1.f);
        const float bb = (b ? kf_f(b[c]) : 0.f) - mean * a;
        const kf_pack<TI, VEC> p = buf[sw * THREADS];
        kf_pack<TO, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] = kf_to<TO>(kf_f(p.v[j]) * a + bb);
        kf_store<TO, VEC>(yg + e, o);
      }
    }
  }
  cl.sync();  // no CTA leaves (freeing its shared memory) while a peer may still read its partial
}

template <int THREADS, int VEC, int NBUF>
inline int kf_gn_ring_launch(const TI* x, const TI* w, const TI* b, TO* y, int64_t groups, int64_t ge, int cl,
                             int per, int64_t hw, int64_t cg, int64_t G, float eps, cudaStream_t stream) {
  const int64_t chunk = ((ge + cl - 1) / cl + VEC - 1) / VEC * VEC;
  const int64_t sweeps = (chunk + (int64_t)THREADS * VEC - 1) / ((int64_t)THREADS * VEC);
  const size_t smem = (size_t)NBUF * sweeps * THREADS * sizeof(kf_pack<TI, VEC>);
  if (smem > 227 * 1024) return -1;  // the chunk does not fit on chip: not this family's shape
  const int64_t ncl = (groups + per - 1) / per;
  return kf_launch_cluster(kf_gn_ring<THREADS, VEC, NBUF>, ncl * cl, THREADS, cl, smem, stream, x, w, b, y, groups,
                           ge, chunk, (int)sweeps, per, hw, cg, G, eps);
}
extern "C" int kforge_launch(const float* x, const float* weight, const float* bias, float* y, int64_t N, int64_t C, int64_t HxW, int64_t G, float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0 || HxW <= 0) return 0;
  if (G <= 0 || C % G) return -1;
  const int64_t groups = N * G, ge = C / G * HxW;
  if (ge > 2147483647 || groups * 16 > 2147483647) return -1;
  int rc;
  if ((HxW % 4 == 0) && kf_aligned(x, 4 * sizeof(TI)) && kf_aligned(y, 4 * sizeof(TO)))
    rc = kf_gn_ring_launch<1024, 4, 2>(x, weight, bias, y, groups, ge, 16, 4, HxW, C / G, G, eps, stream);
  else
    rc = kf_gn_ring_launch<1024, 1, 2>(x, weight, bias, y, groups, ge, 16, 4, HxW, C / G, G, eps, stream);
  return rc ? rc : (int)cudaGetLastError();
}
