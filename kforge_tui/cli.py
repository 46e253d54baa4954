"""`kforge` — the command line. Thin: parse, merge config, call the engine/store/integration.

Exit codes (DESIGN.md): 0 ok, 1 the work failed, 2 bad usage or bad input; errors are one line on
stderr (`kforge: error: ...`), with the traceback only under `--debug`.
Heavy imports (torch, textual, litellm) happen inside the handlers so `--help` is instant.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

from kforge_tui.errors import KforgeError, UsageError


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def _add_cluster(p: argparse.ArgumentParser, resume: bool = False) -> None:
    p.add_argument("--cluster", metavar="WHERE",
                   help="where candidates are evaluated: local, ray (the Ray cluster of RAY_ADDRESS, "
                        "else the one `ray start` runs here) or ray://HOST:PORT; "
                        + ("default: where the run was evaluated" if resume else
                           "default local, or `cluster` in the config"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kforge",
        description="Profile an unmodified PyTorch model, search faster kernels for its hot ops "
                    "(MCTS over LLM or built-in proposals), verify them on captured tensors and "
                    "put the winners back into the model.",
        epilog="MODEL is path/file.py:callable, path/file.py (build() or KernelBench Model/get_inputs) "
               "or package.module:callable. Config: config.toml in the user config directory "
               "(~/.config/kforge/ on Linux; KFORGE_CONFIG), KFORGE_* variables.")
    _add_common(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("doctor", help="check toolchain, GPU and LLM settings")
    p.add_argument("--llm", help="LLM to check (litellm provider/model)")
    p.add_argument("--api-base", help="OpenAI-compatible server URL to check")
    p.add_argument("--json", action="store_true")
    _add_common(p)

    p = sub.add_parser("profile", help="profile a model's regions (ops and fused chains)")
    p.add_argument("model")
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--top", type=int, default=None, help="rows to show (default all)")
    p.add_argument("--ops", help="comma-separated region names, kinds or aten ops to show")
    p.add_argument("--compile-top", type=int, default=10,
                   help="time torch.compile of the N heaviest regions alone (default 10; 0: none)")
    p.add_argument("--json", action="store_true")
    _add_common(p)

    p = sub.add_parser("optimize", help="profile, capture, search kernels, integrate and report")
    p.add_argument("model")
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--ops", help="comma-separated region names, kinds or aten ops to optimise "
                                 "(default: the heaviest regions)")
    p.add_argument("--top", type=int, help="how many regions to optimise (default 5; 3 on the CPU)")
    p.add_argument("--budget", type=int, help="candidates evaluated per region (default 50; 6 on the CPU)")
    p.add_argument("--backend", choices=["cuda", "triton", "auto", "cpu"],
                   help="kernel languages: auto (the default on a GPU: each region starts from "
                        "Inductor's own Triton kernel, then Triton moves, CUDA families and "
                        "generated kernels, LLM proposals), cuda, triton, cpu (C++, the default "
                        "without a GPU)")
    p.add_argument("--llm", help="litellm model string, e.g. openai/gpt-4.1, anthropic/..., "
                                 "ollama/..., hosted_vllm/... (default: built-in proposer)")
    p.add_argument("--api-base", help="base URL of an OpenAI-compatible server (with --llm openai/NAME)")
    p.add_argument("--parallel", type=int, help="evaluations in flight (default: from the hardware)")
    _add_cluster(p)
    p.add_argument("--run-dir", help="where to keep the run (default: kforge_runs/<model>-<time>)")
    p.add_argument("--time-limit", type=float, help="wall-time limit per op, seconds")
    p.add_argument("--target", type=float, help="stop an op once this speedup is reached")
    p.add_argument("--compile-baseline", action=argparse.BooleanOptionalAction, default=None,
                   help="also time torch.compile as a baseline (default: on for cuda)")
    p.add_argument("--apply", dest="apply", action=argparse.BooleanOptionalAction, default=None,
                   help="check and time the patched model end to end at the end (default: on a GPU; "
                        "on the CPU `kforge apply` does it later)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--headless", action="store_true", help="no TUI: progress lines and a final table")
    p.add_argument("--json", action="store_true", help="with --headless: print the final summary as JSON")
    p.add_argument("--theme", help="TUI theme")
    _add_common(p)

    p = sub.add_parser("resume", help="continue a run that was stopped or killed")
    p.add_argument("run_dir")
    _add_cluster(p, resume=True)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--theme")
    _add_common(p)

    p = sub.add_parser("tui", help="open a finished or running run in the TUI")
    p.add_argument("run_dir")
    p.add_argument("--theme")
    _add_common(p)

    p = sub.add_parser("runs", help="list runs")
    p.add_argument("--root", help="where to look (default: every run made here, the config run_root "
                                  "and ./kforge_runs)")
    p.add_argument("--json", action="store_true")
    _add_common(p)

    p = sub.add_parser("show", help="per-op results of a run")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true")
    _add_common(p)

    p = sub.add_parser("apply", help="integrate a run's winners into MODEL, check and time end to end")
    p.add_argument("run_dir")
    p.add_argument("model")
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--mode", choices=["compile", "eager"], default=None,
                   help="compile (default): torch.compile with the kernels inside; eager: the "
                        "same regions replaced, the rest run eagerly (for models Inductor cannot "
                        "compile; chosen automatically when compiling fails)")
    p.add_argument("--inductor-mode", default=None,
                   help="torch.compile mode for both kforge and the comparison: default, "
                        "reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    p.add_argument("--json", action="store_true")
    _add_common(p)

    p = sub.add_parser("export", help="write a package that needs only torch to load the kernels")
    p.add_argument("run_dir")
    p.add_argument("out_dir")
    p.add_argument("--force", action="store_true",
                   help="export every verified winner, not only those the whole-model check kept")
    _add_common(p)
    return parser


# ----------------------------------------------------------------------------- handlers

def cmd_doctor(args) -> int:
    from kforge_tui.config import load_config
    from kforge_tui.doctor import format_checks, run_checks

    cfg = load_config({"llm": args.llm, "api_base": args.api_base})
    checks = run_checks(cfg.llm, cfg.api_base)
    if args.json:
        print(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        print(format_checks(checks))
    return 0


def cmd_profile(args) -> int:
    from kforge_tui.device import resolve_backend
    from kforge_tui.workload.capture import trace_model
    from kforge_tui.workload.loader import load_model
    from kforge_tui.workload.profile import format_profile, profile_regions

    backend = resolve_backend(args.device)
    _progress(args, f"loading {args.model} on {backend}")
    loaded = load_model(args.model, backend)
    _progress(args, "capturing the graph as torch.compile sees it")
    traced = trace_model(loaded, backend, max_calls=1)
    _progress(args, f"timing {len(traced.records)} regions (eager; torch.compile for the top "
                    f"{args.compile_top})")
    prof = profile_regions(loaded, traced, compile_top=args.compile_top)
    if args.ops:
        from kforge_tui.workload.select import select

        names = [o.strip() for o in args.ops.split(",") if o.strip()]
        keep = {t.key for t in select(_with_profile(traced.tasks(), prof), names, None)}
        prof.rows = [r for r in prof.rows if r.task_key in keep]
    if args.json:
        print(json.dumps(prof.to_json(), indent=2))
    else:
        print(format_profile(prof, top=args.top))
    return 0


def _with_profile(tasks, prof):
    """Tasks carrying their profile time (for ranking and selection)."""
    from dataclasses import replace

    out = []
    for t in tasks:
        row = prof.row_for(t.key)
        out.append(replace(t, total_us=row.total_us, share=row.share, calls=row.calls) if row else t)
    return out


# A first run on a CPU (the README's first command on a 2-core machine) is measured in minutes:
# the CPU defaults are a small search, and the end-to-end check (compiling and timing the whole
# model with Inductor: minutes on 2 cores) is `kforge apply`'s, or `--apply`'s.
CPU_DEFAULTS = {"budget": 6, "top": 3}
GPU_DEFAULTS = {"budget": 50, "top": 5}


def _settings_from_args(args, device: str | None = None):
    from kforge_tui.cluster import parse_cluster
    from kforge_tui.config import load_config
    from kforge_tui.device import resolve_backend
    from kforge_tui.engine import OptimizeSettings

    cfg = load_config({"llm": args.llm, "api_base": args.api_base, "budget": args.budget,
                       "top": args.top, "parallel": args.parallel, "device": args.device,
                       "theme": args.theme, "cluster": args.cluster})
    device = device or resolve_backend(cfg.device)
    defaults = CPU_DEFAULTS if device == "cpu" else GPU_DEFAULTS
    budget = cfg.budget if cfg.budget is not None else defaults["budget"]
    top = cfg.top if cfg.top is not None else defaults["top"]
    if budget < 1:
        raise UsageError(f"--budget must be at least 1, not {budget}")
    if top < 1:
        raise UsageError(f"--top must be at least 1, not {top}")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    end_to_end = args.apply if args.apply is not None else device != "cpu"
    return OptimizeSettings(model=args.model, device=device, ops=ops, top=top,
                            budget=budget, llm=cfg.llm, api_base=cfg.api_base,
                            parallel=cfg.parallel, run_dir=args.run_dir, run_root=cfg.run_root,
                            time_limit_s=args.time_limit, target_speedup=args.target,
                            compile_baseline=args.compile_baseline, end_to_end=end_to_end,
                            backend=args.backend, cluster=parse_cluster(cfg.cluster),
                            seed=args.seed), cfg


def _check_run_dir(settings) -> None:
    """Where the run will live must be creatable, said in one line before anything loads: a
    read-only directory, a path under a file and /proc are the user's input, not a crash."""
    import tempfile

    from kforge_tui.run_settings import default_run_dir

    target = Path(settings.run_dir).expanduser() if settings.run_dir else default_run_dir(settings)
    what = f"--run-dir {settings.run_dir}" if settings.run_dir else f"the run directory {target}"
    if (target / "run.db").exists():
        raise UsageError(f"{what} already holds a run; use `kforge resume {target}` or another --run-dir")
    base = target
    while not base.exists():
        if base.parent == base:
            break
        base = base.parent
    if not base.is_dir():
        raise UsageError(f"{what}: {base} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kforge-probe-", dir=base))
    except OSError as e:
        raise UsageError(f"{what}: cannot create it in {base} ({e.strerror or e})") from None


def _op_vocabulary() -> set[str]:
    """Every name a region can be selected by (select.matches): kinds, patterns, labels, the
    torch functions and modules users call, aten ops. Broad on purpose: it only catches names
    that match nothing anywhere, before the model is even loaded."""
    import operator

    import torch

    from kforge_tui.regions import partition, patterns

    names = {"compute", "pointwise", "reduction", "fused", *patterns.OPS, *partition.FRIENDLY.values(),
             *partition._MODULE_NAMES.values(), *partition._PY_OPS.values()}
    for mod in (torch, torch.nn.functional, torch.Tensor, torch.special, torch.linalg, torch.fft, operator):
        names.update(n.lower() for n in dir(mod) if not n.startswith("__"))
    names.update(n.lower() for n in dir(torch.nn) if n[:1].isupper())
    names.update(op.split("::", 1)[1].split(".")[0].lower() for op in torch._C._dispatch_get_all_op_names()
                 if op.startswith("aten::"))
    return names


def _check_op_names(ops: list[str]) -> None:
    """`--ops nosuchop` fails in a second, not after the capture and the profile."""
    import re

    vocab = _op_vocabulary()

    def known(name: str) -> bool:
        n = name.strip().lower()
        if re.search(r"_\d+(x\d+)*_[a-z0-9]+_[0-9a-f]{6}$", n):  # a task id
            return True
        parts = [p for p in n.split("+") if p and p != "…"]
        return bool(parts) and all(p in vocab or p.startswith("l_") or "__" in p for p in parts)

    unknown = [o for o in ops if not known(o)]
    if unknown:
        raise UsageError(f"--ops: {', '.join(unknown)} names no op, pattern or kind kforge knows; use a "
                         "region label (softmax, conv, batch_norm+relu), a pattern (rms_norm), a kind "
                         "(compute, pointwise, reduction, fused), an aten op (addmm) or a task id; "
                         "`kforge profile MODEL` lists the model's regions")


def _plan(settings, args) -> str:
    """What this run will do and roughly how long it takes, said up front."""
    what = (f"{', '.join(settings.ops)}" if settings.ops else f"the {settings.top} heaviest regions")
    e2e = "then the end-to-end check" if settings.end_to_end else \
        "no end-to-end check (`--apply`, or `kforge apply` later)"
    line = f"plan: {what}, {settings.budget} candidates each, {e2e}"
    if settings.device == "cpu" and not settings.llm:
        n = max(len(settings.ops), settings.top) if settings.ops else settings.top  # select's rule
        per = CPU_SECONDS_PER_CANDIDATE / max(1, min(settings.parallel or 2, os.cpu_count() or 2))
        est = CPU_FIXED_S + n * (settings.budget + 2) * per
        line += (f"; about {max(1, round(est / 60))} min on this CPU ({os.cpu_count()} cores; "
                 f"--budget/--top change it)")
        if settings.end_to_end:
            small, big = (_about(end_to_end_seconds(n, *model)) for model in (SMALL_MODEL, RESNET50))
            line += f", and {small} (a small model) to {big} (ResNet-50) for the end-to-end check"
    return line


# Measured on a 2-core CPU (ResNet-50 sample, 2026-12-01): load, capture, profile and baselines
# took about 60 s; a candidate about 9 s of one core (compile, verify, time, its re-timing share)
CPU_FIXED_S = 60.0
CPU_SECONDS_PER_CANDIDATE = 9.0
# (forward s, whole-model compile s) on 2 CPU cores. Small: held-out blocks (GNN, UNet, MoE,
# Swin, 2026-12-07) took 15-20 s for the check of 2 regions, forwards 6-70 ms; ResNet-50: its
# check took 190 s (2026-12-01), forwards ~0.3 s.
SMALL_MODEL = (0.01, 5.0)
RESNET50 = (0.3, 25.0)


def end_to_end_seconds(regions: int, forward_s: float, compile_s: float) -> float:
    """The end-to-end check's time on a model, from the model's forward and compile times: it
    compiles the whole model for torch.compile and again with each region's winner it tries
    (integrate/decide.py); each trial times 14 rounds of a block of each of 2 forwards, the final
    check 14 rounds of 3 blocks and 23 single forwards of each of the 3 (measure.throughput,
    measure.latency); a block lasts two forwards, at least BLOCK_MS. Both times are the model's
    own and unknown before it loads, when the plan is said: hence the plan's range."""
    from kforge_tui.integrate.measure import BLOCK_MS

    block_s = max(2 * forward_s, BLOCK_MS / 1e3)
    return (1 + regions) * compile_s + (2 * regions + 3) * 14 * block_s + 3 * 23 * forward_s


def _about(seconds: float) -> str:
    return f"{round(seconds / 60)} min" if seconds >= 90 else f"{5 * max(1, round(seconds / 5))} s"


def _private() -> None:
    """Everything this process creates (run dir, captures, compile cache, the worker processes'
    files) is the user's model data: owner-only, whatever the shell's umask (README: Privacy)."""
    os.umask(0o077)


def _reach_cluster(settings) -> None:
    """--cluster: one line and exit 2 now (Ray missing, nobody at the address, no GPU there),
    not after the model was captured or behind a screen."""
    if settings.cluster:
        from kforge_tui.cluster import connect

        connect(settings.cluster, settings.device)


def cmd_optimize(args) -> int:
    from kforge_tui.config import load_config

    _private()
    early = load_config({"llm": args.llm, "api_base": args.api_base})
    if early.llm and early.api_base:  # before torch and litellm load (seconds): refused at once
        from kforge_tui.search.proposers.llm import _check_reachable

        _check_reachable(early.api_base, 2.0, given=True)
    settings, cfg = _settings_from_args(args)  # the device resolved there
    _reach_cluster(settings)
    _check_run_dir(settings)
    if settings.ops:
        _check_op_names(settings.ops)
    if settings.llm:
        from kforge_tui.search.proposers.llm import check_llm_settings

        check_llm_settings(settings.llm, settings.api_base)
    _progress(args, _plan(settings, args))
    if not _use_tui(args):
        from kforge_tui.report import run_headless

        return run_headless(settings, json_out=args.json)
    from kforge_tui.tui.app import run_live

    return run_live(settings, theme=args.theme or cfg.theme, keymap=cfg.keymap)


def cmd_resume(args) -> int:
    from kforge_tui.engine import settings_for_resume
    from kforge_tui.store import owner_pid

    _private()
    settings = settings_for_resume(args.run_dir)
    pid = owner_pid(args.run_dir)
    if pid is not None:  # say so before a screen opens (the engine would refuse it too)
        raise UsageError(f"{args.run_dir} is being run by another kforge process (pid {pid}); "
                         f"watch and steer it with `kforge tui {args.run_dir}`")
    if args.cluster is not None:  # go on elsewhere: here (local), or on another cluster
        from kforge_tui.cluster import parse_cluster

        settings.cluster = parse_cluster(args.cluster)
    _reach_cluster(settings)
    if not _use_tui(args):
        from kforge_tui.report import run_headless

        return run_headless(settings, json_out=args.json, resume=True)
    from kforge_tui.config import load_config
    from kforge_tui.tui.app import run_live

    cfg = load_config()
    return run_live(settings, theme=args.theme or cfg.theme, resume=True, keymap=cfg.keymap)


def cmd_tui(args) -> int:
    from kforge_tui.config import load_config
    from kforge_tui.store import RunStore

    RunStore.open(args.run_dir, readonly=True).close()  # clear error before anything else
    if not _has_terminal():  # Textual would wait forever for a terminal that is not there
        raise UsageError(f"kforge tui needs a terminal (stdin and stdout are not a TTY); "
                         f"`kforge show {args.run_dir}` prints the run instead")
    _private()  # the TUI may resume the run to evaluate an edit
    from kforge_tui.tui.app import run_follow

    cfg = load_config()
    return run_follow(args.run_dir, theme=args.theme or cfg.theme, keymap=cfg.keymap)


def cmd_runs(args) -> int:
    from kforge_tui.config import load_config
    from kforge_tui.store import list_runs, registered_runs, run_summary

    roots = [Path(args.root)] if args.root else [Path(load_config().run_root), Path("kforge_runs")]
    seen, runs = set(), []
    found = [r for root in roots for r in list_runs(root.expanduser())]
    if not args.root:  # runs made with --run-dir anywhere (the user data directory keeps the list)
        found += [r for d in registered_runs() if (r := run_summary(d)) is not None]
    for r in sorted(found, key=lambda r: r["created"], reverse=True):
        key = os.path.realpath(r["run_dir"])
        if key not in seen:
            seen.add(key)
            runs.append(r)
    if args.json:
        print(json.dumps({"runs": runs}, indent=2, default=str))
        return 0
    if not runs:
        where = ", ".join(dict.fromkeys(str(r) for r in roots))
        print(f"no runs under {where}" + ("" if args.root else " nor in the list of runs made elsewhere"))
        return 0
    from datetime import datetime

    for r in runs:
        created = r.get("created")
        when = datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M") if isinstance(created, (int, float)) else ""
        print(f"{when:16}  {r.get('status', '?'):9s} {r.get('tasks', '?'):>2} ops  {r.get('model', '')}  "
              f"{r['run_dir']}")
    return 0


def cmd_show(args) -> int:
    from kforge_tui.summary import format_show, show_json

    data = show_json(args.run_dir)
    print(json.dumps(data, indent=2) if args.json else format_show(data))
    return 0


def cmd_apply(args) -> int:
    from kforge_tui.device import resolve_backend
    from kforge_tui.integrate.e2e import check_with_fallback
    from kforge_tui.store import RunStore
    from kforge_tui.summary import format_end_to_end
    from kforge_tui.workload.loader import load_model

    RunStore.open(args.run_dir, readonly=True).close()
    loaded = load_model(args.model, resolve_backend(args.device))
    # the whole-model decision compiles the model once per candidate: say what it is doing
    report = check_with_fallback(loaded, args.run_dir, args.mode, args.inductor_mode,
                                 log=lambda m: print(f"kforge: {m}", file=sys.stderr, flush=True))
    print(json.dumps(report, indent=2, default=str) if args.json else format_end_to_end(report))
    if not report.get("kernels_used"):
        if report.get("verified_tasks"):  # verified, but torch.compile alone is faster
            theirs = "the eager model's" if args.mode == "eager" else "torch.compile's"
            print(f"kforge: no kernel made the model faster; it stays {theirs} "
                  "(each kernel's reason is above)", file=sys.stderr)
            return 0
        print("kforge: no verified kernel of this run applies to this model; nothing was patched",
              file=sys.stderr)
        return 1
    if not report.get("within_tolerance", False):
        why = next((n for n in report.get("notes") or [] if not n.startswith("accepted")), "")
        print(f"kforge: end-to-end mismatch: max abs err {report.get('max_abs_err')}"
              + (f" ({why})" if why else ""), file=sys.stderr)
        return 1
    return 0


def cmd_export(args) -> int:
    from kforge_tui.integrate.export import export_run

    out = export_run(args.run_dir, args.out_dir, force=args.force)
    print(f"exported to {out} (import it and call apply(model))")
    return 0


HANDLERS = {"doctor": cmd_doctor, "profile": cmd_profile, "optimize": cmd_optimize,
            "resume": cmd_resume, "tui": cmd_tui, "runs": cmd_runs, "show": cmd_show,
            "apply": cmd_apply, "export": cmd_export}


SAMPLE_EXTRAS = ("transformers", "diffusers", "accelerate")


def _hint(message: str) -> str:
    """What to do about an error a user can fix with one command."""
    for mod in SAMPLE_EXTRAS:
        if f"No module named '{mod}'" in message:
            return (f"; the sample models need the [models] extra: pip install -e '.[models]' in the "
                    f"clone (or pip install {' '.join(SAMPLE_EXTRAS)}); `kforge doctor` checks them")
    return ""


def _has_terminal() -> bool:
    return sys.stdout.isatty() and sys.stdin.isatty()


def _use_tui(args) -> bool:
    """The TUI needs a terminal; with no terminal (nohup, CI, pipes) run headless, like nvitop -1."""
    return not args.headless and not getattr(args, "json", False) and _has_terminal()


def _progress(args, msg: str) -> None:
    if not getattr(args, "json", False):
        print(f"kforge: {msg}", file=sys.stderr, flush=True)


class _KforgeStdout:
    """sys.stdout while a command runs: what kforge itself prints goes to stdout, what anything
    else prints (a model's `print` in its forward or build(), a library) goes to stderr, so
    `--json` output and the tables stay clean whatever the model prints."""

    def __init__(self, out, err):
        self._out, self._err = out, err

    def _target(self):
        f = sys._getframe(2)  # the frame that called print() (or wrote to sys.stdout)
        name = f.f_globals.get("__name__", "") if f is not None else ""
        return self._out if name == "kforge_tui" or name.startswith("kforge_tui.") \
            or name == "__main__" and "kforge_tui" in (f.f_globals.get("__file__") or "") else self._err

    def write(self, s):
        return self._target().write(s)

    def flush(self):
        self._out.flush()
        self._err.flush()

    def __getattr__(self, name):
        return getattr(self._out, name)


def _separate_user_output(args) -> bool:
    """Not while the TUI owns the terminal: it draws on stdout itself."""
    return args.command in ("profile", "apply", "show", "runs", "doctor") or \
        (args.command in ("optimize", "resume") and not _use_tui(args))


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    saved = sys.stdout
    if _separate_user_output(args) and not isinstance(saved, _KforgeStdout):
        sys.stdout = _KforgeStdout(saved, sys.stderr)
    try:
        return HANDLERS[args.command](args)
    except KforgeError as e:
        if args.debug:
            traceback.print_exc()
        print(f"kforge: error: {e}{_hint(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("kforge: interrupted; everything evaluated so far is in the run store", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"kforge: internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
    finally:
        sys.stdout = saved


def entry() -> None:
    """The `kforge` command: main(), then a quiet exit. Once kforge has printed its last line
    (the summary after the TUI closes), native extensions' exit-time chatter (triton's nanobind
    reports ~27 "leaked" objects at interpreter shutdown) would bury it: stderr goes to
    /dev/null for the shutdown only."""
    rc = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    except OSError:
        pass
    sys.exit(rc)


if __name__ == "__main__":
    entry()
