"""A deterministic scripted run (events plus node details) for pilot tests, snapshots and the bench.

It exercises every pane the way a real run does — profile, baselines, a tree with ok, failed and
in-flight nodes, a best node, LLM usage — without an engine, a compiler or a clock.
"""
from __future__ import annotations

import random

from kforge_tui import events as ev
from kforge_tui.summary import figure_fields

T0 = 1_767_225_600.0  # fixed epoch so snapshots do not depend on the wall clock

KERNEL = """#include <cuda_runtime.h>

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x;
    if (row >= rows) return;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[row * cols + c]);
    // block reduce (VEC)
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(x[row * cols + c] - m);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[row * cols + c] = __expf(x[row * cols + c] - m) / s;
}

extern "C" int kforge_launch(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
    softmax_rows<<<rows, 256, 0, stream>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
"""

TASKS = [("softmax", [4096, 256], "float32", 12, 3100.0, 0.21),
         ("layer_norm", [8192, 4096], "bfloat16", 24, 2200.0, 0.15),
         ("gelu", [8, 1024, 3072], "float16", 12, 900.0, 0.06)]

FAILS = ["compile_error", "verify_error", "static_error", "timeout"]


def task_id(op: str, shape: list, dtype: str) -> str:
    return f"{op}_{'x'.join(map(str, shape))}_{dtype}"


def scripted_run(nodes_per_task: int = 12, *, seed: int = 0, in_flight: int = 2,
                 finish: bool = False) -> tuple[list[ev.Event], dict[int, dict]]:
    """Events of a run part-way through (or finished) and the store rows of its nodes."""
    rng = random.Random(seed)
    side = random.Random(seed + 1)  # the side-by-side eager times: the tree's shape stays rng's
    t = T0
    out: list[ev.Event] = [ev.RunStarted(run_dir="", model="sample_models/resnet50.py", device="cuda",
                                         device_name="NVIDIA H200", proposer="built-in", ts=t),
                           ev.Phase(name="search", ts=t)]
    rows: dict[int, dict] = {}
    nid = 0
    for op, shape, dtype, calls, total, share in TASKS:
        tid = task_id(op, shape, dtype)
        out.append(ev.TaskAdded(task_id=tid, op=op, shape=shape, dtype=dtype, budget=max(64, nodes_per_task),
                                calls=calls, total_us=total, share=share, ts=t))
        out.append(ev.TaskBaseline(task_id=tid, eager_us=10.0, compiled_us=8.0, floor_us=2.0, ts=t))
        out.append(ev.TaskStatus(task_id=tid, status="searching", ts=t))
        nid += 1
        root = nid
        out.append(ev.NodeAdded(task_id=tid, node_id=root, parent_id=None, action="root", proposer="", ts=t))
        rows[root] = {"id": root, "task_id": tid, "parent_id": None, "action": "root", "source": None,
                      "status": "ok", "result": None, "prompt": None, "response": None, "proposer": ""}
        ids = [root]
        best = 1.0
        for k in range(nodes_per_task - 1):
            nid += 1
            t += 1.0
            parent = rng.choice(ids)  # random recursive tree: depth ~ log n, like MCTS
            action = rng.choice(["family:warp_per_row", "set:vec=4", "set:block=512", "llm:improve"])
            out.append(ev.NodeAdded(task_id=tid, node_id=nid, parent_id=parent, action=action,
                                    proposer="builtin", ts=t))
            ids.append(nid)
            src = KERNEL.replace("VEC", f"vec {k}")
            row = {"id": nid, "task_id": tid, "parent_id": parent, "action": action, "source": src,
                   "proposer": "builtin", "prompt": None, "response": None}
            rows[nid] = row
            if k >= nodes_per_task - 1 - in_flight and not finish:
                out.append(ev.NodeStage(task_id=tid, node_id=nid, stage=rng.choice(["compile", "verify", "time"]), ts=t))
                row.update(status="pending", result=None, message="")
                continue
            if k % 4 == 3:
                status = FAILS[(k // 4) % len(FAILS)]
                msg = {"compile_error": "error: identifier \"fmaxff\" is undefined",
                       "verify_error": "values differ on random[1]: 12/1048576 elements",
                       "static_error": "reads global memory outside the row",
                       "timeout": "kernel ran past 10 s"}[status]
                result = {"status": status, "stage": status.split("_")[0], "message": msg,
                          "log": f"kernel.cu(7): {msg}\n1 error detected", "error_line": 7,
                          "mismatch": ({"input_set": "random[1]", "max_abs_err": 0.5, "max_rel_err": 2.0,
                                        "mismatched": 12, "total": 1048576, "reason": "values differ",
                                        "first": [{"index": [3, 17], "expected": 0.25, "got": 0.75}]}
                                       if status == "verify_error" else None)}
                row.update(status=status, message=msg, result=result)
                out.append(ev.NodeFinished(task_id=tid, node_id=nid, status=status, message=msg, time_us=None,
                                           speedup=None, reward=-1.0, ts=t))
                continue
            sp = round(0.8 + 0.05 * k + rng.random() * 0.3, 3)
            tu = round(10.0 / sp, 3)
            # the eager time measured next to it varies a little (one sample of the pooled reference);
            # one node is timed on a noisy machine: the fastest, but not the best until re-timed
            eager = round(10.0 * (0.97 + 0.06 * side.random()), 3)
            noisy = k == 6
            if noisy:
                tu = round(tu * 0.7, 3)
            lo, hi = (0.6, 1.9) if noisy else (0.98, 1.03)
            sp = round(eager / tu, 3)  # what the sandbox reports: over the eager time measured with it
            result = {"status": "ok", "stage": "time", "message": f"{sp:.2f}x",
                      "timing": {"median_us": tu, "p10_us": round(tu * lo, 3), "p90_us": round(tu * hi, 3),
                                 "min_us": round(tu * lo * 0.97, 3), "n": 200, "method": "cuda events, L2 flushed"},
                      "baseline": {"median_us": eager, "p10_us": round(eager * 0.99, 3),
                                   "p90_us": round(eager * 1.02, 3), "min_us": round(eager * 0.98, 3), "n": 200},
                      "floor_us": 2.0, "resources": {"registers": 32, "spill_stores": 0}, "compile_s": 1.2,
                      "speedup": sp}
            row.update(status="ok", message=f"{sp:.2f}x", result=result, time_us=tu, speedup=sp)
            out.append(ev.NodeFinished(task_id=tid, node_id=nid, status="ok", message=f"{sp:.2f}x", time_us=tu,
                                       speedup=sp, reward=0.1, ts=t, **figure_fields(result)))
            if sp > best:
                best = sp
                out.append(ev.BestImproved(task_id=tid, node_id=nid, time_us=tu, speedup=sp, iteration=k + 1, ts=t))
        if finish:
            out.append(ev.TaskStatus(task_id=tid, status="done", ts=t))
    out.append(ev.LLMUsage(prompt_tokens=1200, completion_tokens=800, cost_usd=0.0123, ts=t))
    out.append(ev.LogLine(level="warning", message="gelu: torch.compile baseline slower than eager", ts=t))
    if finish:
        out.append(ev.RunFinished(summary={}, ts=t + 1))
    return out, rows


def main() -> int:
    """`python -m kforge_tui.tui.demo [NODES]`: the app on a scripted run (docs capture, trying keys)."""
    import sys

    from kforge_tui.tui.app import KforgeApp
    from kforge_tui.tui.details import DictDetails

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    events, rows = scripted_run(n, in_flight=3)
    app = KforgeApp(control=None, run_dir=None, details=DictDetails(rows), clock=lambda: T0 + n + 42)
    app.call_later(app.feed, events)
    app.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def write_store(run_dir, nodes_per_task: int = 6, *, finish: bool = True, delay: float = 0.0):
    """Write the scripted run into a real run store (follow-mode tests, the tmux test, docs).

    `delay` seconds between node writes imitates a headless engine writing while a viewer follows.
    Returns the store's node ids per scripted id.
    """
    import time as _time

    from kforge_tui.store import RunStore

    events, rows = scripted_run(nodes_per_task, finish=finish, in_flight=0 if finish else 1)
    store = RunStore.create(run_dir, model="sample_models/resnet50.py", settings={"budget": 64},
                            device={"backend": "cuda", "name": "NVIDIA H200"}, proposer="built-in")
    ids: dict[int, int] = {}
    try:
        for e in events:
            if isinstance(e, ev.TaskAdded):  # plain task JSON: the demo does not depend on the Task class
                meta = {"name": "x", "shape": list(e.shape), "dtype": e.dtype}
                store.add_task({"task_id": e.task_id, "op": e.op, "dtype": e.dtype, "shape": list(e.shape),
                                "inputs": [meta], "backend": "cuda", "calls": e.calls, "total_us": e.total_us,
                                "share": e.share}, e.budget)
            elif isinstance(e, ev.TaskBaseline):
                med = lambda us: {"median_us": us, "p10_us": us, "p90_us": us, "min_us": us, "n": 10}  # noqa: E731
                store.set_baseline(e.task_id, {"eager": med(e.eager_us), "compiled": med(e.compiled_us),
                                               "floor_us": e.floor_us})
            elif isinstance(e, ev.TaskStatus):
                store.set_task_status(e.task_id, e.status)
            elif isinstance(e, ev.NodeAdded):
                if e.action == "root":
                    ids[e.node_id] = store.root_node(e.task_id)
                    continue
                r = rows[e.node_id]
                ids[e.node_id] = store.add_node(e.task_id, ids[e.parent_id], action=e.action,
                                                proposer=e.proposer, source=r["source"])
            elif isinstance(e, ev.NodeFinished):
                r = rows[e.node_id]
                store.finish_node(ids[e.node_id], status=e.status, message=e.message, result=r["result"],
                                  reward=e.reward, time_us=e.time_us, speedup=e.speedup)
                if delay:
                    _time.sleep(delay)
            elif isinstance(e, ev.LLMUsage):
                store.add_llm_usage(model="built-in", prompt_tokens=e.prompt_tokens,
                                    completion_tokens=e.completion_tokens, cost_usd=e.cost_usd, ok=True)
        if finish:
            store.set_run_status("finished")
    finally:
        store.close()
    return ids
