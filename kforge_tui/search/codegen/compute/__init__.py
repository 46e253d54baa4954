"""Generated kernels for *compute* regions: matmul (mm/addmm/bmm/baddbmm, Linear as
permute+addmm), attention (the sdpa ops) and convolution (1d/2d/3d, groups, depthwise).

A compute region is one compute op plus the pure views that only feed it (partition.py).
The views are folded into index arithmetic: `analyze` walks the region graph on meta tensors
(`as_strided` over a storage of the input's span) and records, for every tensor argument of
the compute op, which region input it reads and with which shape, strides and storage offset.
Every kernel then reads its operands through those strides and writes every output element at
the output's own strides, so any layout (transposed weights, channels_last, the [B, L, H, E]
memory of an sdpa output) is served by the same source.

`generate` (listed in codegen/__init__.py) offers the designs of one kernel family, a module each
(their docstrings describe the designs):

  gemm.py         the GEMM core; matmul: gen_gemm_omp, gen_gemm_simt, gen_gemm_wmma
  epilogue.py     the same GEMMs with the region's elementwise epilogue fused (linear+gelu)
  conv.py         implicit GEMMs on that core (gen_conv_omp / _simt / _wmma), direct kernels
                  (gen_conv_direct, gen_conv_direct_omp)
  attention.py    the sdpa ops: gen_flash_omp, gen_flash_simt, gen_flash_mma
  attention_triton.py  the sdpa ops in Triton at any head dim: gen_flash_triton (tf32x3 in f32)
  base.py         the analysis and the C helpers every family builds with (codegen/pool.py too:
                  pooling, gathers, copies and scans)

Sources are complete candidates: `#include "kforge_region.h"` then the kernel and the generic
entry point (Triton: the kernel and `kforge_launch`). No library calls, no `static` state.
"""
from __future__ import annotations

from kforge_tui.search.codegen.compute import attention_triton
from kforge_tui.search.codegen.compute.attention import SDPA, attention_designs
from kforge_tui.search.codegen.compute.base import analyze
from kforge_tui.search.codegen.compute.conv import conv_designs
from kforge_tui.search.codegen.compute.epilogue import epilogue_designs
from kforge_tui.search.codegen.compute.gemm import MM_TARGETS, matmul_designs


def generate(task) -> list:
    """Every generated compute design for this task ([] when none fits; never raises)."""
    try:
        if task.kind != "compute" or task.backend not in ("cpu", "cuda", "triton"):
            return []
        R = analyze(task)
        if task.backend == "triton":  # Triton's own designs (the seed's are triton_seed.py)
            return attention_triton.designs(task) if R is not None and R.target in SDPA else []
        if R is None:  # more than one op: a GEMM with its epilogue (partition rule 2)?
            return epilogue_designs(task)
        if R.target in MM_TARGETS:
            return matmul_designs(task)
        if R.target in SDPA:
            return attention_designs(task)
        if R.target == "aten.convolution.default":
            return conv_designs(task)
    except Exception:
        return []
    return []
