"""Static check of a Triton candidate (Python source) before it is loaded anywhere.

A Triton candidate is one Python file with `@triton.jit` kernels and the entry point

    def kforge_launch(inputs, outputs): ...       # lists of torch tensors, in ABI order

(regions/abi.py). Unlike a `.cu` file, it is *Python*: loading it runs its module code in the
worker, and its launcher runs host Python on every call. So the check is an allow-list over the
AST (Python's own parser: exact, no regexes), written against classes of trick:

  imports        only `triton`, `triton.language`, `triton.language.extra[.cuda].libdevice`,
                 `math` and `torch` (torch only for what the harness permits, below).
  module state   module-level code is imports, function definitions and constants: a name bound
                 once to a literal, a tuple of literals, `tl.constexpr(...)`, a dtype or a
                 `triton.Config(...)`. No lists/dicts/sets, no calls, no classes, no `global` /
                 `nonlocal`, no attribute assignment anywhere (`kforge_launch.cache = ...` stashes
                 state on a function object), no mutable default arguments: a result cannot
                 survive from one call to the next.
  escapes        no `open`, `eval`, `exec`, `compile`, `__import__`, `getattr`/`setattr`,
                 `globals`, `vars`, `type`, `print`, ...; no dunder or private attribute
                 (`x.__class__`, `f.__globals__`, `t._cdata`): these reach the interpreter's
                 internals and from there `os`; module attributes only along allow-listed paths
                 (`tl.math.exp`, `libdevice.rsqrt`, `triton.cdiv`; never `tl.core`,
                 `triton.runtime`, `triton.knobs`).
  decorators     only `triton.jit`, `triton.autotune(...)`, `triton.heuristics(...)`.
  host code      (every function that is not a kernel: the launcher and its helpers) may only
                 launch kernels of this file (`kernel[grid](...)`), do integer arithmetic for
                 grids, and touch tensors through metadata: `.data_ptr()`, `.shape`, `.stride()`,
                 `.numel()`, `.size()`, `.dim()`, `.dtype`, `.device`, `.element_size()`,
                 `.is_contiguous()`, plus `.zero_()` / `.fill_()` to initialise an output or
                 scratch before atomics. `torch.<dtype>` names are allowed. Any other torch
                 call is computing with PyTorch instead of writing the kernel.
  scratch        declared, not hidden: `buf = torch.empty_strided((64, 1), (1, 1),
                 dtype=torch.float32, device=inputs[0].device)` (or `torch.empty` /
                 `torch.zeros`) as a top-level statement of `kforge_launch`, with literal sizes,
                 so its bytes are known before the candidate runs (`TritonReport.scratch_bytes`).
                 It comes from PyTorch's stream-ordered caching allocator on the harness stream.
  libraries      a vendor GEMM, as a top-level statement of `kforge_launch` writing into a
                 given buffer: `torch.mm(a, b, out=o)` (also addmm, bmm, baddbmm; cuBLAS on a
                 GPU), and the two ops Inductor hands to PyTorch in MoE routing (topk, sort:
                 `torch.topk(x, k, out=(values, indices))`). A region whose GEMM Inductor hands to the library (a Linear with its
                 epilogue) is started from that call plus Inductor's Triton epilogue, as
                 torch.compile runs it; the CUDA backend admits cuBLASLt the same way
                 (sandbox/compile.py). Operands may be viewed with `.as_strided(size, stride)`
                 (a weight's transpose); PyTorch bounds-checks a view against its storage.
  no try/with    a launcher has no exception to handle; a `try` could swallow the harness's own
                 checks (the runtime guard of sandbox/triton_loader.py also records, not only
                 raises).

What the AST cannot see (a tensor operator in host code, `o = outputs[0]; o += 1`) is caught at
run time: the loader runs the launcher under a dispatch guard that refuses every aten op other
than scratch allocation, fills and views (sandbox/triton_loader.py). Verification against the
reference (poisoned outputs, fresh values in reused buffers) catches the rest.

Diagnostics have the same shape as sandbox/static.py's (`Diagnostic`, `StaticReport`).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from kforge_tui.regions import abi
from kforge_tui.sandbox.static import Diagnostic, StaticReport

ENTRY = abi.ENTRY

# ------------------------------------------------------------------------------ allow-lists

# canonical module path -> what it is called in messages
MODULES = ("triton", "triton.language", "triton.language.extra.libdevice", "math", "torch")
_IMPORT_FROM_OK = {
    "triton": {"language": "triton.language"},
    "triton.language.extra": {"libdevice": "triton.language.extra.libdevice"},
    "triton.language.extra.cuda": {"libdevice": "triton.language.extra.libdevice"},
}
_IMPORT_OK = {"triton": "triton", "triton.language": "triton.language", "math": "math",
              "torch": "torch", "triton.language.extra.libdevice": "triton.language.extra.libdevice",
              "triton.language.extra.cuda.libdevice": "triton.language.extra.libdevice"}
_FORBIDDEN_MODULES = {
    "os", "sys", "subprocess", "ctypes", "importlib", "threading", "multiprocessing", "socket",
    "pathlib", "io", "builtins", "inspect", "gc", "signal", "time", "random", "pickle", "shutil",
    "tempfile", "weakref", "functools", "concurrent", "asyncio", "atexit", "mmap", "marshal",
    "code", "codeop", "runpy", "pty", "select", "urllib", "http", "requests", "numpy", "cupy",
    "operator", "types", "copyreg", "resource", "faulthandler", "traceback", "logging", "platform",
}

# Names that would mean an escape if they resolved (they cannot be imported; say so clearly).
_ESCAPE_MODULES = {"os", "sys", "subprocess", "ctypes", "importlib", "builtins", "threading"}

_TRITON_ATTRS = {"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language"}
# Submodules of triton.language: internals (core, semantic, standard) are not the language.
_TL_SUBMODULES = {"core", "extra", "math", "random", "standard", "target_info", "semantic",
                  "tensor_descriptor", "extra_libdevice"}
# The one name of tl.core that kernels need: Inductor's own sort helpers
# (triton_helpers._compare_and_swap_with_index) bitcast keys with
# `tl.core.get_int_dtype(bitwidth, signed)`, a constexpr function from two numbers to a dtype
# that the compiler evaluates; nothing of it reaches the host or Triton's state.
_TL_CORE_NAMES = {"get_int_dtype"}
_TORCH_DTYPES = {"float32", "float16", "bfloat16", "float64", "float", "half", "double", "int64",
                 "int32", "int16", "int8", "uint8", "bool", "long", "int", "short",
                 "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"}
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8,
                "double": 8, "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2,
                "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
                "uint16": 2, "uint32": 4, "uint64": 8}
SCRATCH_FUNCS = {"empty", "empty_strided", "zeros"}
# vendor GEMMs, and the PyTorch ops Inductor itself falls back to (MoE top-k), into given
# buffers (out=)
LIBRARY_FUNCS = {"mm", "addmm", "bmm", "baddbmm", "topk", "sort"}

_DECORATORS = {"jit", "autotune", "heuristics"}

# Builtins that reach the interpreter, the file system or the terminal.
_FORBIDDEN_BUILTINS = {
    "open": "it touches the file system", "eval": "it runs code from a string",
    "exec": "it runs code from a string", "compile": "it builds code from a string",
    "__import__": "it imports modules past the import check", "getattr": "it reaches attributes "
    "by name, past the attribute check", "setattr": "it stores state on an object",
    "delattr": "it changes an object", "hasattr": "it probes objects by name",
    "globals": "it exposes the module's namespace", "locals": "it exposes a frame",
    "vars": "it exposes an object's namespace", "dir": "it probes objects by name",
    "input": "it reads the terminal", "print": "kernels do no I/O",
    "breakpoint": "it starts a debugger", "exit": "it ends the worker", "quit": "it ends the worker",
    "help": "it starts an interactive help", "memoryview": "it reads raw memory",
    "type": "it builds classes or reaches them", "object": "it reaches the class hierarchy",
    "super": "it reaches the class hierarchy", "classmethod": "no classes in a candidate",
    "staticmethod": "no classes in a candidate", "property": "no classes in a candidate",
    "id": "object identities are how replay caches key results", "bytearray": "no raw buffers",
    "copyright": "interactive helper", "credits": "interactive helper", "license": "interactive helper",
}

# What host code may do with a tensor (or any non-module value).
HOST_METHODS = {"data_ptr", "stride", "numel", "size", "dim", "element_size", "is_contiguous",
                "zero_", "fill_", "as_strided"}
HOST_ATTRS = {"shape", "dtype", "device", "ndim", "itemsize", "index", "type"} | HOST_METHODS
_HOST_BUILTINS_OK = {"range", "len", "min", "max", "abs", "int", "float", "bool", "tuple",
                     "enumerate", "zip", "isinstance", "divmod", "round", "all", "any", "sum",
                     "reversed", "sorted", "list", "dict", "str", "ValueError", "RuntimeError",
                     "AssertionError"}
# Attributes refused in kernel code too (string formatting and frame walking reach internals).
_DEVICE_ATTR_DENY = {"format", "format_map", "mro", "gi_frame", "gi_code", "f_globals",
                     "f_locals", "f_back", "f_builtins", "tb_frame", "cr_frame", "ag_frame",
                     "co_code", "device_print", "static_print"}


@dataclass
class TritonReport(StaticReport):
    """A StaticReport plus what the candidate declares (its scratch allocations)."""

    scratch_bytes: int = 0
    kernels: tuple[str, ...] = ()


def _d(node, message: str, rule: str) -> Diagnostic:
    return Diagnostic(getattr(node, "lineno", 1) or 1, (getattr(node, "col_offset", 0) or 0) + 1,
                      message, rule)


def _chain(node) -> tuple[str, list[str]] | None:
    """`a.b.c` -> ("a", ["b", "c"]); None when the root is not a plain name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, list(reversed(attrs))
    return None


def _dotted(node) -> str:
    c = _chain(node)
    return ".".join([c[0], *c[1]]) if c else ast.unparse(node)


# ------------------------------------------------------------------------------ the checker

class _Checker:
    def __init__(self, source: str):
        self.source = source
        self.diags: list[Diagnostic] = []
        self.mods: dict[str, str] = {}  # local alias -> canonical module path
        self.kernels: set[str] = set()  # module-level @triton.jit (possibly autotuned) functions
        self.host_fns: set[str] = set()
        self.consts: set[str] = set()
        self.scratch_bytes = 0
        self._from_values: dict[str, str] = {}  # `from triton import jit` -> "triton.jit"

    def add(self, node, message: str, rule: str) -> None:
        self.diags.append(_d(node, message, rule))

    # ------------------------------------------------------------------ module level
    def run(self, tree: ast.Module) -> None:
        body = list(tree.body)
        # imports first (they may come after use only in odd files; order-independent here)
        for st in body:
            if isinstance(st, (ast.Import, ast.ImportFrom)):
                self.check_import(st)
        for st in body:
            if isinstance(st, ast.FunctionDef):
                if self._is_kernel(st):
                    self.kernels.add(st.name)
                else:
                    self.host_fns.add(st.name)
        entries = [st for st in body if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and st.name == ENTRY]
        if not entries:
            self.diags.append(Diagnostic(1, 1, f"missing the entry point `{abi.declaration('triton')}`"
                                         " at module level", "entry"))
        for k, st in enumerate(body):
            if k == 0 and isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) \
                    and isinstance(st.value.value, str):
                continue  # module docstring
            if isinstance(st, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(st, ast.FunctionDef):
                self.check_function(st, entries)
            elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                self.check_module_assign(st)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) \
                    and isinstance(st.value.value, str):
                continue  # a stray string (comment block)
            elif isinstance(st, ast.AsyncFunctionDef):
                self.add(st, "async functions are not allowed: the launcher runs synchronously on "
                         "the harness stream", "entry")
            elif isinstance(st, ast.ClassDef):
                self.add(st, "classes are not allowed: class attributes are state that outlives a "
                         "call", "module-state")
            else:
                self.add(st, f"module-level `{type(st).__name__.lower()}` statement is not allowed: "
                         "module code may only import, define functions and bind constants (it "
                         "runs once at load and its effects would outlive every call)",
                         "module-state")
        if len(entries) > 1:
            self.add(entries[1], f"`{ENTRY}` is defined {len(entries)} times", "entry")
        for node in ast.walk(tree):
            self.check_everywhere(node)

    def check_import(self, st) -> None:
        if isinstance(st, ast.Import):
            for a in st.names:
                root = a.name.split(".")[0]
                canon = _IMPORT_OK.get(a.name)
                if canon is None:
                    self._bad_import(st, a.name, root)
                    continue
                if a.asname:
                    self.mods[a.asname] = canon
                else:
                    self.mods[root] = root  # `import triton.language` binds `triton`
            return
        mod = st.module or ""
        if st.level:
            self.add(st, "relative imports are not allowed: a candidate is one self-contained file",
                     "import")
            return
        ok = _IMPORT_FROM_OK.get(mod)
        for a in st.names:
            if a.name == "*":
                self.add(st, f"`from {mod} import *` is not allowed: name every import", "import")
                continue
            if ok is not None and a.name in ok:
                self.mods[a.asname or a.name] = ok[a.name]
            elif mod in ("triton", "triton.language") and a.name in (
                    _TRITON_ATTRS - {"language"} if mod == "triton" else {"constexpr"}):
                # `from triton import jit` / `from triton.language import constexpr`: a value
                self.consts.add(a.asname or a.name)
                self._from_values[(a.asname or a.name)] = f"{mod}.{a.name}"
            else:
                self._bad_import(st, f"{mod}.{a.name}", mod.split(".")[0])

    def _bad_import(self, st, name: str, root: str) -> None:
        if root in _FORBIDDEN_MODULES:
            why = ("processes, files, threads, the environment and the interpreter are off limits "
                   "to a kernel")
        elif root == "torch":
            why = "only `import torch` itself (dtypes, scratch allocation) is allowed"
        elif root == "triton":
            why = ("only triton, triton.language and triton.language.extra's libdevice are part of "
                   "the kernel language (not triton.runtime, triton.knobs, triton.testing, ...)")
        else:
            why = "a candidate may import only triton, triton.language, libdevice, math and torch"
        self.add(st, f"import of `{name}` is not allowed: {why}", "import")

    def _is_kernel(self, fn: ast.FunctionDef) -> bool:
        return any(self._decorator_kind(d) == "jit" for d in fn.decorator_list)

    def _constexpr_literal(self, node) -> bool:
        """`tl.constexpr(False)`: a default of a @triton.jit function that Inductor's own helpers
        write (triton_helpers.sort_with_index). The compiler reads it; the body never runs as
        Python, so no call can keep state in it."""
        if not (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], ast.Constant)):
            return False
        c = _chain(node.func)
        if c is None:
            return False
        root, attrs = c
        path = ".".join([self.mods.get(root, root), *attrs])
        return path in ("triton.language.constexpr", "tl.constexpr") and root in self.mods

    def _decorator_kind(self, d) -> str | None:
        target = d.func if isinstance(d, ast.Call) else d
        c = _chain(target)
        if c is None:
            return None
        root, attrs = c
        path = self.mods.get(root)
        if path == "triton" and len(attrs) == 1 and attrs[0] in _DECORATORS:
            return attrs[0]
        if root in self._from_values and not attrs:
            name = self._from_values[root].rsplit(".", 1)[-1]
            return name if name in _DECORATORS else None
        return None

    def check_function(self, fn: ast.FunctionDef, entries) -> None:
        kinds = [self._decorator_kind(d) for d in fn.decorator_list]
        for d, k in zip(fn.decorator_list, kinds):
            if k is None:
                self.add(d, f"decorator `{ast.unparse(d)[:60]}` is not allowed: only triton.jit, "
                         "triton.autotune and triton.heuristics", "decorator")
        if fn.name == ENTRY:
            if fn.decorator_list:
                self.add(fn, f"`{ENTRY}` must be a plain function (no decorator)", "entry")
            a = fn.args
            names = [p.arg for p in a.posonlyargs + a.args]
            if names != ["inputs", "outputs"] or a.vararg or a.kwarg or a.kwonlyargs \
                    or a.defaults or a.kw_defaults:
                self.add(fn, f"the entry point must be exactly `{abi.declaration('triton')}` "
                         f"(found `def {ENTRY}({ast.unparse(a)})`)", "entry")
        if fn.name in self.kernels:
            self.check_device(fn)
        else:
            self.check_host(fn, is_entry=fn.name == ENTRY)

    def check_module_assign(self, st) -> None:
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        value = st.value
        for t in targets:
            if not isinstance(t, ast.Name):
                self.add(t, "module-level assignment must bind a plain name to a constant",
                         "module-state")
                continue
            if t.id in self.consts or t.id in self.kernels or t.id in self.host_fns:
                self.add(t, f"`{t.id}` is bound twice at module level: module names are constants",
                         "module-state")
            self.consts.add(t.id)
        if value is None:
            self.add(st, "a module-level annotation without a value is not allowed", "module-state")
            return
        bad = self._non_constant(value)
        if bad is not None:
            node, why = bad
            self.add(node, f"module-level value is not a constant ({why}): module state would "
                     "outlive a call; compute it inside the launcher or make it a literal / "
                     "tl.constexpr", "module-state")

    def _non_constant(self, v):
        """None if `v` is a constant expression; else (node, why)."""
        if isinstance(v, ast.Constant):
            return None
        if isinstance(v, ast.Tuple):
            for e in v.elts:
                r = self._non_constant(e)
                if r:
                    return r
            return None
        if isinstance(v, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp,
                          ast.GeneratorExp)):
            return v, f"a mutable {type(v).__name__.lower()}; use a tuple"
        if isinstance(v, ast.UnaryOp):
            return self._non_constant(v.operand)
        if isinstance(v, ast.BinOp):
            return self._non_constant(v.left) or self._non_constant(v.right)
        if isinstance(v, ast.BoolOp):
            for e in v.values:
                r = self._non_constant(e)
                if r:
                    return r
            return None
        if isinstance(v, ast.Compare):
            for e in [v.left, *v.comparators]:
                r = self._non_constant(e)
                if r:
                    return r
            return None
        if isinstance(v, ast.IfExp):
            return self._non_constant(v.test) or self._non_constant(v.body) \
                or self._non_constant(v.orelse)
        if isinstance(v, ast.Name):
            return None if v.id in self.consts else (v, f"`{v.id}` is not a module constant")
        if isinstance(v, ast.Attribute):
            c = _chain(v)
            if c and c[0] in self.mods:
                path = self.mods[c[0]]
                if path in ("torch", "triton.language", "math", "triton"):
                    return None  # checked as a module attribute everywhere
            return v, "attribute of a value"
        if isinstance(v, ast.Call):
            c = _chain(v.func)
            name = None
            if c and c[0] in self.mods:
                name = self.mods[c[0]] + "".join("." + a for a in c[1])
            elif c and c[0] in self._from_values and not c[1]:
                name = self._from_values[c[0]]
            if name in ("triton.language.constexpr", "triton.Config", "triton.cdiv",
                        "triton.next_power_of_2") or (name or "").startswith("math."):
                for a in [*v.args, *[k.value for k in v.keywords]]:
                    if isinstance(a, ast.Dict) and name == "triton.Config":
                        for e in [*a.keys, *a.values]:
                            r = e is not None and self._non_constant(e)
                            if r:
                                return r
                        continue
                    r = self._non_constant(a)
                    if r:
                        return r
                return None
            return v, f"a call to `{ast.unparse(v.func)[:40]}`"
        return v, type(v).__name__

    # ------------------------------------------------------------------ everywhere
    def check_everywhere(self, node) -> None:
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            self.add(node, f"`{type(node).__name__.lower()}` is not allowed: it keeps state between "
                     "calls", "global-state")
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                self.add(node, f"`{_dotted(node)[:60]}`: private and dunder attributes are off limits "
                         "(they reach the interpreter's internals)", "dunder")
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                self.add(node, f"assigning or deleting the attribute `{_dotted(node)[:60]}` is not "
                         "allowed: attributes on functions, kernels or modules are state that "
                         "outlives a call", "attribute-state")
            self.check_module_attr(node)
        elif isinstance(node, ast.Name):
            if node.id.startswith("__") and node.id != "__name__":
                self.add(node, f"`{node.id}` is not allowed: dunder names reach the interpreter's "
                         "internals", "dunder")
            elif node.id in _FORBIDDEN_BUILTINS:
                if _scope_binds(node, node.id):
                    pass  # a local variable or parameter of that name, not the builtin
                elif isinstance(node.ctx, ast.Load):
                    self.add(node, f"`{node.id}` is not allowed in a candidate: "
                             f"{_FORBIDDEN_BUILTINS[node.id]}", "forbidden-name")
                else:
                    self.add(node, f"rebinding `{node.id}` at module level is not allowed (a "
                             "builtin the checks rely on)", "shadowing")
            elif node.id in _ESCAPE_MODULES and isinstance(node.ctx, ast.Load) \
                    and node.id not in self.mods and not _scope_binds(node, node.id):
                self.add(node, f"`{node.id}` is not available to a kernel (processes, files, the "
                         "environment and the interpreter are off limits)", "forbidden-name")
            if isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in self.mods:
                self.add(node, f"rebinding `{node.id}` is not allowed (it is an imported module the "
                         "checks rely on)", "shadowing")
        elif isinstance(node, ast.arg):
            if node.arg in self.mods:
                self.add(node, f"parameter `{node.arg}` shadows an imported module", "shadowing")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            jit = isinstance(node, ast.FunctionDef) and self._is_kernel(node)
            for dflt in [*a.defaults, *[k for k in a.kw_defaults if k is not None]]:
                if jit and self._constexpr_literal(dflt):
                    continue
                if not isinstance(dflt, (ast.Constant, ast.Name, ast.Attribute, ast.Tuple,
                                         ast.UnaryOp)):
                    self.add(dflt, "mutable or computed default argument: a default is created "
                             "once and shared by every call (state between calls)",
                             "function-state")
            if isinstance(node, ast.FunctionDef) and node.name in self.mods:
                self.add(node, f"function `{node.name}` shadows an imported module", "shadowing")
        elif isinstance(node, (ast.Try, ast.With, ast.AsyncWith)) or type(node).__name__ == "TryStar":
            kind = "try" if not isinstance(node, (ast.With, ast.AsyncWith)) else "with"
            self.add(node, f"`{kind}` blocks are not allowed: a launcher has nothing to handle, and "
                     "a try could swallow the harness's checks", "control")
        elif isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
            self.add(node, "generators and coroutines are not allowed: the entry point runs once "
                     "per call and returns", "control")
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset > 0:
            self.add(node, "imports belong at module level", "import")
        elif isinstance(node, ast.ClassDef) and node.col_offset > 0:
            self.add(node, "classes are not allowed: class attributes are state that outlives a "
                     "call", "module-state")

    def check_module_attr(self, node: ast.Attribute) -> None:
        """Attribute chains rooted at an imported module must follow the allow-listed paths.
        Only the outermost Attribute of a chain is judged (inner ones are its prefixes)."""
        c = _chain(node)
        if c is None or c[0] not in self.mods:
            return
        parent = getattr(node, "_kf_parent", None)
        if isinstance(parent, ast.Attribute):
            return  # judged at the outermost attribute
        root, attrs = c
        path = self.mods[root].split(".") + attrs
        why = _module_path_problem(path)
        if why:
            self.add(node, f"`{_dotted(node)[:60]}` is not allowed: {why}", "module-attribute")

    # ------------------------------------------------------------------ kernels
    def check_device(self, fn: ast.FunctionDef) -> None:
        # decorator arguments (heuristics lambdas, autotune hooks) run on the host
        self.check_host_nodes([n for d in fn.decorator_list for n in ast.walk(d)], set(), fn,
                              decorator=True)
        for node in (n for st in fn.body for n in ast.walk(st)):
            if isinstance(node, ast.Name) and self.mods.get(node.id) == "torch":
                self.add(node, "torch is not available inside a @triton.jit kernel: write it with "
                         "triton.language", "torch-use")
            elif isinstance(node, ast.Attribute) and node.attr in _DEVICE_ATTR_DENY:
                self.add(node, f"`.{node.attr}` is not allowed in a kernel", "forbidden-name")
            elif isinstance(node, ast.Name) and node.id == ENTRY:
                self.add(node, f"a kernel must not call `{ENTRY}`", "entry")

    # ------------------------------------------------------------------ host code
    def check_host(self, fn: ast.FunctionDef, is_entry: bool) -> None:
        top_scratch: set[int] = set()
        if is_entry:
            for st in fn.body:
                if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                        and self._torch_fn(st.value.func) in LIBRARY_FUNCS \
                        and any(k.arg == "out" for k in st.value.keywords):
                    top_scratch.add(id(st.value))  # a library call into a buffer
                if isinstance(st, (ast.Assign, ast.AnnAssign)) and isinstance(st.value, ast.Call) \
                        and self._torch_fn(st.value.func) in SCRATCH_FUNCS:
                    tgts = st.targets if isinstance(st, ast.Assign) else [st.target]
                    if len(tgts) == 1 and isinstance(tgts[0], ast.Name):
                        top_scratch.add(id(st.value))
                        self.check_scratch(st.value)
        self.check_host_nodes(list(ast.walk(fn)), top_scratch, fn)

    def check_host_nodes(self, nodes, top_scratch: set[int], fn, decorator: bool = False) -> None:
        for node in nodes:
            if isinstance(node, ast.Call):
                self.check_host_call(node, top_scratch, decorator)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                parent = getattr(node, "_kf_parent", None)
                if isinstance(parent, ast.Call) and parent.func is node:
                    continue  # a method call: judged by check_host_call
                if isinstance(parent, ast.Attribute):
                    continue  # judged at the outermost attribute of the chain
                c = _chain(node)
                if c is not None and c[0] in self.mods:
                    continue  # module paths: check_module_attr
                if c is not None and (c[0] in self.kernels or c[0] in self.host_fns) and c[1]:
                    self.add(node, f"`{_dotted(node)[:60]}`: reading attributes of a kernel or "
                             "function object is not allowed (launch it with kernel[grid](...))",
                             "host-code")
                    continue
                if node.attr not in HOST_ATTRS:
                    self.add(node, f"`.{node.attr}` is not allowed in the launcher: host code may "
                             "only read tensor metadata (.shape, .stride(), .data_ptr(), "
                             ".numel(), .dtype, .device) and launch kernels", "host-code")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                tgts = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in tgts:
                    for sub in ast.walk(t):
                        if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Store):
                            self.add(sub, "assigning into `x[...]` in the launcher is not "
                                     "allowed: writing a tensor from Python makes PyTorch do the "
                                     "work (build tuples for grids instead)", "host-write")
            elif isinstance(node, ast.Delete):
                for t in node.targets:
                    if isinstance(t, ast.Subscript):
                        self.add(t, "deleting `x[...]` is not allowed in the launcher", "host-write")
            elif isinstance(node, ast.FunctionDef) and node is not fn and node.decorator_list:
                self.add(node, "decorators are only allowed on module-level kernels", "decorator")

    def _torch_fn(self, func) -> str | None:
        c = _chain(func)
        if c and self.mods.get(c[0]) == "torch" and len(c[1]) == 1:
            return c[1][0]
        return None

    def check_host_call(self, call: ast.Call, top_scratch: set[int], decorator: bool = False) -> None:
        f = call.func
        tfn = self._torch_fn(f)
        if tfn in LIBRARY_FUNCS:
            if id(call) not in top_scratch:
                self.add(call, f"`torch.{tfn}` must be a top-level statement of {ENTRY} writing "
                         f"into a buffer: `torch.{tfn}(..., out=outputs[0])`", "library")
            return
        if tfn in SCRATCH_FUNCS:
            if id(call) not in top_scratch:
                self.add(call, f"`torch.{tfn}` must be a top-level statement of {ENTRY} of the form "
                         f"`buf = torch.{tfn}(...)`: scratch is declared up front, not allocated "
                         "in loops, branches or helpers", "scratch")
            return
        if isinstance(f, ast.Name):
            if f.id in self.kernels:
                self.add(call, f"`{f.id}(...)`: launch a kernel as `{f.id}[grid](...)`", "launch")
            elif f.id in _FORBIDDEN_BUILTINS:
                pass  # reported as forbidden-name
            return
        if isinstance(f, ast.Subscript):
            base = f.value
            if not (isinstance(base, ast.Name) and base.id in self.kernels):
                self.add(call, f"`{ast.unparse(f)[:60]}(...)`: only kernels defined in this file "
                         "(@triton.jit functions) can be launched", "launch")
            return
        if isinstance(f, ast.Attribute):
            c = _chain(f)
            if c and c[0] in self.mods:
                path = self.mods[c[0]].split(".") + c[1]
                if path[0] == "torch":
                    self.add(call, f"`{_dotted(f)}(...)` is not allowed: computing with PyTorch "
                             "is not writing the kernel (torch offers only dtypes and "
                             "torch.empty/empty_strided/zeros for declared scratch)", "torch-use")
                elif path[0] == "triton" and path[1:] and path[1] == "language":
                    pass  # tl.* in host code: a constexpr or dtype helper, harmless
                elif path[0] == "triton" and path[1:] not in (["cdiv"], ["next_power_of_2"]) \
                        and not (decorator and path[1:] in (["autotune"], ["heuristics"], ["jit"],
                                                            ["Config"])):
                    self.add(call, f"`{_dotted(f)}(...)` is not allowed in the launcher: only "
                             "triton.cdiv and triton.next_power_of_2", "host-code")
                return
            if f.attr not in HOST_METHODS:
                self.add(call, f"`.{f.attr}(...)` is not allowed in the launcher: tensors are only "
                         "read for metadata (.data_ptr(), .stride(), .numel(), .size(), .dim(), "
                         ".element_size(), .is_contiguous()) or initialised (.zero_(), .fill_()); "
                         "any other torch method computes with PyTorch instead of the kernel",
                         "torch-use")
            return
        # a call of a call / lambda: allowed, its parts are checked on their own

    def check_scratch(self, call: ast.Call) -> None:
        fn = self._torch_fn(call.func)
        shape = call.args[0] if call.args else None
        stride = call.args[1] if fn == "empty_strided" and len(call.args) > 1 else None
        kw = {k.arg: k.value for k in call.keywords}
        form = (f"`buf = torch.{fn}((n0, n1, ...), "
                + ("(s0, s1, ...), " if fn == "empty_strided" else "")
                + "dtype=torch.float32, device=inputs[0].device)` with literal integer sizes")

        def ints(node):
            if isinstance(node, ast.Constant) and isinstance(node.value, int) \
                    and not isinstance(node.value, bool):
                return [node.value]
            if isinstance(node, (ast.Tuple, ast.List)) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, int)
                    and not isinstance(e.value, bool) for e in node.elts):
                return [e.value for e in node.elts]
            return None

        dims = ints(shape) if shape is not None else None
        strides = ints(stride) if stride is not None else ([] if fn != "empty_strided" else None)
        extra = len(call.args) > (2 if fn == "empty_strided" else 1)
        dt = kw.get("dtype")
        dtc = _chain(dt) if dt is not None else None
        dtype = dtc[1][0] if dtc and self.mods.get(dtc[0]) == "torch" and len(dtc[1]) == 1 else None
        dev = kw.get("device")
        dev_ok = isinstance(dev, ast.Attribute) and dev.attr == "device"
        unknown_kw = set(kw) - {"dtype", "device"}
        if dims is None or strides is None or extra or dtype not in _DTYPE_BYTES or not dev_ok \
                or unknown_kw or any(d < 0 for d in dims):
            self.add(call, f"scratch must be declared as {form}", "scratch")
            return
        if fn == "empty_strided" and len(strides) != len(dims):
            self.add(call, "scratch shape and strides differ in length", "scratch")
            return
        if fn == "empty_strided":
            span = 0 if any(d == 0 for d in dims) else 1 + sum((d - 1) * s for d, s in zip(dims, strides))
        else:
            span = 1
            for d in dims:
                span *= d
        self.scratch_bytes += span * _DTYPE_BYTES[dtype]


def _module_path_problem(path: list[str]) -> str | None:
    """Why an attribute path from an allowed module is refused (None: allowed)."""
    head = path[0]
    if any(p.startswith("_") for p in path):
        return "private attributes are off limits"
    if head == "math":
        return None if len(path) == 2 else "only math.<function or constant>"
    if head == "torch":
        if len(path) == 2 and (path[1] in _TORCH_DTYPES or path[1] in SCRATCH_FUNCS
                               or path[1] in LIBRARY_FUNCS):
            return None
        if len(path) == 3 and path[1] in _TORCH_DTYPES and path[2] in ("itemsize", "is_floating_point"):
            return None
        return ("torch is only for dtypes (torch.float32, ...) and declared scratch "
                "(torch.empty/empty_strided/zeros); calling PyTorch is not writing the kernel")
    if head == "triton" and len(path) >= 2 and path[1] == "language":
        path = ["tl", *path[2:]]
        head = "tl"
    elif head == "triton":
        if len(path) == 1:
            return None
        if path[1] in _TRITON_ATTRS and len(path) == 2:
            return None
        return ("only triton.jit, triton.autotune, triton.heuristics, triton.Config, triton.cdiv "
                "and triton.next_power_of_2 (not triton.runtime, triton.knobs, triton.compiler, "
                "triton.testing, ...)")
    if head == "triton.language.extra.libdevice" or path[:1] == ["libdevice"]:
        return None if len(path) == 2 else "only libdevice.<function>"
    if head == "tl" or head == "triton.language":
        rest = path[1:]
        if not rest:
            return None
        if rest[0] in _TL_SUBMODULES:
            if rest[0] == "math" and len(rest) == 2 and rest[1] != "core":
                return None
            if rest[0] == "core" and len(rest) == 2 and rest[1] in _TL_CORE_NAMES:
                return None
            if rest[:2] == ["extra", "libdevice"] and len(rest) == 3:
                return None
            if rest[:3] == ["extra", "cuda", "libdevice"] and len(rest) == 4:
                return None
            return (f"tl.{'.'.join(rest)} reaches Triton's internals; the language is tl.*, "
                    "tl.math.* and libdevice.*")
        return None
    return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _binds(scope, name: str) -> bool:
    """Does `scope` (a function, lambda or comprehension) bind `name` locally?"""
    cache = getattr(scope, "_kf_locals", None)
    if cache is None:
        cache = set()
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = scope.args
            cache |= {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
            cache |= {p.arg for p in (a.vararg, a.kwarg) if p is not None}
            body = scope.body if isinstance(scope.body, list) else [scope.body]
        else:
            body = list(scope.generators)
        stack = list(body)
        while stack:
            n = stack.pop()
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                cache.add(n.id)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cache.add(n.name)
                continue  # its body is its own scope
            if isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                              ast.GeneratorExp)) and n is not scope:
                continue
            stack.extend(ast.iter_child_nodes(n))
        scope._kf_locals = cache  # type: ignore[attr-defined]
    return name in cache


def _scope_binds(node, name: str) -> bool:
    """Is `name` at `node` a local of an enclosing function/comprehension (not the builtin)?"""
    p = getattr(node, "_kf_parent", None)
    while p is not None:
        if isinstance(p, _SCOPES) and _binds(p, name):
            return True
        p = getattr(p, "_kf_parent", None)
    return False


def _parents(tree) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._kf_parent = node  # type: ignore[attr-defined]


def check_source(source: str, signature: abi.Signature | None = None) -> TritonReport:
    """Check one Triton candidate. `signature` (the task's, backend "triton") is accepted for
    symmetry with sandbox/static.py; the Python entry point takes the tensors in lists, so only
    its name and parameters are checked here."""
    if not isinstance(source, str):
        return TritonReport(False, [Diagnostic(1, 1, f"source is {type(source).__name__}, not text",
                                               "empty")])
    if not source.strip():
        return TritonReport(False, [Diagnostic(1, 1, "empty source: there is no code to check",
                                               "empty")])
    if "\x00" in source:
        return TritonReport(False, [Diagnostic(1, 1, "source contains a NUL byte: not a text file",
                                               "parse")])
    try:
        tree = ast.parse(source, filename="candidate.py", type_comments=False)
    except SyntaxError as e:
        return TritonReport(False, [Diagnostic(e.lineno or 1, e.offset or 1,
                                               f"not valid Python: {e.msg}", "parse")])
    except (ValueError, RecursionError, MemoryError) as e:
        return TritonReport(False, [Diagnostic(1, 1, f"cannot parse: {type(e).__name__}", "parse")])
    _parents(tree)
    ck = _Checker(source)
    try:
        ck.run(tree)
    except RecursionError:
        ck.diags.append(Diagnostic(1, 1, "source nests too deeply to check", "parse"))
    seen, diags = set(), []
    for d in sorted(ck.diags, key=lambda d: (d.line, d.col)):
        k = (d.line, d.col, d.rule, d.message)
        if k not in seen:
            seen.add(k)
            diags.append(d)
    return TritonReport(not diags, diags, ck.scratch_bytes, tuple(sorted(ck.kernels)))
