"""Exported packages: importable in a fresh interpreter that has torch and nothing of kforge."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kforge_tui.errors import UsageError, WorkFailed
from kforge_tui.integrate.export import export_run
from test_integrate import (RELU_CPP, SILU_CPP, SOFTMAX_CPP, WRONG_SOFTMAX_CPP, build_tiny, example,
                            make_run, tiny_tasks)

TORCH_SITE = str(Path(torch.__file__).resolve().parent.parent)

# The same Tiny model as test_integrate.py, rebuilt from scratch in the child (same seed).
CHILD = textwrap.dedent("""
    import json, sys
    import torch, torch.nn as nn, torch.nn.functional as F
    out = {}
    try:
        import kforge_tui
        out["kforge_importable"] = True
    except ImportError:
        out["kforge_importable"] = False

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64)
            self.act = nn.SiLU()
        def forward(self, x):
            h = self.act(self.lin(x))
            h = torch.relu(h - 0.1)
            return F.softmax(h * 3.0, dim=-1)

    torch.manual_seed(0)
    model = Tiny().eval()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        want = model(x)
    import PKG as pkg
    try:
        pkg.apply(model)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out)); sys.exit(0)
    with torch.inference_mode():
        got = model(x)
    out["counts"] = pkg.counts()
    out["max_abs_err"] = float((got - want).abs().max())
    out["got_sum"] = float(got.sum())
    pkg.remove(model)
    out["restored"] = F.softmax.__module__ == "torch.nn.functional" and "forward" not in model.__dict__
    out["modules"] = sorted(m for m in ("kforge_tui", "litellm", "textual") if m in sys.modules)
    print(json.dumps(out))
""")


def run_child(pkg_dir: Path, path_env: str | None = None) -> dict:
    """A fresh interpreter with -S -E (no site, no env paths beyond ours): sys.path is the
    export's parent and torch's site-packages only."""
    env = {"PYTHONPATH": f"{pkg_dir.parent}{os.pathsep}{TORCH_SITE}", "HOME": os.environ.get("HOME", "/"),
           "PATH": path_env if path_env is not None else os.environ.get("PATH", ""),
           "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-S", "-c", CHILD.replace("PKG", pkg_dir.name)],
                       cwd=pkg_dir.parent, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    t = tiny_tasks()
    base = tmp_path_factory.mktemp("exp")
    run = make_run(base / "run", [(t["softmax"], SOFTMAX_CPP, 1.6), (t["silu"], SILU_CPP, 1.3),
                                  (t["relu"], RELU_CPP, 0.9)])
    return export_run(run, base / "tiny_kernels"), t


def test_export_layout_and_manifest(exported):
    out, t = exported
    m = json.loads((out / "manifest.json").read_text())
    assert {p.name for p in out.iterdir()} >= {"__init__.py", "_loader.py", "manifest.json", "kernels"}
    assert m["backend"] == "cpu" and m["arch"] and m["created"][:4].isdigit()
    by_op = {k["op"]: k for k in m["kernels"]}
    assert set(by_op) == {"softmax", "silu"}
    assert by_op["softmax"]["shape"] == [4, 64] and by_op["softmax"]["dtype"] == "float32"
    assert by_op["softmax"]["speedup"] == 1.6
    assert t["relu"].task_id in m["left_to_pytorch"]
    for k in m["kernels"]:
        assert (out / k["source"]).read_text().startswith("#include")
        assert (out / k["binary"]).stat().st_size > 0
    tree = ast.parse((out / "_loader.py").read_text())
    roots = {(a.name if isinstance(n, ast.Import) else n.module).split(".")[0]
             for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert roots <= set(sys.stdlib_module_names) | {"torch", "__future__"}, roots


@pytest.mark.slow
def test_export_imports_in_a_fresh_interpreter_with_only_torch(exported):
    out, t = exported
    r = run_child(out)
    assert r["kforge_importable"] is False, "the child must not see kforge_tui"
    assert "error" not in r, r.get("error")
    assert r["counts"] == {t["softmax"].task_id: 1, t["silu"].task_id: 1}
    assert r["max_abs_err"] < 1e-6
    model, x = build_tiny(0), example()
    with torch.inference_mode():
        want = model(x)
    assert r["got_sum"] == pytest.approx(float(want.sum()), rel=1e-6)
    assert r["restored"] is True and r["modules"] == []


@pytest.mark.slow
def test_other_arch_without_compiler_is_a_clear_error(exported, tmp_path):
    out, _ = exported
    other = tmp_path / "other_kernels"
    shutil.copytree(out, other)
    m = json.loads((other / "manifest.json").read_text())
    m["arch"] = "x86_64 Imaginary CPU 9000"
    (other / "manifest.json").write_text(json.dumps(m))
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    r = run_child(other, path_env=str(empty_bin))  # no g++/c++/clang++ on PATH
    assert "error" in r
    assert "ArchMismatch" in r["error"] and "x86_64 Imaginary CPU 9000" in r["error"]
    from kforge_tui.integrate.loader import current_arch

    assert current_arch("cpu") in r["error"] and "compiler" in r["error"]
    # with a compiler on PATH the package rebuilds from its sources and works
    r = run_child(other)
    assert "error" not in r, r.get("error")
    assert r["max_abs_err"] < 1e-6 and sum(r["counts"].values()) == 2
    assert list((other / "build").glob("*/*.so"))


def test_export_bad_input(tmp_path):
    t = tiny_tasks()
    run = make_run(tmp_path / "run", [], losers=[t["softmax"]])
    with pytest.raises(WorkFailed, match="nothing to export"):
        export_run(run, tmp_path / "pkg")
    good = make_run(tmp_path / "run2", [(t["softmax"], WRONG_SOFTMAX_CPP, 2.0)])
    with pytest.raises(UsageError, match="identifier"):
        export_run(good, tmp_path / "my-kernels")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        export_run(good, busy)
    with pytest.raises(UsageError):
        export_run(tmp_path / "no-run", tmp_path / "pkg2")


def test_export_rebuilds_with_the_sandbox_flags():
    """The export's loader cannot import kforge, so it repeats the compile flags: keep them the
    flags the kernels were verified with (less the -Xptxas -v resource report)."""
    from kforge_tui.integrate.loader import build_command
    from kforge_tui.sandbox.compile import compile_flags

    for backend, arch in (("cuda", "sm_90"), ("cpu", "native")):
        got = build_command(backend, "CC", "k.src", "k.so", arch)
        want = [f for f in compile_flags(backend, arch)]
        if "-Xptxas" in want:
            i = want.index("-Xptxas")
            del want[i:i + 2]
        assert got[0] == "CC" and got[-3:] == ["-o", "k.so", "k.src"]
        assert got[1:-3] == want
