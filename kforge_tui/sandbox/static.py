"""Static check of a candidate kernel before any compiler runs.

A candidate is untrusted text from an LLM (or a person). Before it costs a compile, this module
refuses what a kernel has no business doing and what would make verification or timing lie:
sources that do not parse, a missing or mis-typed entry point (the generic ABI of
regions/abi.py: `extern "C" int kforge_launch(const void* const* inputs, void* const* outputs
[, cudaStream_t stream])`), headers outside an allow-list (torch, cuBLAS, file or thread
libraries; the one quoted include is the generated `"kforge_region.h"`), calls that run
programs, touch files or sockets, load code, start threads or streams, set signals or timers,
read the environment, change the floating-point environment or allocate outside the stream, and
state that outlives a call.

The rules are written against classes of trick, not single cheats (issue 17):
- preprocessor: every `#pragma` / `_Pragma` outside a small allow-list is refused (kills
  `#pragma redefine_extname`, `weak`, `GCC dependency`, `STDC FENV_ACCESS`, OpenMP `target`...);
  `#define`/`#undef` of a keyword, a CUDA qualifier, a reserved identifier (`__x`, `_X`) or an
  ABI constant (`KF_*`) is refused (kills `#define __device__` turning "device code" into host
  code that issues raw syscalls);
- names: a function declared without a body that this file does not define (a hand-declared
  libc entry such as `int pthread_create(...)` or `char* getenv(...)`), an `extern` variable
  (`extern char** environ`), names reserved for code the compiler generates;
- load-time code: `__attribute__((constructor/destructor/init_priority/ifunc/section/...))`;
- state: every variable with static or thread storage must be immutable all the way down: a
  `T* const` static still points at writable memory, and a `mutable` member is writable
  through a const object (issue 17, class 1);
- host escapes: asm outside device code, and the `__builtin_`s / intrinsics that walk the stack,
  read the thread pointer or time stamp counter, or set MXCSR (flush-to-zero, rounding).

Why an AST walk (tree-sitter) and not regexes: a regex cannot tell a call from a comment, a
string, a field name (`s.open`) or a declaration; it cannot say whether a variable is at file
scope or whether `const` applies to the pointer or the pointee; and it cannot tell inline PTX in
`__device__` code from host assembly. The text-level steps are a few spelling fixes the grammar
lacks (`__align__(n)`, `__attribute__((...))`, `_Pragma(...)`, `[] __device__` lambdas), blanked
to spaces of the same length so that every line and column stays exact, and the preprocessor
directives, which are read from the text with comments removed (the grammar keeps their bodies
as raw strings and does not know the `%:` digraph).

Modules: this one walks the tree (check_source, declarations and state, asm, streams); the
names it refuses are in static_rules.py, the text layer (comments, directives, pragmas,
attribute blanking, the parser) in static_text.py, the entry-point check in static_entry.py.

This check is the fast first filter, not the only layer: the built library's imported symbols,
load-time code and writable data are checked after the compile (sandbox/compile.py,
`link_check`), and candidates run in a killable worker process whose verification they cannot
predict.
"""
from __future__ import annotations

import re

from kforge_tui.regions import abi
# the vocabulary, the text layer and the entry point live beside this module; callers import
# them from here
from kforge_tui.sandbox.static_rules import (_FORBIDDEN_TYPES, _RESERVED_NAMES, _WHY,  # noqa: F401
                                             ENTRY, HEADER_NAME, _ATTR_FORBIDDEN, _FORBIDDEN_SCOPES,
                                             _IDENT, Diagnostic, StaticReport, _decode_ucn,
                                             _forbidden_group, _forbidden_message, _include_allowed,
                                             _include_reason)
from kforge_tui.sandbox.static_text import (_attribute_message, _check_directives, _line_col,  # noqa: F401
                                            _parser, _pos, _prepare, _specifiers, _strip_comments,
                                            _txt, _walk)
from kforge_tui.sandbox.static_entry import _check_entry, _includes_header  # noqa: F401

# ------------------------------------------------------------------------------- checks

def check_source(source: str, signature: abi.Signature) -> StaticReport:
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
    _check_directives(source, backend, diags)
    text = _prepare(source, backend, diags)
    tree = _parser(backend).parse(text.encode("utf-8"))
    root = tree.root_node

    parse = _parse_errors(root, text)
    if parse:
        # Nothing else is meaningful on a tree with holes: report where it breaks (and what the
        # directive and attribute checks already found).
        return _report(_unique(parse + diags))

    _check_splices(source, diags)
    defined = _defined_functions(root)
    if backend == "cuda":
        _check_shadow_uses(root, diags)
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
            _check_bodiless(node, defined, diags)
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
        elif t == "call_expression" and backend == "cuda":
            _check_stream_call(node, diags)
        elif t == "attribute_declaration" or t == "attribute":
            bad = _ATTR_FORBIDDEN.search(_txt(node))
            if bad:
                line, col = _pos(node)
                diags.append(Diagnostic(line, col, _attribute_message(bad.group(1)), "load-time-code"))
    _check_entry(root, signature, diags, _includes_header(root))
    return _report(_unique(diags))


# Within one line, the diagnostic that names the trick comes first (the first diagnostic is the
# one-line message users see): `extern "C" int f(...) __asm__("pthread_create");` is an asm label
# before it is a bodiless declaration.
_RULE_RANK = {"parse": 0, "pragma": 1, "redefine": 1, "preprocessor": 1, "load-time-code": 2,
              "asm": 2, "macro": 2, "reserved-name": 3, "forbidden-call": 3, "extern-variable": 3,
              "mutable-state": 4, "include": 4, "launch-stream": 4, "line-splice": 4,
              "undeclared-function": 5}


# ------------------------------------------------------------------ device variables on the host

_DEVICE_SPACES = ("__constant__", "__device__", "__managed__")


def _device_variable_names(root) -> set[str]:
    """Names of file-scope __constant__/__device__/__managed__ variables the source declares."""
    out = set()
    for n in _walk(root):
        if n.type != "declaration" or _inside_function(n):
            continue
        _, quals = _specifiers(n)
        if quals & set(_DEVICE_SPACES):
            out.update(_decode_ucn(_var_name(d)) for d, _, _ in _declared_vars(n))
    return out


def device_variables(source: str, backend: str = "cuda") -> set[str]:
    """The __constant__/__device__ variables a CUDA source declares where the parser can see them:
    nvcc gives each a host-side shadow in writable memory, which the binary check allows for
    exactly these names (and the source check keeps host code away from them)."""
    if backend != "cuda" or not isinstance(source, str):
        return set()
    try:
        text = _prepare(source, backend, [])
        return _device_variable_names(_parser(backend).parse(text.encode("utf-8")).root_node)
    except Exception:  # a source the parser cannot read declares nothing the check trusts
        return set()


def _is_declared_name(node) -> bool:
    """Whether an identifier is the name a declaration introduces (not a use of it)."""
    child, p = node, node.parent
    while p is not None and p.type in ("array_declarator", "init_declarator", "pointer_declarator",
                                       "reference_declarator", "parenthesized_declarator"):
        if p.child_by_field_name("declarator") != child:
            return False
        child, p = p, p.parent
    if p is None or p.type != "declaration":
        return False
    return any(p.field_name_for_child(i) == "declarator" and c == child
               for i, c in enumerate(p.children))


def _host_context(node) -> bool:
    fn = _enclosing_function(node)
    if fn is None:
        return True  # file scope: a host initialiser
    spaces = {c.type for c in fn.children if not c.is_named}
    return "__host__" in spaces or not spaces & {"__device__", "__global__"}


def _check_shadow_uses(root, diags: list[Diagnostic]) -> None:
    """Host code must not touch a __constant__/__device__ variable: what it reaches is the host
    shadow nvcc keeps for the registration, ordinary writable memory (a place to hide state)."""
    names = _device_variable_names(root)
    if not names:
        return
    tainted = set(names)  # macros whose bodies name a device variable, to a fixpoint
    macros = {}
    for n in _walk(root):
        if n.type in ("preproc_def", "preproc_function_def"):
            name, value = n.child_by_field_name("name"), n.child_by_field_name("value")
            if name is not None and value is not None:
                macros[_txt(name)] = set(_IDENT.findall(_decode_ucn(_txt(value))))
    changed = True
    while changed:
        changed = False
        for m, idents in macros.items():
            if m not in tainted and idents & tainted:
                tainted.add(m)
                changed = True
    for n in _walk(root):
        if n.type != "identifier":
            continue
        name = _decode_ucn(_txt(n))
        if name not in tainted or _is_declared_name(n) or not _host_context(n):
            continue
        if n.parent is not None and n.parent.type in ("preproc_def", "preproc_function_def"):
            continue
        line, col = _pos(n)
        what = name if name in names else f"{name} (a macro naming a device variable)"
        diags.append(Diagnostic(line, col, f"host code must not use the device variable {what}: "
                                "on the host it is a shadow copy in ordinary writable memory, a "
                                "place to keep state between calls", "mutable-state"))


def _unique(diags: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per (place, rule, message): an identifier and its call site say the same."""
    seen, unique = set(), []
    for d in sorted(diags, key=lambda d: (d.line, _RULE_RANK.get(d.rule, 4), d.col)):
        key = (d.line, d.col, d.rule, d.message)
        if key not in seen:
            seen.add(key)
            unique.append(d)
    return unique


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
        if raw == f'"{HEADER_NAME}"':
            return  # the region's generated ABI header, written beside the candidate
        diags.append(Diagnostic(line, col, f"#include {raw} is not allowed: a candidate is one "
                                f'self-contained file; the only quoted include is "{HEADER_NAME}" '
                                "(use <...> for the allow-listed headers)", "include"))
        return
    if path_node.type != "system_lib_string":
        diags.append(Diagnostic(line, col, f"#include {raw} is not allowed: the header must be "
                                "named literally", "include"))
        return
    path = raw[1:-1].strip()
    if ".." in path or path.startswith("/") or "\\" in path:
        diags.append(Diagnostic(line, col, f"#include <{path}> is not allowed: a header path must "
                                "not climb out of the include directories", "include"))
    elif path == HEADER_NAME:
        diags.append(Diagnostic(line, col, f'write #include "{HEADER_NAME}" (quoted): the region '
                                "header sits beside the candidate", "include"))
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
            diags.append(Diagnostic(line, col, _forbidden_message(ident, group), "forbidden-call"))
        elif ident in ("asm", "__asm__", "__asm"):
            diags.append(Diagnostic(line, col, "inline asm inside a macro is not allowed", "asm"))
        elif ident in ("thread_local", "__thread", "mutable"):
            diags.append(Diagnostic(line, col, f"{ident} inside a macro is not allowed", "mutable-state"))
        elif _RESERVED_NAMES.match(ident):
            diags.append(Diagnostic(line, col, f"the name {ident} is reserved for code the compiler "
                                    "generates (the binary check trusts it)", "reserved-name"))


def _check_identifier(node, backend: str, diags: list[Diagnostic]) -> None:
    name = _decode_ucn(_txt(node))
    group = _forbidden_group(name, backend)
    if group:
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, _forbidden_message(name, group), "forbidden-call"))
    elif _RESERVED_NAMES.match(name):
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, f"the name {name} is reserved for code the compiler "
                                "generates (the binary check trusts it)", "reserved-name"))


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



def _is_const(node) -> bool:
    return any(q.type == "type_qualifier" and _txt(q) == "const" for q in node.children)


def _declared_vars(node):
    """(declarator, layers, function_pointer) for each variable (not function) a declaration
    introduces. `layers` lists the const-ness of every pointer level, outermost (the pointee)
    first and the variable itself last; a reference adds a level that is always const."""
    for i, c in enumerate(node.children):
        if node.field_name_for_child(i) != "declarator":
            continue
        if "asm" in c.type:
            continue  # an asm label (`... __asm__("sym")`), reported by _check_asm
        d, layers, is_func, fn_ptr = c, [], False, False
        while d is not None:
            if d.type in ("function_declarator", "abstract_function_declarator"):
                inner = d.child_by_field_name("declarator")
                probe = inner
                while probe is not None and probe.type in ("parenthesized_declarator",
                                                           "abstract_parenthesized_declarator"):
                    probe = next((x for x in probe.named_children if x.type != "type_qualifier"), None)
                if probe is None or probe.type not in ("pointer_declarator", "reference_declarator",
                                                       "abstract_pointer_declarator"):
                    is_func = True
                    break
                fn_ptr, layers = True, []  # a pointer to code: only the pointer levels matter
                d = inner
                continue
            if d.type in ("pointer_declarator", "abstract_pointer_declarator"):
                layers.append(_is_const(d))
            elif d.type in ("reference_declarator", "abstract_reference_declarator"):
                layers.append(True)
            if d.type in ("identifier", "field_identifier", "qualified_identifier",
                          "operator_name", "destructor_name"):
                break
            nxt = d.child_by_field_name("declarator")
            if nxt is None:
                named = [x for x in d.named_children if x.type != "type_qualifier"]
                nxt = named[0] if named else None
            d = nxt
        if not is_func:
            yield c, layers, fn_ptr


def _var_name(decl) -> str:
    """The name a declarator introduces (`** environ` -> `environ`, `cache[N] = {}` -> `cache`)."""
    d = decl
    while d is not None:
        if d.type in ("identifier", "field_identifier", "qualified_identifier", "operator_name",
                      "destructor_name"):
            return _txt(d)
        nxt = d.child_by_field_name("declarator")
        if nxt is None:
            named = [x for x in d.named_children if x.type not in ("type_qualifier",)]
            nxt = named[0] if named else None
        d = nxt
    return _txt(decl).split("=")[0].strip()


def _mutability(quals: set[str], layers: list[bool], fn_ptr: bool) -> str | None:
    """What is writable about a variable with static storage, in words (None: nothing)."""
    if "constexpr" in quals:
        return None  # a constant expression cannot point at memory that is writable and its own
    base_const = fn_ptr or "const" in quals
    if layers and not layers[-1]:
        return "the variable itself can be changed"
    if not layers:
        return None if base_const else "the variable itself can be changed"
    if not base_const or not all(layers):
        return "it points at writable memory (a const pointer to non-const data is still state)"
    return None


def _check_declaration(node, diags: list[Diagnostic]) -> None:
    storage, quals = _specifiers(node)
    local = _inside_function(node)
    if local and not storage & {"static", "extern"}:
        return  # an automatic local lives for one call
    if "extern" in storage and "__shared__" not in quals:  # `extern __shared__ float smem[]` is fine
        for decl, _, _ in _declared_vars(node):
            line, col = _pos(decl)
            diags.append(Diagnostic(line, col, f"extern variable '{_var_name(decl)}' is not allowed: "
                                    "it names data defined outside the kernel (e.g. extern char** "
                                    "environ); a kernel sees only its arguments", "extern-variable"))
        return
    if "__shared__" in quals or "__constant__" in quals:
        # __shared__ lives for one block of one launch; device code cannot write __constant__ and
        # the host-side writers (cudaMemcpyToSymbol, cudaGetSymbolAddress) are forbidden calls.
        return
    if "typedef" in storage:
        return
    extern = node.parent is not None and node.parent.type == "linkage_specification"
    for decl, layers, fn_ptr in _declared_vars(node):
        line, col = _pos(decl)
        name = _var_name(decl)
        if extern:
            diags.append(Diagnostic(line, col, f"extern variable '{name}' is not allowed: it "
                                    "names data defined outside the kernel (e.g. extern char** "
                                    "environ); a kernel sees only its arguments", "extern-variable"))
            continue
        problem = _mutability(quals, layers, fn_ptr)
        if problem is None:
            continue
        where = "static local" if local else "file-scope variable"
        space = next((q for q in ("__device__", "__managed__", "__constant__") if q in quals), "")
        what = f"{space} {where}" if space else where
        diags.append(Diagnostic(line, col, f"mutable {what} '{name}' is not allowed: {problem}, "
                                "so it can carry results from one call to the next (make it "
                                "constexpr, or const all the way down, or pass it in)",
                                "mutable-state"))


def _check_field(node, diags: list[Diagnostic]) -> None:
    storage, quals = _specifiers(node)
    if "mutable" in quals:
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, "a mutable member is not allowed: it can be changed "
                                "through a const (even a static const) object, so it can carry "
                                "results from one call to the next", "mutable-state"))
        return
    if "static" not in storage:
        return
    for decl, layers, fn_ptr in _declared_vars(node):
        problem = _mutability(quals, layers, fn_ptr)
        if problem is None:
            continue
        line, col = _pos(decl)
        diags.append(Diagnostic(line, col, f"mutable static member '{_var_name(decl)}' is not allowed: "
                                f"{problem}, so it can carry results from one call to the next",
                                "mutable-state"))


def _declarator_name(node) -> str | None:
    """The (unqualified) name a function definition or declaration introduces."""
    d = node.child_by_field_name("declarator")
    while d is not None:
        if d.type in ("identifier", "field_identifier", "operator_name", "destructor_name"):
            return _txt(d)
        if d.type == "qualified_identifier":
            return re.split(r"\s*::\s*", _txt(d))[-1]
        if d.type == "template_function":
            n = d.child_by_field_name("name")
            return _txt(n) if n is not None else None
        nxt = d.child_by_field_name("declarator")
        if nxt is None:
            named = [x for x in d.named_children if x.type not in ("type_qualifier", "parameter_list")]
            nxt = named[0] if named else None
        d = nxt
    return None


def _defined_functions(root) -> set[str]:
    return {n for node in _walk(root) if node.type == "function_definition"
            and (n := _declarator_name(node)) is not None}


_LIBM_NAME = re.compile(
    r"^(?:sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|tanh|asinh|acosh|atanh|exp|exp2|exp10|expm1|"
    r"log|log2|log10|log1p|logb|ilogb|pow|sqrt|rsqrt|cbrt|hypot|erf|erfc|erfinv|erfcinv|lgamma|"
    r"tgamma|ceil|floor|trunc|round|lround|llround|rint|lrint|llrint|nearbyint|fmod|remainder|"
    r"remquo|fdim|fmax|fmin|fma|fabs|copysign|nan|nextafter|frexp|ldexp|modf|scalbn|scalbln|"
    r"sincos|sincospi|sinpi|cospi|normcdf|normcdfinv)[fl]?$")


_TYPE_NODES = {"primitive_type", "sized_type_specifier", "struct_specifier", "class_specifier",
               "enum_specifier", "union_specifier", "type_qualifier", "template_type",
               "qualified_identifier"}


def _params_look_like_types(fd) -> bool:
    """Whether a block-scope `T f(...)` declares a function (parameter types) rather than an
    object built from expressions (`std::vector<float> e(kN)`, the most vexing parse)."""
    plist = fd.child_by_field_name("parameters")
    if plist is None:
        return False
    params = [c for c in plist.named_children if c.type != "comment"]
    if not params:
        return True  # `int getpid();`
    for p in params:
        if p.type == "variadic_parameter" or p.child_by_field_name("declarator") is not None:
            return True
        t = p.child_by_field_name("type")
        if t is not None and (t.type in _TYPE_NODES or _txt(t) in ("size_t", "int64_t", "uint64_t",
                                                                     "int32_t", "uint32_t")):
            return True
    return False


def _check_bodiless(node, defined: set[str], diags: list[Diagnostic]) -> None:
    """A function declared without a body that this file never defines: a hand-declared entry
    into some library (`int pthread_create(...)`, `extern "C" char* getenv(...)`)."""
    storage, _ = _specifiers(node)
    if "typedef" in storage or (node.parent is not None
                                and node.parent.type in ("field_declaration_list", "template_declaration")
                                and node.parent.parent is not None
                                and node.parent.parent.type in ("class_specifier", "struct_specifier",
                                                                "union_specifier")):
        return
    d = node.child_by_field_name("declarator")
    fd = None
    while d is not None:
        if d.type == "function_declarator":
            inner = d.child_by_field_name("declarator")
            if inner is not None and inner.type in ("identifier", "qualified_identifier",
                                                    "field_identifier", "operator_name",
                                                    "destructor_name", "template_function"):
                fd = d
            break  # `(*fp)(int)` is a function pointer variable: _check_declaration's business
        if d.type in ("init_declarator", "parenthesized_declarator", "identifier",
                      "array_declarator"):
            break  # a variable
        d = d.child_by_field_name("declarator")
    if fd is None:
        return
    if _inside_function(node) and "extern" not in storage and not _params_look_like_types(fd):
        return  # `std::vector<float> e(n);`: an object, whatever the grammar calls it
    name = _declarator_name(node)
    if name is None or name in defined or name == ENTRY or _LIBM_NAME.match(name):
        return
    line, col = _pos(node)
    group = _forbidden_group(name, "cuda")
    why = f" ({_WHY[group]})" if group else ""
    diags.append(Diagnostic(line, col, f"function '{name}' is declared here but not defined: a "
                            "kernel calls only functions it defines or that the allowed headers "
                            f"declare; a hand-written declaration reaches library code the check "
                            f"cannot vet{why}", "undeclared-function"))


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


# Runtime API calls that take a stream, and the index of that argument.
_STREAM_ARG = {"cudaLaunchKernel": 5, "cudaLaunchCooperativeKernel": 5, "cudaMemcpyAsync": 4,
               "cudaMemsetAsync": 3, "cudaMallocAsync": 2, "cudaFreeAsync": 1,
               "cudaMemcpy2DAsync": 7, "cudaMemset2DAsync": 5}


def _check_stream_call(node, diags: list[Diagnostic]) -> None:
    """`cudaLaunchKernel(..., 0)`, `cudaMemcpyAsync(d, s, n, kind)` (the stream defaults to 0):
    work on the legacy default stream, which <<<...>>> checking alone would not see."""
    fn = node.child_by_field_name("function")
    args = node.child_by_field_name("arguments")
    if fn is None or args is None:
        return
    name = re.split(r"\s*::\s*", _txt(fn))[-1]
    if name not in _STREAM_ARG:
        return
    vals = [c for c in args.named_children if c.type != "comment"]
    i = _STREAM_ARG[name]
    if len(vals) <= i or _txt(vals[i]).strip() in _DEFAULT_STREAMS \
            or re.fullmatch(r"\(\s*cudaStream_t\s*\)\s*(0|nullptr|NULL)", _txt(vals[i]).strip()):
        line, col = _pos(node)
        diags.append(Diagnostic(line, col, f"{name} must be given the launcher's stream argument "
                                "(work on the default stream is not ordered with the caller or "
                                "timed)", "launch-stream"))


def _check_launch(node, diags: list[Diagnostic]) -> None:
    args = [c for c in node.named_children if c.type != "comment"]
    line, col = _pos(node)
    if len(args) < 4 or _txt(args[3]).strip() in _DEFAULT_STREAMS:
        diags.append(Diagnostic(line, col, "kernel launch must use the given stream: "
                                "<<<grid, block, smem, stream>>> (work on another stream is not "
                                "ordered with the caller or timed)", "launch-stream"))


