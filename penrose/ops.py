"""The one table of operations: every operation of the language, described once.

Each row says what a user may write — positional arguments, keywords with their kinds,
defaults and validity rules — what the result's legs are, which type rule of the checker
types it (`Op.rule`, a key of `penrose.checker.TYPE_RULES`), which record of `penrose.attrs`
its checked value carries (`Op.attrs`), and one line of documentation. An
element-wise function's row also says what it computes and how it is shown:

    torch    the PyTorch callable the compiler emits, a dotted name ("torch.nn.functional.gelu")
    form     the function written once in primitives of a namespace `m` (exp, log, log1p, expm1,
             tanh, erf, sqrt, abs, where, clamp): `form(x, SCALAR)` computes it on a Python
             number, `form(x, torch)` on a tensor, which is how the interpreter (the second
             implementation) evaluates it without the compiler's callable
    vjp      its derivative, written like form: `vjp(g, x, y, m, **keywords)` is the vector-Jacobian
             product g · f'(x) from the output's gradient g, the operand x and the value y = f(x),
             in the primitives of a namespace `m`: arithmetic, `where(cond, a, b)` and
             `kernel(name, *args)`, torch's own backward kernel of that ATen name
             (`kernel("gelu_backward", g, x)`), so the numbers are autograd's, kinks included.
             `penrose.gradients` supplies `m` (on tensors, and as trees for the functions it
             writes out); None: the generated backward refuses the function where a gradient
             passes (autograd still trains it)
    label    the text of its box in the figure
    latex    its name in equations
    reading  the sentence of its geometric reading (`{keyword}` stands for a keyword's value)
    aten     the ATen op `penrose.trace` lowers to it (None where trace lowers it by hand)
    scalar   it also applies to plain numbers (`sqrt(d)`: the checker folds it; generated source
             writes it with Python's math, `math.sqrt(D)`); `sized`: it is defined at every size,
             so that it may read a size known only at run time

The checker reads arity, keywords, defaults and rules from here; every backend derives what it
can from the rows and keeps a table keyed by the same names for the rest, and a test asserts
the key sets are equal:

    penrose.compiler.LOWER          the PyTorch lowering
    penrose.interpreter.OPERATIONS    the interpreter (the second implementation)
    penrose.rendering.figure.FIGURE    the box drawn in the Penrose figure
    penrose.rendering.equations.EQUATION   the equation
    penrose.rendering.explain.READING  the geometric reading
    penrose.fmt.FORMAT              how `penrose fmt` prints it

and one keeps a subset on purpose: `penrose.gradients._RULES`, the generated backward, which
refuses an operation without a rule where a gradient has to pass (docs/gradients.md); for an
element-wise row that rule is the row's own `vjp`.

Adding an element-wise function is one row here (docs/contributing.md). The TextMate grammar
(grammar/penrose.tmLanguage.json) and the language reference's function list are written from
this table: `python tools/gen_tables.py` (tests fail when they drift). Torch-free.

>>> OPS["layernorm"].keyword("eps").rule
'positive'
>>> key_of("unary", Unary("gelu"))
'gelu'
>>> round(OPS["gelu"].form(1.0, SCALAR), 6)
0.841345
>>> OPS["exp"].vjp(3.0, 0.0, 1.0, SCALAR)   # g · exp'(x) = g · y
3.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from penrose.attrs import (
    Attrs,
    BinOp,
    Clamp,
    Concat,
    Dropout,
    Einop,
    Einsum,
    Flatten,
    LayerNorm,
    Mask,
    NoAttrs,
    Pair,
    Reduce,
    RMSNorm,
    Rope,
    Select,
    Slice,
    Softmax,
    Split,
    TopK,
    Unary,
    Unflatten,
    Where,
)

# keyword kinds: what may be written for a keyword
NUMBER = "number"  # a number literal (inf where the rule allows)
INT = "int"  # a whole number, or a dim (its size)
NUMBER_OR_DIM = "number_or_dim"  # a number, or a dim (its size)
LEG = "leg"  # a leg of the operand: a name, or dim=i
PARAM = "param"  # a declared one-leg param or buffer
DIM = "dim"  # a declared dim (the leg a result takes)
KINDS = (NUMBER, INT, NUMBER_OR_DIM, LEG, PARAM, DIM)
NUMERIC = (NUMBER, INT, NUMBER_OR_DIM)  # kinds whose value is a number

# keyword rules
RULES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "any": ("", lambda v: True),
    "finite": ("finite", lambda v: math.isfinite(v)),
    "positive": ("positive", lambda v: math.isfinite(v) and v > 0),
    "nonneg": ("finite and at least 0", lambda v: math.isfinite(v) and v >= 0),
    "probability": ("in [0, 1)", lambda v: 0 <= v < 1),
    "bound": ("a number or ±inf", lambda v: not math.isnan(v)),
}


@dataclass(frozen=True)
class Kw:
    name: str
    kind: str
    default: object = None  # None: no default (a number keyword without one must be given)
    rule: str = "any"

    def ok(self, value: float) -> bool:
        return RULES[self.rule][1](value)

    @property
    def rule_text(self) -> str:
        return RULES[self.rule][0]

    @property
    def integer(self) -> bool:
        return self.kind == INT

    @property
    def allows_dim(self) -> bool:
        return self.kind in (INT, NUMBER_OR_DIM)

    @property
    def infinite_ok(self) -> bool:
        return self.rule == "bound"


@dataclass(frozen=True)
class Op:
    """One operation: what may be written, what it yields, and (element-wise) what it computes."""

    name: str
    category: str  # elementwise | operator | contraction | leg | mask | shape | index | block
    args: tuple[str, ...]  # positional parameter names (documentation and arity)
    min_args: int
    max_args: int | None  # None: any number
    keywords: tuple[Kw, ...] = ()
    legs: str = ""  # the result-leg rule, in words
    doc: str = ""
    scalar: bool = False  # also applies to plain numbers (folded by the checker)
    sized: bool = False  # defined at every size (a whole number >= 0): also of a size read at run time
    axis_lengths: bool = False  # takes einops' NAME=size keywords for the dims of its pattern
    rule: str | None = None  # the checker's type rule (penrose.checker.TYPE_RULES); None: an operator
    attrs: tuple[type[Attrs], ...] = ()  # the record(s) of penrose.attrs its checked value carries
    # an element-wise function (see the module docstring)
    torch: str | None = None
    form: Callable[..., Any] | None = None
    vjp: Callable[..., Any] | None = None
    label: str = ""
    latex: str = ""
    reading: str = ""
    aten: str | None = None

    def keyword(self, key: str) -> Kw | None:
        for k in self.keywords:
            if k.name == key:
                return k
        return None

    @property
    def keyword_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keywords)

    @property
    def signature(self) -> str:
        parts = list(self.args)
        named = [k for k in self.keywords if k.name not in self.args]
        parts += [f"{k.name}={k.default!r}" if k.default is not None else f"{k.name}=..." for k in named]
        return f"{self.name}({', '.join(parts)})"

    def call(self, x: Any, m: Any, values: dict[str, Any] | None = None) -> Any:
        """This element-wise function of `x` in the primitives of namespace `m` (SCALAR, or
        one that computes on tensors); keyword values from `values`, else their defaults."""
        if self.form is None:
            raise TypeError(f"{self.name} is not an element-wise function of the table")
        values = values or {}
        return self.form(x, m, **{k.name: values.get(k.name, k.default) for k in self.keywords})


class SCALAR:
    """The primitives of the element-wise forms on plain Python numbers (`Op.call(x, SCALAR)`)."""

    exp, log, log1p, expm1, tanh, erf, sqrt = math.exp, math.log, math.log1p, math.expm1, math.tanh, math.erf, math.sqrt
    abs = staticmethod(abs)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b

    @staticmethod
    def clamp(x: Any, lo: Any = None, hi: Any = None) -> Any:
        x = x if lo is None else max(x, lo)
        return x if hi is None else min(x, hi)


PRIMITIVES = ("exp", "log", "log1p", "expm1", "tanh", "erf", "sqrt", "abs", "where", "clamp")


# the element-wise forms: stable where torch's kernels are (no overflow in a branch where() drops,
# so gradients stay finite), and with torch's gradient at the kinks (relu'(0) = 0)
def _sigmoid(x: Any, m: Any) -> Any:
    e = m.exp(m.where(x >= 0, -x, x))  # exp(-|x|), with the sign's gradient at 0
    return m.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x: Any, m: Any) -> Any:
    return m.where(x > 20, x, m.log1p(m.exp(m.clamp(x, None, 20))))  # torch's threshold 20


SAME = "the legs of its operand"
ALIGNED = "the operands' legs aligned by name (or by position when the counts match)"


def _unary(name: str, doc: str, torch: str, form: Callable[..., Any], vjp: Callable[..., Any] | None, label: str, latex: str,
           reading: str, keywords: tuple[Kw, ...] = (), scalar: bool = False, sized: bool = False, aten: str | None = None,
           args: tuple[str, ...] = ("x",)) -> Op:
    """An element-wise function: one row (positional arguments after x are its keywords in order)."""
    return Op(name, "elementwise", args, 1, len(args), keywords, SAME, doc, scalar, sized=sized, rule="elementwise",
              attrs=(Unary,), torch=torch, form=form, vjp=vjp, label=label, latex=latex, reading=reading, aten=aten)


def _backward(kernel: str, *, of: str = "x") -> Callable[..., Any]:
    """The derivative that is torch's backward kernel `kernel` of (g, x), or of (g, y) where `of` is "y"."""
    if of == "y":
        return lambda g, x, y, m: m.kernel(kernel, g, y)
    return lambda g, x, y, m: m.kernel(kernel, g, x)


def _binary(op: str, doc: str) -> Op:
    return Op(op, "operator", ("a", "b"), 2, 2, (), ALIGNED, doc, scalar=op not in ("<", "<=", ">", ">=", "==", "!="),
              attrs=(BinOp,))


def _minmax(name: str, word: str) -> Op:
    """max and min: over a leg (a reduction), or of two operands entry by entry."""
    return Op(name, "leg", ("x", "leg"), 1, 2, (_LEG,),
              "its operand's legs without the reduced leg; of two operands, their legs aligned",
              f"{word} over a leg ({name}(x, k)), or of two operands entry by entry ({name}(a, b): a tensor or a number)",
              rule="minmax", attrs=(Reduce, Pair))


_LEG = Kw("dim", LEG)
_SIGMOID_READING = "Squash every entry into (0, 1) independently (sigmoid): a soft on/off score."

_ROWS = [
    # element-wise functions: one row each
    _unary("sigmoid", "logistic sigmoid 1 / (1 + e^-x), entry by entry", "torch.sigmoid", _sigmoid,
           _backward("sigmoid_backward", of="y"), "sigmoid", r"\sigma", _SIGMOID_READING, aten="sigmoid"),
    _unary("sigma", "σ, the logistic sigmoid (a synonym of sigmoid)", "torch.sigmoid", _sigmoid,
           _backward("sigmoid_backward", of="y"), "sigmoid", r"\sigma", _SIGMOID_READING),
    _unary("relu", "max(x, 0), entry by entry", "torch.relu", lambda x, m: m.where(x > 0, x, 0.0),
           lambda g, x, y, m: m.kernel("threshold_backward", g, y, 0),
           "ReLU", r"\mathrm{ReLU}", "Keep the positive part of every entry independently (ReLU): negative entries become zero.",
           aten="relu"),
    _unary("gelu", "Gaussian error linear unit x·Φ(x) (exact erf form)", "torch.nn.functional.gelu",
           lambda x, m: x * 0.5 * (1 + m.erf(x * 0.7071067811865476)), _backward("gelu_backward"),
           "GELU", r"\mathrm{GELU}", "Gate every entry independently by how large it is (GELU, x·Φ(x)): a smooth ReLU.",
           aten="gelu"),
    _unary("silu", "x·σ(x), entry by entry", "torch.nn.functional.silu", lambda x, m: x * _sigmoid(x, m), _backward("silu_backward"),
           "SiLU", r"\mathrm{SiLU}", "Gate every entry independently by its own sigmoid (SiLU, x·σ(x)): a smooth ReLU.",
           aten="silu"),
    _unary("tanh", "hyperbolic tangent, entry by entry", "torch.tanh", lambda x, m: m.tanh(x), _backward("tanh_backward", of="y"),
           "tanh", r"\tanh", "Squash every entry into (−1, 1) independently (tanh).", aten="tanh"),
    _unary("exp", "e^x, entry by entry", "torch.exp", lambda x, m: m.exp(x), lambda g, x, y, m: g * y,
           "exp", r"\exp", "Exponentiate every entry independently: positive values, sums become products.",
           scalar=True, aten="exp"),
    _unary("log", "natural logarithm, entry by entry", "torch.log", lambda x, m: m.log(x), lambda g, x, y, m: g / x,
           "log", r"\log", "Take the logarithm of every entry independently: products become sums.", scalar=True, aten="log"),
    _unary("sqrt", "square root, entry by entry", "torch.sqrt", lambda x, m: m.sqrt(x), lambda g, x, y, m: g / (2 * y),
           "√", r"\sqrt", "Take the square root of every entry independently.", scalar=True, sized=True, aten="sqrt"),
    _unary("abs", "|x|, entry by entry", "torch.abs", lambda x, m: m.abs(x), lambda g, x, y, m: g * m.kernel("sign", x),
           "|·|", "|", "Take the absolute value of every entry independently: its size without its sign.", scalar=True,
           sized=True, aten="abs"),
    _unary("softplus", "log(1 + e^x), entry by entry", "torch.nn.functional.softplus", _softplus,
           lambda g, x, y, m: m.kernel("softplus_backward", g, x, 1.0, 20.0),  # torch's beta 1, threshold 20
           "softplus", r"\mathrm{softplus}", "Apply softplus, log(1 + eˣ), to every entry independently: a smooth, positive ReLU.",
           aten="softplus"),
    _unary("leaky_relu", "x where x > 0, else slope·x", "torch.nn.functional.leaky_relu",
           lambda x, m, slope: m.where(x > 0, x, x * slope),
           lambda g, x, y, m, slope: m.kernel("leaky_relu_backward", g, x, slope, False),
           "leaky ReLU", r"\mathrm{LeakyReLU}",
           "Keep the positive entries and scale the negative ones by {slope} (leaky ReLU), entry by entry.",
           keywords=(Kw("slope", NUMBER, 0.01, "finite"),)),
    _unary("mish", "x·tanh(softplus(x)), entry by entry", "torch.nn.functional.mish",
           lambda x, m: x * m.tanh(_softplus(x, m)), _backward("mish_backward"),
           "Mish", r"\mathrm{Mish}", "Gate every entry independently by tanh of its softplus (Mish, x·tanh(softplus(x))): a smooth ReLU.",
           aten="mish"),
    _unary("hardswish", "x·clamp(x + 3, 0, 6) / 6, entry by entry", "torch.nn.functional.hardswish",
           lambda x, m: m.where(x <= -3, 0.0, m.where(x >= 3, x, x * (x + 3) / 6)),  # torch's gradient at ±3
           _backward("hardswish_backward"),
           "hard swish", r"\mathrm{HardSwish}",
           "Gate every entry independently by a piecewise-linear ramp (hard swish, x·clamp(x + 3, 0, 6)/6): zero below −3, x above 3.",
           aten="hardswish"),
    _unary("elu", "x where x > 0, else alpha·(e^x − 1)", "torch.nn.functional.elu",
           lambda x, m, alpha: m.where(x > 0, x, alpha * m.expm1(m.clamp(x, None, 0))),
           lambda g, x, y, m, alpha: m.kernel("elu_backward", g, alpha, 1, 1, False, x),
           "ELU", r"\mathrm{ELU}",
           "Keep the positive entries and bend the negative ones smoothly towards −{alpha} (ELU, α(eˣ − 1)), entry by entry.",
           keywords=(Kw("alpha", NUMBER, 1.0, "finite"),)),
    _unary("clamp_min", "max(x, min), entry by entry: clamp with a lower bound only", "torch.clamp_min",
           lambda x, m, min: m.clamp(x, min, None), lambda g, x, y, m, min: m.where(x >= min, g, 0.0),
           "clamp min", r"\max",
           "Raise every entry below {min} to {min}, entry by entry.",
           keywords=(Kw("min", NUMBER_OR_DIM, None, "bound"),), args=("x", "min")),
    # operators
    _binary("+", "sum, entry by entry"),
    _binary("-", "difference, entry by entry"),
    _binary("*", "product, entry by entry (a Hadamard product)"),
    _binary("/", "quotient, entry by entry"),
    _binary("//", "floor division, entry by entry"),
    _binary("**", "power, entry by entry"),
    _binary("<", "comparison: a bool mask"),
    _binary("<=", "comparison: a bool mask"),
    _binary(">", "comparison: a bool mask"),
    _binary(">=", "comparison: a bool mask"),
    _binary("==", "comparison: a bool mask"),
    _binary("!=", "comparison: a bool mask"),
    Op("neg", "operator", ("x",), 1, 1, (), SAME, "unary minus", scalar=True, attrs=(NoAttrs,)),
    # contraction
    Op("einsum", "contraction", ("spec", "*operands"), 2, None, (),
       "the output term of the spec", "contract the operands' legs as the spec says (torch.einsum's rules)", rule="einsum", attrs=(Einsum,)),
    # over one leg
    Op("softmax", "leg", ("x", "leg"), 1, 2, (_LEG,), SAME, "normalise exp(x) to sum to one along a leg", rule="softmax", attrs=(Softmax,)),
    Op("log_softmax", "leg", ("x", "leg"), 1, 2, (_LEG,), SAME, "log of softmax along a leg (stable)", rule="softmax", attrs=(Softmax,)),
    Op("layernorm", "leg", ("x", "leg"), 1, 2,
       (_LEG, Kw("weight", PARAM), Kw("bias", PARAM), Kw("eps", NUMBER, 1e-5, "positive")),
       SAME, "centre and scale to unit variance along a leg, then weight and bias", rule="layernorm", attrs=(LayerNorm,)),
    Op("rmsnorm", "leg", ("x", "leg"), 1, 2,
       (_LEG, Kw("weight", PARAM), Kw("eps", NUMBER, 1e-5, "positive")),
       SAME, "scale to unit root mean square along a leg (in float32, float64 in a float64 model), then weight", rule="rmsnorm", attrs=(RMSNorm,)),
    Op("topk", "leg", ("x", "leg"), 1, 2, (_LEG, Kw("k", INT, None, "positive")), SAME,
       "keep the k largest entries along a leg, zero the rest", rule="topk", attrs=(TopK,)),
    Op("topk_mask", "leg", ("x", "leg"), 1, 2, (_LEG, Kw("k", INT, None, "positive")), SAME + " (a bool mask)",
       "true at the k largest entries along a leg", rule="topk_mask", attrs=(TopK,)),
    Op("sum", "leg", ("x", "leg"), 1, 2, (_LEG,), "its operand's legs without the summed leg", "sum over a leg", rule="reduce", attrs=(Reduce,)),
    Op("mean", "leg", ("x", "leg"), 1, 2, (_LEG,), "its operand's legs without the averaged leg", "mean over a leg", rule="reduce", attrs=(Reduce,)),
    _minmax("max", "maximum"),
    _minmax("min", "minimum"),
    # element-wise with options
    Op("dropout", "elementwise", ("x", "p"), 1, 2, (Kw("p", NUMBER, 0.1, "probability"),), SAME,
       "zero entries with probability p while training (scaled by 1/(1-p)); identity in eval", rule="dropout", attrs=(Dropout,)),
    Op("detach", "elementwise", ("x",), 1, 1, (), SAME, "the same values, no gradient flows back", rule="detach", attrs=(NoAttrs,)),
    Op("clamp", "elementwise", ("x", "min", "max"), 1, 3,
       (Kw("min", NUMBER_OR_DIM, None, "bound"), Kw("max", NUMBER_OR_DIM, None, "bound")), SAME,
       "limit entries to [min, max]", rule="clamp", attrs=(Clamp,)),
    Op("where", "elementwise", ("mask", "a", "b"), 3, 3, (), ALIGNED, "a where the mask is true, else b", rule="where", attrs=(Where,)),
    # masks
    Op("causal", "mask", ("t", "p"), 2, 2, (), "the two dims given (a bool mask)", "true where key p may be seen by query t (p ≤ t)",
       rule="causal", attrs=(Mask,)),
    Op("block_causal", "mask", ("t", "p"), 2, 2, (Kw("block", INT, None, "positive"),), "the two dims given (a bool mask)",
       "true where p's block is not after t's (bidirectional inside blocks of the given size)", rule="block_causal", attrs=(Mask,)),
    Op("arange", "mask", ("t",), 1, 1, (), "the dim given (a float per position)",
       "the positions along a leg, 0, 1, ..., its size - 1 (the size at run time): arange(t) - arange(s) is t - s",
       rule="arange", attrs=(Mask,)),
    # indexing and shapes
    Op("gather", "index", ("table", "ids"), 2, 2, (), "the ids' legs, then the table's legs after the first",
       "pick rows of a table by integer ids (an embedding lookup)", rule="gather", attrs=(NoAttrs,)),
    Op("split", "shape", ("x", "leg", "parts"), 3, 3, (), "one tensor per part, the leg replaced by the part's dim",
       "cut a leg into consecutive pieces", rule="split", attrs=(Split,)),
    Op("concat", "shape", ("parts", "leg", "into"), 3, 3, (), "the first part's legs, the joined leg replaced by `into`",
       "join tensors along a leg", rule="concat", attrs=(Concat,)),
    Op("flatten", "shape", ("x", "legs", "into"), 3, 3, (), "the adjacent legs merged into `into`",
       "merge adjacent legs into one", rule="flatten", attrs=(Flatten,)),
    Op("unflatten", "shape", ("x", "leg", "parts"), 3, 3, (), "the leg split into the given dims",
       "split one leg into several", rule="unflatten", attrs=(Unflatten,)),
    Op("rearrange", "shape", ("x", "pattern"), 2, 2, (), "the right side of the pattern, a leg per entry",
       "reorder legs, merge them ('(h d)') and split them, as einops.rearrange's pattern says", axis_lengths=True, rule="einop", attrs=(Einop,)),
    Op("reduce", "shape", ("x", "pattern", "reduction"), 2, 3, (), "the right side of the pattern, a leg per entry",
       "reduce the legs the right side leaves out ('sum', 'mean', 'max', 'min' or 'prod'; by position or "
       "reduction=), as einops.reduce", axis_lengths=True, rule="einop", attrs=(Einop,)),
    Op("repeat", "shape", ("x", "pattern"), 2, 2, (), "the right side of the pattern, a leg per entry",
       "copy the operand along the new legs of the right side (their dims' sizes), as einops.repeat", axis_lengths=True, rule="einop", attrs=(Einop,)),
    Op("select", "index", ("x", "leg", "index"), 3, 3, (), "its operand's legs without the selected leg",
       "pick one index of a leg (a contraction with a basis vector); the leg disappears", rule="select", attrs=(Select,)),
    Op("slice", "index", ("x", "leg", "start", "length", "into"), 4, 5, (Kw("into", DIM),),
       "its operand's legs, the sliced leg replaced by `into`",
       "keep `length` consecutive indices of a leg from `start` (torch.narrow) as a smaller declared dim", rule="slice", attrs=(Slice,)),
    Op("rope", "shape", ("x", "pos", "leg"), 3, 3, (Kw("base", NUMBER_OR_DIM, 10000.0, "positive"),), SAME,
       "rotary position embedding (rotate-half) of a leg by the position leg", rule="rope", attrs=(Rope,)),
]

OPS: dict[str, Op] = {op.name: op for op in _ROWS}
FUNCTIONS = frozenset(n for n, op in OPS.items() if op.category != "operator")
OPERATORS = frozenset(n for n, op in OPS.items() if op.category == "operator")
# the element-wise functions described by a row (a torch callable and a form)
ELEMENTWISE = frozenset(n for n, op in OPS.items() if op.torch is not None)


def key_of(code: str, attrs: Attrs) -> str | None:
    """The table name of a checked value (checked.V, which stores it as `V.key`): its op code
    refined by its attributes. None for atoms (numbers, references, sizes) and for statements
    (block calls, return)."""
    if isinstance(attrs, (Unary, Reduce, Pair)):
        return attrs.name
    if isinstance(attrs, (Mask, Einop)):
        return attrs.kind
    if isinstance(attrs, BinOp):
        return attrs.op
    if code in OPS:
        return code
    return None
