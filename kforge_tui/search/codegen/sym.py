"""Integer index algebra for generated kernels: affine forms over bounded loop variables,
with exact floor division and modulo by positive constants.

Generated kernels index every tensor through expressions such as
`(i // 25) % 8 * 5 + i % 5`. Most of those cancel once the ranges of the loop variables are
known (a contiguous tensor read through a `view` is just `i`; the group of a group_norm row is
the row itself), and the kernels are only fast - and the reduction epilogue only provably on
its own row - when they do. A `Form` is `const + sum(coeff * atom)`, an atom being a loop
variable with range [0, n) or a floor division / modulo of a non-negative form by a constant.
Simplification rules (all exact for non-negative integers):

  * (g*q + r) // d == q // (d/g)           when g | d and 0 <= r < g
  * (d*q + r) // d == q + r // d
  * (g*q + r) %  d == g*(q % (d/g)) + r    when g | d and 0 <= r < g
  * x // d == 0 and x % d == x             when 0 <= x < d
  * (x // a) // b == x // (a*b),  (x % a) % b == x % b when b | a
  * c*(x // c) + x % c == x                (recombination)

Forms are immutable and hashable (their `key`); equality of keys is what the generators use
to decide that two index expressions are the same.
"""
from __future__ import annotations

import math
from functools import cached_property

INT32_MAX = 2**31 - 1


class Unsupported(Exception):
    """A region (or a parameter point) this code generator cannot express; the message says why."""


class Atom:
    __slots__ = ("kind", "name", "arg", "k", "lo", "hi", "key", "_h")

    def __init__(self, kind: str, name: str = "", arg: "Form | None" = None, k: int = 0,
                 lo: int = 0, hi: int = 0):
        self.kind = kind  # "var" | "div" | "mod"
        self.name = name
        self.arg = arg
        self.k = k
        self.lo = lo
        self.hi = hi
        if kind == "var":
            self.key = ("v", name)
        else:
            self.key = (kind, arg.key, k)
        self._h = hash(self.key)

    def __hash__(self):
        return self._h

    def __eq__(self, other):
        return isinstance(other, Atom) and self.key == other.key

    def __repr__(self):
        return self.c()

    def free(self) -> frozenset:
        if self.kind == "var":
            return frozenset((self.name,))
        return self.arg.free

    def c(self) -> str:
        if self.kind == "var":
            return self.name
        op = "/" if self.kind == "div" else "%"
        inner = self.arg.c()
        if self.arg.hi <= INT32_MAX:  # 32-bit unsigned division: far cheaper on a GPU
            return f"(int64_t)((uint32_t)({inner}) {op} {self.k}u)"
        return f"(({inner}) {op} {self.k}LL)"


def var(name: str, n: int) -> "Form":
    """A loop variable with range [0, n) (n <= 1: the constant 0)."""
    if n <= 1:
        return const(0)
    return Form({Atom("var", name, lo=0, hi=max(0, n - 1)): 1}, 0)


def const(c: int) -> "Form":
    return Form({}, int(c))


class Form:
    """const + sum(coeff * atom): an integer index expression."""

    __slots__ = ("terms", "const", "__dict__")

    def __init__(self, terms: dict, c: int = 0):
        self.terms = {a: v for a, v in terms.items() if v != 0}
        self.const = int(c)

    # ------------------------------------------------------------ identity and ranges
    @cached_property
    def key(self):
        return (tuple(sorted(((a.key, v) for a, v in self.terms.items()), key=repr)), self.const)

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, Form) and self.key == other.key

    @cached_property
    def lo(self) -> int:
        return self.const + sum(min(v * a.lo, v * a.hi) for a, v in self.terms.items())

    @cached_property
    def hi(self) -> int:
        return self.const + sum(max(v * a.lo, v * a.hi) for a, v in self.terms.items())

    @cached_property
    def free(self) -> frozenset:
        out = frozenset()
        for a in self.terms:
            out |= a.free()
        return out

    def is_const(self) -> bool:
        return not self.terms

    def __repr__(self):
        return self.c()

    # ------------------------------------------------------------ arithmetic
    def __add__(self, other) -> "Form":
        if isinstance(other, int):
            return Form(self.terms, self.const + other) if other else self
        t = dict(self.terms)
        for a, v in other.terms.items():
            t[a] = t.get(a, 0) + v
        return _recombine(Form(t, self.const + other.const))

    __radd__ = __add__

    def __sub__(self, other) -> "Form":
        if isinstance(other, int):
            return self + (-other)
        return self + other * -1

    def __mul__(self, c: int) -> "Form":
        c = int(c)
        if c == 0:
            return const(0)
        if c == 1:
            return self
        return Form({a: v * c for a, v in self.terms.items()}, self.const * c)

    __rmul__ = __mul__

    def __floordiv__(self, d: int) -> "Form":
        return floordiv(self, int(d))

    def __mod__(self, m: int) -> "Form":
        return mod(self, int(m))

    # ------------------------------------------------------------ substitution
    def subs(self, env: dict) -> "Form":
        """Replace variables by forms (name -> Form); re-simplifies."""
        if not (self.free & set(env)):
            return self
        out = const(self.const)
        for a, v in self.terms.items():
            out = out + _atom_subs(a, env) * v
        return out

    # ------------------------------------------------------------ C
    def c(self) -> str:
        parts = []
        for a, v in sorted(self.terms.items(), key=lambda av: repr(av[0].key)):
            s = a.c()
            if v == 1:
                parts.append(s)
            elif v == -1:
                parts.append(f"-{s}")
            else:
                parts.append(f"{v}LL * {s}" if abs(v) > INT32_MAX else f"{v} * {s}")
        if self.const or not parts:
            parts.append(f"{self.const}LL" if abs(self.const) > INT32_MAX else str(self.const))
        s = " + ".join(parts).replace("+ -", "- ")
        return s if len(parts) == 1 else f"({s})"


def _atom_subs(a: Atom, env: dict) -> Form:
    if a.kind == "var":
        return env.get(a.name, Form({a: 1}, 0))
    inner = a.arg.subs(env)
    return floordiv(inner, a.k) if a.kind == "div" else mod(inner, a.k)


def _divisors_desc(d: int):
    small = [g for g in range(1, int(math.isqrt(d)) + 1) if d % g == 0]
    out = set(small) | {d // g for g in small}
    return sorted(out, reverse=True)


def _split(f: Form, g: int) -> tuple[Form, Form]:
    """f = g*q + r with q the terms (and constant part) divisible by g."""
    qt, rt = {}, {}
    for a, v in f.terms.items():
        if v % g == 0:
            qt[a] = v // g
        else:
            rt[a] = v
    qc, rc = divmod(f.const, g)
    return Form(qt, qc), Form(rt, rc)


def floordiv(f: Form, d: int) -> Form:
    if d <= 0:
        raise Unsupported(f"division by {d} in an index")
    if d == 1:
        return f
    if f.lo // d == f.hi // d:
        return const(f.lo // d)
    # (d*q + r) // d == q + r // d
    q, r = _split(f, d)
    if not q.is_const() or q.const:
        if r.lo >= 0:
            return q + floordiv(r, d)
    # (g*q + r) // d == q // (d/g) when g | d and 0 <= r < g
    for g in _divisors_desc(d):
        if g == 1:
            break
        q, r = _split(f, g)
        if r.lo >= 0 and r.hi < g and not q.is_const():
            return floordiv(q, d // g)
    # (x // a) // d == x // (a*d)
    if len(f.terms) == 1 and f.const == 0:
        (a, v), = f.terms.items()
        if v == 1 and a.kind == "div":
            return floordiv(a.arg, a.k * d)
    if f.lo < 0:
        raise Unsupported("floor division of an index that can be negative")
    return Form({Atom("div", arg=f, k=d, lo=f.lo // d, hi=f.hi // d): 1}, 0)


def mod(f: Form, m: int) -> Form:
    if m <= 0:
        raise Unsupported(f"modulo by {m} in an index")
    if m == 1:
        return const(0)
    # drop multiples of m
    t = {a: v for a, v in f.terms.items() if v % m}
    f = Form(t, f.const % m) if (len(t) != len(f.terms) or not 0 <= f.const < m) else f
    if f.lo >= 0 and f.hi < m:
        return f
    if f.lo // m == f.hi // m and f.lo >= 0:
        return f - (f.lo // m) * m
    for g in _divisors_desc(m):
        if g == 1:
            break
        q, r = _split(f, g)
        if r.lo >= 0 and r.hi < g and not q.is_const():
            return mod(q, m // g) * g + r
    if len(f.terms) == 1 and f.const == 0:
        (a, v), = f.terms.items()
        if v == 1 and a.kind == "mod" and a.k % m == 0:
            return mod(a.arg, m)
    if f.lo < 0:
        raise Unsupported("modulo of an index that can be negative")
    return Form({Atom("mod", arg=f, k=m, lo=0, hi=min(m - 1, f.hi)): 1}, 0)


def _recombine(f: Form) -> Form:
    """c*(x // c) + x % c -> x wherever both halves are present with matching coefficients."""
    changed = True
    while changed:
        changed = False
        for a, v in list(f.terms.items()):
            if a.kind != "mod":
                continue
            x, c = a.arg, a.k
            dv = floordiv(x, c)
            need = dv * (v * c)
            if need.is_const():
                continue
            if all(f.terms.get(b, 0) == w for b, w in need.terms.items()):
                t = dict(f.terms)
                for b in need.terms:
                    del t[b]
                del t[a]
                rest = Form(t, f.const - need.const)
                # x*v added back (x may share atoms with rest: plain merge, then recombine again)
                t2 = dict(rest.terms)
                for b, w in x.terms.items():
                    t2[b] = t2.get(b, 0) + w * v
                f = Form(t2, rest.const + x.const * v)
                changed = True
                break
    return f


def ravel(idx, shape) -> Form:
    """Row-major linear index of the index forms `idx` over `shape`."""
    out = const(0)
    mul = 1
    for i, s in zip(reversed(list(idx)), reversed(list(shape))):
        if s != 1:
            out = out + i * mul
        mul *= s
    return out


def unravel(lin: Form, shape) -> list:
    """Index forms of the row-major linear index `lin` over `shape`. The outermost coordinate
    takes no modulo: `lin` is an index into the shape (its symbolic range may be looser, as for
    the rows of a partly filled last block)."""
    out = []
    inner = 1
    shape = list(shape)
    for k, s in enumerate(reversed(shape)):
        if s == 1:
            out.append(const(0))
        elif k == len(shape) - 1:
            out.append(floordiv(lin, inner))
        else:
            out.append(floordiv(lin, inner) % s if inner > 1 else lin % s)
        inner *= s
    return list(reversed(out))
