"""Verification and timing logic (sandbox/verify.py, sandbox/bench.py) with in-process callables
standing in for kernels: each test shows a specific way of being wrong is caught, and that an
honest implementation is not."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from kforge_tui.sandbox import bench, verify
from kforge_tui.sandbox.backends.cpu import CpuBackend
from kforge_tui.task import SUPPORTED_DTYPES, TensorStats
from kforge_tui.workload import catalogue


def softmax_task(shape=(8, 64), dtype=torch.float32):
    x = torch.randn(*shape).to(dtype)
    return catalogue.make_task("softmax", {"x": x}, {"dim": -1}, torch.softmax(x, -1))


def sets_for(task, calls=(), n_random=3):
    return verify.build_sets(task, list(calls), n_random, "cpu", 1234,
                             lambda inp: catalogue.reference(task, inp), min_sets=4)[0]


def honest(task):
    def call(s):
        s.out.tensor.copy_(catalogue.reference(task, s.tensors()))
        return 0
    return call


def test_tolerance_table_covers_every_supported_dtype():
    for dt in SUPPORTED_DTYPES:
        rtol, atol = verify.tolerance(dt)
        assert 0 < rtol < 0.05 and 0 < atol < 0.05


def test_compare_accepts_reordered_f32_and_rejects_bf16_rounding():
    x = torch.randn(16, 4096)
    ref = torch.softmax(x, -1)
    reordered = torch.softmax(x.double(), -1).float()  # a different (more exact) summation
    assert verify.compare(ref, reordered, "float32", "random[0]") is None
    rounded = ref.to(torch.bfloat16).float()
    mm = verify.compare(ref, rounded, "float32", "random[0]")
    assert mm is not None and "values differ" in mm.reason and mm.input_set == "random[0]"
    assert mm.max_rel_err > 1e-3 and mm.mismatched > 0 and len(mm.first) == verify.FIRST_N
    first = mm.first[0]
    assert ref.reshape(-1)[first["index"][0] * 4096 + first["index"][1]].item() == pytest.approx(first["expected"])


def test_compare_nan_rules():
    ref = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    assert verify.compare(ref, ref.clone(), "float32", "s") is None  # NaN matches NaN, inf matches inf
    got = ref.clone(); got[0] = float("nan")
    assert "NaN where the reference is finite" in verify.compare(ref, got, "float32", "s").reason
    got = ref.clone(); got[1] = 0.0
    assert "finite where the reference is NaN" in verify.compare(ref, got, "float32", "s").reason
    got = ref.clone(); got[3] = verify.SENTINEL
    assert "unwritten" in verify.compare(ref, got, "float32", "s", poison=verify.SENTINEL).reason


def test_honest_candidate_passes_every_dtype():
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        task = softmax_task(dtype=dt)
        assert verify.verify_candidate(honest(task), sets_for(task), task.output.dtype, lambda: None) is None


def test_skipping_elements_where_the_reference_is_nan_is_caught():
    task = softmax_task()
    calls = [{"inputs": {"x": torch.randn(8, 64)}, "stats": {}}]
    calls[0]["inputs"]["x"][3, 5] = float("nan")  # row 3 of the reference is all NaN
    sets = sets_for(task, calls)

    def lazy(s):  # writes only where the reference is finite: NaN poison would hide it
        ref = catalogue.reference(task, s.tensors())
        keep = torch.isnan(ref)
        s.out.tensor.copy_(torch.where(keep, s.out.tensor, ref))
        return 0
    mm = verify.verify_candidate(lazy, sets, "float32", lambda: None)
    assert mm is not None and "unwritten" in mm.reason and mm.input_set == "captured[0]"


def test_writing_nan_everywhere_is_caught():
    task = softmax_task()
    def nan_everywhere(s):
        s.out.tensor.fill_(float("nan"))
        return 0
    mm = verify.verify_candidate(nan_everywhere, sets_for(task), "float32", lambda: None)
    assert mm is not None and "NaN" in mm.reason


def test_input_modification_and_out_of_bounds_writes_are_caught():
    task = softmax_task()
    sets = sets_for(task)

    def scribble(s):
        honest(task)(s)
        s.inputs["x"].tensor[0, 0] += 1
        return 0
    assert "inputs modified" in verify.verify_candidate(scribble, sets, "float32", lambda: None).reason
    verify.restore_inputs(sets)

    def past_end(s):
        honest(task)(s)
        s.out.base[-1] = 0  # one byte past the end of the output, inside the guard
        return 0
    assert "outside the output" in verify.verify_candidate(past_end, sets, "float32", lambda: None).reason


def test_replaying_a_result_keyed_on_the_buffer_is_caught():
    task = softmax_task()
    memo: dict[int, torch.Tensor] = {}

    def replay(s):  # remembers the answer per input pointer: right for every set seen once
        key = s.inputs["x"].tensor.data_ptr()
        if key not in memo:
            memo[key] = catalogue.reference(task, s.tensors()).clone()
        s.out.tensor.copy_(memo[key])
        return 0
    mm = verify.verify_candidate(replay, sets_for(task), "float32", lambda: None)
    assert mm is not None and "replay check" in mm.input_set


def test_nonzero_return_code_raises_candidate_error():
    task = softmax_task()
    with pytest.raises(verify.CandidateError, match="returned 5"):
        verify.verify_candidate(lambda s: 5, sets_for(task), "float32", lambda: None)


def test_random_draws_follow_captured_statistics():
    task = softmax_task(shape=(64, 512))
    captured = torch.randn(64, 512) * 3 + 10
    captured.clamp_(4, 15)
    stats = {"x": TensorStats.of(captured).__dict__}
    sets, note = verify.build_sets(task, [{"inputs": {"x": captured}, "stats": stats}], 3, "cpu", 7,
                                   lambda inp: catalogue.reference(task, inp), min_sets=4)
    assert [s.name for s in sets] == ["captured[0]", "random[0]", "random[1]", "random[2]"]
    assert "1 captured calls + 3 random draws" in note
    for s in sets[1:]:
        x = s.inputs["x"].tensor
        assert 9 < x.mean().item() < 11 and x.min().item() >= 4 and x.max().item() <= 15
        assert not torch.equal(x, sets[1].inputs["x"].tensor) or s is sets[1]
    sets, note = verify.build_sets(task, [], 3, "cpu", 7, lambda inp: catalogue.reference(task, inp), 4)
    assert len(sets) == 4 and "no captured calls" in note and "default" in note


def test_strided_inputs_keep_their_layout():
    x = torch.randn(6, 2 * 32)
    a, b = x[:, :32], x[:, 32:]
    task = catalogue.make_task("silu_mul", {"a": a, "b": b}, {}, torch.nn.functional.silu(a) * b)
    sets = sets_for(task)
    assert sets[0].inputs["a"].tensor.stride() == (64, 1)
    assert torch.allclose(sets[0].expected, torch.nn.functional.silu(sets[0].inputs["a"].tensor)
                          * sets[0].inputs["b"].tensor)


class _Clock:
    """cpu backend without the flush cost, for fast loop tests."""

    name = "cpu"

    def flush(self):
        pass

    def start(self):
        return time.perf_counter_ns()

    def end(self, tok):
        return (time.perf_counter_ns() - tok) / 1e3

    def elapsed(self, tok):
        return tok

    def timing_method(self, k):
        return f"test clock, {k} sets"


class _DeferredClock(_Clock):
    """Like a device: end() only records a marker, elapsed() is the wait; logs the order."""

    def __init__(self):
        self.log = []

    def end(self, tok):
        self.log.append("call")
        return {"us": super().end(tok), "read": False}

    def elapsed(self, tok):
        if not tok["read"]:  # the first read is the wait; later reads of a waited marker are free
            self.log.append("wait")
            tok["read"] = True
        return tok["us"]


def test_only_checked_calls_wait_so_launch_cost_overlaps():
    """Unchecked timed calls do not wait for their end marker inside the loop (the host runs
    ahead, as in do_bench); checked ones wait before their output is read; every call is timed."""
    task = softmax_task(shape=(64, 256))
    sets = sets_for(task)
    clock = _DeferredClock()
    t, mm = bench.time_calls(clock, lambda s: catalogue.reference(task, s.tensors()), sets,
                             {"min_iters": 12, "max_iters": 12, "warmup": 2})
    assert mm is None and t.n == 12
    loop = clock.log[4:]  # after the two waited warm-up calls
    assert clock.log[:4] == ["call", "wait", "call", "wait"]
    assert loop[:12] == ["call"] * 12 and loop[12:] == ["wait"] * 12
    clock = _DeferredClock()
    t, mm = bench.time_calls(clock, honest(task), sets, {"min_iters": 12, "max_iters": 12,
                             "warmup": 0, "random_checks": 0.0}, check_dtype="float32")
    k = len(sets)
    assert mm is None and t.n == 12
    # first and last rotation checked (call, wait each); the middle calls wait at the end
    assert clock.log[:2 * k] == ["call", "wait"] * k
    middle = 12 - 2 * k
    assert clock.log[2 * k:2 * k + middle] == ["call"] * middle
    assert clock.log.count("wait") == 12


def test_timed_output_is_checked_so_work_after_return_is_caught():
    task = softmax_task(shape=(64, 256))
    sets = sets_for(task)
    t, mm = bench.time_calls(_Clock(), honest(task), sets, {"min_iters": 8, "max_iters": 8},
                             check_dtype="float32")
    assert mm is None and t.n >= 8 and t.p10_us <= t.median_us <= t.p90_us

    def escape(s):  # returns at once; the work lands later on another thread
        def later():
            time.sleep(0.01)
            s.out.tensor.copy_(catalogue.reference(task, s.tensors()))
        threading.Thread(target=later, daemon=True).start()
        return 0
    _, mm = bench.time_calls(_Clock(), escape, sets, {"min_iters": 8, "max_iters": 8, "warmup": 0},
                             check_dtype="float32")
    time.sleep(0.05)
    assert mm is not None and mm.input_set.startswith("timed-run output") and "unwritten" in mm.reason


def test_floor_and_bandwidth_cache(tmp_path):
    assert bench.floor_us(4_000_000, 4000.0) == pytest.approx(1.0)
    assert bench.below_floor(0.97, 1.0) and not bench.below_floor(0.985, 1.0)
    assert not bench.below_floor(0.5, None)

    class Fake:
        calls = 0

        def bandwidth_key(self):
            return "fake:0"

        def measure_bandwidth(self):
            Fake.calls += 1
            return 123.0, "fake copy"
    assert bench.bandwidth(Fake(), tmp_path)["gbs"] == 123.0
    assert bench.bandwidth(Fake(), tmp_path)["gbs"] == 123.0
    assert Fake.calls == 1 and (tmp_path / "bandwidth.json").exists()


def test_cpu_backend_flush_exceeds_a_cache_share_and_bandwidth_is_sane():
    be = CpuBackend()
    assert be.flush_bytes >= 16 * 2**20
    gbs, note = be.measure_bandwidth()
    assert 0.5 < gbs < 10_000 and "GB/s" in note
