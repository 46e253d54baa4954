"""bench/ is one tool: `python -m bench --help` lists every step, fast, and each step module keeps
the contract of bench/steps/__init__.py. (The steps themselves are measurements: they run on
demand, with `--small` for a dry run, not in the suite.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from bench.steps import STEPS, load  # noqa: E402
from bench.steps.throughput import summary  # noqa: E402


def _bench(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_every_step_without_importing_torch():
    r = _bench("--help")
    assert r.returncode == 0, r.stderr
    for name in STEPS:
        assert f"  {name} " in r.stdout, name
    code = ("import sys, runpy; sys.argv = ['bench', '--help']\ntry:\n    runpy.run_module('bench', run_name='__main__')\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "False", r.stdout[-500:]


def test_every_step_module_is_registered_and_keeps_the_contract():
    modules = {p.stem.replace("_", "-") for p in (ROOT / "bench" / "steps").glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(STEPS)
    for name in STEPS:
        m = load(name)
        assert isinstance(m.HELP, str) and m.HELP and callable(m.run), name
        assert m.__doc__ and m.__doc__.startswith(f"{name}:"), name


def test_unknown_steps_are_usage_errors():
    r = _bench("no-such-step", "--device", "cpu")
    assert r.returncode == 2 and "unknown step" in r.stderr


def test_tables_render_as_markdown_with_their_record():
    t = report.Table(["a", "b"], [{"a": 1.23456, "b": "x|y"}, {"a": None}], ["a note"])
    rec = {"date": "2026-12-01 00:00 UTC", "command": "python -m bench x",
           "machine": {"cpu": "cpu", "cpus": 2, "torch": "2.13", "git": "abc"}}
    text = report.render("x", t, rec)
    assert "| 1.23 | x\\|y |" in text and "| - | - |" in text and text.endswith("a note")
    assert "`python -m bench x`" in text


def test_throughput_reads_the_scripts_summary_line():
    line = ("| local | backend cpu | shape 256,1024 | n 20 | ok 20 | cand/min 72.5 | latency med 11.50 s | "
            "compile med 0.90 s | verify med 0.16 s | time med 0.38 s |")
    got = summary("noise\n" + line + "\n")
    assert got["cand/min"] == 72.5 and got["n"] == 20 and got["latency med s"] == 11.5
    assert got["backend"] == "cpu" and got["shape"] == "256,1024"
    # the line the step reads is the one bench/eval_throughput.py prints
    assert got["run"] == "local"
    assert 'print(f"| {label} | backend {args.backend} | shape {args.shape}' in (ROOT / "bench" / "eval_throughput.py").read_text()


def test_search_time_meets_its_budget_target_only_when_every_candidate_was_evaluated():
    from bench.steps.search_time import _budget_spent

    # a run cut by its timeout reports its last evaluation's time as "budget s": not spent
    assert _budget_spent("20/20") and _budget_spent("21/20")
    assert not _budget_spent("8/20") and not _budget_spent(None) and not _budget_spent("-")


def test_search_time_names_the_seed_action_node_zero_uses():
    from bench.steps.search_time import SEED_ACTION
    from kforge_tui.search.node_zero import ACTION

    assert SEED_ACTION == ACTION


def test_the_bench_table_calls_a_row_slower_only_when_both_clocks_say_so():
    from bench.steps import _runs

    rows = [{"model": "a", "inductor_mode": "default", "vs_compile": 1.01, "db_vs_compile": 0.99},
            {"model": "b", "inductor_mode": "default", "vs_compile": 0.90, "db_vs_compile": 1.00},
            {"model": "c", "inductor_mode": "reduce-overhead", "vs_compile": 0.90, "db_vs_compile": 0.91},
            {"model": "d", "inductor_mode": "default", "vs_compile": None}]
    note = _runs.never_slower(rows)
    assert "2 of 3 rows" in note and "c (reduce-overhead: 0.900" in note and "b (" not in note, note
    # a row that kept nothing timed torch.compile's forward twice: never slower, its gap is noise
    same = rows + [{"model": "e", "inductor_mode": "default", "vs_compile": 0.96, "db_vs_compile": 0.95,
                    "same_forward": True}]
    note = _runs.never_slower(same)
    assert "3 of 4 rows" in note and " e (" not in note and "1 of them kept no kernel" in note, note
    assert "5.0% apart" in note, note
    assert _runs._agreement({"ratios": {"eager": 1.01, "kforge": 0.93}, "agrees": False}) == "0.930 OFF"
    assert _runs._agreement({"ratios": {"kforge": 1.09}, "off": 1.004, "agrees": True}) == "1.004 ok"


def test_each_apply_row_is_printed_as_it_is_measured(tmp_path, capsys):
    """A step cut short by a time limit (a device call's) still shows the rows it finished."""
    import argparse
    import json as _json
    import subprocess

    from bench.steps import Context, _runs

    answer = {"mode": "compile", "eager_ms": 5.0, "compile_ms": 2.0, "patched_ms": 1.6, "speedup": 3.125,
              "speedup_vs_compile": 1.25, "do_bench_ms": {"compile": 2.1, "kforge": 1.7},
              "clock_agreement": {"ratios": {}, "off": 1.012, "agrees": True},
              "decision": {"trials": [{"kept": True, "gain": 0.2}]}, "within_tolerance": True}

    class Ctx(Context):
        def kforge(self, *args, log, timeout=None, capture=False, **env):
            return subprocess.CompletedProcess(args, 0, _json.dumps(answer), "")

    ctx = Ctx(argparse.Namespace(modes="default"), tmp_path, tmp_path, "cuda", False)
    row = _runs.apply(ctx, "m", "m.py")
    assert row["vs_compile"] == 1.25 and row["kept"] == "1/1"
    err = capsys.readouterr().err
    assert "m.default: " in err and "vs_compile 1.25" in err and "clock/db 1.012 ok" in err
