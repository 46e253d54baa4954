"""The cpu norm families: rows_omp (layer/rms norm) and groups_omp (group_norm)."""
from __future__ import annotations

from kforge_tui.search.families.base import Family, register
from kforge_tui.search.families._common import cpu_head, entry, fill, pow2_at_most
from kforge_tui.regions.patterns import OpTask
from kforge_tui.search.families.norms.common import KIND, ROW_OPS, rows_n, round2


# ------------------------------------------------------------------------------- CPU

_CPU_ROWS = r"""
inline int kf_norm_rows(const TI* x, const TI* w, const TI* b, TO* y, int64_t rows, int64_t n, float eps,
                        float woff) {
#pragma omp parallel for schedule(static, @GRAIN@) if(rows > 1 && rows * n >= kf_omp_min_work)
  for (int64_t r = 0; r < rows; ++r) {
    const TI* xr = x + r * n;
    TO* yr = y + r * n;
    float mean = 0.f, q = 0.f;
    if (@KIND@ == 0) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += kf_in(xr[j]);
      mean = s / (float)n;
#pragma omp simd reduction(+ : q)
      for (int64_t j = 0; j < n; ++j) { const float d = kf_in(xr[j]) - mean; q += d * d; }
    } else {
#pragma omp simd reduction(+ : q)
      for (int64_t j = 0; j < n; ++j) { const float v = kf_in(xr[j]); q += v * v; }
    }
    const float rstd = 1.f / sqrtf(q / (float)n + eps);
    if (@KIND@ == 0) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        float o = (kf_in(xr[j]) - mean) * rstd;
        if (w) o *= kf_in(w[j]);
        if (b) o += kf_in(b[j]);
        yr[j] = kf_out(o);
      }
    } else if (w && @ROUND2@) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = kf_out(kf_in(w[j]) * kf_in(kf_round(kf_in(xr[j]) * rstd)));
    } else if (w) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = kf_out(kf_in(xr[j]) * rstd * (kf_in(w[j]) + woff));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = kf_out(kf_in(xr[j]) * rstd);
    }
  }
  return 0;
}
"""


def _cpu_rows_render(task: OpTask, p: dict) -> str:
    src = fill(_CPU_ROWS, GRAIN=p["grain"], KIND=KIND[task.op], ROUND2="1" if round2(task) == "true" else "0")
    call = ("kf_norm_rows(x, weight, bias, y, rows, n, eps, 0.f)" if task.op == "layer_norm"
            else "kf_norm_rows(x, weight, (const TI*)0, y, rows, n, eps, weight_offset)")
    return cpu_head(task) + src + entry(task, "cpu", f"  return {call};")


def _cpu_rows_default(task: OpTask) -> dict:
    rows, _ = rows_n(task)
    return {"grain": pow2_at_most(max(1, rows // 64), (1, 4, 16, 64))}


register(Family("rows_omp", ROW_OPS, "cpu", {"grain": (1, 4, 16, 64)}, _cpu_rows_default,
                lambda t, p: True, _cpu_rows_render, doc="OpenMP over rows, omp simd passes"))


_CPU_GROUPS = r"""
inline int kf_group_norm(const TI* x, const TI* w, const TI* b, TO* y, int64_t N, int64_t C, int64_t HxW,
                         int64_t G, float eps) {
  if (N <= 0 || C <= 0 || HxW <= 0) return 0;
  if (G <= 0 || C % G) return -1;
  const int64_t cg = C / G, ge = cg * HxW;
#pragma omp parallel for schedule(dynamic, 1) if(N * G > 1 && N * C * HxW >= kf_omp_min_work)
  for (int64_t ng = 0; ng < N * G; ++ng) {
    const TI* xg = x + ng * ge;
    TO* yg = y + ng * ge;
    const float K = kf_in(xg[0]);
    double s = 0.0, q = 0.0;
    for (int64_t c0 = 0; c0 < ge; c0 += @TILE@) {
      const int64_t c1 = c0 + @TILE@ < ge ? c0 + @TILE@ : ge;
      float fs = 0.f, fq = 0.f;
#pragma omp simd reduction(+ : fs, fq)
      for (int64_t j = c0; j < c1; ++j) { const float d = kf_in(xg[j]) - K; fs += d; fq += d * d; }
      s += fs;
      q += fq;
    }
    const double ms = s / (double)ge, var = q / (double)ge - ms * ms;
    const float mean = (float)(K + ms), rstd = 1.f / sqrtf((float)(var > 0.0 ? var : 0.0) + eps);
    for (int64_t c = 0; c < cg; ++c) {
      const int64_t ch = (ng % G) * cg + c;
      const float a = rstd * (w ? kf_in(w[ch]) : 1.f), bb = (b ? kf_in(b[ch]) : 0.f) - mean * a;
      const TI* xc = xg + c * HxW;
      TO* yc = yg + c * HxW;
#pragma omp simd
      for (int64_t j = 0; j < HxW; ++j) yc[j] = kf_out(kf_in(xc[j]) * a + bb);
    }
  }
  return 0;
}
"""


def _cpu_groups_render(task: OpTask, p: dict) -> str:
    src = fill(_CPU_GROUPS, TILE=p["tile"])
    return cpu_head(task) + src + entry(task, "cpu", "  return kf_group_norm(x, weight, bias, y, N, C, HxW, G, eps);")


register(Family("groups_omp", ("group_norm",), "cpu", {"tile": (256, 1024, 4096, 16384)},
                lambda t: {"tile": 1024}, lambda t, p: True, _cpu_groups_render,
                doc="OpenMP over (n, group): shifted f32 tiles summed in double, then apply"))
