"""The honest-kernel sweep (issue 21's "honest kernels lose nothing"): 24 region kinds x
{float32, bfloat16, float16}, every family and generated design at its default point, through the
real EvaluatorPool("cpu") (static check, compile + binary and instruction checks, a fresh runner
under the syscall filter, verification, every timed call checked). Prints one line per failure and
a last line `N of M verified`.

    python3 tests/cheats/honest_sweep.py [--dtypes float32,bfloat16,float16] [--workers 2]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

F = torch.nn.functional


def regions():
    """name -> (callable, input builder(dtype))."""
    g = torch.Generator().manual_seed(0)

    def r(*s, scale=1.0):
        return lambda dt: (torch.randn(*s, generator=g) * scale).to(dt)

    def rms(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    def new_gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))

    return {
        "softmax_odd_rows": (lambda x: torch.softmax(x, -1), [r(37, 129)]),
        "softmax_dim0": (lambda x: torch.softmax(x, 0), [r(64, 48)]),
        "softmax_long_row": (lambda x: torch.softmax(x, -1), [r(1, 70000)]),
        "layer_norm_transposed": (lambda x, w, b: F.layer_norm(x.t(), (64,), w, b), [r(64, 32), r(64), r(64)]),
        "rms_norm_handwritten": (rms, [r(16, 256), r(256)]),
        "new_gelu": (new_gelu, [r(32, 256)]),
        "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [r(32, 256)]),
        "silu_mul_slices": (lambda x: F.silu(x[:, :128]) * x[:, 128:], [r(32, 256)]),
        "group_norm": (lambda x, w, b: F.group_norm(x, 4, w, b), [r(2, 16, 8, 8), r(16), r(16)]),
        "batch_norm_relu": (lambda x, m, v, w, b: torch.relu(F.batch_norm(x, m, v, w, b, False, 0.1, 1e-5)),
                            [r(4, 8, 6, 6), r(8), lambda dt: torch.rand(8, generator=g).to(dt) + 0.5, r(8), r(8)]),
        "column_mean": (lambda x: x.mean(0), [r(128, 64)]),
        "full_sum": (lambda x: x.sum(), [r(64, 64)]),
        "mse": (lambda a, b: F.mse_loss(a, b), [r(32, 64), r(32, 64)]),
        "avg_pool": (lambda x: F.avg_pool2d(x, 2), [r(2, 4, 8, 8)]),
        "max_pool": (lambda x: F.max_pool2d(x, 2), [r(2, 4, 8, 8)]),
        "cumsum": (lambda x: torch.cumsum(x, -1), [r(16, 64)]),
        "where": (lambda x, y: torch.where(x > 0, x, y), [r(32, 64), r(32, 64)]),
        "linear": (lambda x, w, b: F.linear(x, w, b), [r(16, 32), r(24, 32), r(24)]),
        "bmm": (lambda a, b: torch.bmm(a, b), [r(4, 8, 16), r(4, 16, 8)]),
        "conv": (lambda x, w: F.conv2d(x, w, padding=1), [r(1, 4, 8, 8), r(6, 4, 3, 3)]),
        "causal_sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        [r(1, 2, 16, 8), r(1, 2, 16, 8), r(1, 2, 16, 8)]),
        "embedding": (lambda i, w: F.embedding(i, w), [lambda dt: torch.randint(0, 50, (8, 6), generator=g),
                                                      r(50, 16)]),
        "argmax": (lambda x: torch.argmax(x, -1), [r(32, 64)]),
        "clamp_pow_chain": (lambda x: torch.clamp(x, -2, 2).pow(2) + 1, [r(32, 64)]),
    }


async def main(args) -> int:
    from kforge_tui.regions.build import task_of
    from kforge_tui.sandbox.pool import EvaluatorPool
    from kforge_tui.search.designs import designs_for

    cache, run_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    pool = EvaluatorPool("cpu", cache_dir=cache, workers=args.workers, eval_timeout_s=120)
    await pool.start()
    jobs, skipped = [], []
    for name, (fn, builders) in regions().items():
        for dt in args.dtypes.split(","):
            dtype = getattr(torch, dt)
            try:
                task = task_of(fn, tuple(b(dtype) for b in builders), backend="cpu")
            except Exception as e:  # noqa: BLE001
                skipped.append(f"{name}/{dt}: no task ({type(e).__name__}: {e})")
                continue
            for d in designs_for(task):
                try:
                    p = d.default(task)
                    if not d.valid(task, p):
                        continue
                    src = d.render(task, p)
                except Exception as e:  # noqa: BLE001
                    skipped.append(f"{name}/{dt}/{d.name}: no render ({e})")
                    continue
                jobs.append((f"{name}/{dt}/{d.name}", task, src))
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(args.workers * 2)

    async def one(label, task, src):
        async with sem:
            return label, await pool.evaluate(task.to_json(), run_dir, src)

    results = await asyncio.gather(*(one(*j) for j in jobs))
    await pool.close()
    ok = 0
    for label, r in results:
        if r.status == "ok":
            ok += 1
        else:
            print(f"FAIL {label}: {r.status} {r.message[:300]}")
    for s in skipped:
        print(f"skip {s}")
    print(f"{ok} of {len(results)} verified ({time.perf_counter() - t0:.0f} s, {len(skipped)} skipped)")
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--workers", type=int, default=2)
    sys.exit(asyncio.run(main(ap.parse_args())))
