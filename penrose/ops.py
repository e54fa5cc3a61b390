"""The one table of operations: every operation of the language, named once.

Each row says what a user may write — positional arguments, keywords with their kinds,
defaults and validity rules — what the result's legs are, and one line of documentation. The
checker reads arity and keywords from here; every backend keeps a table keyed by the same
names and a test asserts the key sets are equal:

    penrose.compiler.LOWER          the PyTorch lowering
    penrose.render.figure.FIGURE    the box drawn in the Penrose figure
    penrose.render.equations.EQUATION   the equation
    penrose.render.explain.READING  the geometric reading
    penrose.fmt.FORMAT              how `penrose fmt` prints it

Adding an element-wise function is one row here plus one entry per backend. Torch-free.

>>> OPS["layernorm"].keyword("eps").rule
'positive'
>>> key_of("unary", {"name": "gelu"})
'gelu'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# keyword kinds: what may be written for a keyword
NUMBER = "number"  # a number literal (inf where the rule allows)
INT = "int"  # a whole number, or a dim (its size)
NUMBER_OR_DIM = "number_or_dim"  # a number, or a dim (its size)
LEG = "leg"  # a leg of the operand: a name, or dim=i
PARAM = "param"  # a declared one-leg param or buffer
DIM = "dim"  # a declared dim (the leg a result takes)

# keyword rules
RULES = {
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
    default: object = None
    rule: str = "any"

    def ok(self, value) -> bool:
        return RULES[self.rule][1](value)

    @property
    def rule_text(self) -> str:
        return RULES[self.rule][0]


@dataclass(frozen=True)
class Op:
    """One operation: what may be written, what it yields."""

    name: str
    category: str  # elementwise | operator | contraction | leg | mask | shape | index | block
    args: tuple  # positional parameter names (documentation and arity)
    min_args: int
    max_args: int | None  # None: any number
    keywords: tuple = ()
    legs: str = ""  # the result-leg rule, in words
    doc: str = ""
    scalar: bool = False  # also applies to plain numbers (folded by the checker)
    axis_lengths: bool = False  # takes einops' NAME=size keywords for the dims of its pattern

    def keyword(self, key: str) -> Kw | None:
        for k in self.keywords:
            if k.name == key:
                return k
        return None

    @property
    def keyword_names(self) -> tuple:
        return tuple(k.name for k in self.keywords)

    @property
    def signature(self) -> str:
        parts = list(self.args)
        parts += [f"{k.name}={k.default!r}" if k.default is not None else f"{k.name}=..." for k in self.keywords]
        return f"{self.name}({', '.join(parts)})"


SAME = "the legs of its operand"
ALIGNED = "the operands' legs aligned by name (or by position when the counts match)"


def _unary(name, doc, keywords=(), scalar=False):
    return Op(name, "elementwise", ("x",), 1, 1, keywords, SAME, doc, scalar)


def _binary(op, doc):
    return Op(op, "operator", ("a", "b"), 2, 2, (), ALIGNED, doc, scalar=op not in ("<", "<=", ">", ">=", "==", "!="))


_LEG = Kw("dim", LEG)

_ROWS = [
    # element-wise functions
    _unary("sigmoid", "logistic sigmoid 1 / (1 + e^-x), entry by entry"),
    _unary("sigma", "σ, the logistic sigmoid (a synonym of sigmoid)"),
    _unary("relu", "max(x, 0), entry by entry"),
    _unary("gelu", "Gaussian error linear unit x·Φ(x) (exact erf form)"),
    _unary("silu", "x·σ(x), entry by entry"),
    _unary("tanh", "hyperbolic tangent, entry by entry"),
    _unary("exp", "e^x, entry by entry", scalar=True),
    _unary("log", "natural logarithm, entry by entry", scalar=True),
    _unary("sqrt", "square root, entry by entry", scalar=True),
    _unary("abs", "|x|, entry by entry", scalar=True),
    _unary("softplus", "log(1 + e^x), entry by entry"),
    _unary("leaky_relu", "x where x > 0, else slope·x", (Kw("slope", NUMBER, 0.01, "finite"),)),
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
    Op("neg", "operator", ("x",), 1, 1, (), SAME, "unary minus", scalar=True),
    # contraction
    Op("einsum", "contraction", ("spec", "*operands"), 2, None, (),
       "the output term of the spec", "contract the operands' legs as the spec says (torch.einsum's rules)"),
    # over one leg
    Op("softmax", "leg", ("x", "leg"), 1, 2, (_LEG,), SAME, "normalise exp(x) to sum to one along a leg"),
    Op("log_softmax", "leg", ("x", "leg"), 1, 2, (_LEG,), SAME, "log of softmax along a leg (stable)"),
    Op("layernorm", "leg", ("x", "leg"), 1, 2,
       (_LEG, Kw("weight", PARAM), Kw("bias", PARAM), Kw("eps", NUMBER, 1e-5, "positive")),
       SAME, "centre and scale to unit variance along a leg, then weight and bias"),
    Op("rmsnorm", "leg", ("x", "leg"), 1, 2,
       (_LEG, Kw("weight", PARAM), Kw("eps", NUMBER, 1e-5, "positive")),
       SAME, "scale to unit root mean square along a leg (in float32), then weight"),
    Op("topk", "leg", ("x", "leg"), 1, 2, (_LEG, Kw("k", INT, None, "positive")), SAME,
       "keep the k largest entries along a leg, zero the rest"),
    Op("topk_mask", "leg", ("x", "leg"), 1, 2, (_LEG, Kw("k", INT, None, "positive")), SAME + " (a bool mask)",
       "true at the k largest entries along a leg"),
    Op("sum", "leg", ("x", "leg"), 1, 2, (_LEG,), "its operand's legs without the summed leg", "sum over a leg"),
    Op("mean", "leg", ("x", "leg"), 1, 2, (_LEG,), "its operand's legs without the averaged leg", "mean over a leg"),
    Op("max", "leg", ("x", "leg"), 1, 2, (_LEG,), "its operand's legs without the reduced leg", "maximum over a leg"),
    # element-wise with options
    Op("dropout", "elementwise", ("x", "p"), 1, 2, (Kw("p", NUMBER, 0.1, "probability"),), SAME,
       "zero entries with probability p while training (scaled by 1/(1-p)); identity in eval"),
    Op("detach", "elementwise", ("x",), 1, 1, (), SAME, "the same values, no gradient flows back"),
    Op("clamp", "elementwise", ("x", "min", "max"), 1, 3,
       (Kw("min", NUMBER_OR_DIM, None, "bound"), Kw("max", NUMBER_OR_DIM, None, "bound")), SAME,
       "limit entries to [min, max]"),
    Op("where", "elementwise", ("mask", "a", "b"), 3, 3, (), ALIGNED, "a where the mask is true, else b"),
    # masks
    Op("causal", "mask", ("t", "p"), 2, 2, (), "the two dims given (a bool mask)", "true where key p may be seen by query t (p ≤ t)"),
    Op("block_causal", "mask", ("t", "p"), 2, 2, (Kw("block", INT, None, "positive"),), "the two dims given (a bool mask)",
       "true where p's block is not after t's (bidirectional inside blocks of the given size)"),
    # indexing and shapes
    Op("gather", "index", ("table", "ids"), 2, 2, (), "the ids' legs, then the table's legs after the first",
       "pick rows of a table by integer ids (an embedding lookup)"),
    Op("split", "shape", ("x", "leg", "parts"), 3, 3, (), "one tensor per part, the leg replaced by the part's dim",
       "cut a leg into consecutive pieces"),
    Op("concat", "shape", ("parts", "leg", "into"), 3, 3, (), "the first part's legs, the joined leg replaced by `into`",
       "join tensors along a leg"),
    Op("flatten", "shape", ("x", "legs", "into"), 3, 3, (), "the adjacent legs merged into `into`",
       "merge adjacent legs into one"),
    Op("unflatten", "shape", ("x", "leg", "parts"), 3, 3, (), "the leg split into the given dims",
       "split one leg into several"),
    Op("rearrange", "shape", ("x", "pattern"), 2, 2, (), "the right side of the pattern, a leg per entry",
       "reorder legs, merge them ('(h d)') and split them, as einops.rearrange's pattern says", axis_lengths=True),
    Op("reduce", "shape", ("x", "pattern", "reduction"), 2, 3, (), "the right side of the pattern, a leg per entry",
       "reduce the legs the right side leaves out ('sum', 'mean', 'max', 'min' or 'prod'; by position or "
       "reduction=), as einops.reduce", axis_lengths=True),
    Op("repeat", "shape", ("x", "pattern"), 2, 2, (), "the right side of the pattern, a leg per entry",
       "copy the operand along the new legs of the right side (their dims' sizes), as einops.repeat", axis_lengths=True),
    Op("select", "index", ("x", "leg", "index"), 3, 3, (), "its operand's legs without the selected leg",
       "pick one index of a leg (a contraction with a basis vector); the leg disappears"),
    Op("slice", "index", ("x", "leg", "start", "length", "into"), 4, 5, (Kw("into", DIM),),
       "its operand's legs, the sliced leg replaced by `into`",
       "keep `length` consecutive indices of a leg from `start` (torch.narrow) as a smaller declared dim"),
    Op("rope", "shape", ("x", "pos", "leg"), 3, 3, (Kw("base", NUMBER_OR_DIM, 10000.0, "positive"),), SAME,
       "rotary position embedding (rotate-half) of a leg by the position leg"),
]

OPS: dict[str, Op] = {op.name: op for op in _ROWS}
FUNCTIONS = frozenset(n for n, op in OPS.items() if op.category != "operator")
OPERATORS = frozenset(n for n, op in OPS.items() if op.category == "operator")
ELEMENTWISE = frozenset(n for n, op in OPS.items() if op.category == "elementwise" and op.args == ("x",) and n != "detach")


def key_of(code: str, attrs: dict) -> str | None:
    """The table name of a checked value (check.V): its op code refined by its attributes.
    None for atoms (numbers, references, sizes) and for statements (block calls, return)."""
    if code in ("unary", "sfunc", "reduce"):
        return attrs["name"]
    if code in ("mask", "einop"):
        return attrs["kind"]
    if code in ("binop", "sbin"):
        return attrs["op"]
    if code in OPS:
        return code
    return None


def key(v) -> str | None:
    """`key_of` for a checked value."""
    return key_of(v.op, v.attrs)
