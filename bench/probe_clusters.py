"""How many thread-block clusters of each cluster_group point are resident at once (run on the GPU).

    python bench/probe_clusters.py

For group_norm [1,512,128,128] (f32, bf16) and [1,256,512,512], each point's kernel is rendered by
the family, compiled with a small main() that asks cudaOccupancyMaxActiveClusters, and run; the
table shows resident clusters against the 32 groups (clusters) the launch needs, i.e. whether the
kernel runs in one wave. Explains what the timing alone cannot (bench/NOTES.md, round 3).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_families_gpu import make  # noqa: E402

from kforge_tui.search.families import get_family  # noqa: E402
from kforge_tui.search.families.norms.common import rows_n  # noqa: E402
from kforge_tui.search.families.norms.group import _gnc_keepk  # noqa: E402

MAIN = r"""
#include <cstdio>
int main() {
  auto k = kf_gn_cluster<@T@, @V@, @U@, @K@>;
  const size_t smem = (size_t)@K@ * @T@ * sizeof(kf_pack<TI, @V@>);
  if (@CL@ > 8) cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(@GROUPS@ * @CL@, 1, 1);
  cfg.blockDim = dim3(@T@, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeClusterDimension;
  a[0].val.clusterDim.x = @CL@; a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
  cfg.attrs = a; cfg.numAttrs = 1;
  int n = -1, b = -1;
  cudaError_t e = cudaOccupancyMaxActiveClusters(&n, (void*)k, &cfg);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, @T@, smem);
  printf("%d %d %s\n", n, b, cudaGetErrorName(e));
  return 0;
}
"""

CASES = [("GN [1,512,128,128] f32", ("group_norm", (1, 512, 128, 128), "float32")),
         ("GN [1,512,128,128] bf16", ("group_norm", (1, 512, 128, 128), "bfloat16")),
         ("GN [1,256,512,512] bf16", ("group_norm", (1, 256, 512, 512), "bfloat16"))]
POINTS = [dict(cluster=c, threads=t, keep=k) for c in (2, 4, 8, 16) for t in (512, 1024) for k in (0, 64, 128)]


def main() -> int:
    fam = get_family("cluster_group", "cuda")
    jobs = []
    for name, (op, shape, dt) in CASES:
        task = make(op, shape, dt, groups=32)
        groups, _ = rows_n(task)
        d = fam.default(task)
        for o in POINTS:
            p = {**d, **o}
            if not fam.valid(task, p):
                continue
            src = fam.render(task, p) + MAIN
            for k, v in dict(T=p["threads"], V=p["vec"], U=p["unroll"], K=_gnc_keepk(task, p), CL=p["cluster"],
                             GROUPS=groups).items():
                src = src.replace(f"@{k}@", str(v))
            jobs.append((name, p, groups, src))
    work = Path(tempfile.mkdtemp(prefix="kforge_probe_"))

    def build_run(i):
        name, p, groups, src = jobs[i]
        cu, exe = work / f"p{i}.cu", work / f"p{i}"
        cu.write_text(src)
        r = subprocess.run(["nvcc", "-arch=sm_90", "-O3", str(cu), "-o", str(exe)], capture_output=True, text=True)
        if r.returncode:
            return name, p, groups, "compile failed: " + r.stderr.strip().splitlines()[-1][:100]
        return name, p, groups, subprocess.run([str(exe)], capture_output=True, text=True).stdout.strip()

    with ThreadPoolExecutor(16) as ex:
        res = list(ex.map(build_run, range(len(jobs))))
    print(f"{'case':26s} {'cluster':>7s} {'threads':>7s} {'keep KB':>7s} {'CTAs/SM':>7s} {'resident':>8s} "
          f"{'needed':>6s} {'waves':>5s}")
    for name, p, groups, out in res:
        try:
            n, b, err = out.split()
            n, b = int(n), int(b)
            waves = f"{-(-groups // n)}" if n > 0 else "-"
            print(f"{name:26s} {p['cluster']:7d} {p['threads']:7d} {p['keep']:7d} {b:7d} {n:8d} {groups:6d} "
                  f"{waves:>5s} {'' if err == 'cudaSuccess' else err}")
        except ValueError:
            print(f"{name:26s} {p['cluster']:7d} {p['threads']:7d} {p['keep']:7d}  {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
