"""Device facts of one evaluation slot, and the rule that keeps a node out of a run.

A speedup is a ratio of two timings on one device, so a node may only time a run's candidates
when its device is the run's: same GPU model, compute capability, SM count (a MIG slice is not
the whole GPU), memory, driver, torch and CUDA runtime, candidate compiler and kforge; on the
CPU the CPU model, the CPUs the worker may use and the OpenMP threads it runs with. Facts are
read by a fresh process (`python -m kforge_tui.cluster.facts DEVICE`): the same environment a
worker supervisor starts in, and no CUDA context or OpenMP pool left in the process asking.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from kforge_tui.errors import UsageError

PROBE_TIMEOUT_S = 180.0  # importing torch (and creating a CUDA context) on a cold node

# what must be equal, with the words a refusal uses; `host` and the index are not facts
LABELS = {
    "device": "device",
    "name": "GPU",
    "compute_capability": "compute capability",
    "sms": "SMs",
    "memory_gb": "GPU memory GB",
    "driver": "driver",
    "torch_cuda": "CUDA runtime",
    "cpu": "CPU",
    "cpus": "CPUs usable",
    "threads": "OpenMP threads",
    "torch": "torch",
    "compiler": "compiler",
    "kforge": "kforge",
}


def probe(device: str) -> dict:
    """The facts of this process's device (call it in a fresh process: see `collect`)."""
    from kforge_tui.sandbox.worker import thread_env

    threads = thread_env()  # what a worker here would run with (before torch reads it)
    import torch

    from kforge_tui._version import __version__
    from kforge_tui.device import _cpu_name, cxx_path, nvcc_path

    facts = {"device": device, "host": os.uname().nodename, "torch": torch.__version__,
             "kforge": f"{__version__}+{source_digest()}"}
    if device == "cuda":
        if not torch.cuda.is_available():
            facts["name"] = "no CUDA GPU visible"
            return facts
        p = torch.cuda.get_device_properties(0)  # the GPU Ray gave this slot (CUDA_VISIBLE_DEVICES)
        facts.update(name=p.name, compute_capability=f"{p.major}.{p.minor}", arch=f"sm_{p.major}{p.minor}",
                     sms=p.multi_processor_count, memory_gb=round(p.total_memory / 2**30),
                     driver=_driver_version(), torch_cuda=torch.version.cuda or "",
                     compiler=_first_line([nvcc_path(), "--version"], last=True))
    else:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:
            cpus = os.cpu_count() or 1
        facts.update(cpu=_cpu_name(), cpus=cpus, threads=threads, arch="native",
                     compiler=_first_line([cxx_path(), "--version"]))
    return facts


def collect(device: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """`probe` in a fresh Python process with this process's environment."""
    try:
        out = subprocess.run([sys.executable, "-m", "kforge_tui.cluster.facts", device], capture_output=True,
                             text=True, timeout=timeout_s, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"device": device, "error": f"reading the device facts took over {timeout_s:g} s"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"device": device, "error": f"reading the device facts failed: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def mismatch(run: dict, node: dict) -> str:
    """Why `node` may not time this run's candidates ("" when it may), in one line."""
    if node.get("error"):
        return node["error"]
    diffs = [f"{label} {node.get(k)!s} (the run's: {run.get(k)!s})"
             for k, label in LABELS.items() if (k in run or k in node) and run.get(k) != node.get(k)]
    return "; ".join(diffs)


def describe(facts: dict) -> str:
    if facts.get("device") == "cuda":
        return (f"{facts.get('name')} (sm_{str(facts.get('compute_capability', '')).replace('.', '')}, "
                f"driver {facts.get('driver')}, torch {facts.get('torch')})")
    return f"{facts.get('cpu')} ({facts.get('cpus')} CPUs, torch {facts.get('torch')})"


def source_digest() -> str:
    """12 hex digits over kforge's own Python files: a node with other kforge code is refused."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def _driver_version() -> str:
    line = _first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if line:
        return line
    try:  # no nvidia-smi in the image: the CUDA version the driver supports
        import torch

        v = torch._C._cuda_getDriverVersion()
        return f"cuda {v // 1000}.{v % 1000 // 10}"
    except Exception:
        return ""


def _first_line(cmd: list, last: bool = False) -> str:
    if not cmd or not cmd[0]:
        return ""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [x.strip() for x in out.splitlines() if x.strip()]
    if not lines:
        return ""
    return lines[-1] if last else lines[0]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("cpu", "cuda"):
        raise UsageError("usage: python -m kforge_tui.cluster.facts cpu|cuda")
    print(json.dumps(probe(args[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
