"""The explicit-SIMD layer the fast cpu families stand on (families/_common.py, `_CPU_SIMD`).

Correctness only - speed targets live in bench/cpu_families.py. Each helper is compiled three
times with the real g++ and the candidates' flags: `-march=native` (AVX-512 on the CI box),
then with AVX-512 switched off (the AVX2+FMA path) and with AVX switched off (the scalar
fallback), so all three branches are checked on one machine. The outputs are compared with
float64 torch.exp rounded to float32 (the correctly rounded expf):

  * results >= FLT_MIN: at most MAX_ULP ulp (the Cephes polynomial: measured 1 ulp);
  * subnormal results: within 1 subnormal step (2^-149) plus the relative error above;
  * overflow (x > 88.7228) gives +inf, -inf gives 0, +inf gives +inf, NaN gives NaN.
"""
from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from kforge_tui.regions.meta import TensorMeta
from kforge_tui.regions.patterns import OpTask
from kforge_tui.search.families._common import cpu_head

GXX = shutil.which("g++")
MAX_ULP = 2
VARIANTS = {
    "native": [],
    "avx2": ["-mno-avx512f"],
    "scalar": ["-mno-avx", "-mno-avx2", "-mno-fma", "-mno-f16c", "-mno-avx512f"],
}
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not installed")


def _task(dtype: str) -> OpTask:
    x = TensorMeta("x", (64,), dtype)
    return OpTask(op="relu", dtype=dtype, inputs=(x,), output=TensorMeta("y", (64,), dtype), backend="cpu")


_HARNESS = textwrap.dedent(r'''
    extern "C" int kf_width() { return SIMD_W; }
    // n must be a multiple of SIMD_W: only the vector helpers run.
    extern "C" void kf_t_vexp(const float* x, float* y, int64_t n) {
      for (int64_t i = 0; i < n; i += SIMD_W) kf_vst_f32(y + i, kf_vexp(kf_vld_f32(x + i)));
    }
    extern "C" void kf_t_exp(const float* x, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = kf_exp(x[i]); }
    extern "C" void kf_t_verf(const float* x, float* y, int64_t n) {
      for (int64_t i = 0; i < n; i += SIMD_W) kf_vst_f32(y + i, kf_verf(kf_vld_f32(x + i)));
    }
    extern "C" void kf_t_vin(const TI* x, float* y, int64_t n) { for (int64_t i = 0; i < n; i += SIMD_W) kf_vst_f32(y + i, kf_vin(x + i)); }
    extern "C" void kf_t_vout(const float* x, TO* y, int64_t n) { for (int64_t i = 0; i < n; i += SIMD_W) kf_vout(y + i, kf_vld_f32(x + i)); }
''')


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """{(variant, dtype): CDLL} for every instruction-set variant and dtype, compiled in parallel."""
    d = tmp_path_factory.mktemp("simd")
    jobs = [(v, dt) for v in VARIANTS for dt in ("float32", "bfloat16", "float16")]

    def build(job):
        v, dt = job
        src = d / f"{v}_{dt}.cpp"
        src.write_text(cpu_head(_task(dt)) + _HARNESS)
        so = d / f"{v}_{dt}.so"
        r = subprocess.run([GXX, "-O3", "-march=native", *VARIANTS[v], "-fopenmp", "-shared", "-fPIC",
                            "-std=c++17", str(src), "-o", str(so)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return job, so

    with ThreadPoolExecutor(2) as ex:
        built = dict(ex.map(build, jobs))
    return {k: ctypes.CDLL(str(so)) for k, so in built.items()}


def _call(lib, name: str, x: torch.Tensor, out_dtype=torch.float32) -> torch.Tensor:
    y = torch.full_like(x, float("nan"), dtype=out_dtype)
    getattr(lib, name)(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(x.numel()))
    return y


def _exp_inputs() -> torch.Tensor:
    """Every 64th float32 bit pattern in [-110, 95] (both signs), plus the edges and specials."""
    lo = torch.arange(0, 0x42DC0000, 64, dtype=torch.int32).view(torch.float32)  # 0 .. 110
    hi = torch.arange(0, 0x42BE0000, 64, dtype=torch.int32).view(torch.float32)  # 0 .. 95
    special = torch.tensor([float("-inf"), float("inf"), float("nan"), -0.0, 0.0, 1e-45, -1e-45, 1e-38,
                            3.4028235e38, -3.4028235e38, 88.72283, 88.72284, 88.7229, -87.33654, -87.3365,
                            -103.27893, -103.97208, -103.972084, -104.0, -150.0, 89.0, 100.0, -1000.0])
    x = torch.cat([-lo, hi, special])
    pad = (-x.numel()) % 64
    return torch.cat([x, torch.zeros(pad)])


def _ulp_report(x: torch.Tensor, y: torch.Tensor) -> dict:
    ref64 = torch.exp(x.double())
    ref = ref64.float()  # correctly rounded (double rounding is below these tolerances)
    finite = torch.isfinite(ref) & torch.isfinite(x)
    normal = finite & (ref >= torch.finfo(torch.float32).tiny)
    ulp = (torch.nextafter(ref, torch.tensor(float("inf"))) - ref).double()
    err = ((y.double() - ref64).abs() / ulp)
    sub = finite & ~normal
    sub_err = (y.double() - ref64).abs() - ref64 * (MAX_ULP * 2.0 ** -23)
    return {
        "max_ulp_normal": float(err[normal].max()),
        "max_sub_excess": float(sub_err[sub].max() / 2.0 ** -149) if sub.any() else 0.0,
        "nan_ok": bool(torch.equal(torch.isnan(y), torch.isnan(x))),
        "overflow_ok": bool(torch.all(y[(x > 88.7229) & ~torch.isnan(x)] == float("inf"))),
        "neg_inf_ok": bool(torch.all(y[x == float("-inf")] == 0.0)),
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("fn", ["kf_t_vexp", "kf_t_exp"])
def test_exp_matches_expf_over_the_whole_range(libs, variant, fn):
    lib = libs[(variant, "float32")]
    x = _exp_inputs()
    rep = _ulp_report(x, _call(lib, fn, x))
    assert rep["max_ulp_normal"] <= MAX_ULP, rep
    assert rep["max_sub_excess"] <= 1.0, rep
    assert rep["nan_ok"] and rep["overflow_ok"] and rep["neg_inf_ok"], rep
    # Within the bound, not trivially: a libm-identical result would be ~0.5 ulp at most too,
    # but a broken reduction (e.g. a wrong ln2 split) lands at thousands of ulp.
    assert rep["max_ulp_normal"] > 0


def test_variants_really_differ_in_width(libs):
    """The three builds take the three branches (16, 8 and 1 lanes on an AVX-512 machine)."""
    widths = {v: libs[(v, "float32")].kf_width() for v in VARIANTS}
    assert widths["scalar"] == 1
    assert widths["avx2"] in (1, 8)
    assert widths["native"] >= widths["avx2"]


def test_exp_check_catches_a_bad_exp(libs):
    """The ulp check can fail: exp(x) * (1 + 2^-21) is 4 ulp off everywhere."""
    x = _exp_inputs()
    y = _call(libs[("native", "float32")], "kf_t_vexp", x) * (1 + 2.0 ** -21)
    assert _ulp_report(x, y)["max_ulp_normal"] > MAX_ULP


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_erf_is_within_abramowitz_stegun_bound(libs, variant):
    x = torch.linspace(-8, 8, 2 ** 16 - 64)
    x = torch.cat([x, torch.tensor([float("inf"), float("-inf"), 0.0, -0.0] * 16)])
    y = _call(libs[(variant, "float32")], "kf_t_verf", x)
    ref = torch.erf(x.double())
    assert float((y.double() - ref).abs().max()) <= 6e-7  # 1.5e-7 formula + f32 rounding (~4 ulp of 1)
    assert torch.equal(torch.signbit(y), torch.signbit(x))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype,tdt", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_vector_half_conversions_match_torch(libs, variant, dtype, tdt):
    """kf_vin over every 16-bit pattern and kf_vout (RNE, NaN kept) over random + edge floats."""
    lib = libs[(variant, dtype)]
    bits = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16)
    h = bits.view(tdt)
    got = _call(lib, "kf_t_vin", bits, torch.float32)
    want = h.float()
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    assert bool(same.all()), int((~same).sum())

    g = torch.Generator().manual_seed(0)
    f = torch.cat([torch.randn(1 << 16, generator=g) * 10.0 ** torch.randint(-9, 6, (1 << 16,), generator=g),
                   want[torch.isfinite(want)] * (1 + 2.0 ** -12),  # halfway-ish cases
                   torch.tensor([float("nan"), float("inf"), float("-inf"), 65520.0, 65519.0, 6e-8, 3e-8, -0.0])])
    f = torch.cat([f, torch.zeros((-f.numel()) % 64)])
    out = torch.zeros(f.numel(), dtype=torch.int16)
    y = torch.full_like(out, 0)
    lib.kf_t_vout(ctypes.c_void_p(f.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(f.numel()))
    got, want = y.view(tdt).float(), f.to(tdt).float()
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    assert bool(same.all()), (int((~same).sum()), f[~same][:5].tolist(), got[~same][:5].tolist())
    assert math.isnan(float(got[torch.isnan(f)][0]))
