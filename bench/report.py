"""What every step hands back, and how it is shown and kept: one table, JSON, the machine and date.

A figure without its machine, date and command cannot be quoted or re-made, so the runner
records them with every table (`record`), prints the table, and writes `<out>/<step>.json`.
Nothing here imports torch at module level: `python -m bench --help` must stay fast.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Table:
    """A step's result: `rows` are dicts keyed by `columns` (missing keys print as "-"), `notes`
    are the summary lines under the table, `extra` goes into the JSON only. `ok` False makes
    the command exit 1 (something measured failed: a wrong kernel, a run that crashed)."""

    columns: list[str]
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    ok: bool = True


class StepError(Exception):
    """A step that cannot run here or as asked; `code` 2 is bad usage, 1 a failed run."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def machine() -> dict:
    """The host, its GPUs and the software that made a figure."""
    out = {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
           "cpus": os.cpu_count(), "cpu": _cpu_model(), "git": _git()}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            out["cuda"] = torch.version.cuda
    except Exception as e:  # torch missing or broken: the record says so
        out["torch"] = f"unavailable: {type(e).__name__}"
    try:  # the version only: importing triton here would leave its bindings to tear down at exit
        from importlib.metadata import version

        out["triton"] = version("triton")
    except Exception:
        pass
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("+dirty" if dirty else "") if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def command_line(argv: list[str] | None = None) -> str:
    return "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.3g}" if abs(v) < 0.01 else f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
    if isinstance(v, (list, tuple)):
        return "x".join(str(x) for x in v)
    return str(v).replace("|", "\\|")  # a bar inside a cell would end it


def render(name: str, table: Table, rec: dict) -> str:
    """The table as Markdown (what RESULTS.md quotes), headed by what made it."""
    m = rec["machine"]
    where = ", ".join(m.get("gpus") or []) or f"{m.get('cpu')} ({m.get('cpus')} cores), no GPU"
    lines = [f"## {name}: {rec['date']}, {where}, torch {m.get('torch')}, commit {m.get('git')}",
             f"`{rec['command']}`", "",
             "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    for r in table.rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in table.columns) + " |")
    if not table.rows:
        lines.append("| (no rows) |")
    if table.notes:
        lines += [""] + table.notes
    return "\n".join(lines)


def record(name: str, table: Table, command: str) -> dict:
    return {"step": name, "date": now(), "machine": machine(), "command": command, "ok": table.ok,
            "columns": table.columns, "rows": table.rows, "notes": table.notes, **table.extra}


def write(out: Path, name: str, rec: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(rec, indent=1, default=str) + "\n")
    return path
