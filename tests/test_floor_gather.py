"""The roofline floor leaves out a table read only through indices: how much of it a kernel
reads depends on the index values, and the gathered elements are written to the output, which
is counted (a 262144-row embedding counted whole got a 2050 us floor against 57.6 us eager, and
every honest kernel faster than that was rejected as impossible_timing). A table also read
whole keeps its bytes."""
from __future__ import annotations

import torch

from kforge_tui.regions import floor as F
from kforge_tui.regions.build import tasks_of
from kforge_tui.regions.meta import TensorMeta
from kforge_tui.regions.task import Task


def _task(nodes: list, inputs: list[TensorMeta], outputs: list[TensorMeta], out_refs: list[str]) -> Task:
    graph = {"inputs": [m.name for m in inputs], "nodes": nodes,
             "outputs": [{"ref": r} for r in out_refs]}
    return Task("region", "compute", graph, tuple(inputs), tuple(outputs))


def _node(name: str, target: str, *args) -> dict:
    return {"name": name, "target": target, "args": list(args), "kwargs": {}}


def _only(f, *args) -> Task:
    (t,) = [t for t in tasks_of(f, args) if any(m.shape == tuple(args[0].shape) for m in t.inputs)]
    return t


def test_embedding_with_2d_indices_counts_ids_and_output():
    table = torch.nn.Embedding(1000, 16)
    t = _only(lambda i: table(i), torch.randint(0, 1000, (4, 8)))
    rows = 4 * 8
    assert F.bytes_moved(t) == rows * 8 + rows * 16 * 4  # ids, output
    assert F.floor(t, 1.0).bytes == F.bytes_moved(t)
    assert "tables read through indices left out" in F.floor(t, 1.0).note


def test_embedding_with_3d_indices_and_a_large_vocabulary():
    table = TensorMeta("in0", (262144, 256), "float32")
    ids = TensorMeta("in1", (2, 3, 4), "int64")
    out = TensorMeta("y", (2, 3, 4, 256), "float32")
    t = _task([_node("emb", "aten.embedding.default", {"ref": "in0"}, {"ref": "in1"})],
              [table, ids], [out], ["emb"])
    assert F.bytes_moved(t) == 24 * 8 + 24 * 256 * 4


def test_repeated_lookups_never_raise_the_floor_past_the_output():
    table = torch.nn.Embedding(10, 16)
    t = _only(lambda i: table(i), torch.randint(0, 10, (64,)))
    assert F.bytes_moved(t) == 64 * 8 + 64 * 16 * 4


def test_index_select_counts_the_selected_slices_along_its_dim():
    x = TensorMeta("in0", (100, 16), "float32")
    idx = TensorMeta("in1", (5,), "int64")
    rows = _task([_node("sel", "aten.index_select.default", {"ref": "in0"}, 0, {"ref": "in1"})],
                 [x, idx], [TensorMeta("y", (5, 16), "float32")], ["sel"])
    assert F.bytes_moved(rows) == 5 * 8 + 5 * 16 * 4
    cols = _task([_node("sel", "aten.index_select.default", {"ref": "in0"}, 1, {"ref": "in1"})],
                 [x, idx], [TensorMeta("y", (100, 5), "float32")], ["sel"])
    assert F.bytes_moved(cols) == 5 * 8 + 100 * 5 * 4
    # torch.index_select as traced (aten.index.Tensor), with the region's own shapes
    traced = _only(lambda a, i: torch.index_select(a, 1, i), torch.randn(100, 16), torch.randint(0, 16, (5,)))
    assert F.bytes_moved(traced) == 5 * 8 + 100 * 5 * 4


def test_gather_counts_indices_and_output():
    t = _only(lambda a, i: torch.gather(a, 1, i), torch.randn(100, 64), torch.randint(0, 64, (100, 3)))
    assert F.bytes_moved(t) == 300 * 8 + 300 * 4


def test_a_table_reached_through_a_view_is_still_gathered():
    # torch.take traces as view(-1) then index
    t = _only(lambda a, i: torch.take(a, i), torch.randn(100, 16), torch.randint(0, 1600, (7,)))
    assert [n["target"] for n in t.graph["nodes"]] == ["aten.view.default", "aten.index.Tensor"]
    assert F.bytes_moved(t) == 7 * 8 + 7 * 4


def test_a_table_also_read_whole_keeps_its_full_bytes():
    table = TensorMeta("in0", (1000, 16), "float32")
    ids = TensorMeta("in1", (4, 8), "int64")
    out = TensorMeta("y", (4, 8, 16), "float32")
    t = _task([_node("emb", "aten.embedding.default", {"ref": "in0"}, {"ref": "in1"}),
               _node("total", "aten.sum.default", {"ref": "in0"}),
               _node("add", "aten.add.Tensor", {"ref": "emb"}, {"ref": "total"})],
              [table, ids], [out], ["add"])
    assert F.bytes_moved(t) == 1000 * 16 * 4 + 32 * 8 + 32 * 16 * 4
    assert F.gathered_inputs(t) == set()
    # the ids are indices, never a table: read whole even next to a gathered table
    gathered = _task([_node("emb", "aten.embedding.default", {"ref": "in0"}, {"ref": "in1"}),
                      _node("scaled", "aten.mul.Tensor", {"ref": "emb"}, 2.0)],
                     [table, ids], [out], ["scaled"])
    assert F.gathered_inputs(gathered) == {0}


def test_a_returned_view_of_the_table_is_read_whole():
    table = TensorMeta("in0", (1000, 16), "float32")
    ids = TensorMeta("in1", (4,), "int64")
    t = _task([_node("flat", "aten.view.default", {"ref": "in0"}, [-1]),
               _node("emb", "aten.embedding.default", {"ref": "in0"}, {"ref": "in1"})],
              [table, ids], [TensorMeta("y0", (16000,), "float32"), TensorMeta("y1", (4, 16), "float32")],
              ["flat", "emb"])
    assert F.bytes_moved(t) == 1000 * 16 * 4 + 4 * 8 + 16000 * 4 + 4 * 16 * 4
