"""Convolution designs (1d/2d/3d, groups, depthwise, transposed).

  gen_conv_omp / gen_conv_simt / gen_conv_wmma: gemm.py's three GEMMs as an implicit GEMM per
                  group (M = out channels, N = batch x output positions, K = in channels x taps),
                  the im2col done on the fly in the loaders.
  gen_conv_direct cuda: one thread per OCPT output channels of one position (depthwise).
  gen_conv_direct_omp  cpu: direct convolution, OpenMP over output rows (depthwise / few channels
                  per group, where a GEMM has nothing to block).
"""
from __future__ import annotations

from dataclasses import dataclass

from kforge_tui.search.codegen.compute.base import (FLOATS, HALVES, Operand, OutRef, analyze, compute_design,
                                                    entry_fill, fill, load, off_expr, otype, prelude, raw_zero,
                                                    store, usable)
from kforge_tui.search.codegen.compute.gemm import (Gemm, cpu_gemm_default, cpu_gemm_space, cpu_gemm_valid,
                                                    render_cpu_gemm, render_simt_gemm, render_wmma_gemm,
                                                    simt_default, simt_space, simt_valid, wmma_default,
                                                    wmma_space, wmma_valid)


# =============================================================================== convolution

@dataclass
class ConvInfo:
    N: int
    C: int
    OC: int
    G: int
    sp: tuple  # input spatial (D, H, W)
    osp: tuple  # output spatial (OD, OH, OW)
    ker: tuple  # (KD, KH, KW)
    stride: tuple
    pad: tuple
    dil: tuple
    x: Operand
    xs: tuple  # strides (n, c, d, h, w)
    w: Operand
    ws: tuple  # strides (oc, ic, kd, kh, kw)
    bias: Operand | None
    out: OutRef
    os: tuple  # strides (n, oc, od, oh, ow)
    dtype: str
    nd: int
    transposed: bool = False  # weight [C_in, OC/G, k...]; out[o] gathers x[(o + p - k*d) / s]

    @property
    def ICg(self) -> int:
        return self.C // self.G

    @property
    def OCg(self) -> int:
        return self.OC // self.G

    @property
    def taps(self) -> int:
        return self.ker[0] * self.ker[1] * self.ker[2]

    @property
    def P(self) -> int:
        return self.N * self.osp[0] * self.osp[1] * self.osp[2]


def _pad3(v: tuple, fill_value: int) -> tuple:
    return (fill_value,) * (3 - len(v)) + tuple(v)


def conv_info(task) -> ConvInfo | None:
    if task.kind != "compute":
        return None
    R = analyze(task)
    if R is None or R.target != "aten.convolution.default" or len(R.outs) != 1:
        return None
    a = R.args
    x, w, bias = a["input"], a["weight"], a.get("bias")
    if not isinstance(x, Operand) or not isinstance(w, Operand):
        return None
    transposed = bool(a.get("transposed"))
    if x.dtype not in FLOATS or w.dtype != x.dtype:
        return None
    nd = x.ndim - 2
    if nd not in (1, 2, 3) or w.ndim != x.ndim:
        return None
    G = int(a["groups"])
    N, C = x.shape[:2]
    if G <= 0:
        return None
    if transposed:
        if w.shape[0] != C:
            return None
        OC, ICg = w.shape[1] * G, C // G
    else:
        OC, ICg = w.shape[:2]
    if C % G or OC % G or ICg != C // G:
        return None
    o = R.outs[0]
    if o.item != 0 or len(o.shape) != x.ndim or o.dtype != x.dtype or o.shape[:2] != (N, OC):
        return None
    stride, pad, dil = (list(a[k]) for k in ("stride", "padding", "dilation"))
    if len(stride) == 1 and nd > 1:
        stride = stride * nd
    if len(pad) == 1 and nd > 1:
        pad = pad * nd
    if len(dil) == 1 and nd > 1:
        dil = dil * nd
    if len(stride) != nd or len(pad) != nd or len(dil) != nd:
        return None
    if bias is not None:
        if not isinstance(bias, Operand) or bias.shape != (OC,) or bias.dtype not in FLOATS:
            return None
    sp = _pad3(x.shape[2:], 1)
    osp = _pad3(o.shape[2:], 1)
    ker = _pad3(w.shape[2:], 1)
    xs = tuple(x.strides[:2]) + _pad3(x.strides[2:], 0)
    ws = tuple(w.strides[:2]) + _pad3(w.strides[2:], 0)
    os_ = tuple(o.strides[:2]) + _pad3(o.strides[2:], 0)
    st3, pd3, dl3 = _pad3(stride, 1), _pad3(pad, 0), _pad3(dil, 1)
    if transposed:
        opad = list(a.get("output_padding") or [0] * nd)
        if len(opad) == 1 and nd > 1:
            opad = opad * nd
        if len(opad) != nd:
            return None
        op3 = _pad3(opad, 0)
    for i in range(3):  # the output size the op defines
        if transposed:
            want = (sp[i] - 1) * st3[i] - 2 * pd3[i] + dl3[i] * (ker[i] - 1) + op3[i] + 1
        else:
            want = (sp[i] + 2 * pd3[i] - dl3[i] * (ker[i] - 1) - 1) // st3[i] + 1
        if want != osp[i]:
            return None
    return ConvInfo(N, C, OC, G, sp, osp, ker, st3, pd3, dl3, x, xs, w, ws,
                    bias if isinstance(bias, Operand) else None, o, os_, x.dtype, nd, transposed)


def _in_coord(ci: ConvInfo, axis: int, o: str, k: str, i: str, on_bad: str) -> str:
    """C lines computing input coordinate `i` of output coordinate `o` and tap `k` on one
    spatial axis (0: d, 1: h, 2: w), running `on_bad` when that tap reads padding."""
    s, p, d, n = ci.stride[axis], ci.pad[axis], ci.dil[axis], ci.sp[axis]
    if not ci.transposed:
        return (f"const int64_t {i} = {o} * {s} - {p} + {k} * {d}; "
                f"if ((uint64_t){i} >= (uint64_t){n}) {on_bad}")
    t = f"t{i}_"
    if s == 1:
        return (f"const int64_t {i} = {o} + {p} - {k} * {d}; "
                f"if ((uint64_t){i} >= (uint64_t){n}) {on_bad}")
    return (f"const int64_t {t} = {o} + {p} - {k} * {d}; if ({t} < 0 || {t} % {s}) {on_bad} "
            f"const int64_t {i} = {t} / {s}; if ({i} >= {n}) {on_bad}")


def _conv_cl(ci: ConvInfo) -> bool:
    """Channels-last input: ic is the fastest digit of the reduction index."""
    return ci.xs[1] == 1 and ci.ICg > 1


def _conv_gemm(ci: ConvInfo) -> Gemm:
    KD, KH, KW = ci.ker
    OD, OH, OW = ci.osp
    ICg, OCg = ci.ICg, ci.OCg
    cl = _conv_cl(ci)
    if cl:
        rdec = (f"const int64_t ic = k % {ICg}; const int64_t t_ = k / {ICg}; "
                f"const int64_t kw = t_ % {KW}, kh = (t_ / {KW}) % {KH}, kd = t_ / {KW * KH};")
    else:
        rdec = (f"const int64_t ic = k / {ci.taps}; const int64_t t_ = k % {ci.taps}; "
                f"const int64_t kw = t_ % {KW}, kh = (t_ / {KW}) % {KH}, kd = t_ / {KW * KH};")
    pdec = (f"const int64_t ow = n % {OW}, oh = (n / {OW}) % {OH}, od = (n / {OW * OH}) % {OD}, "
            f"nb = n / {OW * OH * OD};")
    if ci.transposed:
        w_off = off_expr([(f"b * {ICg} + ic", ci.ws[0]), ("m", ci.ws[1]), ("kd", ci.ws[2]),
                          ("kh", ci.ws[3]), ("kw", ci.ws[4])])
    else:
        w_off = off_expr([(f"b * {OCg} + m", ci.ws[0]), ("ic", ci.ws[1]), ("kd", ci.ws[2]),
                          ("kh", ci.ws[3]), ("kw", ci.ws[4])])
    a_raw = f"{rdec} return {ci.w.ptr()}[{w_off}];"
    sd, sh, sw = ci.stride
    pd, ph, pw = ci.pad
    dd, dh, dw = ci.dil
    D, H, W = ci.sp
    x_off = off_expr([("nb", ci.xs[0]), (f"b * {ICg} + ic", ci.xs[1]), ("id", ci.xs[2]),
                      ("ih", ci.xs[3]), ("iw", ci.xs[4])])
    zero = "return @ZERO@;"
    b_body = (f"{rdec} {pdec} " + _in_coord(ci, 0, "od", "kd", "id", zero) + " "
              + _in_coord(ci, 1, "oh", "kh", "ih", zero) + " " + _in_coord(ci, 2, "ow", "kw", "iw", zero)
              + f" return {ci.x.ptr()}[{x_off}];")
    o = ci.out
    o_off = off_expr([("nb", ci.os[0]), (f"b * {OCg} + m", ci.os[1]), ("od", ci.os[2]),
                      ("oh", ci.os[3]), ("ow", ci.os[4])])
    bias = ci.bias
    pdec_n = pdec

    def epi(backend: str) -> str:
        val = "v"
        if bias is not None:
            val += " + " + load(bias.dtype, backend,
                                f"{bias.ptr()}[(b * {OCg} + m){'' if bias.strides[0] == 1 else ' * ' + str(bias.strides[0]) + 'LL'}]",
                                "acc_t")
        return (f"{pdec_n} (({otype(o.index)}*)P.out[{o.index}])[{o_off}] = "
                f"{store(o.dtype, backend, val)};")

    acc = "double" if ci.dtype == "float64" else "float"
    g = Gemm(ci.G, OCg, ci.P, ICg * ci.taps, ci.dtype, ci.dtype, acc, a_raw, b_body, epi, "k",
             "k" if cl else "n", None, None, "conv", 2.0 * ci.P * ci.OC * ICg * ci.taps)
    g.out_nfast = not (ci.os[1] == 1)
    return g


def _conv_gemm_backend(g: Gemm, backend: str) -> Gemm:
    """The GEMM with backend-specific zero literals filled in."""
    from dataclasses import replace
    return replace(g, b_raw=g.b_raw.replace("@ZERO@", raw_zero(g.b_dtype, backend)))


def _cg(task) -> Gemm:
    return _conv_gemm_backend(_conv_gemm(conv_info(task)), task.backend)


def _conv_ins(task) -> tuple[int, int]:
    ci = conv_info(task)
    return ci.w.index, ci.x.index


# ---------------------------------------------------------------------- cpu direct conv

_CPU_CONV_DIRECT = r"""
#define CG_N @N@LL
#define CG_G @G@LL
#define ICG @ICG@LL
#define OCG @OCG@LL
#define OCB @OCB@
#define D_ @D@LL
#define H_ @H@LL
#define W_ @W@LL
#define OD @OD@LL
#define OH @OH@LL
#define OW @OW@LL
#define KD @KD@
#define KH @KH@
#define KW @KW@
typedef @ACC@ acc_t;
KF_DEV acc_t kf_x(const kf_ptrs& P, int64_t off) { return @LDX@; }
KF_DEV acc_t kf_w(const kf_ptrs& P, int64_t oc, int64_t ic, int64_t kd, int64_t kh, int64_t kw) { return @LDW@; }
KF_DEV acc_t kf_bias(const kf_ptrs& P, int64_t oc) { return @LDBIAS@; }
KF_DEV void kf_o(const kf_ptrs& P, int64_t n, int64_t oc, int64_t od, int64_t oh, int64_t ow, acc_t v) { @STO@ }

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs) {
@FILL@
  if (CG_N == 0 || OD * OH * OW == 0) return 0;
  int failed = 0;
#pragma omp parallel
  {
    acc_t* row = (acc_t*)malloc(sizeof(acc_t) * OCB * OW);
    if (!row) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(3) schedule(static)
    for (int64_t n = 0; n < CG_N; ++n)
      for (int64_t ocb = 0; ocb < CG_G * OCG / OCB; ++ocb)
        for (int64_t r = 0; r < OD * OH; ++r) {
          if (!row) continue;
          const int64_t oc0 = ocb * OCB, g = oc0 / OCG, od = r / OH, oh = r % OH;
          for (int64_t e = 0; e < OCB * OW; ++e) row[e] = 0;
          for (int64_t ic = 0; ic < ICG; ++ic)
            for (int kd = 0; kd < KD; ++kd) {
              const int64_t id = od * @SD@ - @PD@ + kd * @DD@;
              if (id < 0 || id >= D_) continue;
              for (int kh = 0; kh < KH; ++kh) {
                const int64_t ih = oh * @SH@ - @PH@ + kh * @DH@;
                if (ih < 0 || ih >= H_) continue;
                const int64_t base = n * @XSN@LL + (g * ICG + ic) * @XSC@LL + id * @XSD@LL + ih * @XSH@LL;
                for (int kw = 0; kw < KW; ++kw) {
                  const int64_t off = (int64_t)kw * @DW@ - @PW@;
                  const int64_t lo = off >= 0 ? 0 : (-off + @SW@ - 1) / @SW@;
                  const int64_t hi0 = W_ - 1 - off < 0 ? 0 : (W_ - 1 - off) / @SW@ + 1;
                  const int64_t hi = hi0 < OW ? hi0 : OW;
                  acc_t wv[OCB];
                  for (int u = 0; u < OCB; ++u) wv[u] = kf_w(P, oc0 + u, ic, kd, kh, kw);
                  for (int u = 0; u < OCB; ++u) {
                    acc_t* ru = row + u * OW;
                    const acc_t wu = wv[u];
#pragma omp simd
                    for (int64_t ow = lo; ow < hi; ++ow) ru[ow] += wu * kf_x(P, base + (ow * @SW@ + off) * @XSW@LL);
                  }
                }
              }
            }
          for (int u = 0; u < OCB; ++u)
            for (int64_t ow = 0; ow < OW; ++ow) kf_o(P, n, oc0 + u, od, oh, ow, row[u * OW + ow] + kf_bias(P, oc0 + u));
        }
    free(row);
  }
  return failed ? 1 : 0;
}
"""


def _conv_direct_common(ci: ConvInfo, backend: str) -> dict:
    x, w, o = ci.x, ci.w, ci.out
    ldx = load(x.dtype, backend, f"{x.ptr()}[off]", "acc_t")
    if ci.transposed:
        widx = off_expr([(f"(oc / {ci.OCg}) * {ci.ICg} + ic", ci.ws[0]), (f"oc % {ci.OCg}", ci.ws[1]),
                         ("kd", ci.ws[2]), ("kh", ci.ws[3]), ("kw", ci.ws[4])])
    else:
        widx = off_expr([("oc", ci.ws[0]), ("ic", ci.ws[1]), ("kd", ci.ws[2]), ("kh", ci.ws[3]),
                         ("kw", ci.ws[4])])
    ldw = load(w.dtype, backend, f"{w.ptr()}[{widx}]", "acc_t")
    if ci.bias is not None:
        b = ci.bias
        ldb = load(b.dtype, backend, f"{b.ptr()}[{off_expr([('oc', b.strides[0])])}]", "acc_t")
    else:
        ldb = "(acc_t)0"
    sto = (f"(({otype(o.index)}*)P.out[{o.index}])[{off_expr([('n', ci.os[0]), ('oc', ci.os[1]), ('od', ci.os[2]), ('oh', ci.os[3]), ('ow', ci.os[4])])}] = "
           f"{store(o.dtype, backend, 'v')};")
    D, H, W = ci.sp
    OD, OH, OW = ci.osp
    KD, KH, KW = ci.ker
    return dict(N=ci.N, G=ci.G, ICG=ci.ICg, OCG=ci.OCg, D=D, H=H, W=W, OD=OD, OH=OH, OW=OW, KD=KD,
                KH=KH, KW=KW, ACC="double" if ci.dtype == "float64" else "float", LDX=ldx, LDW=ldw,
                LDBIAS=ldb, STO=sto, CD=_in_coord(ci, 0, "od", "kd", "id", "continue;"),
                CH=_in_coord(ci, 1, "oh", "kh", "ih", "continue;"),
                CW=_in_coord(ci, 2, "ow", "kw", "iw", "continue;"), SD=ci.stride[0], SH=ci.stride[1], SW=ci.stride[2],
                PD=ci.pad[0], PH=ci.pad[1], PW=ci.pad[2], DD=ci.dil[0], DH=ci.dil[1], DW=ci.dil[2],
                XSN=ci.xs[0], XSC=ci.xs[1], XSD=ci.xs[2], XSH=ci.xs[3], XSW=ci.xs[4])


def render_conv_direct_omp(task, p: dict) -> str:
    ci = conv_info(task)
    return prelude("cpu") + fill(_CPU_CONV_DIRECT, OCB=p["ocb"], FILL=entry_fill("cpu"),
                                 **_conv_direct_common(ci, "cpu"))


# ---------------------------------------------------------------------- cuda direct conv

_CUDA_CONV_DIRECT = r"""
#define CG_N @N@LL
#define CG_G @G@LL
#define ICG @ICG@LL
#define OCG @OCG@LL
#define OCPT @OCPT@
#define D_ @D@LL
#define H_ @H@LL
#define W_ @W@LL
#define OD @OD@LL
#define OH @OH@LL
#define OW @OW@LL
#define KD @KD@
#define KH @KH@
#define KW @KW@
#define THREADS @THREADS@
typedef @ACC@ acc_t;
KF_DEV acc_t kf_x(const kf_ptrs& P, int64_t off) { return @LDX@; }
KF_DEV acc_t kf_w(const kf_ptrs& P, int64_t oc, int64_t ic, int64_t kd, int64_t kh, int64_t kw) { return @LDW@; }
KF_DEV acc_t kf_bias(const kf_ptrs& P, int64_t oc) { return @LDBIAS@; }
KF_DEV void kf_o(const kf_ptrs& P, int64_t n, int64_t oc, int64_t od, int64_t oh, int64_t ow, acc_t v) { @STO@ }

__global__ void __launch_bounds__(THREADS) kf_conv_direct(kf_ptrs P) {
  const int64_t total = CG_N * CG_G * (OCG / OCPT) * OD * OH * OW;
  for (int64_t t = (int64_t)blockIdx.x * THREADS + threadIdx.x; t < total; t += (int64_t)gridDim.x * THREADS) {
    int64_t q = t;
@DECOMP@
    const int64_t oc0 = g * OCG + ocb * OCPT;
    acc_t acc[OCPT];
#pragma unroll
    for (int u = 0; u < OCPT; ++u) acc[u] = 0;
    for (int64_t ic = 0; ic < ICG; ++ic) {
#pragma unroll
      for (int kd = 0; kd < KD; ++kd) {
        @CD@
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
          @CH@
#pragma unroll
          for (int kw = 0; kw < KW; ++kw) {
            @CW@
            const acc_t xv = kf_x(P, n * @XSN@LL + (g * ICG + ic) * @XSC@LL + id * @XSD@LL + ih * @XSH@LL + iw * @XSW@LL);
#pragma unroll
            for (int u = 0; u < OCPT; ++u) acc[u] += xv * kf_w(P, oc0 + u, ic, kd, kh, kw);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < OCPT; ++u) kf_o(P, n, oc0 + u, od, oh, ow, acc[u] + kf_bias(P, oc0 + u));
  }
}

extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
@FILL@
  const int64_t total = CG_N * CG_G * (OCG / OCPT) * OD * OH * OW;
  if (total == 0) return 0;
  int64_t blocks = (total + THREADS - 1) / THREADS;
  if (blocks > 1048576) blocks = 1048576;
  kf_conv_direct<<<(unsigned)blocks, THREADS, 0, stream>>>(P);
  return (int)cudaGetLastError();
}
"""


def _conv_decomp(ci: ConvInfo, ocpt: int) -> str:
    """Output index order for threads: the output's memory order (channels-last output keeps
    channels innermost so that consecutive threads write consecutive addresses)."""
    OD, OH, OW = ci.osp
    ocb_n = ci.OCg // ocpt
    if ci.os[1] == 1 and ci.OC > 1:  # channels innermost
        dims = [("ocb", ocb_n), ("g", ci.G), ("ow", OW), ("oh", OH), ("od", OD), ("n", ci.N)]
    else:
        dims = [("ow", OW), ("oh", OH), ("od", OD), ("ocb", ocb_n), ("g", ci.G), ("n", ci.N)]
    lines = []
    for nm, sz in dims[:-1]:
        lines.append(f"    const int64_t {nm} = q % {sz}LL; q /= {sz}LL;")
    lines.append(f"    const int64_t {dims[-1][0]} = q;")
    return "\n".join(lines)


def render_conv_direct_cuda(task, p: dict) -> str:
    ci = conv_info(task)
    return prelude("cuda") + fill(_CUDA_CONV_DIRECT, OCPT=p["ocpt"], THREADS=p["threads"],
                                  FILL=entry_fill("cuda"), DECOMP=_conv_decomp(ci, p["ocpt"]),
                                  **_conv_direct_common(ci, "cuda"))


def _conv_extent(task):
    ci = conv_info(task)
    return (ci.N * ci.OC, ci.osp[0] * ci.osp[1] * ci.osp[2])


def conv_designs(task) -> list:
    ci = conv_info(task)
    if ci is None:
        return []
    out = []
    ocb_ok = lambda t, p, key: conv_info(t).OCg % p[key] == 0  # noqa: E731
    if task.backend == "cpu":
        out.append(compute_design(
            "gen_conv_omp", "cpu", cpu_gemm_space(), "conv",
            lambda t: cpu_gemm_default(_cg(t)),
            lambda t, p: cpu_gemm_valid(_cg(t), p),
            lambda t, p: render_cpu_gemm(_cg(t), p, *_conv_ins(t)),
            _conv_extent, "implicit GEMM per group (im2col while packing), OpenMP"))
        out.append(compute_design(
            "gen_conv_direct_omp", "cpu", {"ocb": (1, 2, 4, 8)}, "conv",
            lambda t: {"ocb": max(c for c in (1, 2, 4, 8) if conv_info(t).OCg % c == 0)},
            lambda t, p: ocb_ok(t, p, "ocb") and not conv_info(t).transposed, render_conv_direct_omp,
            _conv_extent,
            "direct convolution over output rows, simd along the row (depthwise, few channels)"))
    elif task.backend == "cuda":
        out.append(compute_design(
            "gen_conv_simt", "cuda", {k: v for k, v in simt_space().items() if k != "vec"} | {"vec": (1,)},
            "conv", lambda t: dict(simt_default(_cg(t)), vec=1),
            lambda t, p: simt_valid(_cg(t), p),
            lambda t, p: render_simt_gemm(_cg(t), p, *_conv_ins(t)),
            _conv_extent, "implicit GEMM per group, shared-memory tiles, register blocking"))
        if ci.dtype in HALVES:
            out.append(compute_design(
                "gen_conv_wmma", "cuda", wmma_space(), "conv",
                lambda t: wmma_default(_cg(t)),
                lambda t, p: wmma_valid(_cg(t), p),
                lambda t, p: render_wmma_gemm(_cg(t), p, *_conv_ins(t)),
                _conv_extent, "implicit GEMM per group on tensor cores (wmma, f32 accumulate)"))
        out.append(compute_design(
            "gen_conv_direct", "cuda", {"threads": (64, 128, 256, 512), "ocpt": (1, 2, 4, 8)}, "conv",
            lambda t: {"threads": 256, "ocpt": max(c for c in (1, 2, 4) if conv_info(t).OCg % c == 0)},
            lambda t, p: ocb_ok(t, p, "ocpt"), render_conv_direct_cuda, _conv_extent,
            "direct convolution, a thread per OCPT output channels of one position"))
    return [d for d in out if usable(d, task)]
