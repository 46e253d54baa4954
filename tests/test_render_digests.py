"""Every kernel source the built-in proposer can render stays byte-identical across refactors.

The fixtures are plain data in tests/fixtures/render_digests/: region tasks (captured from the
snippets of tests/test_codegen.py, tests/test_codegen_compute.py and a few model-sized shapes,
bound to their pattern as capture binds them) and pattern tasks (tests/test_families.py's cases
in every dtype, and DESIGN.md's reference shapes). For each region task on each backend, every
design `designs_for` offers (families through their binding, every generator) is rendered at its
default point and at every valid one-parameter move from it; for each pattern task, every family
is rendered the same way. digests.json holds, per task and design, a sha256 over every point's
parameters and source, and per task the order of its designs (the order the proposer sees).
A refactor (moving generators between modules, splitting a family file) must leave it green.

When a change is meant to change kernels, regenerate and commit the digests with the change,
and say so in the commit message:

    python tests/test_render_digests.py            # re-render the stored tasks, rewrite digests.json
    python tests/test_render_digests.py --capture  # also re-capture the tasks (new snippets, or a
                                                   # torch that partitions differently)

Triton seeds are Inductor's own code, so they follow the installed torch and triton: those
entries are compared only when the versions match the ones recorded in digests.json.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
DATA = HERE / "fixtures" / "render_digests"
BACKENDS = ("cpu", "cuda", "triton")
TRITON_CASES = 8  # region tasks rendered for triton (Inductor's codegen costs ~1.5 s a task)


# ----------------------------------------------------------------------------- rendering

def points(design, task) -> list[dict]:
    """The default, then every valid one-parameter move from it (space order)."""
    d = design.default(task)
    out = [d]
    for k, vals in design.space.items():
        for v in vals:
            p = dict(d, **{k: v})
            if p != d and p not in out and design.valid(task, p):
                out.append(p)
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _renders(prefix: str, design, task, out: dict) -> None:
    """One entry per design: a digest over every point's parameters and rendered source (a render
    that raises is recorded as raising: it must keep raising)."""
    key = f"{prefix}|{design.name}"
    n = sum(1 for k in out if k == key or k.startswith(key + "#"))
    if n:  # two designs of one name for one task (families of one name for several ops)
        key += f"#{n}"
    parts = []
    for p in points(design, task):
        try:
            src = _digest(design.render(task, p))
        except Exception as e:
            src = f"raises {type(e).__name__}"
        parts.append(f"{json.dumps(p, sort_keys=True)}={src}")
    out[key] = _digest("\n".join(parts))


def region_tasks() -> list[tuple[str, object]]:
    from kforge_tui.regions.task import Task

    return [(r["id"], Task.from_json(r["task"])) for r in json.loads((DATA / "regions.json").read_text())]


def op_tasks() -> list[tuple[str, object]]:
    from kforge_tui.regions.meta import TensorMeta
    from kforge_tui.regions.patterns import OpTask

    out = []
    for r in json.loads((DATA / "op_tasks.json").read_text()):
        t = r["task"]
        out.append((r["id"], OpTask(op=t["op"], dtype=t["dtype"],
                                    inputs=tuple(TensorMeta.from_json(m) for m in t["inputs"]),
                                    output=TensorMeta.from_json(t["output"]), params=t["params"],
                                    backend=t["backend"])))
    return out


def render_all() -> dict[str, str]:
    from kforge_tui.search.designs import designs_for
    from kforge_tui.search.families import families_for

    out: dict[str, str] = {}
    for i, (rid, task) in enumerate(region_tasks()):
        for b in BACKENDS:
            if b == "triton" and i >= TRITON_CASES:
                continue
            tb = task.with_backend(b)
            ds = designs_for(tb)
            out[f"region:{rid}|{b}|(order)"] = _digest(" ".join(d.name for d in ds))
            for d in ds:
                _renders(f"region:{rid}|{b}", d, tb, out)
    for oid, ot in op_tasks():
        fs = families_for(ot)
        out[f"family:{oid}|(order)"] = _digest(" ".join(f.name for f in fs))
        for f in fs:
            _renders(f"family:{oid}", f, ot, out)
    return out


def versions() -> dict:
    import torch

    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    return {"torch": torch.__version__, "triton": tv}


# ----------------------------------------------------------------------------- the test

def test_every_rendered_source_is_byte_identical():
    stored = json.loads((DATA / "digests.json").read_text())
    want = stored["renders"]
    got = render_all()
    if stored["versions"] != versions():  # Inductor's code follows torch/triton: skip its entries
        want = {k: v for k, v in want.items() if "|triton|" not in k}
        got = {k: v for k, v in got.items() if "|triton|" not in k}
    changed = sorted(k for k in want if k in got and got[k] != want[k])
    lost = sorted(k for k in want if k not in got)
    new = sorted(k for k in got if k not in want)
    msg = []
    for what, keys in (("changed", changed), ("no longer rendered", lost), ("new", new)):
        if keys:
            msg.append(f"{len(keys)} {what}:\n  " + "\n  ".join(keys[:15]))
    assert not msg, ("rendered kernel sources differ from tests/fixtures/render_digests/digests.json "
                     "(if the change is meant, regenerate: see this module's docstring)\n" + "\n".join(msg))


def test_the_fixtures_are_broad():
    """Every generator kind and every registered family is exercised."""
    names = {k.rsplit("|", 1)[-1].split("#")[0] for k in json.loads((DATA / "digests.json").read_text())["renders"]}
    names.discard("(order)")
    for prefix in ("gen_pointwise", "gen_rows", "gen_cols", "gen_gemm", "gen_conv", "gen_flash", "gen_pool", "gen_gather",
                   "gen_scan", "gen_copy", "inductor"):
        assert any(n.startswith(prefix) for n in names), prefix
    from kforge_tui.search.families import all_families

    assert {f.name for f in all_families()} <= names, {f.name for f in all_families()} - names
    assert len(names) >= 40, sorted(names)


# ----------------------------------------------------------------------------- regeneration

def _snippets() -> list[tuple[str, object, tuple]]:
    """(id, callable, args) of every snippet the region fixtures come from."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(HERE))
    import test_codegen as cg
    import test_codegen_compute as cc

    out = [(k, fn, args) for k, (fn, args, _) in sorted(cg.CASES.items())]
    out += [(c[0], c[1], c[2]) for c in cc.CASES]
    bf, hf = torch.bfloat16, torch.float16
    lin16 = torch.nn.Linear(1024, 1024).half()
    conv16 = torch.nn.Conv2d(64, 64, 3, padding=1).bfloat16()
    out += [  # model-sized shapes: other defaults, split layouts, tensor-core paths
        ("big_softmax_logits", lambda x: torch.softmax(x, -1), (torch.randn(8, 262144),)),
        ("big_softmax_router", lambda x: torch.softmax(x, -1), (torch.randn(4096, 256),)),
        ("big_layer_norm_bf16", lambda x, w, b: F.layer_norm(x, (4096,), w, b),
         (torch.randn(512, 4096, dtype=bf), torch.randn(4096, dtype=bf), torch.randn(4096, dtype=bf))),
        ("big_silu_mul_bf16", lambda x: F.silu(x[:, :8192]) * x[:, 8192:], (torch.randn(64, 16384, dtype=bf),)),
        ("big_group_norm", lambda x, w, b: F.group_norm(x, 32, w, b),
         (torch.randn(1, 128, 64, 64), torch.randn(128), torch.randn(128))),
        ("big_mean_dim0", lambda x: x.mean(0), (torch.randn(65536, 256),)),
        ("big_adaptive_avg_pool", lambda x: F.adaptive_avg_pool2d(x, 1), (torch.randn(32, 2048, 7, 7),)),
        ("big_linear_f16", lin16, (torch.randn(256, 1024, dtype=hf),)),
        ("big_sdpa_f16_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         tuple(torch.randn(1, 4, 256, 64, dtype=hf) for _ in range(3))),
        ("big_conv_bf16_channels_last", conv16,
         (torch.randn(4, 64, 28, 28, dtype=bf).to(memory_format=torch.channels_last),)),
        ("big_max_pool", lambda x: F.max_pool2d(x, 3, 2, 1), (torch.randn(8, 64, 56, 56),)),
    ]
    return out


def capture() -> None:
    """Re-capture the region and pattern tasks (as workload.capture binds patterns)."""
    from dataclasses import replace

    from kforge_tui.regions import patterns
    from kforge_tui.regions.build import tasks_of

    sys.path.insert(0, str(HERE))
    from families_util import DTYPES, make
    from test_families import cases

    regions = []
    for sid, fn, args in _snippets():
        for j, t in enumerate(tasks_of(fn, args, "cpu")):
            b = patterns.match(t)
            if b is not None:
                t = replace(t, op=b.op_task.op, pattern=b.op_task.op, params={"binding": b.to_json()})
            regions.append({"id": f"{sid}#{j}", "task": t.to_json()})
    ops = []
    for backend in ("cpu", "cuda"):
        big = [  # DESIGN.md's reference shapes: the cooperative, cluster and split paths
            make("group_norm", (1, 512, 128, 128), "float32", backend, groups=32),
            make("group_norm", (1, 256, 512, 512), "bfloat16", backend, groups=32),
            make("softmax", (8, 262144), "float32", backend, dim=-1),
            make("softmax", (4096, 256), "float32", backend, dim=-1),
            make("softmax", (1, 8, 2048, 2048), "bfloat16", backend, dim=-1),
            make("layer_norm", (8192, 4096), "bfloat16", backend),
            make("rms_norm", (8192, 4096), "bfloat16", backend, variant="llama"),
            make("silu_mul", (8192, 16384), "bfloat16", backend),
            make("adaptive_avg_pool2d", (32, 2048, 7, 7), "float32", backend, output_size=[1, 1]),
            make("adaptive_avg_pool2d", (2, 64, 64, 64), "float16", backend, output_size=[1, 1]),
        ]
        for dt in DTYPES:
            for ot in cases(backend, dt) + (big if dt == DTYPES[0] else []):
                ops.append({"id": ot.task_id, "task": {
                    "op": ot.op, "dtype": ot.dtype, "inputs": [m.to_json() for m in ot.inputs],
                    "output": ot.output.to_json(), "params": ot.params, "backend": ot.backend}})
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "regions.json").write_text(json.dumps(regions, indent=0, sort_keys=True) + "\n")
    (DATA / "op_tasks.json").write_text(json.dumps(ops, indent=0, sort_keys=True) + "\n")
    print(f"captured {len(regions)} region tasks, {len(ops)} pattern tasks")


def write_digests() -> None:
    renders = render_all()
    (DATA / "digests.json").write_text(json.dumps({"versions": versions(), "renders": renders},
                                                  indent=0, sort_keys=True) + "\n")
    print(f"wrote {len(renders)} digests to {DATA / 'digests.json'}")


if __name__ == "__main__":
    if "--capture" in sys.argv[1:]:
        capture()
    write_digests()
