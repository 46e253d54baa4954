"""Triton backend on the GPU: seed vs torch.compile, and candidates per minute (issue 13).

    python bench/triton_throughput.py [--candidates 40] [--regions softmax,layer_norm,...]
                                      [--record tests/fixtures/inductor] [--json out.json]

For each region (real model shapes from DESIGN.md's table):
  1. `inductor_seed.compile_region` compiles the region with Inductor on CUDA, runs it once
     (autotune) and returns the compiled callable (the torch.compile baseline) and the seed
     (that same kernel on the candidate ABI). Both are timed with triton.testing.do_bench,
     interleaved over 3 rounds on the same inputs: the seed must time within noise of the
     baseline (ratio column).
  2. Throughput: distinct points of the Inductor-seeded designs (search/codegen/triton_seed.py)
     are evaluated one after another as one worker would: check + load + first call (JIT, fresh
     TRITON_CACHE_DIR per candidate) + verify against the reference (2 input sets, poisoned
     outputs) + time (do_bench, short). Reported: candidates/min, median and p90 latency, the
     JIT share, and the best point found vs the seed.
  --record DIR writes small CUDA Inductor outputs (wrapper, input order, chosen configs) for the
  CPU tests (tests/test_triton_backend.py rewrites and runs them under the interpreter).
Target (issue 13): >= 120 candidates/min, median latency <= 3 s, per GPU worker.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def regions():
    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    bf = torch.bfloat16
    return {
        "softmax_router": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(4096, 256),)),
        "softmax_logits": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(8, 262144),)),
        "softmax_attn_bf16": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(1, 8, 2048, 2048, dtype=bf),)),
        "layer_norm_bf16": (lambda x, w, b: F.layer_norm(x, (4096,), w, b),
                            lambda: (torch.randn(8192, 4096, dtype=bf), torch.randn(4096, dtype=bf),
                                     torch.randn(4096, dtype=bf))),
        "rms_norm_bf16": (rms, lambda: (torch.randn(8192, 4096, dtype=bf), torch.randn(4096, dtype=bf))),
        "silu_mul_bf16": (lambda x: F.silu(x[:, :8192]) * x[:, 8192:],
                          lambda: (torch.randn(8192, 16384, dtype=bf),)),
        "gelu_chain": (lambda x, y: F.gelu(x * 0.5 + y), lambda: (torch.randn(4096, 4096), torch.randn(4096))),
        "group_norm_vae": (lambda x, w, b: F.group_norm(x, 32, w, b),
                           lambda: (torch.randn(1, 512, 128, 128), torch.randn(512), torch.randn(512))),
        "avg_pool": (lambda x: F.adaptive_avg_pool2d(x, 1), lambda: (torch.randn(32, 2048, 7, 7),)),
    }


SMALL = {  # recorded for the CPU tests (the interpreter runs them)
    "layer_norm_small": (lambda x, w, b: F.layer_norm(x, (32,), w, b),
                         lambda: (torch.randn(16, 32), torch.randn(32), torch.randn(32))),
    "chain_small": (lambda x, y: F.gelu(x * 2 + y).sigmoid() * torch.tanh(x),
                    lambda: (torch.randn(33, 100), torch.randn(100))),
    "fullsum_small": (lambda x: x.sum(), lambda: (torch.randn(1 << 16),)),
}


def bench(fn, rep=40):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median") * 1e3  # us


def record(out_dir: Path) -> None:
    from kforge_tui.regions.build import task_of
    from kforge_tui.search import inductor_seed as S

    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (fn, mk) in SMALL.items():
        task = task_of(fn, mk(), backend="triton")
        ins = S.example_inputs(task, "cuda")
        with torch.no_grad():
            import torch._inductor.config as icfg
            from kforge_tui.regions.graph import to_graph_module

            gm = to_graph_module(task.graph, "cuda")
            with icfg.patch(S._inductor_patches("default", cpu=False)), S.capture() as cap:
                torch.compile(gm, backend=S._backend(cap, ins), dynamic=False)(*ins)
        rec = {"task": task.to_json(), "wrapper": cap.codes[-1], "input_order": cap.input_order,
               "chosen": cap.chosen_configs(), "torch": torch.__version__,
               "device": torch.cuda.get_device_name()}
        (out_dir / f"{name}.json").write_text(json.dumps(rec, indent=1))
        print(f"recorded {name}: {len(rec['wrapper'])} chars, chosen {rec['chosen']}")


def verify(task, launch, sets, tol):
    for ins, ref in sets:
        outs = [torch.empty_strided(m.shape, m.strides, dtype=getattr(torch, m.dtype), device="cuda")
                for m in task.outputs]
        for o in outs:
            o.fill_(float("nan"))
        rc = launch(ins, outs)
        torch.cuda.synchronize()
        if rc != 0:
            return f"rc {rc}"
        for o, r in zip(outs, ref):
            rtol, atol = tol.get(str(o.dtype).replace("torch.", ""), (1e-4, 1e-5))
            e, g = r.double().reshape(o.shape), o.double()
            scale = float(e[torch.isfinite(e)].abs().max()) if e.numel() else 1.0
            bad = ~((g == e) | ((g - e).abs() <= atol * scale + rtol * e.abs()))
            if bool(bad.any()):
                return "mismatch"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=30, help="per region")
    ap.add_argument("--regions", default="")
    ap.add_argument("--record", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--reuse-seed-cache", action="store_true")
    args = ap.parse_args(argv)
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    import triton

    from kforge_tui.regions.build import task_of
    from kforge_tui.sandbox import triton_loader
    from kforge_tui.search import inductor_seed as S
    from kforge_tui.search.codegen import triton_seed

    print(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}")
    if args.record:
        record(Path(args.record))
    tol = {"float32": (1e-4, 1e-5), "bfloat16": (1.6e-2, 8e-3), "float16": (2e-3, 1e-3)}
    names = [n for n in (args.regions.split(",") if args.regions else regions())]
    table, lat_all, t_all0, n_all = [], [], time.perf_counter(), 0
    tmp = Path(tempfile.mkdtemp(prefix="kforge_triton_bench_"))
    for name in names:
        fn, mk = regions()[name]
        task = task_of(fn, mk(), backend="triton")
        ins = S.example_inputs(task, "cuda")
        t = time.perf_counter()
        call, seed, note = S.compile_region(task, ins, "cuda")
        compile_s = time.perf_counter() - t
        if seed is None:
            print(f"{name}: {note}")
            table.append({"region": name, "note": note})
            continue
        S.remember(task, seed)
        ref_sets = []
        for s in range(2):
            xs = S.example_inputs(task, "cuda", seed=10 + s)
            ref_sets.append((xs, [r.clone() for r in task.reference(xs)]))
        seed_entry = triton_loader.worker_entry(
            seed.render(), tmp / name / "seed", ins,
            [torch.empty_strided(m.shape, m.strides, dtype=getattr(torch, m.dtype), device="cuda")
             for m in task.outputs], torch.cuda.synchronize)
        if seed_entry.status != "ok":
            print(f"{name}: seed failed: {seed_entry.status} {seed_entry.message}")
            table.append({"region": name, "note": f"seed failed: {seed_entry.message}"})
            continue
        bad = verify(task, seed_entry.launch, ref_sets, tol)
        outs = [torch.empty_strided(m.shape, m.strides, dtype=getattr(torch, m.dtype), device="cuda")
                for m in task.outputs]
        from kforge_tui.regions.graph import to_graph_module

        gm = to_graph_module(task.graph, "cuda")
        mod = getattr(call, "inductor_module", None)
        base_t, mod_t, seed_t = [], [], []
        with torch.no_grad():
            for _ in range(3):  # interleaved rounds, same inputs
                base_t.append(bench(lambda: call(ins)))  # torch.compile'd region (dynamo guards)
                if mod is not None:  # Inductor's module: its kernels + thin wrapper
                    mod_t.append(bench(lambda: mod.call(list(ins))))
                seed_t.append(bench(lambda: seed_entry.launch_fast(ins, outs)))
            eager = bench(lambda: gm(*ins))
        b, sd = statistics.median(base_t), statistics.median(seed_t)
        bm = statistics.median(mod_t) if mod_t else b
        # throughput over the designs' points
        ds = triton_seed.generate(task)
        rng = random.Random(0)
        points, seen = [], set()
        for _ in range(args.candidates * 20):
            if len(points) >= args.candidates or not ds:
                break
            d = rng.choice(ds)
            p = d.default(task)
            for _k in range(rng.randint(1, 3)):
                k = rng.choice(list(d.space))
                p[k] = rng.choice(d.space[k])
            key = (d.name, json.dumps(p, sort_keys=True))
            if key in seen or not d.valid(task, p):
                continue
            seen.add(key)
            points.append((d, p))
        lat, jit, best, statuses = [], [], (sd, "seed"), {}
        t_reg = time.perf_counter()
        for i, (d, p) in enumerate(points):
            t0 = time.perf_counter()
            src = d.render(task, p)
            reuse = [seed_entry.cache_dir] if args.reuse_seed_cache else ()
            e = triton_loader.worker_entry(src, tmp / name / f"c{i}", ins, outs,
                                           torch.cuda.synchronize, reuse_cache_from=reuse)
            st = e.status
            if st == "ok":
                why = verify(task, e.launch, ref_sets, tol)
                if why:
                    st = "verify_error"
                else:
                    us = bench(lambda: e.launch_fast(ins, outs), rep=20)
                    if us < best[0]:
                        best = (us, f"{d.name} {p}")
            statuses[st] = statuses.get(st, 0) + 1
            lat.append(time.perf_counter() - t0)
            jit.append(e.jit_s)
        wall = time.perf_counter() - t_reg
        n_all += len(points)
        lat_all += lat
        row = {"region": name, "eager_us": round(eager, 2), "compile_us": round(b, 2),
               "inductor_module_us": round(bm, 2),
               "seed_us": round(sd, 2), "seed_over_compile": round(sd / bm, 3),
               "seed_ok": bad is None, "best_us": round(best[0], 2), "best": best[1],
               "candidates": len(points), "per_min": round(60 * len(points) / max(wall, 1e-9), 1),
               "median_latency_s": round(statistics.median(lat), 2) if lat else None,
               "p90_latency_s": round(sorted(lat)[int(0.9 * (len(lat) - 1))], 2) if lat else None,
               "median_jit_s": round(statistics.median(jit), 2) if jit else None,
               "statuses": statuses, "compile_region_s": round(compile_s, 1),
               "designs": [d.name for d in ds]}
        table.append(row)
        print(json.dumps(row), flush=True)
    total = time.perf_counter() - t_all0
    summary = {"candidates": n_all, "per_min_overall": round(60 * n_all / total, 1) if n_all else 0,
               "median_latency_s": round(statistics.median(lat_all), 2) if lat_all else None}
    print("SUMMARY", json.dumps(summary))
    print(f"{'region':22} {'eager':>9} {'compile':>9} {'ind.mod':>9} {'seed':>9} {'ratio':>6} {'best':>9} "
          f"{'cand/min':>8} {'med s':>6}")
    for r in table:
        if "compile_us" in r:
            print(f"{r['region']:22} {r['eager_us']:9.1f} {r['compile_us']:9.1f} "
                  f"{r['inductor_module_us']:9.1f} {r['seed_us']:9.1f} "
                  f"{r['seed_over_compile']:6.2f} {r['best_us']:9.1f} {r['per_min']:8.1f} "
                  f"{r['median_latency_s'] or 0:6.2f}")
        else:
            print(f"{r['region']:22} {r.get('note', '')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": table, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
