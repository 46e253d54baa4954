"""Flash attention in Triton for the sdpa ops, at any head dimension (`gen_flash_triton`).

Why a Triton design next to the CUDA ones (attention.py): PyTorch's fused kernels stop at head
dim 256 in 16-bit and have no tensor-core path in float32, so an sdpa region outside those (SD3.5
VAE's mid-block attention, 16384 tokens of head dim 512 in float32; KernelBench 97, head dim 1024)
runs the memory-efficient kernel on CUDA cores, or the math path, and the SIMT design here is no
faster. `tl.dot` puts both GEMMs of the online softmax on tensor cores, and for float32 it offers
`tf32x3`: three TF32 products (hi*hi + hi*lo + lo*hi) whose error is float32's, so a float32
region keeps its accuracy at a third of TF32's rate (still several times the CUDA cores' rate).
`ieee` (full float32 FMA) is the other point of that axis.

One program owns BLOCK_M query rows of one (batch, head) and BLOCK_DV columns of the output:
  * scores for a BLOCK_N key tile are accumulated over the head dimension in BLOCK_D slices
    (a 512-wide Q tile would not fit in registers), scaled, masked (causal, the region's additive
    or boolean mask, keys past S) and folded into the running max / sum (online softmax);
  * the output tile, BLOCK_M x BLOCK_DV in float32, is rescaled and accumulates P @ V;
  * a head dim wider than BLOCK_DV is split over the grid's third axis: each split recomputes
    the scores (more FLOPs, fewer registers), which the search trades against BLOCK_M.
Rows whose every key is masked write 0, and the log-sum-exp the op itself gives them.
Strides, offsets, sizes and the scale are literals of the task (the region's shapes are fixed),
so one source serves any input layout: the [B, L, H, E] memory of a transformer's q, GQA's
shared K/V heads (h // GQ), a mask broadcast over batch or heads.
"""
from __future__ import annotations

from kforge_tui.regions.meta import storage_span
from kforge_tui.search.codegen.compute.attention import SDPA, AttnInfo, _attn_extent, attn_info
from kforge_tui.search.codegen.compute.base import ESIZE, HALVES, analyze, cdiv
from kforge_tui.search.codegen.kbuild import GenDesign
from kforge_tui.search.seed_model import np2

_TL = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16"}
PRECISIONS = ("tf32x3", "ieee")  # float32 only; 16-bit dots are exact products into float32
REG_BUDGET = 160  # float32 values a thread may hold across the tiles below (255 is the hardware cap)
SMEM_BUDGET = 200 * 1024  # bytes of staged tiles (H100/H200: 227 KiB per block)


def _space() -> dict:
    return {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128), "BLOCK_D": (16, 32, 64, 128),
            "BLOCK_DV": (16, 32, 64, 128, 256, 512, 1024), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3),
            "precision": PRECISIONS}


def _fits(ai: AttnInfo) -> bool:
    return ai.dtype in _TL and ai.B * ai.H <= 65535 and ai.L > 0 and ai.S > 0


def _valid(ai: AttnInfo, p: dict) -> bool:
    if not _fits(ai):
        return False
    bm, bn, bd, bdv, w = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_D"], p["BLOCK_DV"], p["num_warps"]
    if bd > max(16, np2(ai.E)) or bdv > max(16, np2(ai.Ev)) or bn > max(16, np2(ai.S)):
        return False  # a tile wider than the tensor only adds masked lanes
    if ai.dtype in HALVES and p["precision"] != PRECISIONS[0]:
        return False  # the axis means nothing for 16-bit inputs: one point of it
    threads = 32 * w
    es = ESIZE[ai.dtype]
    # in registers: the float32 accumulator, scores and probabilities, and the Q tile in its own
    # dtype (K and V tiles are staged through shared memory, counted below); counting K and V
    # here too refused Triton's own tutorial point (128 x 64 x 128, 8 warps) for bf16 head dim 128
    regs = (bm * bdv + 2 * bm * bn + bm * bd * es / 4) / threads
    if regs > REG_BUDGET:
        return False
    smem = es * p["num_stages"] * (bm * bd + bd * bn) + es * bn * bdv + 4 * bm * bn
    return smem <= SMEM_BUDGET


def _default(ai: AttnInfo) -> dict:
    """Few head-dim splits first (each one recomputes every score: at Ev 1024 in slices of 128
    the scores' FLOPs are 8x), then the rows a program holds: the output tile BLOCK_M x
    BLOCK_DV stays near 16K float32 values over 8 warps."""
    half = ai.dtype in HALVES
    bdv = max(16, min(np2(ai.Ev), 512))
    bm = 64 if bdv <= 128 else 32
    if ai.L <= 32:
        bm = 16
    if half and np2(ai.E) <= 128 and np2(ai.Ev) <= 128 and ai.L > 64:
        # Triton's own tutorial point: the whole head dim in one slice, Q loaded once per program
        bm, bd = 128, max(16, np2(ai.E))
    else:
        bd = min(max(16, np2(ai.E)), 64)
    base = {"BLOCK_M": bm, "BLOCK_N": 64 if half and bdv <= 128 else 32,
            "BLOCK_D": bd, "BLOCK_DV": bdv,
            "num_warps": 8 if bm * bdv >= 64 * 128 else 4, "num_stages": 3 if half else 2,
            "precision": "tf32x3"}
    for w in (base["num_warps"], 8):  # more warps before smaller tiles
        for bn in (base["BLOCK_N"], 32, 16):
            p = {**base, "num_warps": w, "BLOCK_N": bn}
            if _valid(ai, p):
                return p
    return base


def _i(x: int) -> str:
    return str(int(x))


def render(task, p: dict) -> str:
    ai = attn_info(task)
    q, k, v, o = ai.q, ai.k, ai.v, ai.out
    half = ai.dtype in HALVES
    prec = "" if half else f", input_precision={p['precision']!r}"
    # int64 addressing where a tensor spans past int32 (a 6 GiB KernelBench input)
    spans = [storage_span(t.shape, t.strides) + getattr(t, "offset", 0) for t in (q, k, v, o)]
    if ai.mask is not None:
        spans.append(storage_span((ai.B, ai.H, ai.L, ai.S), ai.mask_strides) + ai.mask.offset)
    wide = max(spans) >= 2 ** 31 - 1
    cast = ".to(tl.int64)" if wide else ""
    params = ["q_ptr", "k_ptr", "v_ptr"] + (["m_ptr"] if ai.mask is not None else []) + ["o_ptr"]
    params += ["lse_ptr"] if ai.lse is not None else []
    L_, S_, E_, EV = ai.L, ai.S, ai.E, ai.Ev
    lines = [
        '"""Flash attention for this sdpa region (kforge gen_flash_triton): online softmax, both',
        'GEMMs on tensor cores, the head dimension in slices."""',
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def kf_flash({', '.join(params)}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,",
        "             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):",
        "    pid_m = tl.program_id(0)",
        f"    bh = tl.program_id(1){cast}",
        "    pid_v = tl.program_id(2)",
        f"    b = bh // {_i(ai.H)}",
        f"    h = bh % {_i(ai.H)}",
        f"    hk = h // {_i(ai.H // ai.Hk)}",
        f"    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){cast}",
        f"    cols = (pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)){cast}",
        f"    row_ok = rows < {_i(L_)}",
        f"    col_ok = cols < {_i(EV)}",
        f"    q_base = q_ptr + {_i(q.offset)} + b * {_i(q.strides[0])} + h * {_i(q.strides[1])}",
        f"    k_base = k_ptr + {_i(k.offset)} + b * {_i(k.strides[0])} + hk * {_i(k.strides[1])}",
        f"    v_base = v_ptr + {_i(v.offset)} + b * {_i(v.strides[0])} + hk * {_i(v.strides[1])}",
        "    m_i = tl.full((BLOCK_M,), float('-inf'), tl.float32)",
        "    l_i = tl.zeros((BLOCK_M,), tl.float32)",
        "    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)",
    ]
    if ai.causal:  # keys past the block's last row are masked for every row of it
        lines.append(f"    hi = tl.minimum({_i(S_)}, (pid_m + 1) * BLOCK_M)")
    else:
        lines.append(f"    hi = {_i(S_)}")
    # Masks only where a tile can run past its tensor: a load under a mask that is always true
    # still costs the compare and keeps Triton from proving the access in bounds.
    full_d = E_ % p["BLOCK_D"] == 0
    q_mask = " & ".join(x for x in ("row_ok[:, None]", "" if full_d else "d_ok[None, :]") if x)
    k_mask = " & ".join(x for x in ("key_ok[None, :]", "" if full_d else "d_ok[:, None]") if x)
    q_load = (f"tl.load(q_base + rows[:, None] * {_i(q.strides[2])} + ds[None, :] * {_i(q.strides[3])}, "
              f"mask={q_mask}, other=0.0)")
    k_load = (f"tl.load(k_base + keys[None, :] * {_i(k.strides[2])} + ds[:, None] * {_i(k.strides[3])}, "
              f"mask={k_mask}, other=0.0)")
    if p["BLOCK_D"] >= E_:  # one slice: Q is loaded once per program, not per key block
        lines += ["    ds = tl.arange(0, BLOCK_D)"] + ([] if full_d else [f"    d_ok = ds < {_i(E_)}"])
        lines += [f"    qt = {q_load}"]
        scores = [f"        s = tl.dot(qt, {k_load}, tl.zeros((BLOCK_M, BLOCK_N), tl.float32){prec})"]
    else:
        scores = ["        s = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)",
                  f"        for d0 in range(0, {_i(E_)}, BLOCK_D):",
                  "            ds = d0 + tl.arange(0, BLOCK_D)"]
        scores += [] if full_d else [f"            d_ok = ds < {_i(E_)}"]
        scores += [f"            qt = {q_load}", f"            kt = {k_load}", f"            s = tl.dot(qt, kt, s{prec})"]
    lines += [
        "    for j0 in range(0, hi, BLOCK_N):",
        f"        keys = (j0 + tl.arange(0, BLOCK_N)){cast}",
        f"        key_ok = keys < {_i(S_)}",
        *scores,
        f"        s = s * {float(ai.scale)!r}",
        "        ok = row_ok[:, None] & key_ok[None, :]",
    ]
    if ai.causal:
        lines.append("        ok = ok & (keys[None, :] <= rows[:, None])")
    if ai.mask is not None:
        ms = ai.mask_strides
        addr = (f"m_ptr + {_i(ai.mask.offset)} + b * {_i(ms[0])} + h * {_i(ms[1])} + rows[:, None] * {_i(ms[2])}"
                f" + keys[None, :] * {_i(ms[3])}")
        if ai.mask.dtype == "bool":
            lines += [f"        keep = tl.load({addr}, mask=ok, other=0)",
                      "        ok = ok & (keep != 0)"]
        else:
            lines += [f"        s = s + tl.load({addr}, mask=ok, other=0.0).to(tl.float32)"]
    lines += [
        "        s = tl.where(ok, s, float('-inf'))",
        "        m_new = tl.maximum(m_i, tl.max(s, 1))",
        "        m_use = tl.where(m_new == float('-inf'), 0.0, m_new)  # a row with no key yet",
        "        p = tl.exp(s - m_use[:, None])",
        "        alpha = tl.exp(m_i - m_use)",
        "        l_i = l_i * alpha + tl.sum(p, 1)",
        f"        vt = tl.load(v_base + keys[:, None] * {_i(v.strides[2])} + cols[None, :] * {_i(v.strides[3])},",
        "                     mask=key_ok[:, None] & col_ok[None, :], other=0.0)",
        f"        acc = tl.dot(p.to({_TL[ai.dtype]}), vt, acc * alpha[:, None]{prec})",
        "        m_i = m_new",
        "    out = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)",
        f"    o_addr = o_ptr + b * {_i(o.strides[0])} + h * {_i(o.strides[1])} + rows[:, None] * {_i(o.strides[2])}"
        f" + cols[None, :] * {_i(o.strides[3])}",
        f"    tl.store(o_addr, out.to({_TL[o.dtype]}), mask=row_ok[:, None] & col_ok[None, :])",
    ]
    if ai.lse is not None:
        ls = ai.lse.strides
        # a fully masked row's log-sum-exp: +inf from the CUDA kernels, 0 from the cpu op
        empty = "0.0" if SDPA[analyze(task).target] == "cpu_flash" else "float('inf')"
        lines += [
            "    if pid_v == 0:  # one head-dim slice writes it",
            f"        lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), {empty})",
            f"        tl.store(lse_ptr + b * {_i(ls[0])} + h * {_i(ls[1])} + rows * {_i(ls[2])}, lse, mask=row_ok)",
        ]
    args = [f"inputs[{q.index}]", f"inputs[{k.index}]", f"inputs[{v.index}]"]
    if ai.mask is not None:
        args.append(f"inputs[{ai.mask.index}]")
    args.append(f"outputs[{o.index}]")
    if ai.lse is not None:
        args.append(f"outputs[{ai.lse.index}]")
    grid = (cdiv(L_, p["BLOCK_M"]), ai.B * ai.H, cdiv(EV, p["BLOCK_DV"]))
    lines += [
        "",
        "",
        "def kforge_launch(inputs, outputs):",
        f"    kf_flash[({grid[0]}, {grid[1]}, {grid[2]})]({', '.join(args)}, BLOCK_M={p['BLOCK_M']}, "
        f"BLOCK_N={p['BLOCK_N']}, BLOCK_D={p['BLOCK_D']}, BLOCK_DV={p['BLOCK_DV']}, "
        f"num_warps={p['num_warps']}, num_stages={p['num_stages']})",
        "    return 0",
    ]
    return "\n".join(lines) + "\n"


def designs(task) -> list:
    """[gen_flash_triton] for a Triton sdpa task it fits, else []."""
    ai = attn_info(task)
    if ai is None or task.backend != "triton" or not _fits(ai):
        return []
    d = GenDesign("gen_flash_triton", "triton", _space(), "attention",
                  lambda t: _default(attn_info(t)), lambda t, p: _valid(attn_info(t), p), render,
                  _attn_extent, "flash attention in Triton: tensor-core GEMMs (tf32x3 in float32), "
                  "any head dim in slices")
    return [d] if d.valid(task, d.default(task)) else []

