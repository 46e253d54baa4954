"""C source shared by every kernel generator (the families and search/codegen).

OMP_MIN_WORK: CPU kernels split work over an OpenMP team only from this many elements up. Waking
a team costs microseconds, and inside a model's process PyTorch's own OpenMP pool (a second
runtime) can still be spinning on the same cores after its last op, which costs milliseconds;
below this size one thread is faster anyway.

CPU candidates receive half and bfloat16 tensors as raw bits (`uint16_t`, regions/abi.py): these
are the conversions to and from float, rounding to nearest even and keeping NaN, written once.
"""

CPU_HALF_CONVERSIONS = r"""inline float kf_bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
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
"""

OMP_MIN_WORK = 16384
CPU_OMP_MIN_WORK = f"enum {{ kf_omp_min_work = {OMP_MIN_WORK} }};\n"  # a constant, not a macro (KF_ is the ABI's)
