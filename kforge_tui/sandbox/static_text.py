"""The source check's text layer: comments, preprocessor directives and pragmas read from the
text, the attribute and `_Pragma` spellings the grammars mis-parse blanked (every offset kept),
and the tree-sitter parser with the small tree helpers every rule uses.
"""
from __future__ import annotations

import functools
import re

from kforge_tui.sandbox.static_rules import (_ATTR_FORBIDDEN, _IDENT, HEADER_NAME, Diagnostic,
                                             _decode_ucn, _forbidden_group, _forbidden_message)

# ------------------------------------------------------------------------ preprocessor

# Keywords and qualifiers a candidate must not redefine or undefine with the preprocessor. Every
# reserved identifier (`__x`, `_X`: CUDA's __device__/__global__/__shared__, GCC's __attribute__,
# __asm__, ...) is refused by rule; these are the plain-spelled ones.
_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
nullptr operator or or_eq private protected public register reinterpret_cast requires return
short signed sizeof static static_assert static_cast struct switch template this thread_local
throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
xor xor_eq restrict typeof defined main
""".split())
_MACRO_OK = {"_USE_MATH_DEFINES"}  # reserved spelling, harmless and common


def _macro_name_problem(name: str) -> str | None:
    if name in _MACRO_OK:
        return None
    if name in _KEYWORDS:
        return f"'{name}' is a C++ keyword"
    if name.startswith("__") or (len(name) > 1 and name[0] == "_" and name[1].isupper()):
        return (f"'{name}' is a reserved name (CUDA qualifiers such as __device__ and compiler "
                "keywords such as __attribute__ are spelled this way)")
    if name.startswith(("KF_", "kf_", "kforge_")):
        return f"'{name}' belongs to the region's ABI header ({HEADER_NAME})"
    return None


def _strip_comments(source: str) -> str:
    """The source with every comment replaced by spaces (newlines kept): offsets stay exact.
    String, character and raw-string literals are kept as they are."""
    out = list(source)
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "/" and i + 1 < n and source[i + 1] == "/":
            j = i
            while j < n and source[j] != "\n":
                if source[j] == "\\" and j + 1 < n and source[j + 1] == "\n":
                    j += 2  # a line comment continues over a line splice
                    continue
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == "/" and i + 1 < n and source[i + 1] == "*":
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == "R" and i + 1 < n and source[i + 1] == '"' and (i == 0 or not (
                source[i - 1].isalnum() or source[i - 1] == "_") or source[i - 1] in "uUL8"):
            m = re.match(r'R"([^()\\\s]{0,16})\(', source[i:])
            if m:
                end = source.find(")" + m.group(1) + '"', i + m.end())
                i = n if end < 0 else end + len(m.group(1)) + 2
            else:
                i += 1
        elif c == "'" and 0 < i < n - 1 and source[i - 1].isdigit() and source[i + 1].isalnum():
            i += 1  # a digit separator (1'000'000), not a character literal
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return "".join(out)


_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*([A-Za-z_]\w*)?(.*)$")


def _directives(clean: str):
    """(line, col, name, argument) of every preprocessor directive, continuation lines joined."""
    lines = clean.split("\n")
    i = 0
    while i < len(lines):
        first = i
        text = lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + lines[i]
        m = _DIRECTIVE.match(text)
        if m:
            col = len(text) - len(text.lstrip(" \t")) + 1
            digraph = text.lstrip(" \t").startswith("%:")
            yield first + 1, col, m.group(1) or "", m.group(2).strip(), digraph
        i += 1


_PRAGMA_EXPR = re.compile(r"^[\w\s()+\-*/<>%,.]*$")  # `unroll (kVec * 2)`: an integer expression
_OMP_DIRECTIVES = frozenset(
    "parallel for simd sections section single master masked critical atomic barrier task "
    "taskloop taskwait taskgroup taskyield ordered loop flush scan declare reduction unroll tile"
    .split())
_OMP_CLAUSES = frozenset(
    "private firstprivate lastprivate shared default reduction schedule collapse nowait "
    "num_threads if proc_bind simdlen safelen aligned linear uniform inbranch notinbranch untied "
    "mergeable final priority grainsize num_tasks nogroup depend in_reduction task_reduction read "
    "write update capture compare seq_cst relaxed acquire release acq_rel hint copyprivate "
    "nontemporal order partial full sizes initializer filter bind inscan inclusive exclusive "
    "static dynamic guided auto runtime none threads monotonic nonmonotonic close spread primary "
    "concurrent reproducible unconstrained omp_priv omp_orig omp_in omp_out"
    .split())
_GCC_OPTIMIZE_OK = {"O1", "O2", "O3", "-O1", "-O2", "-O3", "unroll-loops", "-funroll-loops",
                    "tree-vectorize", "-ftree-vectorize", "no-math-errno", "-fno-math-errno"}
_PRAGMA_WHY = {
    "redefine_extname": "it makes a name in the source call a different library symbol (a way "
                        "to reach a forbidden function under an innocent name)",
    "weak": "it creates weak symbols and aliases the binary check cannot attribute",
    "STDC": "kernels must not depend on or change the floating-point environment",
    "GCC": "it changes how the compiler builds or links the code",
    "omp": "only OpenMP's parallel/for/simd/task/reduction/... directives are allowed on cpu",
    "push_macro": "it can bring back a macro the check has seen removed",
    "pop_macro": "it can bring back a macro the check has seen removed",
}


def _pragma_problem(text: str, backend: str) -> str | None:
    """Why a pragma (the text after `#pragma`) is not allowed, or None when it is."""
    words = text.split()
    if not words:
        return None  # an empty pragma does nothing
    first, rest = words[0], text[len(words[0]):].strip()
    if first == "once" and not rest:
        return None
    if first in ("unroll", "nounroll") and _PRAGMA_EXPR.match(rest):
        return None
    gcc = re.match(r"^GCC\s+(\w+)\s*(.*)$", text.strip(), re.S)
    if first == "GCC" and gcc:
        sub, arg = gcc.group(1), gcc.group(2).strip()
        if sub == "unroll" and _PRAGMA_EXPR.match(arg):
            return None
        if sub in ("ivdep", "push_options", "pop_options") and not arg:
            return None
        if sub == "diagnostic" and re.match(r'^(push|pop|(ignored|warning)\s+"-W[\w=+-]*")$', arg):
            return None
        if sub == "optimize" and re.match(r'^\(\s*"[^"]*"(\s*,\s*"[^"]*")*\s*\)$', arg) and all(
                o in _GCC_OPTIMIZE_OK for o in re.findall(r'"([^"]*)"', arg)):
            return None
        if sub == "target" and re.match(r'^\(\s*"[\w.,=+-]*"(\s*,\s*"[\w.,=+-]*")*\s*\)$', arg):
            return None
        return (f"#pragma GCC {sub} is not allowed: {_PRAGMA_WHY['GCC']} (allowed: GCC unroll, "
                "ivdep, diagnostic, push_options/pop_options, optimize(\"O3\"), target(\"...\"))")
    if backend == "cuda" and first in ("nv_diag_suppress", "nv_diag_default", "nv_diag_warning",
                                       "nv_diag_once", "diag_suppress", "diag_default",
                                       "diag_warning") and re.match(r"^[\w\s,]*$", rest):
        return None
    if first == "omp":
        if backend != "cpu":
            return "#pragma omp is not allowed on the cuda backend: the launcher runs on one host thread"
        body = rest
        while True:  # drop parenthesised clause arguments: `reduction(max: m)`, `critical(name)`
            nxt = re.sub(r"\([^()]*\)", " ", body)
            if nxt == body:
                break
            body = nxt
        if re.search(r"[^\w\s,:]", body):
            return f"#pragma omp {rest} is not allowed: the directive could not be read"
        ws = re.findall(r"[A-Za-z_]\w*", body)
        if not ws or ws[0] not in _OMP_DIRECTIVES or (ws[0] == "declare" and (
                len(ws) < 2 or ws[1] not in ("simd", "reduction"))):
            return (f"#pragma omp {ws[0] if ws else ''} is not allowed: {_PRAGMA_WHY['omp']}")
        bad = [w for w in ws if w not in _OMP_DIRECTIVES and w not in _OMP_CLAUSES]
        if bad:
            return f"#pragma omp ... {bad[0]} is not allowed: {_PRAGMA_WHY['omp']}"
        return None
    why = _PRAGMA_WHY.get(first, "only unroll/once pragmas (and, on cpu, OpenMP's) are allowed: "
                                 "a pragma can rename symbols or change how the code is built")
    return f"#pragma {first} is not allowed: {why}"


def _pragma_text_problems(text: str, backend: str) -> list[tuple[str, str]]:
    """(rule, message) for code hidden in a pragma's text: OpenMP clauses are expressions
    (`if(...)`, `num_threads(...)`, reduction combiners) evaluated at run time."""
    out = []
    if re.search(r"[{};]", text) or re.search(r"\b(asm|__asm__|__asm)\b", text):
        out.append(("pragma", "a pragma must not contain statements or asm"))
    # string literals are option names already checked against the allow-list by
    # _pragma_problem (`GCC optimize ("no-math-errno")`), not identifiers code could call
    for ident in _IDENT.findall(_decode_ucn(re.sub(r'"[^"\n]*"', '""', text))):
        group = _forbidden_group(ident, backend)
        if group:
            out.append(("forbidden-call", _forbidden_message(ident, group)))
    return out


def _check_directives(source: str, backend: str, diags: list[Diagnostic]) -> None:
    """Rules on preprocessor directives, read from the text (comments removed)."""
    clean = _strip_comments(source)
    for line, col, name, arg, digraph in _directives(clean):
        if digraph:
            diags.append(Diagnostic(line, col, f"%:{name} is not allowed: spell preprocessor "
                                    "directives with # (the digraph hides them from the check)",
                                    "preprocessor"))
        if name in ("define", "undef"):
            m = _IDENT.match(arg)
            macro = m.group(0) if m else ""
            problem = _macro_name_problem(macro) if macro else None
            if problem:
                diags.append(Diagnostic(line, col, f"#{name} {macro} is not allowed: {problem}; "
                                        "redefining it changes what the checked code means "
                                        "(e.g. host code posing as device code)", "redefine"))
            if "%:%:" in arg:
                diags.append(Diagnostic(line, col, "token pasting (%:%: / ##) is not allowed: it "
                                        "can build names the check cannot see", "macro"))
        elif name == "pragma":
            problem = _pragma_problem(arg, backend)
            if problem:
                diags.append(Diagnostic(line, col, problem, "pragma"))
            for rule, msg in _pragma_text_problems(arg, backend):
                diags.append(Diagnostic(line, col, msg, rule))
    for m in _PRAGMA_OP.finditer(clean):
        line, col = _line_col(source, m.start())
        lit = m.group(2)
        if lit is None:
            diags.append(Diagnostic(line, col, f"{m.group(1)} needs one plain string literal "
                                    "(e.g. _Pragma(\"unroll\"))", "pragma"))
            continue
        text = bytes(lit[1:-1], "utf-8").decode("unicode_escape", "replace")
        problem = _pragma_problem(text, backend)
        if problem:
            diags.append(Diagnostic(line, col, problem.replace("#pragma", "_Pragma", 1), "pragma"))
        for rule, msg in _pragma_text_problems(text, backend):
            diags.append(Diagnostic(line, col, msg, rule))


_PRAGMA_OP = re.compile(r'\b(_Pragma|__pragma)\s*(?:\(\s*(L?"(?:[^"\\\n]|\\.)*")\s*\)|)')


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


# GCC accepts `__attribute` as well as `__attribute__` (same meaning): both are attributes.
_ATTR_START = re.compile(r"\b(__attribute__|__attribute|__align__|__declspec)\s*\(")
_LAMBDA_SPACE = re.compile(r"\]\s*((?:(?:__host__|__device__)\s*)+)")


def _blank(text: str, a: int, b: int) -> str:
    return text[:a] + re.sub(r"[^\n]", " ", text[a:b]) + text[b:]


_ATTR_WHY = {
    "constructor": "it runs code when the library loads, before any checked call",
    "destructor": "it runs code when the library unloads, after the checked calls",
    "init_priority": "it runs a static initialiser when the library loads, before any checked call",
    "ifunc": "its resolver runs when the library loads",
    "target_clones": "its resolver runs when the library loads",
    "section": "it places code or data where the binary check does not expect it",
    "noinit": "memory that is not cleared keeps values between loads",
    "persistent": "memory that is not cleared keeps values between loads",
}


def _attribute_message(name: str) -> str:
    why = _ATTR_WHY.get(name, "it redirects or hides a symbol from the checks")
    return f"attribute '{name}' is not allowed: {why}"


def _prepare(source: str, backend: str, out: list[Diagnostic]) -> str:
    """Blank the attribute and `_Pragma(...)` spellings the grammars mis-parse, keeping every
    offset; check attributes first (pragmas are checked by _check_directives). Comments are
    blanked too: an attribute or pragma named in a comment is not code."""
    text = _strip_comments(source)
    pos = 0
    while (m := _ATTR_START.search(text, pos)) is not None:
        end = _scan_balanced(text, m.end() - 1)
        body = text[m.start():end]
        bad = _ATTR_FORBIDDEN.search(body)
        if bad:
            line, col = _line_col(source, m.start())
            out.append(Diagnostic(line, col, _attribute_message(bad.group(1)), "load-time-code"))
        for ident in _IDENT.findall(body):
            group = _forbidden_group(ident, backend)
            if group:
                line, col = _line_col(source, m.start())
                out.append(Diagnostic(line, col, _forbidden_message(ident, group), "forbidden-call"))
        text = _blank(text, m.start(), end)
        pos = end
    for m in list(_PRAGMA_OP.finditer(text)):
        if m.group(2) is not None and not _in_directive(text, m.start()):
            text = _blank(text, m.start(), m.end())  # in code: a statement the grammar lacks
    if backend == "cuda":
        text = _LAMBDA_SPACE.sub(lambda m: m.group(0)[:m.start(1) - m.start(0)]
                                 + " " * len(m.group(1)), text)
    return text


def _in_directive(text: str, offset: int) -> bool:
    """Whether `offset` lies on a preprocessor directive's logical line (continuations included)."""
    start = text.rfind("\n", 0, offset) + 1
    while start > 1 and text[start - 2] == "\\":
        start = text.rfind("\n", 0, start - 1) + 1
    return text[start:offset].lstrip(" \t").startswith(("#", "%:"))


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

