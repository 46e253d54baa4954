#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

typedef float TI;
typedef float TO;

__device__ __forceinline__ float kf_f(float v) { return v; }
__device__ __forceinline__ float kf_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float kf_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T kf_to(float v);
template <> __device__ __forceinline__ float kf_to<float>(float v) { return v; }
template <> __device__ __forceinline__ __half kf_to<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 kf_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// V elements of T moved as one aligned access (16 B = one LDG.128 when sizeof(T)*V == 16).
template <typename T, int V> struct alignas(sizeof(T) * V) kf_pack { T v[V]; };
template <typename T, int V> __device__ __forceinline__ kf_pack<T, V> kf_load(const T* p) {
  return *reinterpret_cast<const kf_pack<T, V>*>(p);
}
template <typename T, int V> __device__ __forceinline__ void kf_store(T* p, const kf_pack<T, V>& v) {
  *reinterpret_cast<kf_pack<T, V>*>(p) = v;
}
// Streaming (evict-first, .cs) twins for data touched once: they leave L2 to what is re-read and
// do not push the next call's lines out early. Packs of 4, 8 or 16 bytes; others load plainly.
template <typename T, int V> __device__ __forceinline__ kf_pack<T, V> kf_load_cs(const T* p) {
  constexpr int B = (int)sizeof(T) * V;
  kf_pack<T, V> r;
  if constexpr (B == 16) { const int4 u = __ldcs(reinterpret_cast<const int4*>(p)); memcpy(&r, &u, B); }
  else if constexpr (B == 8) { const int2 u = __ldcs(reinterpret_cast<const int2*>(p)); memcpy(&r, &u, B); }
  else if constexpr (B == 4) { const int u = __ldcs(reinterpret_cast<const int*>(p)); memcpy(&r, &u, B); }
  else r = kf_load<T, V>(p);
  return r;
}
// 16-byte read-only loads that ask L2 to fetch the whole 256-byte block around them (PTX
// .L2::256B, sm_80+): fewer, larger DRAM requests for streams read once. Other sizes load plainly.
template <typename T, int V> __device__ __forceinline__ kf_pack<T, V> kf_load_pf(const T* p) {
  constexpr int B = (int)sizeof(T) * V;
  kf_pack<T, V> r;
  if constexpr (B == 16) {
    unsigned u[4];
    asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p));
    memcpy(&r, u, B);
  } else {
    r = kf_load<T, V>(p);
  }
  return r;
}
template <typename T, int V> __device__ __forceinline__ void kf_store_cs(T* p, const kf_pack<T, V>& v) {
  constexpr int B = (int)sizeof(T) * V;
  if constexpr (B == 16) { int4 u; memcpy(&u, &v, B); __stcs(reinterpret_cast<int4*>(p), u); }
  else if constexpr (B == 8) { int2 u; memcpy(&u, &v, B); __stcs(reinterpret_cast<int2*>(p), u); }
  else if constexpr (B == 4) { int u; memcpy(&u, &v, B); __stcs(reinterpret_cast<int*>(p), u); }
  else kf_store<T, V>(p, v);
}

__device__ __forceinline__ float kf_warp_sum(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float kf_warp_max(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Every thread gets the block total; the leading barrier lets `sh` be reused call after call.
template <int NW> __device__ __forceinline__ float kf_block_sum(float v, float* sh) {
  v = kf_warp_sum(v, 32);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : 0.f;
  return kf_warp_sum(r, 32);
}
template <int NW> __device__ __forceinline__ float kf_block_max(float v, float* sh) {
  v = kf_warp_max(v, 32);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : -INFINITY;
  return kf_warp_max(r, 32);
}
inline bool kf_aligned(const void* p, int bytes) { return ((uintptr_t)p % (uintptr_t)bytes) == 0; }
// Launch `kernel` as 1-D clusters of `cl` CTAs (sm_90): blocks CTAs of `threads` threads, each
// with `smem` bytes of dynamic shared memory.
template <typename... P, typename... A>
inline int kf_launch_cluster(void (*kernel)(P...), int64_t blocks, int threads, int cl, size_t smem,
                             cudaStream_t stream, A... args) {
  if (cl > 8) {  // 16 is a non-portable cluster size: the kernel must opt in
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return (int)e;
  }
  if (smem > 48 * 1024) {  // above the default carve-out the kernel must opt in too
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks, 1, 1);
  cfg.blockDim = dim3((unsigned)threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)cl;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&cfg, kernel, args...);
}

#include <cooperative_groups.h>
namespace kf_cg = cooperative_groups;

// (sum, sumsq) of the whole block in one shared-memory round: half the barriers of two sums.
template <int NW> __device__ __forceinline__ float2 kf_block_sum2(float s, float q, float2* sh) {
  s = kf_warp_sum(s, 32);
  q = kf_warp_sum(q, 32);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_float2(s, q);
  __syncthreads();
  float2 r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : make_float2(0.f, 0.f);
  r.x = kf_warp_sum(r.x, 32);
  r.y = kf_warp_sum(r.y, 32);
  return r;
}

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
