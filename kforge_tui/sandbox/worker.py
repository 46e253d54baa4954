"""The isolated worker: the only process that loads and runs candidate code.

    python -m kforge_tui.sandbox.worker --backend cpu|cuda [--device N]

Protocol: JSON lines. Requests on stdin, `{"id", "cmd", ...}` with cmd in ping | prepare |
evaluate | exit; on stdout progress `{"id", "event": "stage", "stage"}` and one final
`{"id", "ok": true, ...}` or `{"id", "ok": false, "error"}` per request. File descriptor 1 is
re-pointed at stderr at start-up and the protocol uses a private duplicate, so a candidate's
printf (C stdio writes fd 1) lands in the stderr log instead of corrupting the protocol.

A response carrying `"fatal": true` means the device context is unusable; the worker exits right
after sending it and the pool starts a fresh one. The worker caches per task: the captured calls,
the input sets (captured + fresh draws) with their references, and the eager baseline.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass


def _protocol_stream():
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


@dataclass
class TaskState:
    """What a worker keeps per task between candidates."""

    task: object
    sets: list
    note: str
    baseline: dict
    floor: float | None
    floor_note: str


class Worker:
    MAX_TASKS = 4  # input sets of big tasks are large; keep the most recent few

    def __init__(self, backend_name: str, device_index: int):
        import torch

        self.torch = torch
        if backend_name == "cuda":
            from kforge_tui.sandbox.backends.cuda import CudaBackend

            self.backend = CudaBackend(device_index)
        else:
            from kforge_tui.sandbox.backends.cpu import CpuBackend

            self.backend = CpuBackend(device_index)
        self.backend.setup()
        self.tasks: OrderedDict[str, TaskState] = OrderedDict()
        self.evaluations = 0

    # ------------------------------------------------------------------ per task
    def prepare(self, req: dict, emit) -> dict:
        from kforge_tui.task import Task

        task = Task.from_json(req["task"]).with_backend(self.backend.name)
        st = self._state(task, req)
        out = {"baseline": st.baseline, "note": st.note}
        if req.get("with_compile") and st.baseline.get("compiled") is None:
            st.baseline["compiled"], note = self._time_compiled(st, req.get("timing"))
            if note:
                st.baseline["floor_note"] = (st.baseline.get("floor_note", "") + "; " + note).strip("; ")
        return out

    def _state(self, task, req: dict) -> TaskState:
        from kforge_tui.sandbox import bench, verify
        from kforge_tui.task import load_calls
        from kforge_tui.workload import catalogue

        tid = task.task_id
        if tid in self.tasks:
            self.tasks.move_to_end(tid)
            return self.tasks[tid]
        torch = self.torch
        cap_id = req.get("capture_id") or tid  # the id the run stored captures under
        calls = load_calls(req["run_dir"], cap_id) if req.get("run_dir") else []
        with self.backend.stream_context():
            sets, note = verify.build_sets(task, calls, n_random=3, device=self.backend.device,
                                           seed=int.from_bytes(os.urandom(4), "little"),
                                           reference=lambda inp: catalogue.reference(task, inp),
                                           min_sets=4)
            self.backend.sync()
            eager, _ = bench.time_calls(self.backend, lambda s: catalogue.reference(task, s.tensors()),
                                        sets, req.get("timing"))
            self._scrub(sets)
        bw = bench.bandwidth(self.backend, req["cache_dir"])
        moved, moved_note = catalogue.bytes_moved(task, self.backend.cache_bytes)
        floor = bench.floor_us(moved, bw["gbs"])
        floor_note = f"{moved / 1e6:.3g} MB ({moved_note}) at {bw['note']}"
        from dataclasses import asdict

        baseline = {"eager": asdict(eager), "compiled": None, "floor_us": floor,
                    "floor_note": floor_note, "bandwidth_gbs": bw["gbs"]}
        st = TaskState(task, sets, note, baseline, floor, floor_note)
        self.tasks[tid] = st
        while len(self.tasks) > self.MAX_TASKS:
            self.tasks.popitem(last=False)
        del torch
        return st

    def _scrub(self, sets) -> None:
        sizes = {s.expected.numel() * s.expected.element_size() for s in sets}
        for s in sets[:1]:
            for g in s.inputs.values():
                if g is not None:
                    sizes.add(g.nbytes)
        self.backend.scrub(sorted(sizes))

    def _time_compiled(self, st: TaskState, timing: dict | None):
        from dataclasses import asdict

        from kforge_tui.sandbox import bench
        from kforge_tui.workload import catalogue

        try:
            fn = self.torch.compile(lambda inp: catalogue.reference(st.task, inp))
            with self.backend.stream_context():
                fn(st.sets[0].tensors())
                t, _ = bench.time_calls(self.backend, lambda s: fn(s.tensors()), st.sets, timing)
                self._scrub(st.sets)
            return asdict(t), ""
        except Exception as e:  # inductor missing a compiler etc.: the baseline goes on without it
            return None, f"torch.compile unavailable: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"

    # ------------------------------------------------------------------ a candidate
    def evaluate(self, req: dict, emit) -> dict:
        import ctypes
        from dataclasses import asdict

        from kforge_tui.sandbox import bench, verify
        from kforge_tui.task import Task
        from kforge_tui.workload import catalogue

        stage_s: dict[str, float] = {}
        task = Task.from_json(req["task"]).with_backend(self.backend.name)
        st = self._state(task, req)
        self.evaluations += 1
        res = {"status": "ok", "stage": "load", "message": "", "log": "inputs: " + st.note,
               "mismatch": None, "timing": None, "baseline": st.baseline["eager"],
               "floor_us": st.floor, "stage_s": stage_s, "fatal": False}

        t = time.perf_counter()
        sig = catalogue.signature(task, self.backend.name)
        try:
            lib = ctypes.CDLL(req["lib_path"], mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            return self._fail(res, "load_error", "load", f"cannot load the library: {str(e)[:300]}")
        try:
            fn = getattr(lib, catalogue.ENTRY)
        except AttributeError:
            return self._fail(res, "load_error", "load",
                              f"missing entry point {catalogue.ENTRY} (extern \"C\" needed)")
        fn.restype = ctypes.c_int
        fn.argtypes = sig.argtypes()
        scalars = catalogue.scalar_args(task)
        stream = self.backend.stream_handle()
        arg_cache: dict[tuple, list] = {}

        def call(s) -> int:
            key = (id(s.out), tuple(id(g) for g in s.inputs.values()))
            args = arg_cache.get(key)
            if args is None:
                tensors = {n: (g.tensor if g is not None else None) for n, g in s.inputs.items()}
                args = arg_cache[key] = sig.call_args(tensors, s.out.tensor, scalars, stream)
            return fn(*args)

        stage_s["load"] = time.perf_counter() - t
        emit("verify")
        res["stage"] = "verify"
        t = time.perf_counter()
        try:
            with self.backend.stream_context():
                self._scrub(st.sets)
                mm = verify.verify_candidate(call, st.sets, task.output.dtype, self.backend.sync)
            self.backend.check_device()
        except verify.CandidateError as e:
            return self._rc_fault(res, "verify", e)
        except Exception as e:
            return self._device_fault(res, "verify", e)
        stage_s["verify"] = time.perf_counter() - t
        if mm is not None:
            res["mismatch"] = asdict(mm)
            return self._fail(res, "verify_error", "verify", mm.summary())

        emit("time")
        res["stage"] = "time"
        t = time.perf_counter()
        try:
            with self.backend.stream_context():
                self._scrub(st.sets)
                timing, mm = bench.time_calls(self.backend, call, st.sets, req.get("timing"),
                                              check_dtype=task.output.dtype)
            self.backend.check_device()
        except verify.CandidateError as e:
            return self._rc_fault(res, "time", e)
        except Exception as e:
            return self._device_fault(res, "time", e)
        stage_s["time"] = time.perf_counter() - t
        res["timing"] = asdict(timing)
        if mm is not None:
            res["mismatch"] = asdict(mm)
            return self._fail(res, "verify_error", "time", mm.summary())
        if bench.below_floor(timing.median_us, st.floor):
            return self._fail(res, "impossible_timing", "time",
                              f"median {timing.median_us:.3g} us is below the memory-roofline floor "
                              f"{st.floor:.3g} us ({st.floor_note}); not a win")
        eager = st.baseline["eager"]["median_us"]
        res["message"] = (f"{timing.median_us:.3g} us (p10 {timing.p10_us:.3g}, p90 {timing.p90_us:.3g}) "
                          f"vs eager {eager:.3g} us: {eager / timing.median_us:.2f}x")
        return res

    def _rc_text(self, msg: str) -> str:
        parts = msg.split()
        try:
            rc = int(parts[parts.index("returned") + 1])
            return msg.replace(f"returned {rc}", f"returned {self.backend.error_name(rc)}")
        except (ValueError, IndexError):
            return msg

    def _rc_fault(self, res: dict, stage: str, e: Exception) -> dict:
        """A non-zero return code; on cuda it may be a sticky error from an earlier launch."""
        from kforge_tui.sandbox.backends.cuda import FatalDeviceError

        try:
            self.backend.check_device()
        except FatalDeviceError as fe:
            res["fatal"] = True
            return self._fail(res, "crash", stage, f"{self._rc_text(str(e))}; {fe} (device context lost)")
        return self._fail(res, "verify_error", stage, self._rc_text(str(e)))

    def _device_fault(self, res: dict, stage: str, e: Exception) -> dict:
        from kforge_tui.sandbox.backends.cuda import FatalDeviceError

        try:
            self.backend.check_device()
        except FatalDeviceError as fe:
            res["fatal"] = True
            return self._fail(res, "crash", stage, f"{fe} (device context lost; worker restarted)")
        first = (str(e).splitlines() or [type(e).__name__])[0]
        res["log"] += "\n" + traceback.format_exc()
        return self._fail(res, "verify_error", stage, f"candidate raised {type(e).__name__}: {first[:300]}")

    @staticmethod
    def _fail(res: dict, status: str, stage: str, message: str) -> dict:
        res.update(status=status, stage=stage, message=message.replace("\n", " "))
        return res


def main(argv=None) -> int:
    proto = _protocol_stream()
    # OpenMP threads must not spin-wait between calls: on a small box idle spinners left by
    # a torch op (the cache flush, a check) steal the cores of the next timed call. Set before
    # torch is imported; -fopenmp candidates resolve libgomp.so.1 to the runtime torch already
    # loaded (or the system one, which reads the same variables), so eager and candidate run
    # under the same policy and thread count.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser(prog="kforge_tui.sandbox.worker")
    ap.add_argument("--backend", choices=("cpu", "cuda"), required=True)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        worker = Worker(args.backend, args.device)
    except Exception as e:
        send({"id": 0, "ok": False, "error": f"worker start failed: {e}"})
        return 3
    send({"id": 0, "ok": True, "ready": True, "pid": os.getpid(), "arch": worker.backend.arch(),
          "device": worker.backend.describe()})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError:
            send({"id": None, "ok": False, "error": "bad request line"})
            continue
        rid, cmd = req.get("id"), req.get("cmd")

        def emit(stage: str, rid=rid) -> None:
            send({"id": rid, "event": "stage", "stage": stage})

        try:
            if cmd == "ping":
                send({"id": rid, "ok": True})
            elif cmd == "exit":
                send({"id": rid, "ok": True})
                return 0
            elif cmd == "prepare":
                send({"id": rid, "ok": True, **worker.prepare(req, emit)})
            elif cmd == "evaluate":
                res = worker.evaluate(req, emit)
                send({"id": rid, "ok": True, "result": res})
                if res.get("fatal"):
                    return 4
            else:
                send({"id": rid, "ok": False, "error": f"unknown command {cmd!r}"})
        except Exception as e:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            send({"id": rid, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
