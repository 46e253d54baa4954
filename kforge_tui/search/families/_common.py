"""Source snippets shared by the families: dtype conversion, vector packs, reductions, fast exp.

Each rendered kernel is one self-contained file, so these snippets are pasted into every
source (no shared header to ship to the sandbox). Nothing here uses `static` or globals:
candidates must not hold mutable state between calls.
"""
from __future__ import annotations

from kforge_tui.regions.patterns import OpTask
from kforge_tui.regions import patterns
from kforge_tui.search.csrc import CPU_HALF_CONVERSIONS, CPU_OMP_MIN_WORK

ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def fill(src: str, **kw) -> str:
    """`@NAME@` placeholders, because C++ braces make str.format unreadable."""
    for k, v in kw.items():
        src = src.replace(f"@{k}@", str(v))
    assert "@" not in src.replace("@@", ""), src[src.find("@") - 40: src.find("@") + 40]
    return src


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# On-chip room for kept sweeps (split-row designs that hold their chunk in shared memory): an
# sm_90 block may have 227 KB of dynamic shared memory; 1 KB stays free for static shared memory.
MAX_KEEP_KB = 226
KEEP_KB = (0, 32, 64, 96, 128, 160, 192, 224)


def keep_sweeps(dtype: str, p: dict) -> int:
    """Sweeps (threads x vec elements) of a CTA's chunk that `keep` KB of shared memory hold."""
    return p["keep"] * 1024 // (p["threads"] * p["vec"] * ELEM_BYTES[dtype])


def keep_for(dtype: str, chunk_elems: int, cap_kb: int) -> int:
    """The smallest `keep` value (KB) holding a chunk of `chunk_elems`, else `cap_kb`."""
    need = cdiv(chunk_elems * ELEM_BYTES[dtype], 1024)
    for kb in KEEP_KB[1:]:
        if need <= kb <= cap_kb:
            return kb
    return cap_kb


def pow2_at_most(x: int, choices) -> int:
    best = choices[0]
    for c in choices:
        if c <= x:
            best = c
    return best


# ------------------------------------------------------------------------------ CUDA

_CUDA_HELPERS = r"""
typedef @TI@ TI;
typedef @TO@ TO;

__device__ __forceinline__ float kf_f(float v) { return v; }
template <typename T> __device__ __forceinline__ T kf_to(float v);
template <> __device__ __forceinline__ float kf_to<float>(float v) { return v; }
// the 16-bit overloads exist where their header is included (only for tasks of that type)
#ifdef __CUDA_FP16_H__
__device__ __forceinline__ float kf_f(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ __half kf_to<__half>(float v) { return __float2half_rn(v); }
#endif
#ifdef __CUDA_BF16_H__
__device__ __forceinline__ float kf_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ __nv_bfloat16 kf_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
#endif

// V elements of T moved as one aligned access (16 B = one LDG.128 when sizeof(T)*V == 16).
template <typename T, int V> struct alignas(sizeof(T) * V) kf_pack { T v[V]; };
template <typename T, int V> __device__ __forceinline__ kf_pack<T, V> kf_load(const T* p) {
  return *reinterpret_cast<const kf_pack<T, V>*>(p);
}
// Output packs go out through the __stwb / __stcs intrinsics so they are one vector access:
// stored as a struct, a pack was split by nvcc 13 into 2- or 4-byte stores in cluster_group,
// block_group, two_phase, softmax block_row and rows_vec (PTX, 2026-11-30; silu*b ran at 144 us
// under ncu with them, 90 us without, H200, two calls). The intrinsics' "memory" clobber keeps
// loads from being hoisted above them, so a kernel whose unrolled loop loads after storing
// (kf_norm's affine) uses kf_store_plain, which nvcc does vectorise there.
template <typename T, int V> __device__ __forceinline__ void kf_store_plain(T* p, const kf_pack<T, V>& v) {
  *reinterpret_cast<kf_pack<T, V>*>(p) = v;
}
template <bool CS, typename U> __device__ __forceinline__ void kf_st(U* p, const U& u) {
  if constexpr (CS) __stcs(p, u);
  else __stwb(p, u);
}
// CS: streaming (evict-first) for packs of 4, 8 or 16 bytes; 32-byte packs are two plain stores.
template <bool CS, typename T, int V> __device__ __forceinline__ void kf_store_as(T* p, const kf_pack<T, V>& v) {
  constexpr int B = (int)sizeof(T) * V;
  if constexpr (B == 32) {
    int4 u[2];
    memcpy(u, &v, B);
    kf_st<false>(reinterpret_cast<int4*>(p), u[0]);
    kf_st<false>(reinterpret_cast<int4*>(p) + 1, u[1]);
  } else if constexpr (B == 16) { int4 u; memcpy(&u, &v, B); kf_st<CS>(reinterpret_cast<int4*>(p), u); }
  else if constexpr (B == 8) { int2 u; memcpy(&u, &v, B); kf_st<CS>(reinterpret_cast<int2*>(p), u); }
  else if constexpr (B == 4) { int u; memcpy(&u, &v, B); kf_st<CS>(reinterpret_cast<int*>(p), u); }
  else kf_store_plain<T, V>(p, v);
}
template <typename T, int V> __device__ __forceinline__ void kf_store(T* p, const kf_pack<T, V>& v) {
  kf_store_as<false, T, V>(p, v);
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
  kf_store_as<true, T, V>(p, v);
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
// Second round: with a power-of-two warp count each lane takes partial (lane % NW), so log2(NW)
// shuffles give every lane the total instead of five over zero-padded lanes.
template <int NW> __device__ __forceinline__ float kf_block_sum(float v, float* sh) {
  v = kf_warp_sum(v, 32);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if constexpr ((NW & (NW - 1)) == 0) return kf_warp_sum(sh[threadIdx.x & (NW - 1)], NW);
  float r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : 0.f;
  return kf_warp_sum(r, 32);
}
template <int NW> __device__ __forceinline__ float kf_block_max(float v, float* sh) {
  v = kf_warp_max(v, 32);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if constexpr ((NW & (NW - 1)) == 0) return kf_warp_max(sh[threadIdx.x & (NW - 1)], NW);
  float r = (threadIdx.x & 31) < NW ? sh[threadIdx.x & 31] : -INFINITY;
  return kf_warp_max(r, 32);
}
// V floats rounded to T (as kf_to does) into a pack; 16-bit types two at a time (one
// cvt.rn.bf16x2.f32 / f16x2 per pair instead of a conversion and a move per element).
__device__ __forceinline__ void kf_to2(float a, float b, float* o) { o[0] = a; o[1] = b; }
#ifdef __CUDA_FP16_H__
__device__ __forceinline__ void kf_to2(float a, float b, __half* o) {
  const __half2 h = __floats2half2_rn(a, b);
  memcpy(o, &h, 4);
}
#endif
#ifdef __CUDA_BF16_H__
__device__ __forceinline__ void kf_to2(float a, float b, __nv_bfloat16* o) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  memcpy(o, &h, 4);
}
#endif
template <typename T, int V> __device__ __forceinline__ kf_pack<T, V> kf_to_pack(const float* f) {
  kf_pack<T, V> o;
  if constexpr (V % 2 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 2) kf_to2(f[j], f[j + 1], &o.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = kf_to<T>(f[j]);
  }
  return o;
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
// CTAs of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) that are resident at
// once on the current device, i.e. the largest cooperative grid; 0 when the device cannot launch
// cooperatively or the kernel does not fit. Opts the kernel in to `smem` above 48 KB first.
template <typename... P>
inline int64_t kf_coop_capacity(void (*kernel)(P...), int threads, size_t smem) {
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int dev = 0, sms = 0, coop = 0, occ = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) { cudaGetLastError(); return 0; }
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return coop ? (int64_t)sms * occ : 0;
}
// Launch `kernel` as a cooperative grid of `blocks` CTAs (at most kf_coop_capacity): every CTA
// is resident at once, so grid-wide barriers (cooperative_groups::this_grid().sync()) are safe.
template <typename... P, typename... A>
inline int kf_launch_coop(void (*kernel)(P...), int64_t blocks, int threads, size_t smem, cudaStream_t stream,
                          A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks, 1, 1);
  cfg.blockDim = dim3((unsigned)threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&cfg, kernel, args...);
}
"""

# Cooperative split-row design, shared by softmax and the norms (cuda): how a row of n elements
# is cut into C chunks, one CTA each, for a co-resident grid of at most `cap` CTAs.
CUDA_COOP_SPLIT = r"""
// Chunks per row so that rows x chunks CTAs are co-resident (<= cap) and every chunk holds at
// least one sweep of `step` elements; chunk lengths are multiples of `vec`. Returns the chunk
// length and sets *C; 0 when the rows alone exceed the capacity (the caller falls back).
inline int64_t kf_coop_chunks(int64_t rows, int64_t n, int64_t cap, int64_t step, int64_t vec, int64_t* C) {
  if (rows <= 0 || cap < rows) return 0;
  int64_t c = cap / rows;
  const int64_t sweeps = (n + step - 1) / step;
  if (c > sweeps) c = sweeps;
  if (c < 1) c = 1;
  int64_t chunk = ((n + c - 1) / c + vec - 1) / vec * vec;
  *C = (n + chunk - 1) / chunk;
  return chunk;
}
"""


def cuda_head(task: OpTask, in_dtype: str | None = None, out_dtype: str | None = None) -> str:
    sig = patterns.signature(task, "cuda")
    return sig.prelude(also={in_dtype or task.dtype, out_dtype or task.output.dtype}) + fill(_CUDA_HELPERS,
                                TI=patterns.CUDA_CTYPE[in_dtype or task.dtype],
                                TO=patterns.CUDA_CTYPE[out_dtype or task.output.dtype])


# ------------------------------------------------------------------------------- CPU

_CPU_HELPERS = r"""#include <string.h>
@OMP_MIN@typedef @TI@ TI;
typedef @TO@ TO;

// half / bfloat16 arrive as raw bits in uint16_t; conversions are exact (RNE, NaN kept).
@HALF@
inline float kf_in(TI v) { return @CONV_IN@; }
inline TO kf_out(float v) { return @CONV_OUT@; }
inline TI kf_round(float v) { return @CONV_ROUND@; }

// exp as plain arithmetic: Cephes range reduction + degree-6 polynomial (<= 2 ulp), result
// scaled by 2^k in two steps so underflow to subnormals/0 and overflow to inf match expf; NaN
// propagates (the clamps are written so NaN passes through). The same steps as kf_vexp below,
// which is what the hot loops use: g++ 12 does not vectorise this scalar form on its own.
inline float kf_exp(float x) {
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  float k = nearbyintf(x * 1.44269504088896341f);
  float r = x - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  int32_t ki = (int32_t)k, k1 = ki >> 1, k2 = ki - k1;
  uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2; memcpy(&s1, &b1, 4); memcpy(&s2, &b2, 4);
  return e * s1 * s2;
}
inline float kf_exp_libm(float x) { return expf(x); }
"""

_CPU_SIMD = r"""
// ---- explicit SIMD (why: g++ 12 leaves the polynomial exp and the half/bf16 conversions
// scalar, "no vectype for stmt"). kf_v holds SIMD_W floats: AVX-512 (16), AVX2+FMA (8) or a
// plain float (1), chosen by what -march=native enables. Loops run whole vectors and finish
// the tail with the scalar helpers above, which compute the same functions.
#if defined(__AVX512F__)
#include <immintrin.h>
#define SIMD_W 16
typedef __m512 kf_v;
inline kf_v kf_vset(float a) { return _mm512_set1_ps(a); }
inline kf_v kf_vadd(kf_v a, kf_v b) { return _mm512_add_ps(a, b); }
inline kf_v kf_vsub(kf_v a, kf_v b) { return _mm512_sub_ps(a, b); }
inline kf_v kf_vmul(kf_v a, kf_v b) { return _mm512_mul_ps(a, b); }
inline kf_v kf_vdiv(kf_v a, kf_v b) { return _mm512_div_ps(a, b); }
inline kf_v kf_vfma(kf_v a, kf_v b, kf_v c) { return _mm512_fmadd_ps(a, b, c); }
inline kf_v kf_vmax(kf_v a, kf_v b) { return _mm512_max_ps(a, b); }  // b if either is NaN
inline kf_v kf_vmin(kf_v a, kf_v b) { return _mm512_min_ps(a, b); }
inline kf_v kf_vabs(kf_v a) { return _mm512_abs_ps(a); }
inline kf_v kf_vcopysign(kf_v mag, kf_v sgn) {
  const __m512i m = _mm512_set1_epi32(0x80000000);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(m, _mm512_castps_si512(mag)),
                                             _mm512_and_si512(m, _mm512_castps_si512(sgn))));
}
inline kf_v kf_vrelu(kf_v a) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ), a, _mm512_setzero_ps()); }
inline float kf_vsum(kf_v a) { return _mm512_reduce_add_ps(a); }
inline float kf_vhmax(kf_v a) { return _mm512_reduce_max_ps(a); }
inline kf_v kf_vround_nearest(kf_v a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline kf_v kf_vexp2i(kf_v e, kf_v k) { return _mm512_scalef_ps(e, k); }  // e * 2^k, one rounding
inline kf_v kf_vld_f32(const float* p) { return _mm512_loadu_ps(p); }
inline void kf_vst_f32(float* p, kf_v v) { _mm512_storeu_ps(p, v); }
inline kf_v kf_vld_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline void kf_vst_bf16(uint16_t* p, kf_v v) {
  const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1))));
  r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_srli_epi32(r, 16),
                              _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(r));
}
inline kf_v kf_vld_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline void kf_vst_f16(uint16_t* p, kf_v v) {
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SIMD_W 8
typedef __m256 kf_v;
inline kf_v kf_vset(float a) { return _mm256_set1_ps(a); }
inline kf_v kf_vadd(kf_v a, kf_v b) { return _mm256_add_ps(a, b); }
inline kf_v kf_vsub(kf_v a, kf_v b) { return _mm256_sub_ps(a, b); }
inline kf_v kf_vmul(kf_v a, kf_v b) { return _mm256_mul_ps(a, b); }
inline kf_v kf_vdiv(kf_v a, kf_v b) { return _mm256_div_ps(a, b); }
inline kf_v kf_vfma(kf_v a, kf_v b, kf_v c) { return _mm256_fmadd_ps(a, b, c); }
inline kf_v kf_vmax(kf_v a, kf_v b) { return _mm256_max_ps(a, b); }
inline kf_v kf_vmin(kf_v a, kf_v b) { return _mm256_min_ps(a, b); }
inline kf_v kf_vabs(kf_v a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
inline kf_v kf_vcopysign(kf_v mag, kf_v sgn) {
  const kf_v m = _mm256_set1_ps(-0.0f);
  return _mm256_or_ps(_mm256_andnot_ps(m, mag), _mm256_and_ps(m, sgn));
}
inline kf_v kf_vrelu(kf_v a) { return _mm256_blendv_ps(a, _mm256_setzero_ps(), _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ)); }
inline float kf_vsum(kf_v a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float kf_vhmax(kf_v a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline kf_v kf_vround_nearest(kf_v a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline kf_v kf_vexp2i(kf_v e, kf_v k) {  // e * 2^k for k in [-150, 128]: two normal scale factors
  const __m256i ki = _mm256_cvtps_epi32(k), k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
  const __m256i b = _mm256_set1_epi32(127);
  const kf_v s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, b), 23));
  const kf_v s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, b), 23));
  return _mm256_mul_ps(_mm256_mul_ps(e, s1), s2);
}
inline kf_v kf_vld_f32(const float* p) { return _mm256_loadu_ps(p); }
inline void kf_vst_f32(float* p, kf_v v) { _mm256_storeu_ps(p, v); }
inline kf_v kf_vld_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline void kf_vst_bf16(uint16_t* p, kf_v v) {
  const __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1))));
  r = _mm256_srli_epi32(r, 16);
  const __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(r));
}
inline kf_v kf_vld_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline void kf_vst_f16(uint16_t* p, kf_v v) {
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#else
#define SIMD_W 1
typedef float kf_v;
inline kf_v kf_vset(float a) { return a; }
inline kf_v kf_vadd(kf_v a, kf_v b) { return a + b; }
inline kf_v kf_vsub(kf_v a, kf_v b) { return a - b; }
inline kf_v kf_vmul(kf_v a, kf_v b) { return a * b; }
inline kf_v kf_vdiv(kf_v a, kf_v b) { return a / b; }
inline kf_v kf_vfma(kf_v a, kf_v b, kf_v c) { return a * b + c; }
inline kf_v kf_vmax(kf_v a, kf_v b) { return a > b ? a : b; }  // b if either is NaN, as maxps
inline kf_v kf_vmin(kf_v a, kf_v b) { return a < b ? a : b; }
inline kf_v kf_vabs(kf_v a) { return fabsf(a); }
inline kf_v kf_vcopysign(kf_v mag, kf_v sgn) { return copysignf(mag, sgn); }
inline kf_v kf_vrelu(kf_v a) { return a < 0.f ? 0.f : a; }
inline float kf_vsum(kf_v a) { return a; }
inline float kf_vhmax(kf_v a) { return a; }
inline kf_v kf_vround_nearest(kf_v a) { return nearbyintf(a); }
inline kf_v kf_vexp2i(kf_v e, kf_v k) {
  int32_t ki = (int32_t)k, k1 = ki >> 1, k2 = ki - k1;
  uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2; memcpy(&s1, &b1, 4); memcpy(&s2, &b2, 4);
  return e * s1 * s2;
}
inline kf_v kf_vld_f32(const float* p) { return *p; }
inline void kf_vst_f32(float* p, kf_v v) { *p = v; }
inline kf_v kf_vld_bf16(const uint16_t* p) { return kf_bf2f(*p); }
inline void kf_vst_bf16(uint16_t* p, kf_v v) { *p = kf_f2bf(v); }
inline kf_v kf_vld_f16(const uint16_t* p) { return kf_h2f(*p); }
inline void kf_vst_f16(uint16_t* p, kf_v v) { *p = kf_f2h(v); }
#endif

// Same reduction and polynomial as kf_exp; the clamps take NaN through (max/min return their
// second operand when either is NaN), -inf becomes exp(-104) = 0 and +inf becomes inf.
inline kf_v kf_vexp(kf_v x) {
  x = kf_vmax(kf_vset(-104.0f), x);
  x = kf_vmin(kf_vset(89.0f), x);
  const kf_v k = kf_vround_nearest(kf_vmul(x, kf_vset(1.44269504088896341f)));
  kf_v r = kf_vfma(k, kf_vset(-0.693359375f), x);
  r = kf_vfma(k, kf_vset(2.12194440e-4f), r);
  kf_v p = kf_vset(1.9875691500e-4f);
  p = kf_vfma(p, r, kf_vset(1.3981999507e-3f));
  p = kf_vfma(p, r, kf_vset(8.3334519073e-3f));
  p = kf_vfma(p, r, kf_vset(4.1665795894e-2f));
  p = kf_vfma(p, r, kf_vset(1.6666665459e-1f));
  p = kf_vfma(p, r, kf_vset(5.0000001201e-1f));
  const kf_v e = kf_vadd(kf_vfma(kf_vmul(p, r), r, r), kf_vset(1.0f));
  return kf_vexp2i(e, k);
}
// erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), the formula ATen's own vectorised
// CPU erf uses, so exact gelu agrees with eager to rounding.
inline kf_v kf_verf(kf_v x) {
  const kf_v a = kf_vabs(x);
  const kf_v t = kf_vdiv(kf_vset(1.0f), kf_vfma(kf_vset(0.3275911f), a, kf_vset(1.0f)));
  kf_v p = kf_vset(1.061405429f);
  p = kf_vfma(p, t, kf_vset(-1.453152027f));
  p = kf_vfma(p, t, kf_vset(1.421413741f));
  p = kf_vfma(p, t, kf_vset(-0.284496736f));
  p = kf_vfma(p, t, kf_vset(0.254829592f));
  p = kf_vmul(p, t);
  const kf_v ex = kf_vexp(kf_vsub(kf_vset(0.0f), kf_vmul(a, a)));
  return kf_vcopysign(kf_vsub(kf_vset(1.0f), kf_vmul(p, ex)), x);
}
inline kf_v kf_vin(const TI* p) { return @VIN@(p); }
inline void kf_vout(TO* p, kf_v v) { @VOUT@(p, v); }
// Round to the input dtype and back (what a two-op PyTorch reference does between its ops).
inline kf_v kf_vround(kf_v v) { TI t[SIMD_W]; @VROUND@(t, v); return @VIN@(t); }
// Scalar erf with the same formula, for the tails of vector loops.
inline float kf_erf_as(float x) {
  const float a = fabsf(x), t = 1.0f / (1.0f + 0.3275911f * a);
  const float p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  return copysignf(1.0f - p * kf_exp(-a * a), x);
}
"""

_VIN = {"float32": "kf_vld_f32", "bfloat16": "kf_vld_bf16", "float16": "kf_vld_f16"}
_VOUT = {"float32": "kf_vst_f32", "bfloat16": "kf_vst_bf16", "float16": "kf_vst_f16"}

_CONV_IN = {"float32": "v", "bfloat16": "kf_bf2f(v)", "float16": "kf_h2f(v)"}
_CONV_OUT = {"float32": "v", "bfloat16": "kf_f2bf(v)", "float16": "kf_f2h(v)"}


def cpu_head(task: OpTask, in_dtype: str | None = None, out_dtype: str | None = None) -> str:
    ti, to = in_dtype or task.dtype, out_dtype or task.output.dtype
    sig = patterns.signature(task, "cpu")
    return sig.prelude() + fill(_CPU_HELPERS + _CPU_SIMD, TI=patterns.CPU_CTYPE[ti],
                                TO=patterns.CPU_CTYPE[to], CONV_IN=_CONV_IN[ti], CONV_OUT=_CONV_OUT[to],
                                CONV_ROUND=_CONV_OUT[ti], VIN=_VIN[ti], VOUT=_VOUT[to], VROUND=_VOUT[ti],
                                HALF=CPU_HALF_CONVERSIONS.rstrip("\n"), OMP_MIN=CPU_OMP_MIN_WORK)


def entry(task: OpTask, backend: str, body: str) -> str:
    """The pattern entry point: its exact declaration (regions/patterns.py) around `body`."""
    return patterns.signature(task, backend).declaration() + " {\n" + body.strip("\n") + "\n}\n"
