"""Static check of a candidate kernel before any compiler runs.

A candidate is untrusted text from an LLM (or a person). Before it costs a compile, this module
refuses what a kernel has no business doing and what would make verification or timing lie:
sources that do not parse, a missing or mis-typed `extern "C" int kforge_launch(...)`, headers
outside an allow-list (torch, cuBLAS, file or thread libraries), calls that run programs, touch
files or sockets, load code, start threads or streams, allocate outside the stream, and mutable
`static`/global state that could carry a result from one call to the next.

Why an AST walk (tree-sitter) and not regexes: a regex cannot tell a call from a comment, a
string, a field name (`s.open`) or a declaration; it cannot say whether a variable is at file
scope or whether `const` applies to the pointer or the pointee; and it cannot tell inline PTX in
`__device__` code from host assembly. The only text-level steps are a few spelling fixes the
grammar lacks (`__align__(n)`, `__attribute__((...))`, `[] __device__` lambdas), blanked to
spaces of the same length so that every line and column stays exact, and two checks on
preprocessor text that the grammar keeps as raw strings (macro bodies, line splices).

This check is one layer, not the only one: candidates still run in a killable worker process.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from kforge_tui.workload import catalogue

ENTRY = catalogue.ENTRY


@dataclass
class Diagnostic:
    line: int  # 1-based
    col: int  # 1-based
    message: str
    rule: str

    def text(self) -> str:
        return f"L{self.line}:{self.col} [{self.rule}] {self.message}"


@dataclass
class StaticReport:
    ok: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def text(self) -> str:
        """One diagnostic per line: `L12:5 [forbidden-call] system() is not allowed in a kernel`."""
        return "\n".join(d.text() for d in self.diagnostics)

    @property
    def first_line(self) -> int | None:
        return min((d.line for d in self.diagnostics), default=None)


# ----------------------------------------------------------------------------- includes

_INCLUDES_COMMON = {
    "stdint.h", "stddef.h", "math.h", "float.h", "limits.h", "string.h",
    "cmath", "cstdint", "cstddef", "cfloat", "climits", "cstring",
    "algorithm", "type_traits", "limits", "utility", "array", "numeric",
}
_INCLUDES_CUDA = {
    "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda.h", "mma.h",
    "cooperative_groups.h", "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_awbarrier.h",
    "vector_types.h", "vector_functions.h", "math_constants.h", "device_launch_parameters.h",
    "cuda_runtime_api.h", "cuda_fp16.hpp", "cuda_bf16.hpp",
}
# Directory prefixes. cub: block/warp/thread-level primitives only; cub/device and cub/cub.cuh
# would run a library's whole algorithm (and cub.cuh adds seconds to every compile).
_INCLUDE_DIRS_CUDA = ("cooperative_groups/", "cuda/", "cub/block/", "cub/warp/", "cub/thread/",
                      "cub/iterator/", "cub/util_")
_INCLUDES_CPU = {
    "omp.h", "immintrin.h", "x86intrin.h", "xmmintrin.h", "emmintrin.h", "pmmintrin.h",
    "tmmintrin.h", "smmintrin.h", "nmmintrin.h", "avxintrin.h", "arm_neon.h",
    "stdlib.h", "cstdlib", "vector", "new",  # malloc/free, std::vector: cpu scratch space
}
# Headers refused with a specific reason (everything off the allow-list is refused anyway).
_INCLUDE_REASONS = (
    (("torch/", "ATen/", "c10/", "caffe2/", "pybind11/", "Python.h"),
     "candidates must not call back into PyTorch (and torch/extension.h makes one compile take ~47 s)"),
    (("cublas", "cudnn", "cufft", "cusparse", "cusolver", "curand", "nccl", "cutlass/", "cute/",
      "thrust/", "cub/device/", "cub/cub.cuh", "cub/agent/", "cub/grid/"),
     "calling a library for the op is not writing the kernel (CUTLASS/CuTe are also not shipped "
     "with nvcc and add tens of seconds per compile)"),
    (("thread", "future", "pthread.h", "unistd.h", "stdio.h", "cstdio", "fstream", "iostream",
      "sys/", "dlfcn.h", "fcntl.h", "netinet/", "arpa/", "spawn.h", "signal.h", "filesystem",
      "mutex", "atomic", "chrono"),
     "threads, files, processes and sockets have no place in a kernel"),
)


def _include_allowed(path: str, backend: str) -> bool:
    if path in _INCLUDES_COMMON:
        return True
    if backend == "cuda":
        return path in _INCLUDES_CUDA or path.startswith(_INCLUDE_DIRS_CUDA)
    return path in _INCLUDES_CPU


def _include_reason(path: str) -> str:
    for prefixes, why in _INCLUDE_REASONS:
        if any(path == p or path.startswith(p) for p in prefixes):
            return why
    return "only the allow-listed headers are available to a kernel"


# ------------------------------------------------------------------------ forbidden names

_WHY = {
    "process": "it runs or replaces a process",
    "exit": "it ends the worker process",
    "file": "kernels must not touch the file system",
    "net": "kernels must not open network connections",
    "dl": "it loads code the check has not seen",
    "thread": "work on another thread escapes the timed call",
    "env": "kernels must not read the environment",
    "stream": "work on another stream/event/graph escapes the timed region; launch on the given stream",
    "alloc": "allocation must be stream-ordered: use cudaMallocAsync/cudaFreeAsync on the given stream",
    "device": "it changes device-wide state shared with other work",
    "symbol": "writing __constant__/__device__ symbols carries state between calls",
    "default-stream": "it runs on the legacy default stream; use the Async form on the given stream",
    "library": "calling a library for the op is not writing the kernel",
}
_FORBIDDEN: dict[str, str] = {}
for _group, _names in {
    "process": "system popen pclose fork vfork clone execl execlp execle execv execvp execvpe execve "
               "fexecve posix_spawn posix_spawnp syscall kill ptrace daemon",
    "exit": "exit _exit _Exit quick_exit abort",
    "file": "fopen fopen64 freopen fdopen open open64 openat creat unlink unlinkat remove rename "
            "renameat mkdir rmdir truncate ftruncate chmod chown symlink mkfifo mknod tmpfile "
            "mkstemp tmpnam opendir",
    "net": "socket connect bind listen accept accept4 sendto recvfrom sendmsg recvmsg getaddrinfo "
           "gethostbyname",
    "dl": "dlopen dlmopen dlsym dlvsym",
    "thread": "thrd_create",
    "env": "getenv secure_getenv setenv putenv unsetenv",
    "stream": "cudaLaunchHostFunc cudaStreamAddCallback cuLaunchHostFunc cuStreamAddCallback",
    "alloc": "cudaMalloc cudaMallocManaged cudaMallocHost cudaHostAlloc cudaMallocPitch cudaMalloc3D "
             "cudaMallocArray cudaMalloc3DArray cudaMallocMipmappedArray cudaFree cudaFreeHost "
             "cudaHostRegister",
    "device": "cudaSetDevice cudaDeviceReset cudaDeviceSetLimit cudaDeviceSetCacheConfig "
              "cudaDeviceSetSharedMemConfig cudaSetDeviceFlags cudaThreadExit cudaDeviceSetMemPool",
    "symbol": "cudaMemcpyToSymbol cudaMemcpyToSymbolAsync cudaGetSymbolAddress",
    "default-stream": "cudaMemcpy cudaMemcpy2D cudaMemcpy3D cudaMemset cudaMemset2D cudaMemset3D",
}.items():
    for _n in _names.split():
        _FORBIDDEN[_n] = _group
_FORBIDDEN_PREFIX = (
    ("pthread_", "thread"), ("cudaStreamCreate", "stream"), ("cudaEventCreate", "stream"),
    ("cudaGraph", "stream"), ("cudaStreamBeginCapture", "stream"), ("cuStreamCreate", "stream"),
    ("cuEventCreate", "stream"), ("cuGraph", "stream"), ("cuModule", "dl"), ("cuLibrary", "dl"),
    ("cuLink", "dl"), ("cuCtx", "device"), ("cuDevicePrimaryCtx", "device"), ("cuInit", "device"),
    ("cuMemAlloc", "alloc"), ("cuMemHostAlloc", "alloc"), ("cuMemFree", "alloc"),
    ("cublas", "library"), ("cudnn", "library"), ("cufft", "library"), ("cusparse", "library"),
    ("cusolver", "library"), ("curandCreate", "library"), ("nccl", "library"),
)
_FORBIDDEN_SCOPES = {"torch": "library", "at": "library", "c10": "library", "cutlass": "library",
                     "cute": "library", "thrust": "library", "pybind11": "library"}
_FORBIDDEN_TYPES = {"thread": "thread", "jthread": "thread", "async": "thread"}
_CPU_ALLOWED = {"malloc", "free", "calloc", "realloc", "aligned_alloc", "posix_memalign"}
_ATTR_FORBIDDEN = re.compile(
    r"\b(constructor|destructor|ifunc|alias|weakref|section|init_priority|visibility)\b")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_UCN = re.compile(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})")


def _forbidden_group(name: str, backend: str) -> str | None:
    if backend == "cpu" and name in _CPU_ALLOWED:
        return None
    if name in _FORBIDDEN:
        return _FORBIDDEN[name]
    for prefix, group in _FORBIDDEN_PREFIX:
        if name.startswith(prefix):
            return group
    return None


def _decode_ucn(name: str) -> str:
    """`\\u0073ystem` is the identifier `system` to a C++ compiler; see through it."""
    return _UCN.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), name)


# ------------------------------------------------------------------------------ parsing

@functools.lru_cache(maxsize=None)
def _parser(backend: str):
    import tree_sitter

    if backend == "cuda":
        import tree_sitter_cuda as grammar
    else:
        import tree_sitter_cpp as grammar
    return tree_sitter.Parser(tree_sitter.Language(grammar.language()))


def _scan_balanced(text: str, i: int) -> int:
    """Index just past the parenthesised group starting at text[i] == '(' (or len(text))."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


_ATTR_START = re.compile(r"\b(__attribute__|__align__|__declspec)\s*\(")
_LAMBDA_SPACE = re.compile(r"\]\s*((?:(?:__host__|__device__)\s*)+)")


def _blank(text: str, a: int, b: int) -> str:
    return text[:a] + re.sub(r"[^\n]", " ", text[a:b]) + text[b:]


def _prepare(source: str, backend: str, out: list[Diagnostic]) -> str:
    """Blank the attribute spellings the grammars mis-parse, keeping every offset; check them first."""
    text = source
    pos = 0
    while (m := _ATTR_START.search(text, pos)) is not None:
        end = _scan_balanced(text, m.end() - 1)
        body = text[m.start():end]
        bad = _ATTR_FORBIDDEN.search(body)
        if bad:
            line, col = _line_col(source, m.start())
            out.append(Diagnostic(line, col, f"attribute '{bad.group(1)}' is not allowed: it runs "
                                  "or redirects code outside the timed call", "load-time-code"))
        for ident in _IDENT.findall(body):
            group = _forbidden_group(ident, backend)
            if group:
                line, col = _line_col(source, m.start())
                out.append(Diagnostic(line, col, f"{ident}() is not allowed in a kernel: {_WHY[group]}",
                                      "forbidden-call"))
        text = _blank(text, m.start(), end)
        pos = end
    if backend == "cuda":
        text = _LAMBDA_SPACE.sub(lambda m: m.group(0)[:m.start(1) - m.start(0)]
                                 + " " * len(m.group(1)), text)
    return text


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _pos(node) -> tuple[int, int]:
    return node.start_point.row + 1, node.start_point.column + 1


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _txt(node) -> str:
    return node.text.decode("utf-8", "replace")


# ------------------------------------------------------------------------------- checks

def check_source(source: str, signature: catalogue.Signature) -> StaticReport:
    """Check one candidate against its task's entry-point signature; backend = signature.backend."""
    backend = signature.backend
    if not isinstance(source, str):
        return _report([Diagnostic(1, 1, f"source is {type(source).__name__}, not text", "empty")])
    if not source.strip():
        return _report([Diagnostic(1, 1, "empty source: there is no code to check", "empty")])
    if "\x00" in source:
        line, col = _line_col(source, source.index("\x00"))
        return _report([Diagnostic(line, col, "source contains a NUL byte: not a text file", "parse")])

    diags: list[Diagnostic] = []
    text = _prepare(source, backend, diags)
    tree = _parser(backend).parse(text.encode("utf-8"))
    root = tree.root_node

    parse = _parse_errors(root, text)
    if parse:
        # Nothing else is meaningful on a tree with holes: report where it breaks.
        return _report(parse + diags)

    _check_splices(source, diags)
    for node in _walk(root):
        t = node.type
        if t == "preproc_include":
            _check_include(node, backend, diags)
        elif t in ("preproc_def", "preproc_function_def"):
            _check_macro(node, backend, diags)
        elif t == "preproc_call":
            _check_directive(node, diags)
        elif t == "identifier":
            _check_identifier(node, backend, diags)
        elif t == "qualified_identifier":
            _check_qualified(node, diags)
        elif t == "type_identifier" and node.parent is not None \
                and node.parent.type != "qualified_identifier" and _txt(node) in _FORBIDDEN_TYPES:
            line, col = _pos(node)
            diags.append(Diagnostic(line, col, f"{_txt(node)} is not allowed in a kernel: "
                                    f"{_WHY['thread']}", "forbidden-call"))
        elif t == "declaration":
            _check_declaration(node, diags)
        elif t == "field_declaration":
            _check_field(node, diags)
        elif t in ("storage_class_specifier",) and _txt(node) in ("thread_local", "__thread"):
            line, col = _pos(node)
            diags.append(Diagnostic(line, col, f"{_txt(node)} state is not allowed: it can carry "
                                    "results from one call to the next", "mutable-state"))
        elif "asm" in t and t.endswith(("expression", "statement", "declaration")):
            _check_asm(node, backend, diags)
        elif t == "kernel_call_syntax":
            _check_launch(node, diags)
        elif t == "attribute_declaration" or t == "attribute":
            bad = _ATTR_FORBIDDEN.search(_txt(node))
            if bad:
                line, col = _pos(node)
                diags.append(Diagnostic(line, col, f"attribute '{bad.group(1)}' is not allowed: it "
                                        "runs or redirects code outside the timed call", "load-time-code"))
    _check_entry(root, signature, diags)
    # one diagnostic per (place, rule): the identifier and its call site say the same thing
    seen, unique = set(), []
    for d in sorted(diags, key=lambda d: (d.line, d.col)):
        key = (d.line, d.col, d.rule, d.message)
        if key not in seen:
            seen.add(key)
            unique.append(d)
    return _report(unique)


def _report(diags: list[Diagnostic]) -> StaticReport:
    return StaticReport(ok=not diags, diagnostics=diags)


def _parse_errors(root, text: str, limit: int = 5) -> list[Diagnostic]:
    if not root.has_error:
        return []
    out: list[Diagnostic] = []
    stack = [root]
    while stack and len(out) < limit:
        n = stack.pop()
        if n.is_missing:
            line, col = _pos(n)
            out.append(Diagnostic(line, col, f"syntax error: missing {n.type!r} (truncated or "
                                  "unbalanced source?)", "parse"))
            continue
        if n.is_error:
            line, col = _pos(n)
            if n.end_byte >= len(text.rstrip().encode("utf-8")):
                out.append(Diagnostic(line, col, "syntax error: what starts here is not closed "
                                      "before the end of the source (truncated?)", "parse"))
                continue
            snippet = _txt(n).strip().splitlines()[0][:40] if _txt(n).strip() else ""
            out.append(Diagnostic(line, col, f"syntax error near {snippet!r}" if snippet
                                  else "syntax error", "parse"))
            continue
        if n.has_error:
            stack.extend(reversed(n.children))
    out.sort(key=lambda d: (d.line, d.col))
    return out


def _check_splices(source: str, diags: list[Diagnostic]) -> None:
    """A backslash-newline outside a directive glues tokens (`sys\\` + `tem`) the grammar sees apart."""
    in_directive = False
    for i, line in enumerate(source.split("\n"), 1):
        starts = line.lstrip().startswith("#")
        directive = in_directive or starts
        continued = line.rstrip("\r").endswith("\\")
        if continued and not directive and not line.lstrip().startswith("//"):
            diags.append(Diagnostic(i, len(line.rstrip("\r")), "a backslash-newline outside a "
                                    "#define is not allowed: it can splice names the check cannot "
                                    "see", "line-splice"))
        in_directive = directive and continued


def _check_include(node, backend: str, diags: list[Diagnostic]) -> None:
    path_node = node.child_by_field_name("path")
    line, col = _pos(node)
    if path_node is None:
        diags.append(Diagnostic(line, col, "#include without a path", "include"))
        return
    raw = _txt(path_node).strip()
    if path_node.type == "string_literal":
        diags.append(Diagnostic(line, col, f"#include {raw} is not allowed: a candidate is one "
                                "self-contained file (use <...> for the allow-listed headers)", "include"))
        return
    if path_node.type != "system_lib_string":
        diags.append(Diagnostic(line, col, f"#include {raw} is not allowed: the header must be "
                                "named literally", "include"))
        return
    path = raw[1:-1].strip()
    if ".." in path or path.startswith("/") or "\\" in path:
        diags.append(Diagnostic(line, col, f"#include <{path}> is not allowed: a header path must "
                                "not climb out of the include directories", "include"))
    elif not _include_allowed(path, backend):
        diags.append(Diagnostic(line, col, f"#include <{path}> is not allowed on the {backend} "
                                f"backend: {_include_reason(path)}", "include"))


_DIRECTIVES_OK = {"#pragma", "#error", "#warning", "#undef"}


def _check_directive(node, diags: list[Diagnostic]) -> None:
    """#include_next, #import, #embed, #line ...: other ways to pull in files or skew line numbers."""
    d = node.child_by_field_name("directive")
    name = re.sub(r"\s+", "", _txt(d)) if d is not None else "#?"
    if name not in _DIRECTIVES_OK:
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, f"the {name} directive is not allowed in a kernel",
                                "preprocessor"))


def _check_macro(node, backend: str, diags: list[Diagnostic]) -> None:
    value = node.child_by_field_name("value")
    if value is None:
        return
    body = _txt(value).replace("\\\r\n", "").replace("\\\n", "")
    line, col = _pos(value)
    if "##" in body:
        diags.append(Diagnostic(line, col, "token pasting (##) is not allowed: it can build names "
                                "the check cannot see", "macro"))
    for ident in _IDENT.findall(_decode_ucn(body)):
        group = _forbidden_group(ident, backend)
        if group:
            diags.append(Diagnostic(line, col, f"{ident}() is not allowed in a kernel: {_WHY[group]}",
                                    "forbidden-call"))
        elif ident in ("asm", "__asm__", "__asm"):
            diags.append(Diagnostic(line, col, "inline asm inside a macro is not allowed", "asm"))
        elif ident in ("thread_local", "__thread"):
            diags.append(Diagnostic(line, col, f"{ident} inside a macro is not allowed", "mutable-state"))


def _check_identifier(node, backend: str, diags: list[Diagnostic]) -> None:
    name = _decode_ucn(_txt(node))
    group = _forbidden_group(name, backend)
    if group:
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, f"{name}() is not allowed in a kernel: {_WHY[group]}",
                                "forbidden-call"))


def _check_qualified(node, diags: list[Diagnostic]) -> None:
    scope = node.child_by_field_name("scope")
    name = node.child_by_field_name("name")
    scope_txt = _txt(scope) if scope is not None else ""
    line, col = _pos(node)
    if scope_txt in _FORBIDDEN_SCOPES and (node.parent is None
                                            or node.parent.type != "qualified_identifier"):
        diags.append(Diagnostic(line, col, f"{_txt(node)} is not allowed: {_WHY['library']} "
                                "(and kernels must not call back into PyTorch)", "forbidden-call"))
    elif scope_txt == "std" and name is not None and _txt(name) in _FORBIDDEN_TYPES:
        diags.append(Diagnostic(line, col, f"std::{_txt(name)} is not allowed in a kernel: "
                                f"{_WHY['thread']}", "forbidden-call"))


def _inside_function(node) -> bool:
    p = node.parent
    while p is not None:
        if p.type in ("function_definition", "lambda_expression"):
            return True
        p = p.parent
    return False


def _specifiers(node) -> tuple[set[str], set[str]]:
    """(storage classes, qualifiers incl. CUDA memory spaces) written on a declaration."""
    storage, quals = set(), set()
    for c in node.children:
        if c.type == "storage_class_specifier":
            storage.add(_txt(c))
        elif c.type == "type_qualifier":
            quals.add(_txt(c))
        elif not c.is_named and c.type in ("__device__", "__constant__", "__shared__", "__managed__",
                                            "__host__", "__global__"):
            quals.add(c.type)
    return storage, quals


def _declared_vars(node):
    """(declarator, top_level_const) for each variable (not function) a declaration introduces."""
    for i, c in enumerate(node.children):
        if node.field_name_for_child(i) != "declarator":
            continue
        if "asm" in c.type:
            continue  # an asm label (`... __asm__("sym")`), reported by _check_asm
        d, top_const, is_func = c, None, False
        while d is not None:
            if d.type in ("function_declarator", "abstract_function_declarator"):
                is_func = True
                break
            if d.type == "pointer_declarator":
                top_const = any(q.type == "type_qualifier" and _txt(q) == "const"
                                for q in d.children)
            if d.type in ("identifier", "field_identifier", "qualified_identifier",
                          "operator_name", "destructor_name"):
                break
            nxt = d.child_by_field_name("declarator")
            if nxt is None:
                named = [x for x in d.named_children if x.type != "type_qualifier"]
                nxt = named[0] if named else None
            d = nxt
        if not is_func:
            yield c, top_const


def _check_declaration(node, diags: list[Diagnostic]) -> None:
    storage, quals = _specifiers(node)
    local = _inside_function(node)
    if local and not storage & {"static", "extern"}:
        return  # an automatic local lives for one call
    if "__shared__" in quals or "__constant__" in quals:
        # __shared__ lives for one block of one launch; device code cannot write __constant__ and
        # the host-side writers (cudaMemcpyToSymbol, cudaGetSymbolAddress) are forbidden calls.
        return
    if "typedef" in storage:
        return
    for decl, top_const in _declared_vars(node):
        immutable = "constexpr" in quals or (top_const if top_const is not None else "const" in quals)
        if immutable:
            continue
        line, col = _pos(decl)
        where = "static local" if local else "file-scope variable"
        space = next((q for q in ("__device__", "__managed__", "__constant__") if q in quals), "")
        what = f"{space} {where}" if space else where
        diags.append(Diagnostic(line, col, f"mutable {what} '{_txt(decl).split('=')[0].strip()}' is "
                                "not allowed: it can carry results from one call to the next "
                                "(make it const/constexpr or pass it in)", "mutable-state"))


def _check_field(node, diags: list[Diagnostic]) -> None:
    storage, quals = _specifiers(node)
    if "static" not in storage or "constexpr" in quals or "const" in quals:
        return
    for decl, top_const in _declared_vars(node):
        if top_const:
            continue
        line, col = _pos(decl)
        diags.append(Diagnostic(line, col, f"mutable static member '{_txt(decl)}' is not allowed: it "
                                "can carry results from one call to the next", "mutable-state"))


def _enclosing_function(node):
    p = node.parent
    while p is not None and p.type != "function_definition":
        p = p.parent
    return p


def _check_asm(node, backend: str, diags: list[Diagnostic]) -> None:
    line, col = _pos(node)
    if node.parent is not None and node.parent.type in ("declaration", "field_declaration",
                                                         "function_definition"):
        code = node.child_by_field_name("assembly_code")
        sym = _txt(code).strip('"') if code is not None else "?"
        diags.append(Diagnostic(line, col, f"asm label {sym!r} is not allowed: it binds a name to a "
                                "symbol the check cannot see", "asm"))
        return
    if backend != "cuda":
        diags.append(Diagnostic(line, col, "inline asm is not allowed on the cpu backend: it can "
                                "issue system calls the check cannot see (use intrinsics from "
                                "<immintrin.h>)", "asm"))
        return
    fn = _enclosing_function(node)
    spaces = {c.type for c in fn.children if not c.is_named} if fn is not None else set()
    if fn is None or not spaces & {"__device__", "__global__"} or "__host__" in spaces:
        diags.append(Diagnostic(line, col, "inline asm is allowed only in __device__/__global__ "
                                "functions (inline PTX); host asm can make system calls the check "
                                "cannot see", "asm"))


_DEFAULT_STREAMS = {"0", "0x0", "nullptr", "NULL", "cudaStreamLegacy", "cudaStreamPerThread",
                    "0x1", "0x2", "1", "2"}


def _check_launch(node, diags: list[Diagnostic]) -> None:
    args = [c for c in node.named_children if c.type != "comment"]
    line, col = _pos(node)
    if len(args) < 4 or _txt(args[3]).strip() in _DEFAULT_STREAMS:
        diags.append(Diagnostic(line, col, "kernel launch must use the given stream: "
                                "<<<grid, block, smem, stream>>> (work on another stream is not "
                                "ordered with the caller or timed)", "launch-stream"))


# ------------------------------------------------------------------------- entry point

_RESTRICT = {"__restrict__", "__restrict", "restrict"}
_CV = {"const", "volatile"}
_ALIASES = {
    "long": "int64_t", "long int": "int64_t", "signed long": "int64_t", "signed long int": "int64_t",
    "long long": "int64_t", "long long int": "int64_t", "signed long long": "int64_t",
    "signed long long int": "int64_t", "int64_t": "int64_t",
    "unsigned short": "uint16_t", "unsigned short int": "uint16_t", "uint16_t": "uint16_t",
    "half": "__half", "nv_bfloat16": "__nv_bfloat16",
}


def _base_type(node) -> str:
    t = re.sub(r"\s+", " ", _txt(node)).strip()
    t = re.sub(r"\s*::\s*", "::", t)
    t = t[2:] if t.startswith("::") else t
    t = t[5:] if t.startswith("std::") else t
    return _ALIASES.get(t, t)


def _param_type(param) -> str:
    """Canonical C type of one parameter: names, `restrict` and top-level cv dropped."""
    if param.type == "variadic_parameter":
        return "..."
    type_node = param.child_by_field_name("type")
    base = _base_type(type_node) if type_node is not None else "?"
    base_q = {_txt(c) for c in param.children if c.type == "type_qualifier"} & _CV
    layers: list[tuple[str, set[str]]] = []
    d = param.child_by_field_name("declarator")
    while d is not None and d.type not in ("identifier", "field_identifier"):
        if d.type in ("pointer_declarator", "abstract_pointer_declarator"):
            layers.append(("*", {_txt(c) for c in d.children if c.type == "type_qualifier"} & _CV))
        elif d.type in ("reference_declarator", "abstract_reference_declarator"):
            layers.append(("&", set()))
        elif d.type in ("array_declarator", "abstract_array_declarator"):
            layers.append(("*", set()))  # a parameter array is a pointer
        elif d.type not in ("parenthesized_declarator", "abstract_parenthesized_declarator"):
            return re.sub(r"\s+", " ", _txt(param))  # function pointers etc.: compare as written
        nxt = d.child_by_field_name("declarator")
        if nxt is None:
            named = [x for x in d.named_children if x.type not in ("type_qualifier", "number_literal")]
            nxt = named[0] if named else None
        d = nxt
    if not layers:
        return base  # top-level cv of a value parameter is not part of the function type
    out = " ".join(sorted(base_q)) + " " + base if base_q else base
    for i, (op, q) in enumerate(layers):
        out += op
        if i < len(layers) - 1 and q:
            out += " " + " ".join(sorted(q))
    return out


def _params(fn_declarator) -> list:
    plist = fn_declarator.child_by_field_name("parameters")
    if plist is None:
        return []
    ps = [c for c in plist.named_children if c.type in ("parameter_declaration", "variadic_parameter",
                                                        "optional_parameter_declaration")]
    if len(ps) == 1 and _txt(ps[0]).strip() == "void":
        return []
    return ps


def _fn_declarator(node):
    """The function_declarator naming `kforge_launch` under a definition/declaration, if any."""
    d = node.child_by_field_name("declarator")
    while d is not None:
        if d.type == "function_declarator":
            name = d.child_by_field_name("declarator")
            return d if name is not None and _txt(name) == ENTRY else None
        d = d.child_by_field_name("declarator")
    return None


def _c_linkage(node) -> bool:
    p = node.parent
    while p is not None:
        if p.type == "linkage_specification":
            v = p.child_by_field_name("value")
            if v is not None and _txt(v).strip('"') == "C":
                return True
        p = p.parent
    return False


@functools.lru_cache(maxsize=256)
def _expected_types(declaration: str, backend: str) -> tuple[str, ...]:
    tree = _parser(backend).parse((declaration + ";").encode())
    for n in _walk(tree.root_node):
        if n.type == "function_declarator":
            return tuple(_param_type(p) for p in _params(n))
    raise ValueError(f"cannot parse the expected declaration {declaration!r}")


def _check_entry(root, signature: catalogue.Signature, diags: list[Diagnostic]) -> None:
    defs, decls = [], []
    for n in _walk(root):
        if n.type == "function_definition" and _fn_declarator(n) is not None:
            defs.append(n)
        elif n.type in ("declaration", "field_declaration") and _fn_declarator(n) is not None:
            decls.append(n)
    want = signature.declaration()
    if not defs:
        if decls:
            line, col = _pos(decls[0])
            diags.append(Diagnostic(line, col, f"{ENTRY} is declared but never defined; define "
                                    f"{want} {{...}}", "entry-point"))
        else:
            diags.append(Diagnostic(1, 1, f"no entry point: the candidate must define {want} {{...}}",
                                    "entry-point"))
        return
    fn = defs[0]
    line, col = _pos(fn)
    storage, _ = _specifiers(fn)
    if "static" in storage:
        diags.append(Diagnostic(line, col, f"{ENTRY} must not be static: it would not be exported",
                                "entry-point"))
    if not _c_linkage(fn) and not any(_c_linkage(d) for d in decls):
        diags.append(Diagnostic(line, col, f'{ENTRY} must have C linkage: write extern "C" int '
                                f'{ENTRY}(...) or put it inside extern "C" {{ }} (a C++ name is '
                                "mangled and the loader cannot find it)", "linkage"))
    rtype = fn.child_by_field_name("type")
    if rtype is None or _base_type(rtype) != "int" or fn.child_by_field_name("declarator").type \
            != "function_declarator":
        got = _txt(rtype) if rtype is not None else "nothing"
        diags.append(Diagnostic(line, col, f"{ENTRY} must return int (0 or a cudaError_t), not {got}",
                                "signature"))
    fd = _fn_declarator(fn)
    params = _params(fd)
    got = [_param_type(p) for p in params]
    expected = list(_expected_types(want, signature.backend))
    names = [p.name for p in signature.params]
    if len(got) != len(expected):
        pline, pcol = _pos(fd.child_by_field_name("parameters"))
        diags.append(Diagnostic(pline, pcol, f"{ENTRY} takes {len(got)} parameters, expected "
                                f"{len(expected)}: expected ({', '.join(expected)}), got "
                                f"({', '.join(got)})", "signature"))
        return
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            pline, pcol = _pos(params[i])
            diags.append(Diagnostic(pline, pcol, f"parameter {i + 1} ({names[i]}): expected {e}, "
                                    f"got {g}", "signature"))
