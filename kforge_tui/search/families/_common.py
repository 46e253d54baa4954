"""Source snippets shared by the families: dtype conversion, vector packs, reductions, fast exp.

Each rendered kernel is one self-contained file, so these snippets are pasted into every
source (no shared header to ship to the sandbox). Nothing here uses `static` or globals:
candidates must not hold mutable state between calls.
"""
from __future__ import annotations

from kforge_tui.task import Task
from kforge_tui.workload import catalogue

ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def fill(src: str, **kw) -> str:
    """`@NAME@` placeholders, because C++ braces make str.format unreadable."""
    for k, v in kw.items():
        src = src.replace(f"@{k}@", str(v))
    assert "@" not in src.replace("@@", ""), src[src.find("@") - 40: src.find("@") + 40]
    return src


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
"""


def cuda_head(task: Task, in_dtype: str | None = None, out_dtype: str | None = None) -> str:
    sig = catalogue.signature(task, "cuda")
    return sig.prelude() + fill(_CUDA_HELPERS,
                                TI=catalogue.CUDA_CTYPE[in_dtype or task.dtype],
                                TO=catalogue.CUDA_CTYPE[out_dtype or task.output.dtype])


# ------------------------------------------------------------------------------- CPU

_CPU_HELPERS = r"""#include <string.h>
typedef @TI@ TI;
typedef @TO@ TO;

// half / bfloat16 arrive as raw bits in uint16_t; conversions are exact (RNE, NaN kept).
inline float kf_bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
inline uint16_t kf_f2bf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float kf_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) { float f = (float)m * 5.9604644775390625e-8f; return sign ? -f : f; }
  if (e == 31) u = sign | 0x7f800000u | (m << 13);
  else u = sign | ((e + 112u) << 23) | (m << 13);
  float f; memcpy(&f, &u, 4); return f;
}
inline uint16_t kf_f2h(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    float af; memcpy(&af, &ax, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(af * 16777216.0f));
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13), rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}
inline float kf_in(TI v) { return @CONV_IN@; }
inline TO kf_out(float v) { return @CONV_OUT@; }
inline TI kf_round(float v) { return @CONV_ROUND@; }

// exp as plain arithmetic (Cephes range reduction + degree-6 polynomial, ~1 ulp) so that
// `omp simd` loops vectorise it; libm expf is a call the compiler will not vectorise.
inline float kf_exp(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  x = x > 88.0f ? 88.0f : x;
  float k = floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
  float sc; memcpy(&sc, &bits, 4);
  return e * sc;
}
inline float kf_exp_libm(float x) { return expf(x); }
"""

_CONV_IN = {"float32": "v", "bfloat16": "kf_bf2f(v)", "float16": "kf_h2f(v)"}
_CONV_OUT = {"float32": "v", "bfloat16": "kf_f2bf(v)", "float16": "kf_f2h(v)"}


def cpu_head(task: Task, in_dtype: str | None = None, out_dtype: str | None = None) -> str:
    ti, to = in_dtype or task.dtype, out_dtype or task.output.dtype
    sig = catalogue.signature(task, "cpu")
    return sig.prelude() + fill(_CPU_HELPERS, TI=catalogue.CPU_CTYPE[ti], TO=catalogue.CPU_CTYPE[to],
                                CONV_IN=_CONV_IN[ti], CONV_OUT=_CONV_OUT[to], CONV_ROUND=_CONV_OUT[ti])


def entry(task: Task, backend: str, body: str) -> str:
    """The exported entry point: the catalogue's exact declaration around `body`."""
    return catalogue.signature(task, backend).declaration() + " {\n" + body.strip("\n") + "\n}\n"
