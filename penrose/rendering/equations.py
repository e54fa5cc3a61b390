"""Symbolic equations for diagrams: sympy expressions, their LaTeX, and SVG drawn by mathtext.

An einsum becomes the paper's index equation, written with the diagram's own names:

    einsum('td,de->te', Z, W)   →   h_{te} = \\sum_{d} Z_{td} \\, W_{de}

Tensor entries are sympy `Indexed` objects (a scalar is a `Symbol`), sums are `Sum`s over leg
symbols, and activations are sympy functions that print as σ, softmax_p, top-k_u, RMSNorm_e….
A custom printer keeps operands in diagram order and drops summation bounds, as the paper does.
`latex_to_svg` draws with matplotlib's mathtext (no TeX install); `to_mathtext` first rewrites
the few constructs sympy emits that mathtext does not parse.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Iterable

import sympy
from sympy.printing.latex import LatexPrinter, greek_letters_set, translate

from penrose.attrs import Axis, BinOp, BlockCall, Clamp, Const, DimSize, Einop, Einsum, Flatten, Num, Pair, Ref, Rope, Select, Slice, Where
from penrose import ops
from penrose.rendering.readings import ELLIPSIS, Contraction

__all__ = [
    "EQUATION",
    "apply_function",
    "assign",
    "dim_size",
    "einsum_equation",
    "elementwise",
    "latex_to_svg",
    "normalisation_equation",
    "tensor_entry",
    "to_latex",
    "to_mathtext",
    "value_entry",
]


# ---------------------------------------------------------------------------------------------
# Building expressions


def leg_symbol(leg) -> sympy.Expr:
    """The index symbol of a leg (as used in subscripts and under sums); an index that is
    already an expression (the e·n_d + d of an unflattened leg) stays as it is."""
    return sympy.Symbol(leg) if isinstance(leg, str) else leg


def dim_size(leg: str) -> sympy.Symbol:
    """The size of a leg as a scalar, printed like the leg: ``l / sqrt(dim_size('e'))``.

    It is a positive integer symbol, so sympy keeps it apart from the index symbol `e`.

    >>> to_latex(1 / sympy.sqrt(dim_size('e')))
    '\\\\frac{1}{\\\\sqrt{e}}'
    """
    return sympy.Symbol(leg, positive=True, integer=True)


def tensor_entry(name: str, legs: Iterable[str]) -> sympy.Expr:
    """The entry of tensor `name` at `legs`: ``Z[t, d]``; a scalar is a plain symbol.

    >>> to_latex(tensor_entry('W_q', ('d', 'e')))
    'W_{q,de}'
    """
    legs = tuple(legs)
    if not legs:
        return sympy.Symbol(name)
    return sympy.IndexedBase(name)[tuple(leg_symbol(leg) for leg in legs)]


def assign(result: str, legs: Iterable[str], rhs: sympy.Expr) -> sympy.Eq:
    """The equation ``result[legs] = rhs``, left unevaluated.

    >>> to_latex(assign('y', ('r',), apply_function('sigmoid', tensor_entry('l', 'r'))))
    'y_{r} = \\\\sigma\\\\left(l_{r}\\\\right)'
    """
    return sympy.Eq(tensor_entry(result, legs), rhs, evaluate=False)


def einsum_equation(contraction: Contraction, result_name: str) -> sympy.Eq:
    """The index equation of a contraction: the product of entries, summed over dropped legs.

    >>> from penrose.rendering.readings import parse_einsum
    >>> to_latex(einsum_equation(parse_einsum('td,de->te', 'Z', 'W'), 'h'))
    'h_{te} = \\\\sum_{d} Z_{td} \\\\, W_{de}'
    """
    factors = [tensor_entry(op.name, op.legs) for op in contraction.operands]
    body = factors[0] if len(factors) == 1 else sympy.Mul(*factors, evaluate=False)
    summed = []
    for op in contraction.operands:
        for leg in op.legs:
            if leg not in contraction.output and leg not in summed:
                summed.append(leg)
    rhs = _sum(body, summed) if summed else body
    return assign(result_name, contraction.output, rhs)


def normalisation_equation(
    name: str, legs: Iterable[str], over: Iterable[str], result: str
) -> sympy.Eq:
    """``result = name / sqrt(sum of squares over `over`)``; the sum uses primed legs.

    >>> to_latex(normalisation_equation('a', 'i', 'i', 'an'))
    "\\\\mathrm{an}_{i} = \\\\frac{a_{i}}{\\\\sqrt{\\\\sum_{i'} a_{i'}^{2}}}"
    """
    legs, over = tuple(legs), tuple(over)
    primed = {leg: f"{leg}'" for leg in over}
    inner = tensor_entry(name, tuple(primed.get(leg, leg) for leg in legs))
    norm = sympy.sqrt(_sum(sympy.Pow(inner, 2, evaluate=False), [primed[leg] for leg in over]))
    rhs = elementwise("/", tensor_entry(name, legs), norm)
    return assign(result, legs, rhs)


def elementwise(op: str, *args: sympy.Expr | float) -> sympy.Expr:
    """An unevaluated element-wise operation: '+', '-', '*', '/', '**' (or '-' of one arg).

    >>> to_latex(elementwise('+', tensor_entry('Z', 'te'), tensor_entry('h', 'te')))
    'Z_{te} + h_{te}'
    """
    xs = [sympy.sympify(a) for a in args]
    if op == "+":
        return sympy.Add(*xs, evaluate=False)
    if op == "*":
        return sympy.Mul(*xs, evaluate=False)
    if op == "-" and len(xs) == 1:
        return sympy.Mul(sympy.S.NegativeOne, xs[0], evaluate=False)
    if len(xs) != 2:
        raise ValueError(f"element-wise {op!r} takes two operands, got {len(xs)}")
    a, b = xs
    if op == "-":
        return sympy.Add(a, sympy.Mul(sympy.S.NegativeOne, b, evaluate=False), evaluate=False)
    if op == "/":
        return sympy.Mul(a, sympy.Pow(b, -1, evaluate=False), evaluate=False)
    if op == "**":
        return sympy.Pow(a, b, evaluate=False)
    raise ValueError(f"unknown element-wise operation {op!r}")


def _sum(body: sympy.Expr, legs: Iterable[str]) -> sympy.Sum:
    # Bounds are required by sympy but never printed: the paper writes \sum_d.
    return sympy.Sum(body, *[(leg_symbol(leg), 1, dim_size(leg)) for leg in legs])


# ---------------------------------------------------------------------------------------------
# Named functions


class NamedFunction(sympy.Function):
    """A diagram function, printed by its LaTeX name; a second argument is its leg."""

    latex_name = r"\mathrm{f}"

    @classmethod
    def eval(cls, *args):  # never simplify: the equation shows what the diagram does
        return None

    def _latex(self, printer: LatexPrinter, exp=None) -> str:
        # `exp`: sympy prints f(x)**2 by asking for the function with its power, σ^{2}(x)
        body, *legs = self.args
        sub = f"_{{{','.join(printer._print(leg) for leg in legs)}}}" if legs else ""
        sup = f"^{{{exp}}}" if exp is not None else ""
        inner = printer._print(body)
        if self.latex_name == "|":
            return rf"\left|{inner}\right|{sup}"
        return rf"{self.latex_name}{sub}{sup}\left({inner}\right)"


# Keys are lower case without '_' or '-', so 'top-k', 'top_k' and 'topk' are one function.
FUNCTION_LATEX = {
    # the element-wise functions: their rows' LaTeX
    **{name.replace("_", ""): ops.OPS[name].latex for name in sorted(ops.ELEMENTWISE)},
    "softmax": r"\mathrm{softmax}",
    "logsoftmax": r"\log\mathrm{softmax}",
    "layernorm": r"\mathrm{LayerNorm}",
    "rmsnorm": r"\mathrm{RMSNorm}",
    "topk": r"\mathrm{top}\text{-}k",
    "dropout": r"\mathrm{dropout}",
    "detach": r"\mathrm{detach}",
    "clamp": r"\mathrm{clamp}",
    "mean": r"\mathrm{mean}",
    "max": r"\max",
    "min": r"\min",
    "prod": r"\prod",
    "where": r"\mathrm{where}",
    "rank": r"\mathrm{rank}",
    "rot": r"\mathrm{rot}",
}


def apply_function(name: str, expr: sympy.Expr, leg: str | None = None) -> sympy.Expr:
    """Apply a diagram function to an expression; `leg` is the leg it works along.

    'sqrt' is sympy's square root and 'sum' a `Sum` over `leg`; any other name prints as
    itself in roman type.

    >>> to_latex(apply_function('softmax', tensor_entry('l', 'tp'), 'p'))
    '\\\\mathrm{softmax}_{p}\\\\left(l_{tp}\\\\right)'
    """
    key = name.lower().replace("_", "").replace("-", "")
    if key == "sqrt":
        return sympy.sqrt(expr, evaluate=False)
    if key == "sum":
        if leg is None:
            raise ValueError("sum needs the leg it sums over")
        return _sum(expr, [leg])
    args = (expr,) if leg is None else (expr, leg_symbol(leg))
    return _function_class(key, FUNCTION_LATEX.get(key, _roman(name)))(*args)


@functools.lru_cache(maxsize=None)
def _function_class(key: str, latex_name: str) -> type[NamedFunction]:
    return type(f"penrose_{key}", (NamedFunction,), {"latex_name": latex_name})


# ---------------------------------------------------------------------------------------------
# Checked values: the equation of each operation, one entry per name of `penrose.ops.OPS`
#
# `value_entry(v, names)` is the entry of a checked value (`penrose.checker.V`) at index names,
# one per leg of v: an atom (a tensor, a number, a dim's size, a block call) directly, an
# operation by its rule in EQUATION. A rule gets the value and the names and builds its
# operands' entries with `value_entry`; its index names are strings, or sympy expressions where
# an index is computed (the e·n_d + d of an unflattened leg).


class _Call(sympy.Function):
    """A diagram operation printed as \\mathrm{name}(args); never evaluated."""

    latex_name = r"\mathrm{f}"

    @classmethod
    def eval(cls, *args):
        return None

    def _latex(self, printer, exp=None):
        sup = f"^{{{exp}}}" if exp is not None else ""
        return rf"{self.latex_name}{sup}\left({', '.join(printer._print(a) for a in self.args)}\right)"


@functools.lru_cache(maxsize=None)
def _call_class(latex_name: str) -> type:
    key = "".join(ch for ch in latex_name if ch.isalnum())
    return type(f"penrose_call_{key}", (_Call,), {"latex_name": latex_name})


def call(latex_name: str, *args) -> sympy.Expr:
    r"""An operation written as its name and its arguments: ``\mathrm{where}\left(m, a, b\right)``."""
    return _call_class(latex_name)(*args)


def fresh(letter: str, taken) -> str:
    """`letter`, primed until it differs from every index name in `taken`."""
    name = letter
    while name in taken:
        name += "'"
    return name


def value_entry(v, names: tuple) -> sympy.Expr:
    r"""The entry of checked value `v` at index names `names` (one per leg of v).

    >>> from penrose.checker import check
    >>> from penrose.parser import parse
    >>> c = check(parse("dim t = 4, d = 2\ninput x[t, d]\ny = rope(x, t, d)\noutput y"))
    >>> print(to_latex(value_entry(c.stmts[-2].value, ('t', 'd'))))
    x_{td} \, \cos{\left(t \, \omega_{d} \right)} + \mathrm{rot}_{d}\left(x_{td}\right) \, \sin{\left(t \, \omega_{d} \right)}
    """
    key = v.key
    if key is None:
        return _atom(v, names)
    return EQUATION[key](v, names)


def _atom(v, names: tuple) -> sympy.Expr:
    if v.op == "ref":
        return tensor_entry(v.of(Ref).name, names)
    if v.op == "num":
        return number(v.of(Num).value)
    if v.op == "dimsize":
        return dim_size(v.of(DimSize).name)
    if v.op == "const":  # a named const: its name (alpha prints α), never its value
        return const_symbol(v.of(Const).name)
    if v.op == "block":
        blk = v.of(BlockCall)
        name = blk.block
        latex = _roman(name) + (rf"^{{\times {blk.repeat}}}" if blk.repeat else "")  # f^{×3}: f applied 3 times (shared or not)
        return call(latex, *[value_entry(x, tuple(x.type.legs)) for x in v.args])
    return sympy.Symbol(v.op)


def const_symbol(name: str) -> sympy.Symbol:
    """A named const (`const alpha = 8`) as a scalar, printed by its name: alpha as α.

    It is a real symbol, so sympy keeps it apart from an index or a dim's size of that name.

    >>> to_latex(elementwise('*', tensor_entry('x', 'e'), const_symbol('alpha')))
    'x_{e} \\\\, \\\\alpha'
    """
    return sympy.Symbol(name, real=True)


def keyword_number(v, key: str) -> sympy.Expr:
    """A keyword's value as the diagram writes it: by the names of its consts and dims
    (`clamp(x, min=-alpha)` shows -α), else the number."""
    shown = v.attrs.written(key)
    return value_entry(shown.value, ()) if shown is not None else number(v.attrs.keyword(key))


def number(x) -> sympy.Expr:
    """A diagram number as sympy writes it (four significant digits; ±∞ for inf)."""
    if x == math.inf:
        return sympy.oo
    if x == -math.inf:
        return -sympy.oo
    return sympy.Integer(x) if isinstance(x, int) else sympy.Float(x, 4)


def _operand_names(v, names: tuple) -> list[tuple]:
    """The index names of each operand of an element-wise operation (legs align by name or by
    position: the checker's `align`); a plain number has none."""
    align = (v.attrs.align if isinstance(v.attrs, (BinOp, Pair, Where)) else None) or [None] * len(v.args)
    out = []
    for x, al in zip(v.args, align):
        if x.type.dtype == "scalar" or al is None:
            out.append(())
            continue
        sub = [None] * len(x.type.legs)
        for i, j in enumerate(al):
            if j is not None:
                sub[j] = names[i]
        out.append(tuple(s if s is not None else leg for s, leg in zip(sub, x.type.legs)))
    return out


def _operands(v, names: tuple) -> list:
    return [value_entry(x, sub) for x, sub in zip(v.args, _operand_names(v, names))]


def _same(v, names: tuple) -> sympy.Expr:
    """The entry of the one operand, at the same names (element-wise and over-a-leg operations)."""
    x = v.args[0]
    return value_entry(x, names if x.type.dtype != "scalar" else ())


def _function(name: str):
    return lambda v, names: apply_function(name, _same(v, names))


def _elementwise(name: str):
    """An element-wise function of the table: f(x), its keywords' values as subscripts (LeakyReLU_{0.2}(x))."""
    row = ops.OPS[name]
    if not row.keywords:
        return _function(name)
    key = name.replace("_", "")
    return lambda v, names: _function_class(key, row.latex)(_same(v, names), *[keyword_number(v, k.name) for k in row.keywords])


def _clamp_min(v, names):
    """clamp_min(x, m) = max(x, m), as clamp's lower bound reads."""
    return call(r"\max", _same(v, names), keyword_number(v, "min"))


def _sum_chain(v, names):
    """a + b - c + ...: one flat sum, walking its left spine (a 10,000-term sum needs no stack)."""
    terms = []
    node, at = v, names
    while node.key in ("+", "-"):
        (left, right), (at_left, at_right) = node.args, _operand_names(node, at)
        term = value_entry(right, at_right)
        terms.append(term if node.key == "+" else sympy.Mul(sympy.S.NegativeOne, term, evaluate=False))
        node, at = left, at_left
    terms.append(value_entry(node, at))
    return sympy.Add(*reversed(terms), evaluate=False)


def _arithmetic(op: str):
    return lambda v, names: elementwise(op, *_operands(v, names))


def _floor_div(v, names):
    return sympy.floor(elementwise("/", *_operands(v, names)), evaluate=False)


_RELATIONS = {"<": sympy.StrictLessThan, "<=": sympy.LessThan, ">": sympy.StrictGreaterThan,
              ">=": sympy.GreaterThan, "==": sympy.Eq, "!=": sympy.Ne}


def _relation(op: str):
    return lambda v, names: _RELATIONS[op](*_operands(v, names), evaluate=False)


def _over_leg(name: str):
    """softmax_p(x), LayerNorm_e(x) ...: the function, subscripted with the leg it acts along."""
    return lambda v, names: apply_function(name, _same(v, names), names[v.of(Axis).axis])


def _topk_mask(v, names):
    """rank_u(x) ≤ k: true at the k largest entries along the leg (rank 1 is the largest)."""
    rank = apply_function("rank", _same(v, names), names[v.of(Axis).axis])
    return sympy.LessThan(rank, keyword_number(v, "k"), evaluate=False)


def _reduce(v, names):
    """sum_k x, mean_k x, max_k x: the reduced leg gets an index of its own."""
    x = v.args[0]
    axis = v.of(Axis).axis
    leg = fresh(x.type.legs[axis], set(names))
    inner = names[:axis] + (leg,) + names[axis:]
    return apply_function(v.key, value_entry(x, inner), leg)


def _minmax(v, names):
    """max_k x over a leg, or max(a, b) of two operands entry by entry."""
    if v.op == "reduce":
        return _reduce(v, names)
    return call(FUNCTION_LATEX[v.key], *_operands(v, names))


def _clamp(v, names):
    """clamp(x, lo, hi) = min(max(x, lo), hi)."""
    out = _same(v, names)
    if v.of(Clamp).min is not None:
        out = call(r"\max", out, keyword_number(v, "min"))
    if v.of(Clamp).max is not None:
        out = call(r"\min", out, keyword_number(v, "max"))
    return out


def _where(v, names):
    return call(r"\mathrm{where}", *_operands(v, names))


def _causal(v, names):
    """causal(t, p): p ≤ t, the key position at or before the query position."""
    t, p = (leg_symbol(n) for n in names)
    return sympy.LessThan(p, t, evaluate=False)


def _arange(v, names):
    """arange(t): the position t itself (arange(t) - arange(s) reads t - s)."""
    return leg_symbol(names[0])


def _block_causal(v, names):
    """block_causal(t, p, block=B): ⌊p/B⌋ ≤ ⌊t/B⌋, bidirectional inside a block, causal across."""
    t, p = (leg_symbol(n) for n in names)
    b = keyword_number(v, "block")
    return sympy.LessThan(sympy.floor(p / b, evaluate=False), sympy.floor(t / b, evaluate=False), evaluate=False)


def _gather(v, names):
    table, ids = v.args
    n_ids = len(ids.type.legs)
    idx = value_entry(ids, names[:n_ids])
    rest = [leg_symbol(n) for n in names[n_ids:]]
    return sympy.IndexedBase(table.of(Ref).name if table.op == "ref" else "E")[(idx, *rest)]


def _parts(v, names):
    """split and concat: each part keeps its own index along the axis."""
    axis = v.of(Axis).axis

    def at(x):
        own = list(names)
        own[axis] = fresh(x.type.legs[axis], set(names) - {names[axis]})
        return value_entry(x, tuple(own))

    return call(rf"\mathrm{{{v.key}}}", *[at(x) for x in v.args])


def _leg_size(leg: str) -> sympy.Symbol:
    return sympy.Symbol(f"n_{leg}", positive=True, integer=True)


def _flatten(v, names):
    """flatten(x, [h, d], e): y_{te} = x_{t, ⌊e/n_d⌋, e mod n_d}, the joined index split back."""
    x = v.args[0]
    a, b = v.of(Flatten).start, v.of(Flatten).end
    legs = x.type.legs[a:b + 1]
    joined = leg_symbol(names[a])
    parts = []
    for i, leg in enumerate(legs):
        stride = sympy.Mul(*[_leg_size(l) for l in legs[i + 1:]], evaluate=False) if i + 1 < len(legs) else sympy.S.One
        idx = joined if stride == 1 else sympy.floor(joined / stride, evaluate=False)
        parts.append(idx if i == 0 else sympy.Mod(idx, _leg_size(leg), evaluate=False))
    return value_entry(x, names[:a] + tuple(parts) + names[a + 1:])


def _unflatten(v, names):
    """unflatten(x, e, [h, d]): y_{thd} = x_{t, h·n_d + d}, the new indices joined back."""
    x = v.args[0]
    axis = v.of(Axis).axis
    n = len(v.type.legs) - len(x.type.legs) + 1
    new_legs = v.type.legs[axis:axis + n]
    joined = None
    for leg, name in zip(new_legs, names[axis:axis + n]):
        i = leg_symbol(name)
        joined = i if joined is None else sympy.Add(sympy.Mul(joined, _leg_size(leg), evaluate=False), i, evaluate=False)
    return value_entry(x, names[:axis] + (joined,) + names[axis + n:])


class Group(sympy.Function):
    """The index of a leg that merges several (einops' `(h d)`): h, then d running fastest.
    Printed as (h d); never evaluated."""

    @classmethod
    def eval(cls, *args):
        return None

    def _latex(self, printer, exp=None):
        return "(" + r"\,".join(printer._print(a) for a in self.args) + ")"


class _Paren(sympy.Function):
    """An index expression in parentheses, so a subscript reads as one index: x_{(1 + k),e}."""

    @classmethod
    def eval(cls, *args):
        return None

    def _latex(self, printer, exp=None):
        return f"({printer._print(self.args[0])})"


def einop_names(v) -> tuple:
    """The index names of an einops result, a merged leg written as the group of its axes
    ((h d) for `-> t (h d)`): what the left side of its statement shows."""
    shown = {aid: leg for aid, _, leg in v.of(Einop).axes}
    return tuple(Group(*(leg_symbol(shown[aid]) for aid in group)) if len(group) > 1 else leg
                 for group, leg in zip(v.of(Einop).right, v.type.legs))


# operations whose equation indexes their one tensor operand with their own index names
_SAME_NAMES = ops.ELEMENTWISE | {"neg", "softmax", "log_softmax", "layernorm", "rmsnorm", "topk", "dropout", "detach", "clamp"}


def entry_names(v) -> tuple:
    """The index names a statement writes a value's entries with: its legs, a leg that an
    einops pattern merges as the group of its axes (also through the element-wise steps after
    it: ReLU of a merge is m_{t,(h d)} = ReLU(a_{htd}))."""
    node = v
    while node.key in _SAME_NAMES and node.args and node.args[0].type.legs == v.type.legs:
        node = node.args[0]
    if node.key in ("rearrange", "reduce", "repeat") and node.type.legs == v.type.legs:
        return einop_names(node)
    return tuple(v.type.legs)


def _einop(v, names):
    """rearrange, reduce, repeat: the operand's entry at the pattern's left side, written with
    the result's indices: y_{htd} = x_{t,(h d)} (a split leg's index is the group of its axes),
    y_{htkd} = x_{htd} (a repeat's new leg k is in no index), y_{h} = max_{t,d} x_{t,(h d)}
    (the reduced axes get indices of their own)."""
    a = v.of(Einop)
    shown = {aid: leg for aid, _, leg in a.axes}
    taken = {n for n in names if isinstance(n, str)}
    for n in names:
        if isinstance(n, sympy.Basic):
            taken |= {str(x) for x in n.free_symbols}
    idx = {}
    for group, name in zip(a.right, names):
        if len(group) == 1:
            idx[group[0]] = name
        elif isinstance(name, Group) and len(name.args) == len(group):
            idx.update(zip(group, name.args))
        else:  # a merged index from outside: h = ⌊hd / n_d⌋, d = hd mod n_d
            joined = leg_symbol(name)
            legs = [shown[aid] for aid in group]
            for i, aid in enumerate(group):
                rest = legs[i + 1:]
                stride = sympy.Mul(*[_leg_size(l) for l in rest], evaluate=False) if rest else sympy.S.One
                part = joined if stride == 1 else sympy.floor(joined / stride, evaluate=False)
                idx[aid] = part if i == 0 else sympy.Mod(part, _leg_size(legs[i]), evaluate=False)
    summed = []
    for aid in a.reduced:
        idx[aid] = fresh(shown[aid], taken)
        taken.add(idx[aid])
        summed.append(idx[aid])
    sub = []
    for group in a.left:
        if not group:  # a leg of size 1: its only index
            sub.append(sympy.S.Zero)
        elif len(group) == 1:
            sub.append(idx[group[0]])
        else:
            sub.append(Group(*(leg_symbol(idx[aid]) for aid in group)))
    body = value_entry(v.args[0], tuple(sub))
    if a.kind != "reduce" or not summed:
        return body
    if a.reduction == "sum":
        return _sum(body, summed)
    key = a.reduction
    return _function_class(key, FUNCTION_LATEX[key])(body, *(leg_symbol(n) for n in summed))


def _select(v, names):
    """select(x, t, 0): y_{e} = x_{0,e}, the leg's index fixed."""
    axis = v.of(Axis).axis
    return value_entry(v.args[0], names[:axis] + (sympy.Integer(v.of(Select).index),) + names[axis:])


def _slice_index(v, name):
    """The operand's index along a sliced leg: start + k (k itself from 0)."""
    start = v.of(Slice).start
    k = leg_symbol(name)
    return k if start == 0 else _Paren(sympy.Add(sympy.Integer(start), k, evaluate=False))


def _slice(v, names):
    """slice(x, t, 1, k): y_{ke} = x_{(1 + k),e}, the new leg's index shifted by the start."""
    axis = v.of(Axis).axis
    return value_entry(v.args[0], names[:axis] + (_slice_index(v, names[axis]),) + names[axis + 1:])


def basis_contraction(v, names):
    """select and slice written as the contraction they are: Σ_t x_{te} δ_{t,0} (the basis
    vector e_0), Σ_t x_{te} δ_{t,(1 + k)} (a selection matrix)."""
    axis = v.of(Axis).axis
    x = v.args[0]
    taken = {n for n in names if isinstance(n, str)}
    t = fresh(x.type.legs[axis], taken)
    if v.key == "select":
        inner, at = names[:axis] + (t,) + names[axis:], sympy.Integer(v.of(Select).index)
    else:
        inner, at = names[:axis] + (t,) + names[axis + 1:], _slice_index(v, names[axis])
    delta = sympy.IndexedBase("delta")[(leg_symbol(t), at)]
    return _sum(sympy.Mul(value_entry(x, inner), delta, evaluate=False), [t])


class Chain(sympy.Function):
    """Equal expressions side by side: a = b = c."""

    @classmethod
    def eval(cls, *args):
        return None

    def _latex(self, printer, exp=None):
        return " = ".join(printer._print(a) for a in self.args)


def _rope(v, names):
    """rope(x, t, d): x cos(t ω_d) + rot_d(x) sin(t ω_d), the rotate-half convention: rot_d pairs
    entry i of leg d with entry i + n/2 (as (−x_{i+n/2}, x_i)), ω_i = base^(−2i/n)."""
    x = _same(v, names)
    t, d = leg_symbol(names[v.of(Rope).pos]), names[v.of(Axis).axis]
    angle = sympy.Mul(t, tensor_entry("omega", (d,)), evaluate=False)
    return sympy.Add(
        sympy.Mul(x, sympy.cos(angle, evaluate=False), evaluate=False),
        sympy.Mul(apply_function("rot", x, d), sympy.sin(angle, evaluate=False), evaluate=False),
        evaluate=False,
    )


def _einsum(v, names):
    """The index equation: the operands' entries multiplied, summed over the dropped letters."""
    terms, out = v.of(Einsum).terms, v.of(Einsum).out
    mapping = dict(zip(out, names))
    taken = set(names)
    for term in terms:
        for letter in term:
            if letter not in mapping:
                mapping[letter] = fresh(letter, taken)
                taken.add(mapping[letter])
    factors = [value_entry(x, tuple(mapping[l] for l in term)) for x, term in zip(v.args, terms)]
    body = factors[0] if len(factors) == 1 else sympy.Mul(*factors, evaluate=False)
    summed = [mapping[l] for l in dict.fromkeys(l for term in terms for l in term) if l not in out]
    return _sum(body, summed) if summed else body


EQUATION: dict = {
    # element-wise functions: σ(x), tanh(x), √x ...
    **{name: _elementwise(name) for name in sorted(ops.ELEMENTWISE)},
    "clamp_min": _clamp_min,  # a bound, not a subscript
    # operators
    "+": _sum_chain,
    "-": _sum_chain,
    "*": _arithmetic("*"),
    "/": _arithmetic("/"),
    "//": _floor_div,
    "**": _arithmetic("**"),
    **{op: _relation(op) for op in _RELATIONS},
    "neg": lambda v, names: elementwise("-", _same(v, names)),
    "einsum": _einsum,
    # over one leg
    "softmax": _over_leg("softmax"),
    "log_softmax": _over_leg("log_softmax"),
    "layernorm": _over_leg("layernorm"),
    "rmsnorm": _over_leg("rmsnorm"),
    "topk": _over_leg("topk"),
    "topk_mask": _topk_mask,
    "sum": _reduce,
    "mean": _reduce,
    "max": _minmax,
    "min": _minmax,
    # element-wise with options
    "dropout": _function("dropout"),
    "detach": _function("detach"),
    "clamp": _clamp,
    "where": _where,
    # masks
    "causal": _causal,
    "arange": _arange,
    "block_causal": _block_causal,
    # indexing and shapes
    "gather": _gather,
    "split": _parts,
    "concat": _parts,
    "flatten": _flatten,
    "unflatten": _unflatten,
    "rope": _rope,
    # einops patterns
    "rearrange": _einop,
    "reduce": _einop,
    "repeat": _einop,
    # picking indices
    "select": _select,
    "slice": _slice,
}


# ---------------------------------------------------------------------------------------------
# Printing


class _Printer(LatexPrinter):
    """sympy's LaTeX printer with diagram conventions: names split at '_', subscripts packed
    (Z_{td}), no bounds under sums, factors in the order given."""

    def __init__(self) -> None:
        super().__init__({"order": "none", "mul_symbol": r" \, "})

    def _print_Symbol(self, expr: sympy.Symbol, style: str = "plain") -> str:
        return _name_latex(expr.name)

    def _print_IndexedBase(self, expr: sympy.IndexedBase) -> str:
        return _name_latex(expr.label.name)

    def _print_Indexed(self, expr: sympy.Indexed) -> str:
        base, subs = _split_name(expr.base.label.name)
        indices = [self._print(i) for i in expr.indices]
        if all(_is_one_glyph(i) and not i.isdigit() for i in indices):  # Z_{td}; a command needs a space after it
            packed = "".join(f"{i} " if i.startswith("\\") else i for i in indices).strip()
        else:
            packed = ",".join(indices)
        return f"{base}_{{{','.join(subs + [packed])}}}"

    def _print_Sum(self, expr: sympy.Sum) -> str:
        legs = ",".join(self._print(limit[0]) for limit in expr.limits)
        body = self._print(expr.function)
        if isinstance(expr.function, sympy.Add):
            body = rf"\left({body}\right)"
        return rf"\sum_{{{legs}}} {body}"


def to_latex(expr: sympy.Basic) -> str:
    """LaTeX for an equation or expression, in the diagram's conventions.

    >>> to_latex(tensor_entry('probs', 'tp'))
    '\\\\mathrm{probs}_{tp}'
    """
    return _Printer().doprint(expr)


def _split_name(name: str) -> tuple[str, list[str]]:
    """'W_q' -> ('W', ['q']); 'W0' -> ('W', ['0']); 'c_pred' -> ('c', ['\\mathrm{pred}'])."""
    if name == ELLIPSIS:
        return r"\ldots", []
    primes = len(name) - len(name.rstrip("'"))
    name = name.rstrip("'")
    head, *rest = [p for p in name.split("_") if p] or [name]
    digits = re.fullmatch(r"([A-Za-z]+?)(\d+)", head)
    subs = []
    if digits:
        head, number = digits.groups()
        subs.append(number)
    subs += [_part(p) for p in rest]
    return _part(head) + "'" * primes, subs


def _name_latex(name: str) -> str:
    base, subs = _split_name(name)
    return f"{base}_{{{','.join(subs)}}}" if subs else base


def _part(part: str) -> str:
    if part.lower() in greek_letters_set | {"lamda"}:
        return translate(part)
    if len(part) == 1 or part.isdigit():
        return part
    return rf"\mathrm{{{part}}}"


def _roman(name: str) -> str:
    return r"\mathrm{%s}" % name.replace("_", r"\_")


def _is_one_glyph(tex: str) -> bool:
    tex = tex.rstrip("'")
    return len(tex) == 1 or re.fullmatch(r"\\[A-Za-z]+", tex) is not None


# ---------------------------------------------------------------------------------------------
# mathtext and SVG

_UNWRAP = re.compile(r"\\(?:operatorname|textrm|textnormal|textup|mbox)\{([^{}]*)\}")
_DROP = re.compile(r"\\(?:limits|nolimits|displaystyle|textstyle|scriptstyle|nobreak)(?![A-Za-z])")
_MATHREL = re.compile(r"\\mathrel\{([^{}]*)\}")
_SUM = re.compile(r"(\\sum_\{[^{}]*\})\s*")


def to_mathtext(latex: str) -> str:
    """Rewrite LaTeX into the subset matplotlib's mathtext parses, and space it for mathtext
    (full-size fractions, a thin space after each sum).

    >>> to_mathtext(r'\\operatorname{sm}\\limits_{p} x')
    '\\\\mathrm{sm}_{p} x'
    """
    text = latex.strip().strip("$")
    text = _UNWRAP.sub(r"\\mathrm{\1}", text)
    text = _DROP.sub("", text)
    text = _MATHREL.sub(r"\1", text)
    text = re.sub(r"\\bmod(?![A-Za-z])", r"\\,\\mathrm{mod}\\,", text)
    text = re.sub(r"\\frac(?![A-Za-z])", r"\\dfrac", text)
    return _SUM.sub(r"\1\\, ", text)


@functools.lru_cache(maxsize=512)
def latex_to_svg(latex: str, fontsize: float = 12.0) -> str:
    """Draw LaTeX as a standalone SVG with mathtext; the same input gives the same bytes.

    Raises ValueError, naming the LaTeX, when mathtext cannot parse it.

    >>> latex_to_svg(r'h = \\sum_{i} a_{i} b_{i}').startswith('<?xml')
    True
    """
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.mathtext import MathTextParser

    math = f"${to_mathtext(latex)}$"
    with matplotlib.rc_context({  # written in the call: matplotlib types its keys as literals
        "svg.hashsalt": "penrose",
        "svg.fonttype": "path",
        "mathtext.fontset": "cm",
        "text.usetex": False,
    }):
        try:  # parse first: a drawing error would surface deep inside savefig
            MathTextParser("path").parse(math)
        except ValueError as err:
            raise ValueError(f"mathtext cannot draw {latex!r}: {err}") from None
        fig = Figure(figsize=(1, 1))
        fig.text(0, 0, math, fontsize=fontsize)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight", pad_inches=0.02,
                    transparent=True, metadata={"Date": None})
    return buffer.getvalue()
