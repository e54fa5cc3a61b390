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
import re
from collections.abc import Iterable

import sympy
from sympy.printing.latex import LatexPrinter, greek_letters_set, translate

from penrose.render.readings import ELLIPSIS, Contraction

__all__ = [
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
]


# ---------------------------------------------------------------------------------------------
# Building expressions


def leg_symbol(leg: str) -> sympy.Symbol:
    """The index symbol of a leg (as used in subscripts and under sums)."""
    return sympy.Symbol(leg)


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

    >>> from penrose.render.readings import parse_einsum
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

    def _latex(self, printer: LatexPrinter) -> str:
        body, *legs = self.args
        sub = f"_{{{','.join(printer._print(leg) for leg in legs)}}}" if legs else ""
        inner = printer._print(body)
        if self.latex_name == "|":
            return rf"\left|{inner}\right|"
        return rf"{self.latex_name}{sub}\left({inner}\right)"


# Keys are lower case without '_' or '-', so 'top-k', 'top_k' and 'topk' are one function.
FUNCTION_LATEX = {
    "sigmoid": r"\sigma",
    "sigma": r"\sigma",
    "relu": r"\mathrm{ReLU}",
    "gelu": r"\mathrm{GELU}",
    "silu": r"\mathrm{SiLU}",
    "tanh": r"\tanh",
    "exp": r"\exp",
    "log": r"\log",
    "abs": "|",
    "softplus": r"\mathrm{softplus}",
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
    "where": r"\mathrm{where}",
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
        if all(_is_one_glyph(i) for i in indices):  # Z_{td}; a command needs a space after it
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
    style = {
        "svg.hashsalt": "penrose",
        "svg.fonttype": "path",
        "mathtext.fontset": "cm",
        "text.usetex": False,
    }
    with matplotlib.rc_context(style):
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
