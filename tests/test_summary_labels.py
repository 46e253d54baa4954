"""The final tables name every region so that a user can tell them apart, and the plan's time
estimate for the end-to-end check follows the model (held-out CPU sweep, 2026-12-07: a GNN
layer's two `index_select`s read `index 2000x64` twice, the end-to-end lines named task ids, and
a 40-second run was planned at "about 6 min")."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kforge_tui import cli
from kforge_tui.regions.build import tasks_of
from kforge_tui.regions.meta import TensorMeta
from kforge_tui.store import RunStore
from kforge_tui.summary import format_end_to_end, format_show, region_details, show_json


def message(x, edge_index):
    """A GNN layer's messages: two gathers of one table, at one shape, from two source lines."""
    src, dst = edge_index[0], edge_index[1]
    xs = torch.index_select(x, 0, src)
    xd = torch.index_select(x, 0, dst)
    return torch.relu(torch.cat([xs, xd], dim=-1))


def _line_of(code: str) -> str:
    """`test_summary_labels.py:N` of the line of this file that holds `code`."""
    lines = Path(__file__).read_text().splitlines()
    return f"{Path(__file__).name}:{next(i for i, ln in enumerate(lines, 1) if code in ln)}"


@pytest.fixture(scope="module")
def gathers():
    """The two `index` regions of `message`, captured as a run captures them."""
    tasks = tasks_of(message, (torch.randn(200, 16), torch.randint(0, 200, (2, 1600))))
    xs, xd = sorted((t for t in tasks if t.op == "index"), key=lambda t: t.source)
    assert (xs.shape, xs.dtype) == (xd.shape, xd.dtype) and xs.task_id != xd.task_id
    return xs, xd


def _run(tmp_path, tasks, end_to_end: dict | None = None) -> str:
    run = tmp_path / "run"
    store = RunStore.create(run, model="gnn.py", settings={}, device={"backend": "cpu"}, proposer="builtin")
    try:
        for t in tasks:
            store.add_task(t, 3)
        if end_to_end is not None:
            store.set_end_to_end(dict(end_to_end, run_dir=str(run)))
    finally:
        store.close()
    return str(run)


def _rows(tmp_path, tasks) -> list[dict]:
    return show_json(_run(tmp_path, tasks))["tasks"]


def test_two_regions_of_one_op_and_shape_are_told_apart_by_their_source_line(tmp_path, gathers):
    xs, xd = gathers
    table = format_show(show_json(_run(tmp_path, [xs, xd])), width=120).splitlines()
    shape = "x".join(map(str, xs.shape))
    rows = [ln for ln in table if ln.startswith("index") and f" {shape} " in ln]
    assert len(rows) == 2, table
    assert rows[0].startswith(f"index ({_line_of('xs = torch.index_select')})"), rows
    assert rows[1].startswith(f"index ({_line_of('xd = torch.index_select')})"), rows


def test_what_differs_is_said_and_an_ordinal_only_when_nothing_does(tmp_path, gathers):
    xs, xd = gathers
    half = replace(xs, inputs=tuple(replace(m, dtype="float16") if m.dtype == "float32" else m for m in xs.inputs))
    assert region_details(_rows(tmp_path / "dtype", [xs, half])) == ["float32", "float16"]

    wider = replace(xs, inputs=(xs.inputs[0], replace(xs.inputs[1], shape=(100, 16), stride=(16, 1))))
    shapes = "x".join(map(str, xs.shape))
    assert region_details(_rows(tmp_path / "inputs", [xs, wider])) == [f"inputs {shapes}, 200x16",
                                                                       f"inputs {shapes}, 100x16"]

    x = TensorMeta("x", (2, 8, 4, 4), "float32", (128, 16, 4, 1))
    nhwc = replace(x, stride=(128, 1, 32, 8))
    relu = replace(xs, op="relu", inputs=(x,), outputs=(x,))
    assert region_details(_rows(tmp_path / "layout", [relu, replace(relu, inputs=(nhwc,), outputs=(nhwc,))])) == \
        ["contiguous", "channels-last"]

    same_line = replace(xd, source=xs.source)  # another graph, nothing a user reads differs
    assert region_details(_rows(tmp_path / "alike", [xs, same_line])) == ["#1", "#2"]


def test_the_end_to_end_lines_name_regions_as_the_table_does(tmp_path, gathers):
    xs, xd = gathers
    shape = "x".join(map(str, xs.shape))
    report = {"eager_ms": 1.0, "compile_ms": 0.9, "patched_ms": 0.9, "speedup": 1.1, "speedup_vs_compile": 1.0,
              "max_abs_err": 0.0, "within_tolerance": True, "mode": "compile",
              "kernels_used": {xs.task_id: 1},
              "decision": {"trials": [{"task_id": xs.task_id, "op": "index", "shape": list(xs.shape), "kept": True,
                                       "why": "+3.0 % on the whole forward"}]},
              "skipped": {xd.task_id: "no verified kernel"}}
    run = _run(tmp_path, [xs, xd], report)
    xs_name = f"index {shape} ({_line_of('xs = torch.index_select')})"
    xd_name = f"index {shape} ({_line_of('xd = torch.index_select')})"
    stored = show_json(run)
    for text in (format_end_to_end(stored["end_to_end"]),  # `kforge apply`: read from the run
                 format_show(stored, width=160)):  # the final table's report: the run's rows
        assert f"  left to PyTorch / Inductor {xd_name}: no verified kernel" in text, text
        assert f"  kept {xs_name}: +3.0 %" in text and f"  kernel {xs_name}: 1 calls" in text, text
        assert xs.task_id not in text and xd.task_id not in text, text


def _plan(*argv: str) -> str:
    args = cli.build_parser().parse_args(["optimize", "m.py", "--device", "cpu", *argv])
    return cli._plan(cli._settings_from_args(args, device="cpu")[0], args)


def test_the_end_to_end_estimate_follows_the_model_not_a_fixed_four_minutes():
    with_check, without = _plan("--top", "2", "--budget", "3", "--apply"), _plan("--top", "2", "--budget", "3")

    def headline(plan: str) -> str:
        return plan.split("; about ")[1].split(" on this CPU")[0]

    assert headline(with_check) == headline(without), (with_check, without)  # no 240 s added to every model
    assert with_check.endswith(", and 20 s (a small model) to 3 min (ResNet-50) for the end-to-end check"), \
        with_check
    assert "end-to-end check (" not in without.split(";")[1]
    # the measured checks: 15-20 s for 2 regions of small CPU models (forwards 6-70 ms),
    # 190 s for ResNet-50's (forwards 0.3 s)
    assert 12 <= cli.end_to_end_seconds(2, *cli.SMALL_MODEL) <= 25
    assert 150 <= cli.end_to_end_seconds(3, *cli.RESNET50) <= 240
    # each region's winner is compiled into the whole model and timed there
    assert cli.end_to_end_seconds(3, 0.01, 5.0) > cli.end_to_end_seconds(2, 0.01, 5.0)
    assert cli.end_to_end_seconds(2, 0.3, 5.0) > cli.end_to_end_seconds(2, 0.01, 5.0)


def test_a_region_with_nothing_verified_says_why_its_candidates_failed(tmp_path, gathers):
    """`show` of a region whose every candidate failed names the failures by status and the
    newest message of the most frequent one (KernelBench 97 on an H100, 2026-12-07: 8 of 20
    evaluated, none verified, and the table said only "0 verified"); a region with a verified
    kernel gets no such line."""
    xs, xd = gathers
    run = _run(tmp_path, [xs, xd])
    store = RunStore.open(run)
    try:
        for task, status, message in [
                (xs, "compile_error", "nvcc: expected a ';'"),
                (xs, "verify_error", "values differ beyond tolerance on random[0]"),
                (xs, "verify_error", "edge-case inputs (tiny and denormal): error up to 3 ulps"),
                (xd, "compile_error", "nvcc failed"), (xd, "ok", "12.3 us")]:
            node = store.add_node(task.task_id, None, action="expand", proposer="builtin", source="// k")
            store.finish_node(node, status=status, message=message, result=None, reward=0.0)
    finally:
        store.close()
    data = show_json(run)
    by_id = {t["task_id"]: t for t in data["tasks"]}
    assert [(f["status"], f["n"]) for f in by_id[xs.task_id]["failures"]] == [("verify_error", 2),
                                                                           ("compile_error", 1)]
    assert by_id[xs.task_id]["failures"][0]["message"].startswith("edge-case inputs")  # the newest
    assert by_id[xd.task_id]["verified"]
    said = [ln for ln in format_show(data, width=200).splitlines() if "nothing verified" in ln]
    assert len(said) == 1, said
    assert said[0].startswith(f"index {'x'.join(map(str, xs.shape))} ({_line_of('xs = torch.index_select')})")
    assert "nothing verified (2 verify_error, 1 compile_error); latest verify_error: edge-case inputs" in said[0]
