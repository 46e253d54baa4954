"""The source check of the entry point: `kforge_launch` defined once, exported, with C linkage,
returning int, with exactly the generic ABI's parameter types (regions/abi.py)."""
from __future__ import annotations

import functools
import re

from kforge_tui.regions import abi
from kforge_tui.sandbox.static_rules import ENTRY, HEADER_NAME, Diagnostic
from kforge_tui.sandbox.static_text import _parser, _pos, _specifiers, _txt, _walk

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


def _includes_header(root) -> bool:
    for n in _walk(root):
        if n.type == "preproc_include":
            p = n.child_by_field_name("path")
            if p is not None and _txt(p).strip() == f'"{HEADER_NAME}"':
                return True
    return False


_PARAM_NAMES = ("inputs", "outputs", "stream")


def _check_entry(root, signature: abi.Signature, diags: list[Diagnostic],
                 has_header: bool = False) -> None:
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
    if len(defs) > 1:
        line, col = _pos(defs[1])
        diags.append(Diagnostic(line, col, f"{ENTRY} is defined more than once", "entry-point"))
    fn = defs[0]
    line, col = _pos(fn)
    storage, _ = _specifiers(fn)
    if "static" in storage:
        diags.append(Diagnostic(line, col, f"{ENTRY} must not be static: it would not be exported",
                                "entry-point"))
    # The generated header declares the entry point extern "C"; a later definition keeps that
    # linkage, so a candidate that includes the header may define it without repeating extern "C".
    if not has_header and not _c_linkage(fn) and not any(_c_linkage(d) for d in decls):
        diags.append(Diagnostic(line, col, f'{ENTRY} must have C linkage: write extern "C" int '
                                f'{ENTRY}(...), put it inside extern "C" {{ }} or include '
                                f'"{HEADER_NAME}" (a C++ name is mangled and the loader cannot '
                                "find it)", "linkage"))
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
    names = list(_PARAM_NAMES[:len(expected)])
    if len(got) != len(expected):
        pline, pcol = _pos(fd.child_by_field_name("parameters"))
        diags.append(Diagnostic(pline, pcol, f"{ENTRY} takes {len(got)} parameters, expected "
                                f"{len(expected)}: expected ({', '.join(expected)}), got "
                                f"({', '.join(got)}); the entry point is {want}", "signature"))
        return
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            pline, pcol = _pos(params[i])
            diags.append(Diagnostic(pline, pcol, f"parameter {i + 1} ({names[i]}): expected {e}, "
                                    f"got {g} (shapes, strides and dtypes come from "
                                    f"{HEADER_NAME}, not from parameters)", "signature"))

