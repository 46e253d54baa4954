"""Exported packages: importable in a fresh interpreter that has torch and nothing of kforge,
compiling the model in place with the exported kernels; rebuilt from source on another machine."""
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
from test_integrate import CHAIN_CPP, WRONG_CPP, Tiny, chain_task, make_run

TORCH_SITE = str(Path(torch.__file__).resolve().parent.parent)

CHILD = textwrap.dedent("""
    import inspect, json, sys
    import torch, torch.nn as nn, torch.nn.functional as F
    out = {}
    try:
        import kforge_tui
        out["kforge_importable"] = True
    except ImportError:
        out["kforge_importable"] = False
    D, ROWS = 64, 4
    MODEL_SRC
    torch.manual_seed(0)
    model = Tiny().eval()
    x = torch.randn(ROWS, D, generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        want = model(x)
    try:
        import PKG as pkg
        pkg.apply(model)
        with torch.inference_mode():
            got = model(x)
        out["max_abs_err"] = float((got - want).abs().max())
        out["counts"] = pkg.counts()
        pkg.remove(model)
        out["restored"] = model._compiled_call_impl is None
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["modules"] = sorted(m for m in ("kforge_tui", "litellm", "textual") if m in sys.modules)
    print(json.dumps(out))
""")


def run_child(pkg_dir: Path, path_env: str | None = None) -> dict:
    """A fresh interpreter with -S (no site): sys.path is the export's parent and torch's
    site-packages only."""
    import inspect

    env = {"PYTHONPATH": f"{pkg_dir.parent}{os.pathsep}{TORCH_SITE}", "HOME": os.environ.get("HOME", "/"),
           "PATH": path_env if path_env is not None else os.environ.get("PATH", ""),
           "OMP_NUM_THREADS": "1", "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    src = CHILD.replace("PKG", pkg_dir.name).replace("MODEL_SRC", textwrap.indent(
        inspect.getsource(Tiny), "").replace("\n", "\n"))
    p = subprocess.run([sys.executable, "-S", "-c", src], cwd=pkg_dir.parent, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("exp")
    task = chain_task()
    run = make_run(base / "run", [(task, CHAIN_CPP, 20.0, 15.0, 5.0)])
    return export_run(run, base / "tiny_kernels", force=True), task


def test_export_layout_and_manifest(exported):
    out, task = exported
    m = json.loads((out / "manifest.json").read_text())
    assert {p.name for p in out.iterdir()} >= {"__init__.py", "_kforge", "manifest.json", "kernels"}
    assert m["backend"] == "cpu" and m["arch"] and m["created"][:4].isdigit()
    (k,) = m["kernels"]
    assert k["key"] == task.key and k["graph"] == task.graph
    assert (out / k["source"]).read_text().startswith('#include "kforge_region.h"')
    assert (out / k["header"]).read_text() == task.header()
    assert (out / k["binary"]).stat().st_size > 0
    assert any("{arch}" in f for f in m["flags"])
    for f in (out / "_kforge").glob("*.py"):
        tree = ast.parse(f.read_text())
        roots = {(a.name if isinstance(n, ast.Import) else (n.module or "")).split(".")[0]
                 for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and not getattr(n, "level", 0) for a in n.names}  # siblings are relative
        # triton comes with torch's CUDA build, and is imported only to load a Triton kernel
        extra = {"triton"} if f.name == "triton_region.py" else set()
        assert roots <= set(sys.stdlib_module_names) | {"torch", "__future__", "kforge_tui"} | extra, (f, roots)


@pytest.mark.slow
def test_export_runs_in_a_fresh_interpreter_with_only_torch(exported):
    out, task = exported
    r = run_child(out)
    assert r["kforge_importable"] is False, "the child must not see kforge_tui"
    assert "error" not in r, r.get("error")
    assert r["counts"] == {task.task_id: 1} and r["max_abs_err"] < 1e-6
    assert r["restored"] is True and r["modules"] == []


@pytest.mark.slow
def test_other_arch_without_compiler_is_a_clear_error_and_rebuilds_with_one(exported, tmp_path):
    from kforge_tui.integrate.runtime import current_arch

    out, _ = exported
    other = tmp_path / "other_kernels"
    shutil.copytree(out, other)
    m = json.loads((other / "manifest.json").read_text())
    m["arch"] = "x86_64 Imaginary CPU 9000"
    (other / "manifest.json").write_text(json.dumps(m))
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    r = run_child(other, path_env=str(empty_bin))  # no g++/c++/clang++ on PATH
    assert "ArchMismatch" in r["error"] and "x86_64 Imaginary CPU 9000" in r["error"]
    assert current_arch("cpu") in r["error"] and "compiler" in r["error"]
    r = run_child(other)  # with a compiler on PATH the package rebuilds from its sources
    assert "error" not in r, r.get("error")
    assert r["max_abs_err"] < 1e-6 and sum(r["counts"].values()) == 1
    assert list((other / "build").glob("*/*.so"))


def test_export_bad_input(tmp_path):
    task = chain_task()
    good = make_run(tmp_path / "run2", [(task, WRONG_CPP, 20.0, 15.0, 5.0)])
    with pytest.raises(UsageError, match="identifier"):
        export_run(good, tmp_path / "my-kernels", force=True)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        export_run(good, busy, force=True)
    # a run whose whole-model check never ran exports nothing: the model has not decided
    with pytest.raises(WorkFailed, match="has not been measured"):
        export_run(good, tmp_path / "pkg0")
    slow = make_run(tmp_path / "run3", [(task, CHAIN_CPP, 20.0, 15.0, 19.0)])  # loses to compile
    with pytest.raises(WorkFailed, match="nothing to export"):
        export_run(slow, tmp_path / "pkg", force=True)
    with pytest.raises(UsageError):
        export_run(tmp_path / "no-run", tmp_path / "pkg2")
