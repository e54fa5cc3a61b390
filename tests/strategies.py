"""Hypothesis strategies for `.pen` diagrams, each with the computation it must perform.

As in xarray's `testing/strategies.py`, dims (names and sizes) are drawn first and everything
else is drawn to match them. A drawn `Case` holds the `.pen` text and an independent reference
implementation (`Case.expected`) written directly with `torch.einsum` and torch ops on tensors
whose legs are tracked by name here, not by penrose.

    einsum_cases()        one einsum statement: compact or spaced multi-letter legs, 1-4
                          operands, repeated letters (traces, diagonals), implicit output
                          without '->', '...' on some terms, inputs and params as operands
    elementwise_cases()   1-3 statements of + - * / ** with broadcasting by leg name, outer
                          operations with stated legs (`h0[a, b] = tanh(x0 + x1)`), scalars
                          (numbers, sqrt(d), d * 2, W.shape[i]), unary functions, softmax /
                          log_softmax over a leg, sum / mean / max / min reductions, max(a, b) and
                          min(a, b) entry by entry, reassignment
    decorated(text)       the same diagram with comments, captions, notes, blank lines, odd
                          spacing and calls broken over lines (for the formatter)
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

SHORT_NAMES = list("abcdfghijklmnqrsuvwz")  # single-letter legs (compact einsum form)
LONG_NAMES = ["tok", "emb", "hd", "head", "feat", "ch", "pos", "hid", "kv", "blk"]
INPUT_NAMES = ["X", "Y", "Zin", "A", "B", "C", "D", "E2"]
PARAM_NAMES = ["W", "U", "V", "P", "Q", "R"]


@dataclass
class Case:
    """A drawn diagram: its text, its tensors, and the reference computation."""

    text: str
    dims: dict  # dim name -> size
    inputs: dict  # input name -> tuple of dim names (its legs, in order)
    params: dict = field(default_factory=dict)  # param name -> tuple of dim names
    outputs: tuple = ()
    expected: object = None  # env (name -> tensor; inputs may carry leading batch dims) -> {output: tensor}

    def make_inputs(self, batch=(), dtype=torch.float64, generator=None, sizes=None):
        """Random inputs with the declared (or the given) leg sizes and leading `batch` dims."""
        sizes = sizes or self.dims
        out = {}
        for name, legs in self.inputs.items():
            shape = tuple(batch) + tuple(sizes[l] for l in legs)
            out[name] = torch.randn(shape, dtype=dtype, generator=generator)
        return out

    def __repr__(self):  # hypothesis prints the falsifying example: the text is what matters
        return f"Case(text=\n{self.text})"


# ---- dims ------------------------------------------------------------------------------------


_SIZES = st.integers(1, 4)


def dim_lists(names, min_size=2, max_size=5, sizes=_SIZES):
    """A list of distinct (name, size) pairs."""
    return st.lists(st.sampled_from(names), min_size=min_size, max_size=max_size, unique=True).flatmap(
        lambda ns: st.tuples(*[st.tuples(st.just(n), sizes) for n in ns]).map(list)
    )


def dim_decls(dims, draw) -> list[str]:
    """`dim` lines for (name, size) pairs, several per line or one per line."""
    lines, row = [], []
    for name, size in dims:
        row.append(f"{name} = {size}")
        if draw(st.booleans()):
            lines.append("dim " + ", ".join(row))
            row = []
    if row:
        lines.append("dim " + ", ".join(row))
    return lines


# ---- einsum ----------------------------------------------------------------------------------


@st.composite
def einsum_cases(draw, max_operands=4):
    """One einsum over drawn dims, with params and inputs as operands."""
    spaced = draw(st.booleans())
    dims = draw(dim_lists(LONG_NAMES if spaced else SHORT_NAMES, min_size=2, max_size=5))
    size = dict(dims)
    labels = [n for n, _ in dims]
    if len(labels) >= 3 and draw(st.integers(0, 2)) == 0:
        # a matrix product over one or two legs ('ij,jk->ik', 'j,kj->k', 'aij,jk->aik', 'abc,bcd->ad' ...):
        # the compiler lowers these to '@', flattening grouped legs
        n_ops, explicit = 2, True
        n_c = draw(st.integers(1, 2)) if len(labels) >= 4 else 1
        c, rest = labels[:n_c], labels[n_c:]
        x_free = rest[: draw(st.integers(0, min(2, len(rest) - 1)))]
        y_free = rest[len(x_free) : len(x_free) + draw(st.integers(0, 2))]
        tx = x_free + c if draw(st.integers(0, 3)) or len(x_free) != 1 else c + x_free
        ty = c + y_free if draw(st.integers(0, 2)) else y_free + c
        terms, out = [tx, ty], x_free + y_free
        if draw(st.booleans()):
            terms, out = [ty, tx], (out if draw(st.booleans()) else y_free + x_free)
        if spaced and max(len(t) for t in terms) < 2:
            terms[0] = terms[0] + c  # the spaced form needs a term of two words (a trace, then)
    else:
        n_ops = draw(st.sampled_from([n for n in (1, 2, 2, 3, 4) if n <= max_operands]))
        terms = [draw(st.lists(st.sampled_from(labels), min_size=0, max_size=3)) for _ in range(n_ops)]
        if spaced and max(len(t) for t in terms) < 2:
            terms[0] = terms[0] + draw(st.lists(st.sampled_from(labels), min_size=2 - len(terms[0]), max_size=2 - len(terms[0])))
        explicit = draw(st.booleans())
        out = None
    used = [l for t in terms for l in t]
    if explicit and out is None:
        out = draw(st.permutations(sorted(set(used))).flatmap(lambda p: st.integers(0, len(p)).map(lambda k: list(p[:k]))))

    # operands: inputs (batched at run time) or params; each declared leg is the label's dim or
    # another dim of the same size (einsum letters are local to the call)
    kinds = [draw(st.sampled_from(["input", "input", "param"])) for _ in range(n_ops)]
    if all(k == "param" for k in kinds):
        kinds[draw(st.integers(0, n_ops - 1))] = "input"
    same_size = {l: [n for n, s in dims if s == size[l]] for l in labels}
    inputs, params, operands = {}, {}, []
    in_names, p_names = iter(INPUT_NAMES), iter(PARAM_NAMES)
    for term, kind in zip(terms, kinds):
        legs = tuple(draw(st.sampled_from(same_size[l])) if draw(st.integers(0, 3)) == 0 else l for l in term)
        name = next(in_names) if kind == "input" else next(p_names)
        (inputs if kind == "input" else params)[name] = legs
        operands.append(name)
    dots = [kind == "input" and draw(st.integers(0, 3)) == 0 for kind in kinds]
    dots_out = explicit and any(dots) and draw(st.booleans())

    sep = draw(st.sampled_from([",", ", "])) if not spaced else draw(st.sampled_from([",", ", ", " , "]))
    arrow = draw(st.sampled_from(["->", " -> "]))

    def term_text(t, dot):
        body = " ".join(t) if spaced else "".join(t)
        return ("..." + (" " if spaced and body else "") if dot else "") + body

    spec = sep.join(term_text(t, d) for t, d in zip(terms, dots))
    if explicit:
        spec += arrow + term_text(out, dots_out)

    lines = ["# einsum case"]
    lines += dim_decls(dims, draw)
    for name, legs in inputs.items():
        lines.append(f"input {name}[{', '.join(legs)}]")
    for name, legs in params.items():
        init = draw(st.sampled_from(["", " ~ normal(std=0.5)", " ~ uniform(a=-1, b=1)", " ~ normal(std=1, mean=0.1)"]))
        lines.append(f"param {name}[{', '.join(legs)}]{init}")
    lines.append(f"out = einsum('{spec}', {', '.join(operands)})")
    lines.append("output out")
    text = "\n".join(lines) + "\n"

    # the reference: torch.einsum with one letter per label
    letter = {l: (l if not spaced else string.ascii_lowercase[i]) for i, l in enumerate(labels)}
    if explicit:
        out_labels = out
    elif spaced:
        counts = {l: used.count(l) for l in set(used)}
        out_labels = sorted(l for l, c in counts.items() if c == 1)
    else:
        out_labels = None  # let torch apply its own implicit-output rule

    def expected(env):
        batched = [env[n].dim() > len(t) for n, t in zip(operands, terms)]
        lhs = ",".join(("..." if b else "") + "".join(letter[l] for l in t) for t, b in zip(terms, batched))
        if out_labels is None:
            eq = lhs
        else:
            # torch's rule: an explicit output without '...' sums the ellipsis (batch legs included)
            keep = any(batched) and not (explicit and any(dots) and not dots_out)
            eq = lhs + "->" + ("..." if keep else "") + "".join(letter[l] for l in out_labels)
        return {"out": torch.einsum(eq, *[env[n] for n in operands])}

    return Case(text, size, inputs, params, ("out",), expected)


# ---- element-wise expressions ----------------------------------------------------------------
# A tiny expression tree with two renderers: .pen text (with Python's precedences and random
# redundant parentheses) and a reference evaluator over (tensor, legs) pairs.

_PREC = {"+": 60, "-": 60, "*": 70, "/": 70}
_ATOM, _POW, _UNARY = 100, 90, 80


@dataclass(frozen=True)
class Leaf:
    name: str
    legs: tuple


@dataclass(frozen=True)
class Scalar:
    text: str
    value: float  # may depend on sizes: see `value_of`
    dim: str | None = None  # sizes-dependent scalar: 'sqrt' / 'dim' / 'dim2' of this dim
    kind: str = "num"
    legs: tuple = ()


@dataclass(frozen=True)
class Bin:
    op: str
    left: object
    right: object
    legs: tuple


@dataclass(frozen=True)
class Pow:
    base: object
    exponent: int
    legs: tuple


@dataclass(frozen=True)
class Neg:
    operand: object
    legs: tuple


@dataclass(frozen=True)
class Func:
    name: str
    arg: object
    legs: tuple


@dataclass(frozen=True)
class OverLeg:
    name: str  # softmax, log_softmax, sum, mean, max, min
    arg: object
    leg: str
    how: str  # 'name' | 'neg' (dim=-1) | 'pos' (dim=i, positional index)
    legs: tuple


@dataclass(frozen=True)
class Paren:
    inner: object

    @property
    def legs(self):
        return self.inner.legs


SAFE_UNARY = ["sigmoid", "sigma", "relu", "gelu", "silu", "tanh", "abs", "softplus", "mish", "hardswish", "elu"]


def render(e) -> tuple[str, int]:
    """(text, precedence) of a node, parenthesised only where Python needs it."""
    if isinstance(e, Leaf):
        return e.name, _ATOM
    if isinstance(e, Scalar):
        return e.text, (_ATOM if e.kind in ("num", "dim", "sqrt", "shape") else _PREC["*"])
    if isinstance(e, Paren):
        return "(" + render(e.inner)[0] + ")", _ATOM
    if isinstance(e, Bin) and e.op in ("max", "min"):
        return f"{e.op}({render(e.left)[0]}, {render(e.right)[0]})", _ATOM
    if isinstance(e, Bin):
        p = _PREC[e.op]
        lt, lp = render(e.left)
        rt, rp = render(e.right)
        lt = lt if lp >= p else f"({lt})"
        rt = rt if rp >= p + 1 else f"({rt})"
        return f"{lt} {e.op} {rt}", p
    if isinstance(e, Pow):
        bt, bp = render(e.base)
        bt = bt if bp >= _ATOM else f"({bt})"
        return f"{bt} ** {e.exponent}", _POW
    if isinstance(e, Neg):
        t, p = render(e.operand)
        t = t if p >= _UNARY else f"({t})"
        if t.startswith("-"):
            t = f"({t})"  # '--x' parses, but keep the text readable
        return f"-{t}", _UNARY
    if isinstance(e, Func):
        return f"{e.name}({render(e.arg)[0]})", _ATOM
    if isinstance(e, OverLeg):
        inner = render(e.arg)[0]
        if e.how == "name":
            return f"{e.name}({inner}, {e.leg})", _ATOM
        i = e.arg.legs.index(e.leg)
        return f"{e.name}({inner}, dim={i - len(e.arg.legs) if e.how == 'neg' else i})", _ATOM
    raise TypeError(e)


def evaluate(e, env: dict, sizes: dict, nb: int):
    """Reference value: a Python number for scalars, else a tensor shaped batch + legs."""
    if isinstance(e, Leaf):
        return env[e.name]
    if isinstance(e, Scalar):
        if e.kind == "sqrt":
            return math.sqrt(sizes[e.dim])
        if e.kind in ("dim", "shape"):
            return sizes[e.dim]
        if e.kind == "dim2":
            return sizes[e.dim] * 2
        return e.value
    if isinstance(e, Paren):
        return evaluate(e.inner, env, sizes, nb)
    if isinstance(e, Bin):
        a = _aligned(evaluate(e.left, env, sizes, nb), e.left.legs, e.legs, nb)
        b = _aligned(evaluate(e.right, env, sizes, nb), e.right.legs, e.legs, nb)
        if e.op in ("max", "min"):  # entry by entry; a number clamps the tensor
            if not isinstance(a, torch.Tensor):
                a, b = b, a
            if not isinstance(b, torch.Tensor):
                return a.clamp(**{"min" if e.op == "max" else "max": b})
            return (torch.maximum if e.op == "max" else torch.minimum)(a, b)
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[e.op]()
    if isinstance(e, Pow):
        return evaluate(e.base, env, sizes, nb) ** e.exponent
    if isinstance(e, Neg):
        return -evaluate(e.operand, env, sizes, nb)
    if isinstance(e, Func):
        x = evaluate(e.arg, env, sizes, nb)
        if not isinstance(x, torch.Tensor):
            return {"abs": abs, "exp": math.exp, "log": math.log, "sqrt": math.sqrt}[e.name](x)
        fn = {
            "sigmoid": torch.sigmoid,
            "sigma": torch.sigmoid,
            "relu": torch.relu,
            "gelu": torch.nn.functional.gelu,
            "silu": torch.nn.functional.silu,
            "tanh": torch.tanh,
            "abs": torch.abs,
            "softplus": torch.nn.functional.softplus,
            "mish": torch.nn.functional.mish,
            "hardswish": torch.nn.functional.hardswish,
            "elu": torch.nn.functional.elu,
            "exp": torch.exp,
            "log": torch.log,
            "sqrt": torch.sqrt,
        }[e.name]
        return fn(x)
    if isinstance(e, OverLeg):
        x = evaluate(e.arg, env, sizes, nb)
        d = nb + e.arg.legs.index(e.leg)
        if e.name == "softmax":
            return torch.softmax(x, dim=d)
        if e.name == "log_softmax":
            return torch.log_softmax(x, dim=d)
        if e.name == "sum":
            return x.sum(dim=d)
        if e.name == "mean":
            return x.mean(dim=d)
        if e.name == "min":
            return x.amin(dim=d)
        return x.amax(dim=d)
    raise TypeError(e)


def _aligned(x, legs, target, nb):
    """x (batch + legs) permuted and unsqueezed to batch + target legs; numbers pass through."""
    if not isinstance(x, torch.Tensor):
        return x
    perm = [legs.index(l) for l in target if l in legs]
    x = x.permute(tuple(range(nb)) + tuple(nb + p for p in perm))
    shape = list(x.shape[:nb])
    kept = iter(x.shape[nb:])
    for l in target:
        shape.append(next(kept) if l in legs else 1)
    return x.reshape(shape)


class _Pool:
    """Tensors available as leaves: inputs declared so far and earlier statements' targets."""

    def __init__(self, draw, dims):
        self.draw = draw
        self.dims = dims
        self.inputs: dict[str, tuple] = {}
        self.locals: dict[str, tuple] = {}

    def leaf(self, legs: frozenset) -> Leaf:
        draw = self.draw
        same = [(n, l) for n, l in list(self.inputs.items()) + list(self.locals.items()) if frozenset(l) == legs]
        if same and draw(st.integers(0, 3)) == 0:
            name, l = draw(st.sampled_from(same))
            return Leaf(name, l)
        name = f"x{len(self.inputs)}"
        order = tuple(draw(st.permutations(sorted(legs))))
        if draw(st.booleans()):  # early examples draw the identity permutation often
            order = order[::-1]
        self.inputs[name] = order
        return Leaf(name, order)

    def scalar(self) -> Scalar:
        draw = self.draw
        kind = draw(st.sampled_from(["num", "num", "sqrt", "dim", "dim2", "shape", "shape"]))
        if kind == "num":
            text, value = draw(st.sampled_from([("2", 2), ("3", 3), ("0.5", 0.5), ("1.5", 1.5), (".25", 0.25), ("1e-1", 0.1), ("2.", 2.0)]))
            return Scalar(text, value)
        d = draw(st.sampled_from(sorted(self.dims)))
        if kind == "sqrt":
            return Scalar(f"sqrt({d})", 0, d, "sqrt")
        if kind == "dim":
            return Scalar(d, 0, d, "dim")
        if kind == "dim2":
            return Scalar(f"{d} * 2", 0, d, "dim2")
        tensors = [(n, l) for n, l in self.inputs.items() if l]
        if not tensors:
            return Scalar(d, 0, d, "dim")
        name, legs = draw(st.sampled_from(tensors))
        i = draw(st.integers(-len(legs), len(legs) - 1))
        return Scalar(f"{name}.shape[{i}]", 0, legs[i], "shape")


def _expr(draw, pool: _Pool, legs: frozenset, depth: int, top: bool = False):
    """An expression whose result has exactly the leg set `legs` (a scalar when empty)."""
    if not legs and draw(st.integers(0, 3)) > 0:
        return pool.scalar()
    choices = ["leaf"] if depth <= 0 else ["leaf", "bin", "bin", "bin", "pow", "neg", "func", "over", "reduce", "paren"]
    if top:  # a statement is rarely a bare name: start from an operation
        choices = ["bin", "bin", "bin", "bin", "func", "over", "reduce"]
    kind = draw(st.sampled_from(choices))
    if kind == "leaf" or (not legs and kind in ("over", "func", "pow", "neg")):
        return pool.leaf(legs)
    if kind == "paren":
        return Paren(_expr(draw, pool, legs, depth - 1))
    if kind == "bin":
        op = draw(st.sampled_from(["+", "-", "*", "/"]))
        big = _expr(draw, pool, legs, depth - 1)
        sub = frozenset(draw(st.permutations(sorted(legs)))[: draw(st.integers(0, len(legs)))] if legs and draw(st.integers(0, 2)) else ())
        small = _expr(draw, pool, sub, depth - 1)
        if op == "/":
            left, right = (big, _positive(draw, small)) if draw(st.booleans()) else (small, _positive(draw, big))
            return Bin("/", left, right, _lead(left, right))
        if draw(st.integers(0, 5)) == 0 and legs:  # max(a, b) / min(a, b) entry by entry
            if not small.legs:  # a number: a dim's name or a whole number (`2`, `(2)`) would read as the leg
                small = Scalar("0.25", 0.25)
            left, right = (big, small) if draw(st.booleans()) else (small, big)
            return Bin(draw(st.sampled_from(["max", "min"])), left, right, _lead(left, right))
        left, right = (big, small) if draw(st.booleans()) else (small, big)
        return Bin(op, left, right, _lead(left, right))
    if kind == "pow":
        base = _expr(draw, pool, legs, depth - 1)
        return Pow(base, draw(st.sampled_from([2, 3])), base.legs)
    if kind == "neg":
        inner = _expr(draw, pool, legs, depth - 1)
        return Neg(inner, inner.legs)
    if kind == "func":
        inner = _expr(draw, pool, legs, depth - 1)
        name = draw(st.sampled_from(SAFE_UNARY + ["exp", "log", "sqrt"]))
        if name == "exp":
            inner = Func("tanh", inner, inner.legs)  # keep exp's argument bounded
        elif name in ("log", "sqrt"):
            inner = _positive(draw, inner)
        return Func(name, inner, inner.legs)
    if kind == "over":
        inner = _expr(draw, pool, legs, depth - 1)
        if not inner.legs:
            return inner
        leg = draw(st.sampled_from(inner.legs))
        how = draw(st.sampled_from(["name", "name", "neg", "pos"]))
        return OverLeg(draw(st.sampled_from(["softmax", "log_softmax"])), inner, leg, how, inner.legs)
    # reduce over a leg that is not in the result
    extra = [d for d in sorted(pool.dims) if d not in legs]
    if not extra:
        return _expr(draw, pool, legs, depth - 1)
    leg = draw(st.sampled_from(extra))
    inner = _expr(draw, pool, legs | {leg}, depth - 1)
    assert leg in inner.legs
    how = draw(st.sampled_from(["name", "name", "pos"]))
    return OverLeg(draw(st.sampled_from(["sum", "mean", "max", "min"])), inner, leg, how, tuple(l for l in inner.legs if l != leg))


def _lead(left, right) -> tuple:
    """Result legs of a binary op: those of the operand with more legs, the left one on a tie."""
    return left.legs if len(left.legs) >= len(right.legs) else right.legs


def _positive(draw, e):
    """An expression made strictly positive (and away from zero), for denominators, log and sqrt."""
    if isinstance(e, Scalar):
        return e if e.kind != "num" or e.value > 0 else Scalar("2", 2)
    if not e.legs:  # a number-valued expression: only sqrt, exp, log and abs apply to numbers
        return Paren(Bin("+", Func("abs", e, ()), Scalar("1", 1), ()))
    how = draw(st.sampled_from(["sq", "exp", "softplus"]))
    if how == "sq":
        return Paren(Bin("+", Pow(e, 2, e.legs), Scalar("1", 1), e.legs))
    if how == "exp":
        return Func("exp", Func("tanh", e, e.legs), e.legs)
    return Paren(Bin("+", Func("softplus", e, e.legs), Scalar("0.5", 0.5), e.legs))


@st.composite
def elementwise_cases(draw, max_statements=3, max_depth=3):
    """1-3 element-wise statements over drawn dims, the last (and maybe another) output."""
    dims = draw(dim_lists(SHORT_NAMES[:8] + LONG_NAMES[:4], min_size=2, max_size=4))
    size = dict(dims)
    pool = _Pool(draw, size)
    names = sorted(size)
    stmts = []  # (target, node)
    stated = set()  # the statements (id of the node) written with their legs stated: `h0[a, b] = x0 + x1`
    n = draw(st.integers(1, max_statements))
    for i in range(n):
        k = draw(st.integers(1, len(names)))
        legs = frozenset(draw(st.permutations(names))[:k])
        if len(names) >= 2 and draw(st.integers(0, 3)) == 0:  # an outer operation by name, its legs stated
            order = tuple(draw(st.permutations(names))[: draw(st.integers(2, len(names)))])
            first = draw(st.integers(1, len(order) - 1))
            a, b = pool.leaf(frozenset(order[:first])), pool.leaf(frozenset(order[first:]))
            node = Bin(draw(st.sampled_from(["+", "-", "*"])), a, b, order)
            if draw(st.booleans()):
                node = Func("tanh", node, order)
            target = f"h{i}"
            stated.add(id(node))
            stmts.append((target, node))
            pool.locals[target] = node.legs
            continue
        node = _expr(draw, pool, legs, draw(st.integers(1, max_depth)), top=True)
        if not node.legs:  # a scalar-only value: make it a tensor
            leaf = pool.leaf(legs)
            node = Bin("*", leaf, node, leaf.legs)
        if pool.locals and draw(st.booleans()):
            target = draw(st.sampled_from(sorted(pool.locals)))  # reassignment (SSA in the IR), legs may change
        else:
            target = f"h{i}"
        stmts.append((target, node))
        pool.locals[target] = node.legs
    last = stmts[-1][0]
    others = [t for t in pool.locals if t != last]
    outputs = (last,) if not others or draw(st.booleans()) else (draw(st.sampled_from(others)), last)

    lines = dim_decls(dims, draw)
    for name, legs in pool.inputs.items():
        lines.append(f"input {name}[{', '.join(legs)}]")
    for target, node in stmts:
        shown = f"{target}[{', '.join(node.legs)}]" if id(node) in stated else target
        lines.append(f"{shown} = {render(node)[0]}")
    lines.append("output " + ", ".join(outputs))
    text = "\n".join(lines) + "\n"
    inputs = dict(pool.inputs)

    def expected(env, sizes=None):
        sizes = sizes or size
        env = dict(env)
        first = next(iter(inputs))
        nb = env[first].dim() - len(inputs[first])
        for target, node in stmts:
            env[target] = evaluate(node, env, sizes, nb)
        return {o: env[o] for o in outputs}

    return Case(text, size, inputs, {}, outputs, expected)


# ---- decoration (comments, captions, notes, layout) ------------------------------------------


@st.composite
def decorated(draw, text: str, comments: bool = True):
    """`text` with comments, captions, notes, blank lines, extra spaces and line breaks in calls."""
    out = []
    step = 0
    if comments and draw(st.booleans()):
        out.append("# index legend: t token, e embedding")
    for line in text.splitlines():
        if draw(st.integers(0, 4)) == 0:
            out.append("")
        if not comments:
            pass
        elif draw(st.integers(0, 4)) == 0:
            step += 1
            out.append(f"# {step}) Step number {step}. Yields: something.")
        elif draw(st.integers(0, 5)) == 0:
            out.append(draw(st.sampled_from(["# a plain comment", "#no space", "#", "   # indented comment"])))
        if draw(st.integers(0, 3)) == 0:
            sep = draw(st.sampled_from([",", " , ", ",   "]))
            # outside quotes only: a space inside an einsum spec is part of what fmt keeps
            line = "'".join(part if i % 2 else part.replace(", ", sep) for i, part in enumerate(line.split("'")))
        if draw(st.integers(0, 3)) == 0:
            line = line.replace(" = ", draw(st.sampled_from(["=", "  =  "])), 1)
        if "(" in line and draw(st.integers(0, 3)) == 0:
            i = line.index("(") + 1
            line = line[:i] + "\n    " + line[i:]  # newlines are free inside brackets
        if comments and draw(st.integers(0, 3)) == 0:
            line += draw(st.sampled_from(["  # a note", " #note with 'quotes'", "\t# tab note"]))
        if draw(st.integers(0, 6)) == 0:
            line = "  " + line
        out.append(line)
    if comments and draw(st.booleans()):
        out.append("# trailing comment")
    return "\n".join(out) + draw(st.sampled_from(["\n", "", "\n\n", "\r\n"]))
