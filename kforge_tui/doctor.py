"""`kforge doctor`: what this machine offers kforge, and how to fix what is missing.

Each check is cheap and side-effect free (version queries only), so doctor is safe to run
on a busy GPU server. A check that is missing says what will happen instead (e.g. the cpu
backend) and the command that fixes it.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass

from kforge_tui import device as devmod


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _run(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return (p.stdout or p.stderr).strip()


def _python() -> Check:
    v = sys.version_info
    ok = v >= (3, 11)
    return Check("python", ok, f"{platform.python_version()} ({sys.executable})",
                 "" if ok else "use Python 3.11 or newer (tomllib)")


def _torch() -> list[Check]:
    try:
        import torch
    except Exception as exc:
        return [Check("torch", False, f"not importable: {exc}",
                      "pip install torch --index-url https://download.pytorch.org/whl/cpu (CPU only), "
                      "or a CUDA build from https://pytorch.org for GPU kernels")]
    cuda_build = torch.version.cuda
    detail = f"{torch.__version__}, " + (f"CUDA {cuda_build} build" if cuda_build else "CPU-only build")
    checks = [Check("torch", True, detail,
                    "" if cuda_build else "for GPU kernels install a CUDA build of torch "
                    "(pip install torch --index-url https://download.pytorch.org/whl/cu128)")]
    if devmod.cuda_available():
        info = devmod.device_info("cuda")
        checks.append(Check("gpu", True, f"{info.name}, compute capability "
                            f"{info.compute_capability} ({info.arch}), {info.sms} SMs, "
                            f"{info.memory_gb:.0f} GB"))
    else:
        why = "no CUDA GPU visible to torch" if cuda_build else "torch has no CUDA support"
        checks.append(Check("gpu", False, f"{why}; kforge will use the cpu backend (C++ kernels)",
                            "check nvidia-smi and CUDA_VISIBLE_DEVICES, and use a CUDA build of torch"))
    return checks


def _nvcc() -> Check:
    path = devmod.nvcc_path()
    if not path:
        return Check("nvcc", False, "not found (needed for the cuda backend)",
                     "install the CUDA toolkit, or set KFORGE_NVCC=/path/to/nvcc")
    out = _run([path, "--version"])
    rel = next((ln.strip() for ln in out.splitlines() if "release" in ln), out.splitlines()[-1] if out else "?")
    return Check("nvcc", True, f"{rel} ({path})")


def _cxx() -> Check:
    path = devmod.cxx_path()
    if not path:
        return Check("c++ compiler", False, "no g++/clang++ found (needed by the cpu backend and "
                     "as nvcc's host compiler)", "apt-get install g++ (or set KFORGE_CXX / CXX)")
    first = (_run([path, "--version"]).splitlines() or ["?"])[0]
    return Check("c++ compiler", True, f"{first} ({path})")


def _tree_sitter() -> Check:
    missing, found = [], []
    for mod in ("tree_sitter", "tree_sitter_cuda", "tree_sitter_cpp", "tree_sitter_c"):
        try:
            __import__(mod)
            found.append(mod)
        except Exception:
            missing.append(mod)
    if missing:
        return Check("tree-sitter", False, "missing: " + ", ".join(missing),
                     "pip install " + " ".join(m.replace("_", "-") for m in missing))
    return Check("tree-sitter", True, "grammars: cuda, cpp, c")


def _textual() -> Check:
    # Asked through package metadata, not imported: engine code never imports Textual.
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("textual")
    except PackageNotFoundError:
        v = None
    if v is None or importlib.util.find_spec("textual") is None:
        return Check("textual", False, "not installed (the TUI needs it)", "pip install textual")
    return Check("textual", True, v)


def _sample_extras() -> Check:
    """The `[models]` extra the sample models (sample_models/*.py) import: library model code.
    Asked through package metadata (no import: transformers takes seconds to import)."""
    from importlib.metadata import PackageNotFoundError, version

    found, missing = [], []
    for pkg in ("transformers", "diffusers", "accelerate"):
        try:
            found.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            missing.append(pkg)
    if missing:
        return Check("sample models", False, f"missing: {', '.join(missing)} (the sample models import them; "
                     "your own models do not need them)",
                     "pip install -e '.[models]' in the clone (or pip install " + " ".join(missing) + ")")
    return Check("sample models", True, ", ".join(found))


def _llm(llm: str | None, api_base: str | None) -> Check:
    if not llm:
        return Check("llm", True, "none configured: the built-in proposer will be used (works offline)",
                     "to use an LLM: --llm PROVIDER/MODEL (any litellm provider string), "
                     "plus --api-base URL for a local OpenAI-compatible server")
    try:
        from importlib.metadata import version

        lv = version("litellm")
    except Exception:
        return Check("llm", False, f"{llm} configured but litellm is not installed",
                     "pip install litellm")
    where = f" at {api_base}" if api_base else ""
    return Check("llm", True, f"{llm}{where} through litellm {lv}")


def run_checks(llm: str | None = None, api_base: str | None = None) -> list[Check]:
    """All checks, in the order a user reads them."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return [_python(), *_torch(), _nvcc(), _cxx(), _tree_sitter(), _textual(), _sample_extras(),
            _llm(llm, api_base)]


def format_checks(checks: list[Check]) -> str:
    """One line per check (OK / missing), with the fix indented below what is missing."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{'OK     ' if c.ok else 'missing'}  {c.name.ljust(width)}  {c.detail}")
        if c.fix and not c.ok:
            lines.append(f"{'':7}  {'':{width}}  fix: {c.fix}")
        elif c.fix and c.name == "llm":
            lines.append(f"{'':7}  {'':{width}}  note: {c.fix}")
    backend = devmod.default_backend()
    lines.append("")
    lines.append(f"kforge will use the {backend} backend"
                 + (" (nvcc-compiled CUDA kernels)" if backend == "cuda" else " (g++-compiled C++ kernels)"))
    return "\n".join(lines)
