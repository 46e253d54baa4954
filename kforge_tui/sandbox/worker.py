"""The isolated worker: a supervisor that never runs candidate code, and one fresh runner process
per candidate.

    python -m kforge_tui.sandbox.worker --backend cpu|cuda|triton [--device N] [--cache-dir DIR]

Processes (all in the worker's session, so the pool's killpg takes every one):

  supervisor  talks JSON lines to the pool; builds the input sets, computes every reference
              (PyTorch eager on the region's graph, float64 for edge cases), times eager and
              torch.compile, writes poison, guards and new input values, and judges outputs.
              It never loads a candidate library: references are computed where no candidate
              was ever loaded, and nothing a candidate did can reach the next one.
  zygote      forked right after imports, before any OpenMP thread, CUDA context or task data
              exists (GNU OpenMP and CUDA do not survive a fork once used); forks runners.
  runner      one per candidate (forked by the zygote, pre-warmed: CUDA context or OpenMP pool
              ready before it is needed); maps the task's arena (sandbox/backends/arena.py),
              records the process state, loads the library, records it again, and calls the
              kernel when the supervisor says so; runs the timing loop, pausing at checked calls
              for the supervisor; exits. A crash, hang, sticky CUDA error, leftover thread,
              signal handler, timer or FP-environment change dies with it.

Triton (`--backend triton`): the device side is the cuda backend (device, stream, events, memory),
or the cpu backend when the pool set TRITON_INTERPRET=1 (no GPU: Triton's interpreter runs the
kernels in numpy on CPU tensors; CI). What differs from a C candidate, and only this:
  zygote      imports Triton (and what the loader's torch-op guard needs) before it forks.
  runner      warms Triton before any candidate exists (a tiny kernel of ours, with a trusted cache
              dir shared by runners: on a GPU Triton's cuda_utils module is built there once);
              then, instead of `ctypes.CDLL`, `triton_loader.worker_entry` checks the source
              again (the wire is not trusted), imports it from a fresh per-candidate directory
              made by the supervisor (removed afterwards) with TRITON_CACHE_DIR inside it, and
              makes the first call on set 0 (Triton's JIT, timed to the end of its work: it
              counts in the load stage, `stage_s["jit"]`, reported as the compile time). The
              census around it allows new executable mappings only from that directory and
              installed Python code. Verification calls use the guarded `entry.launch` (an aten
              op issued by the candidate's own Python is refused; a non-zero return or an
              exception fails it with the loader's message); timed calls use
              `entry.launch_fast`. Poison, guards, replay checks, edge cases, the census after
              calls and at the end, and the adjacent baselines are the C path's, unchanged.
  supervisor  `prepare` on a GPU compiles the region with Inductor (`inductor_seed.compile_region`,
              autotuned on set 0): that callable is the torch.compile baseline, and its Triton
              code on the candidate ABI is the seed, sent in the reply (`baseline["seed"]`) for
              the engine to `remember`. On the CPU there is no seed (`baseline["seed_note"]`).
  statuses    loader "compile_error" -> compile_error; "load_error"/"launch_error" (the first
              call raised or returned non-zero) -> load_error; a device fault in it -> crash;
              "torch_op" -> verify_error; "static_error" (re-check) -> static_error.

Modules: this one is the entry point; the channel is sandbox/channel.py, the zygote
sandbox/zygote.py, the supervisor sandbox/supervisor.py, the runner sandbox/runner.py (its
messages are listed there), the timing across the two sandbox/timing.py (the loop itself:
sandbox/bench.py), the runner's syscall filter sandbox/seccomp.py. Supervisor <-> runner: one
JSON object per message over a SOCK_SEQPACKET socket (never pickle: the runner runs untrusted
code).

Pool protocol (unchanged): requests `{"id", "cmd", ...}` with cmd in ping | prepare | evaluate |
exit; progress `{"id", "event": "stage", "stage"}`; one final `{"id", "ok": true, ...}` or
`{"id", "ok": false, "error"}`. File descriptor 1 is re-pointed at stderr at start-up and the
protocol uses a private duplicate (closed in the zygote and runners), so a candidate can
neither corrupt nor forge the protocol.

Memory (issue 14): the number of input sets follows free memory and the region's bytes
(`plan_sets`); an out-of-memory error anywhere in the harness is retried with fewer sets, and
when even one set does not fit the result is "infra_error", never a candidate failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

# before torch is imported: one OpenMP thread count for torch and candidates, capped
if __name__ == "__main__" or os.environ.get("KFORGE_WORKER_PROCESS"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

def _protocol_stream():
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1), fd


def thread_env() -> int:
    """Pin the OpenMP thread count before torch is imported: OMP_NUM_THREADS (or
    KFORGE_CPU_THREADS) if set, else the physical cores this process may run on; and cap the
    pool there (OMP_THREAD_LIMIT), so a candidate's num_threads(64) cannot grow it and every
    thread that appears after the runner warmed the pool is the candidate's."""
    n = os.environ.get("KFORGE_CPU_THREADS") or os.environ.get("OMP_NUM_THREADS")
    try:
        count = int(n) if n else 0
    except ValueError:
        count = 0
    if count <= 0:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except AttributeError:
            cpus = list(range(os.cpu_count() or 1))
        cores = set()
        for c in cpus:
            base = f"/sys/devices/system/cpu/cpu{c}/topology"
            try:
                with open(f"{base}/physical_package_id") as f1, open(f"{base}/core_id") as f2:
                    cores.add((f1.read().strip(), f2.read().strip()))
            except OSError:
                cores.add(("?", str(c)))
        count = max(1, len(cores))
    os.environ["OMP_NUM_THREADS"] = str(count)
    os.environ["OMP_THREAD_LIMIT"] = str(count)
    os.environ.setdefault("OMP_DYNAMIC", "false")
    return count



def main(argv=None) -> int:
    proto, proto_fd = _protocol_stream()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser(prog="kforge_tui.sandbox.worker")
    ap.add_argument("--backend", choices=("cpu", "cuda", "triton"), required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    thread_env()  # before torch is imported (OpenMP reads it once)
    import torch  # noqa: F401  (imported before the zygote forks: runners start warm)

    from kforge_tui.regions import abi, graph, meta, task  # noqa: F401
    from kforge_tui.sandbox import bench, verify  # noqa: F401
    from kforge_tui.sandbox.backends import arena, probe  # noqa: F401
    from kforge_tui.sandbox.runner import _import_triton
    from kforge_tui.sandbox.supervisor import InfraError, Worker
    from kforge_tui.sandbox.zygote import Zygote

    def send_proto(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        if args.backend == "triton":
            _import_triton()  # before the zygote forks: runners start with Triton loaded
        zygote = Zygote(args.backend, args.device, proto_fd)
        worker = Worker(args.backend, args.device, zygote, args.cache_dir)
    except Exception as e:
        send_proto({"id": 0, "ok": False, "error": f"worker start failed: {e}"})
        return 3
    describe = worker.backend.describe()
    if args.backend == "triton":
        describe += ("; Triton under its interpreter (TRITON_INTERPRET=1)" if worker.backend.name == "cpu"
                     else "; Triton")
    send_proto({"id": 0, "ok": True, "ready": True, "pid": os.getpid(), "arch": worker.backend.arch(),
                "device": describe, "device_kind": worker.backend.name})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError:
            send_proto({"id": None, "ok": False, "error": "bad request line"})
            continue
        rid, cmd = req.get("id"), req.get("cmd")

        def emit(stage: str, rid=rid) -> None:
            send_proto({"id": rid, "event": "stage", "stage": stage})

        try:
            if cmd == "ping":
                send_proto({"id": rid, "ok": True})
            elif cmd == "exit":
                send_proto({"id": rid, "ok": True})
                return 0
            elif cmd == "prepare":
                try:
                    send_proto({"id": rid, "ok": True, **worker.prepare(req, emit)})
                except InfraError as e:
                    send_proto({"id": rid, "ok": False, "infra": True, "error": str(e)[:500]})
            elif cmd == "evaluate":
                res = worker.evaluate(req, emit)
                send_proto({"id": rid, "ok": True, "result": res})
            else:
                send_proto({"id": rid, "ok": False, "error": f"unknown command {cmd!r}"})
        except Exception as e:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            send_proto({"id": rid, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]})
    return 0


if __name__ == "__main__":
    # run the package's copy of this module: the zygote, the runners and the supervisor then
    # share one set of its classes (RunnerGone) instead of __main__'s and the package's
    from kforge_tui.sandbox import worker as _package_worker

    sys.exit(_package_worker.main())


