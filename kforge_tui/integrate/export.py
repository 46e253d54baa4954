"""`kforge export RUN_DIR OUT_DIR`: a package that needs only torch to put the winners in.

OUT_DIR becomes an importable package: `__init__.py` (apply(model) / remove(model)), `_kforge/`
(verbatim copies of integrate/runtime.py, kernel_spec.py, triton_region.py and region_op.cpp and of regions/graph.py,
partition.py, rewrite.py and trace.py, which import only torch and the standard library: the
torch.compile backend, the C++ region op (built on first use with torch.utils.cpp_extension,
or Python calls where no compiler is there) and the partitioner that finds the regions again), `kernels/` (each winner's source, its ABI header
and its prebuilt binary; a Triton winner's source alone, which Inductor compiles where it runs) and `manifest.json` (regions, shapes, dtypes, measured speedups,
device, compile flags, date). `apply(model)` compiles the model in place with the kforge
backend, as `kforge_tui.apply` does. Binaries are built for the architecture the run was
verified on; on another GPU/CPU the package rebuilds them from source when a compiler is
there, else apply() raises one clear error naming both architectures.
"""
from __future__ import annotations

import datetime as _dt
import json
import shutil
from pathlib import Path

from kforge_tui.errors import UsageError, WorkFailed
from kforge_tui.integrate import runtime as rt
from kforge_tui.integrate.patch import build, spec_for, winners

FORMAT = 2

INIT_TEMPLATE = '''"""Kernels found by kforge-tui for {model!r} ({n} kernel(s), {arch}, exported {date}).

Needs only torch. Usage:
    import {name}
    {name}.apply(model)    # compiles model in place; the exported regions run these kernels
    {name}.remove(model)
See manifest.json for regions, shapes, dtypes and measured speedups.
"""
import json as _json
from pathlib import Path as _Path

from ._kforge import runtime as _loader

_HERE = _Path(__file__).resolve().parent
manifest = _json.loads((_HERE / "manifest.json").read_text())
_runtime = None


def runtime():
    """Load (or, on another architecture, rebuild) the kernels once per process."""
    global _runtime
    if _runtime is None:
        _runtime = _loader.load_export(_HERE)
    return _runtime


def apply(model, mode="compile", inductor_mode=None):
    """Compile `model` in place (torch.compile with the kforge backend): each exported region
    runs its kernel, everything else is Inductor's (mode="eager": run eagerly instead)."""
    _loader.install(model, runtime(), manifest["backend"], mode=mode, inductor_mode=inductor_mode)
    return model


def remove(model):
    """Undo apply(); True if something was removed."""
    return _loader.uninstall(model)


def counts():
    """task_id -> calls that ran a kernel so far in this process."""
    return dict(runtime().counts)


def fallbacks():
    return runtime().fallbacks
'''


def _check_out_dir(out: Path) -> None:
    if not out.name.isidentifier():
        raise UsageError(f"{out}: the export is a Python package, so its name must be an identifier "
                         f"(letters, digits, underscores), e.g. {''.join(c if c.isalnum() else '_' for c in out.name)}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").exists():
        raise UsageError(f"{out} exists, is not empty and is not an earlier export; choose another OUT_DIR")


def export_run(run_dir, out_dir, *, min_speedup: float = 1.02, mode: str = "compile",
               inductor_mode: str | None = None, force: bool = False) -> Path:
    """Write the kernels RUN_DIR's whole-model check kept in `mode` (as `apply` puts them in; every
    admitted candidate with `force`) as a torch-only package."""
    from kforge_tui._version import __version__
    from kforge_tui.device import nvcc_path
    from kforge_tui.sandbox.compile import compile_flags

    out = Path(out_dir).resolve()
    _check_out_dir(out)
    rows, skipped, info, n = winners(run_dir, min_speedup=min_speedup, mode=mode,
                                     inductor_mode=inductor_mode, decided=not force)
    if not rows:
        why = "; ".join(f"{k}: {v}" for k, v in list(skipped.items())[:3])
        raise WorkFailed(f"nothing to export: no verified kernel in {run_dir} ({n} task(s)"
                         + (f"; {why}" if why else "") + ")")
    device = info.get("device") or {}
    backends = {r["task"].get("backend", "cpu") for r in rows}
    if len(backends) != 1:
        raise WorkFailed(f"{run_dir} mixes backends {sorted(backends)}; export one backend per package")
    backend = backends.pop()
    if backend == "cuda":
        build_arch = device.get("arch") or ""
        if not build_arch.startswith("sm_"):
            raise WorkFailed(f"{run_dir} does not record the GPU architecture it was verified on")
        if nvcc_path() is None:
            raise WorkFailed(f"cannot build the kernels for {build_arch}: nvcc was not found "
                             "(set KFORGE_NVCC or put nvcc on PATH)")
        arch_label = build_arch
    else:
        # -march=native binaries are for this CPU; record it so another CPU rebuilds
        build_arch, arch_label = "native", rt.current_arch("cpu")

    kdir = out / "kernels"
    if kdir.exists():
        shutil.rmtree(kdir)
    shutil.rmtree(out / "build", ignore_errors=True)
    kdir.mkdir(parents=True)
    ext = ".cu" if backend == "cuda" else ".cpp"
    entries = []
    from kforge_tui.regions.task import Task

    for row in rows:
        tid = row["task_id"]
        task = Task.from_json(row["task"])
        if row.get("best_lang") == "triton" or task.backend == "triton":  # Inductor compiles it there
            (kdir / f"{tid}.py").write_text(row["source"])
            spec = spec_for(row["task"], "", row)
            spec.pop("lib")
            spec.update(lang="triton", device="cuda", source=f"kernels/{tid}.py")
            entries.append(spec)
            continue
        try:
            lib = build(row["source"], task, build_arch, Path(run_dir) / "cache")
        except Exception as e:
            raise WorkFailed(f"cannot build {tid} for {arch_label}: {e}") from None
        (kdir / f"{tid}{ext}").write_text(row["source"])
        (kdir / f"{tid}.h").write_text(task.header())
        shutil.copyfile(lib, kdir / f"{tid}.so")
        spec = spec_for(row["task"], "", row)
        spec.pop("lib")
        spec.update(source=f"kernels/{tid}{ext}", header=f"kernels/{tid}.h",
                    binary=f"kernels/{tid}.so")
        entries.append(spec)
    import torch

    manifest = {"format": FORMAT, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "kforge_version": __version__, "torch_version": torch.__version__,
                "model": info.get("model"), "backend": backend, "arch": arch_label,
                "device": device, "flags": [f.replace(build_arch, "{arch}") for f in compile_flags(backend, build_arch)],
                "min_speedup": min_speedup, "kernels": entries,
                "left_to_pytorch": skipped}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    from kforge_tui.regions import graph, partition, rewrite, trace

    pkg = out / "_kforge"
    shutil.rmtree(pkg, ignore_errors=True)
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""kforge runtime (copied from kforge-tui; needs only torch)."""\n')
    from kforge_tui.integrate import kernel_spec, triton_region

    for mod in (rt, kernel_spec, triton_region, graph, partition, rewrite, trace):
        shutil.copyfile(mod.__file__, pkg / Path(mod.__file__).name)
    shutil.copyfile(rt.NATIVE_SOURCE, pkg / rt.NATIVE_SOURCE.name)  # built there once per machine
    (out / "__init__.py").write_text(INIT_TEMPLATE.format(
        model=info.get("model"), n=len(entries), arch=arch_label, date=manifest["created"][:10],
        name=out.name))
    return out
