"""House rules that keep the design honest: the engine is UI-free, the CLI starts fast, no import
circles, nothing inside imports the package face."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kforge_tui"
ENGINE_MODULES = ["kforge_tui.engine", "kforge_tui.store", "kforge_tui.report", "kforge_tui.events",
                  "kforge_tui.search.mcts", "kforge_tui.sandbox.pool", "kforge_tui.cli"]


def test_no_textual_import_outside_tui():
    offenders = []
    for path in PKG.rglob("*.py"):
        if "tui" in path.relative_to(PKG).parts[:1]:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "textual" or n.startswith("textual.") for n in names):
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert offenders == [], f"engine code imports Textual: {offenders}"


def test_engine_import_does_not_load_textual():
    code = ("import sys, importlib\n"
            f"for m in {ENGINE_MODULES!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
            "assert not bad, bad\nprint('clean')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "clean" in r.stdout, r.stderr[-2000:]


def test_cli_help_is_fast_and_lists_contract_commands():
    r = subprocess.run([sys.executable, "-m", "kforge_tui", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    for cmd in ("doctor", "profile", "optimize", "resume", "tui", "runs", "show", "apply", "export"):
        assert cmd in r.stdout
    # --help must not import torch/litellm/textual (a slow start on every call)
    code = ("import sys; sys.argv=['kforge','--help']\nfrom kforge_tui import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch','litellm','textual') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


def test_cli_without_command_is_usage_error():
    r = subprocess.run([sys.executable, "-m", "kforge_tui"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2


# ----------------------------------------------------------------------------- the import graph
#
# Nodes are the modules under kforge_tui/ (a package is its __init__.py). An edge is any import
# statement of the module that names another kforge_tui module: at module level, inside a
# function or a class, inside try/except. A lazy (function-level) import hides a circle from
# import time, not from the design: designs <-> codegen and codegen.ir <-> codegen.ops were both
# lazy on one side, and a circle of lazy imports still means neither module can be read or
# tested without the other. Not edges: imports under `if TYPE_CHECKING:` (they never run), and
# the implicit import of a module's parent packages (Python runs a package's __init__ before
# its submodules; that is membership, not a dependency a module chose). `from pkg import name`
# is an edge to pkg.name when that is a module, else to pkg.

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(name: str, mods) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path, mods) -> list[tuple[str, int, str]]:
    """(imported module, line, what the import names) for every kforge_tui import of a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def visit(node):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                visit(ast.Module(body=ch.orelse, type_ignores=[]))
                continue
            if isinstance(ch, ast.Import):
                for a in ch.names:
                    t = _resolve(a.name, mods)
                    if t:
                        out.append((t, ch.lineno, a.name))
            elif isinstance(ch, ast.ImportFrom):
                base = ch.module or ""
                if ch.level:
                    pkg = here
                    for _ in range(ch.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                for a in ch.names:
                    t = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else _resolve(base, mods)
                    if t:
                        out.append((t, ch.lineno, a.name))
            visit(ch)

    visit(tree)
    return [e for e in out if e[0] != name]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle through each strongly connected component of more than one module."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strong(v):  # Tarjan, iterative enough for this graph's depth
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:
        start = min(comp)
        paths, seen = [[start]], {start}
        while paths:  # breadth first inside the component: the shortest way back to start
            p = paths.pop(0)
            nxt = sorted(w for w in graph[p[-1]] if w in comp)
            if start in nxt:
                out.append(p + [start])
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append(p + [w])
    return out


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    mods = _modules()
    graph, lines = {}, {}
    for name, path in mods.items():
        graph[name] = set()
        for target, line, _ in _imports(name, path, mods):
            graph[name].add(target)
            lines.setdefault((name, target), line)
    return graph, lines


def test_no_import_circles():
    graph, lines = import_graph()
    circles = _circles(graph)
    # a:12 -> b means line 12 of a imports b
    shown = ["  " + " -> ".join(f"{a}:{lines[a, b]}" for a, b in zip(c, c[1:])) + f" -> {c[-1]}"
             for c in circles]
    assert not circles, "import circles in kforge_tui/:\n" + "\n".join(shown)


def test_circle_finder_sees_lazy_imports(tmp_path):
    """The rule above on a made-up package: a function-level import closes a circle."""
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert _circles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    src = "import kforge_tui.search.designs\ndef f():\n    from kforge_tui.search import codegen\n"
    (tmp_path / "x.py").write_text(src)
    mods = _modules()
    got = {t for t, _, _ in _imports("kforge_tui.x", tmp_path / "x.py", mods)}
    assert got == {"kforge_tui.search.designs", "kforge_tui.search.codegen"}


def test_nothing_inside_imports_the_package_face():
    """kforge_tui/__init__.py is the users' face (apply, remove, __version__); a module that takes
    a name from it reaches up past everything it sits on. Submodules named through it
    (`from kforge_tui import events`) are imports of those submodules, not of the face."""
    mods = _modules()
    bad = [f"{name}:{line} imports {what!r} from kforge_tui/__init__.py"
           for name, path in mods.items() if name != "kforge_tui"
           for target, line, what in _imports(name, path, mods) if target == "kforge_tui"]
    assert bad == [], bad


# ----------------------------------------------------------------------------- module size
#
# A module should fit in a head: about 1,000 lines. One that is truly one job may be longer if
# its docstring says why, in a paragraph starting "Kept whole:". The allow-list below is for
# splits under way elsewhere; each entry names who is splitting it. An entry whose module is no
# longer over the limit fails the test, so the list cannot go stale: remove it with the split.

MAX_LINES = 1000
PENDING_SPLITS: dict[str, str] = {}  # (the sandbox's worker/verify/static splits landed)


def _long_modules() -> dict[str, int]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            out[path.relative_to(PKG).as_posix()] = n
    return out


def test_modules_fit_in_a_head():
    bad = []
    for rel, n in _long_modules().items():
        doc = ast.get_docstring(ast.parse((PKG / rel).read_text())) or ""
        if rel in PENDING_SPLITS or "\nKept whole:" in "\n" + doc:
            continue
        bad.append(f"{rel}: {n} lines (split it along its seams, or say why not in a 'Kept whole:' "
                   "paragraph of its docstring)")
    assert bad == [], "\n".join(bad)


def test_pending_split_entries_are_still_needed():
    stale = sorted(set(PENDING_SPLITS) - set(_long_modules()))
    assert stale == [], f"no longer over {MAX_LINES} lines, remove from PENDING_SPLITS: {stale}"
