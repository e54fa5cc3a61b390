"""Hypothesis strategies for WHOLE `.pen` programs, for the differential fuzzer.

As in xarray's `testing/strategies.py`, dims (names and sizes, with sum and product relations
for split/concat/flatten/unflatten) are drawn first, then blocks, then statements; tensors are
declared on demand, when an expression needs a leaf with given legs. Every expression is drawn
for a *target* list of legs (dim names), so the program type-checks by construction: an
einsum picks its contracted labels and its operands' legs, an element-wise operator draws its
second operand on a subset of the first one's legs, a reduction draws its operand with one leg
more, and so on. Any expression may stand in any argument position, nested to a drawn depth.

    programs(decorate=False)   a Program: the text and what the test needs to feed it
    deep_programs()            one statement nested hundreds of levels, or thousands of terms

The grammar covers every operation of the language: numbers and dim sizes (`sqrt(d)`,
`W.shape[0]`, `d // 2`), unary minus, + - * / ** //, comparisons feeding where(), every
element-wise function, einsum (compact and spaced forms, 1-4 operands, contracted labels,
renamed legs, diagonals, size-1 broadcasting, implicit output, '...' kept, summed, or covering
declared legs anywhere in a term), softmax, log_softmax, layernorm and rmsnorm (with
weights and biases), topk, topk_mask, sum/mean/max/min over a leg, max/min of two operands, dropout, detach (both spellings), clamp,
where, causal and block_causal masks, positions (`arange(t)`), gather, split, concat, unflatten, flatten, rope, the einops
calls (rearrange, reduce with the five reductions, repeat: permutations, merges on the right
into product dims, splits on the left, `1`/`()` legs, `...` on both sides or, in reduce, on the
left only, new legs alone and inside merges), select and slice (by name or position, negative
indices, a length as a dim, a number with into= or positional), consts (numbers and expressions
of dims and consts, read as scalars, indices, keyword values and init arguments), blocks
(calls in expressions, `as` with names and dotted paths, `repeat` and `repeat N shared` with
further arguments, several results, blocks calling blocks), stated legs with outer sums,
products and powers (`h[a, b, c] = x + y`), attention
sequences the compiler fuses, reassignment (SSA), labels, captions and notes.

With `decorate=True` the text also carries comments in awkward places: inside multi-line
calls, inside leg lists and block signatures, after a block's `{` and its `}`, between
statements, and backslash continuations; the formatter must keep every comment.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from hypothesis import strategies as st

from penrose import ops

BASE_DIMS = list("abcdefgh")
WORD_DIMS = ["tok", "emb"]  # multi-letter legs: einsum takes the spaced form
DERIVED_DIMS = list("mnrsuvwz")
FRESH_LABELS = list("ijklopqxy")  # einsum letters that are no dim (contracted legs, renamed)

ATOM, POW, UNARY, MUL, ADD, CMP = 6, 5, 4, 3, 2, 1
BINPREC = {"**": POW, "*": MUL, "/": MUL, "//": MUL, "+": ADD, "-": ADD}
# every element-wise function of the table: a new row is fuzzed without an edit here
UNARY_FUNCS = sorted(ops.ELEMENTWISE)
COMPARE = ["<", "<=", ">", ">=", "==", "!="]
CONST_NAMES = ["alpha", "beta", "gamma"]
REDUCTIONS = ["sum", "mean", "max", "min", "prod"]


@dataclass
class Program:
    """A drawn program: its text and what a test needs to run it."""

    text: str
    dims: dict  # dim name -> size
    inputs: dict  # input name -> (legs, dtype, bound): bound is the id range for int inputs
    ops: frozenset = frozenset()  # the operations used (for coverage reports)

    def __repr__(self):  # hypothesis prints the falsifying example: the text is what matters
        return f"Program(text=\n{self.text})"


@dataclass
class _Tensor:
    legs: tuple
    batched: bool
    dtype: str = "float"
    kind: str = "local"


@dataclass
class _Block:
    name: str
    formals: list  # (name, legs)
    outs: list  # legs of each returned value


@dataclass
class _Scope:
    is_block: bool
    size_dims: set  # dims whose size an expression may read (a block: its formals' legs)
    tensors: dict = field(default_factory=dict)
    decls: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    labelled: set = field(default_factory=set)
    blocks: list = field(default_factory=list)  # blocks callable from this scope


def _wrap(e, need):
    text, prec = e[0], e[1]
    return text if prec >= need else f"({text})"


class _Gen:
    def __init__(self, draw, decorate: bool, consts: bool = False, hostile: bool = False):
        self.draw = draw
        self.decorate = decorate
        self.hostile = hostile  # names drawn from what Python, torch and the generated module use
        self.used_names: set = set()
        self.force_consts = consts
        self.counter = itertools.count(1)
        self.comment_no = itertools.count(1)
        self.dims: dict = {}
        self.sums: dict = {}  # dim -> (part, part): size(dim) = size(part) + size(part)
        self.prods: dict = {}  # dim -> (factor, factor)
        self.inputs: dict = {}
        self.ops: set = set()
        self.blocks: list = []
        self.consts: dict = {}  # const name -> value (at the declared sizes)
        self.const_lines: list = []
        self.const_dims: set = set()  # the dims the consts' values read

    # -- small draws
    def coin(self, p=0.5) -> bool:
        return self.draw(st.floats(0, 1)) < p

    def pick(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def fresh(self, prefix: str) -> str:
        if self.hostile and self.coin(0.5):
            pool = [n for n in hostile_names() if n not in self.used_names and n not in self.dims and n not in CONST_NAMES]
            if pool:
                name = self.pick(pool)
                self.used_names.add(name)
                return name
        return f"{prefix}{next(self.counter)}"

    def comment(self) -> str:
        return f"c{next(self.comment_no)} remark"

    def note(self) -> str:
        return f"   # n{next(self.comment_no)} note" if self.decorate and self.coin(0.2) else ""

    # -- dims
    def draw_dims(self) -> list:
        base = self.draw(st.lists(st.sampled_from(BASE_DIMS), min_size=2, max_size=4, unique=True))
        if self.coin(0.3):
            base.append(self.pick(WORD_DIMS))
        for name in base:
            self.dims[name] = self.draw(st.integers(1, 4))
        if not any(self.dims[n] % 2 == 0 for n in base):  # rope needs an even leg
            self.dims[base[0]] = 2
        items = [f"{n} = {self.dims[n]}" for n in base]
        spare = list(DERIVED_DIMS)
        small = [n for n in base if len(n) == 1]
        for kind in self.draw(st.lists(st.sampled_from(["sum", "double", "prod"]), max_size=3)):
            if not spare or len(small) < 2:
                break
            name = spare.pop(0)
            a, b = self.draw(st.permutations(small))[:2]
            if kind == "sum":
                self.dims[name] = self.dims[a] + self.dims[b]
                self.sums[name] = (a, b)
                items.append(f"{name} = {a} + {b}")
            elif kind == "double":
                self.dims[name] = 2 * self.dims[a]
                self.sums[name] = (a, a)
                items.append(f"{name} = 2 * {a}")
            else:
                self.dims[name] = self.dims[a] * self.dims[b]
                self.prods[name] = (a, b)
                items.append(f"{name} = {a} * {b}")
        lines, row = [], []
        for item in items:
            row.append(item)
            if self.coin(0.5):
                lines.append("dim " + ", ".join(row))
                row = []
        if row:
            lines.append("dim " + ", ".join(row))
        if self.force_consts or self.coin(0.4):
            self.draw_consts(small)
        return lines

    def draw_consts(self, small: list):
        """`const` declarations: numbers, and expressions of dims and earlier consts (`alpha / b`)."""
        for name in CONST_NAMES[: self.draw(st.integers(1, len(CONST_NAMES)))]:
            ints = [c for c, v in self.consts.items() if isinstance(v, int)]
            form = self.pick(["int", "int", "float", "neg", "of_dim", "of_const"])
            if form == "int":
                value = self.draw(st.integers(0, 3))
                text = str(value)
            elif form == "float":
                text = self.pick(["0.5", "1.5", "0.25", "2.0", "1e-3"])
                value = float(text)
            elif form == "neg":
                value = -self.draw(st.integers(1, 3))
                text = str(value)
            elif form == "of_dim" and small:
                d = self.pick(small)
                self.const_dims.add(d)
                op = self.pick(["/", "*", "-", "//"])
                k = self.draw(st.integers(1, 2))
                text = f"{d} {op} {k}"
                n = self.dims[d]
                value = {"/": n / k, "*": n * k, "-": n - k, "//": n // k}[op]
            elif form == "of_const" and ints:
                c = self.pick(ints)
                value = self.consts[c] * 2 + 1
                text = f"{c} * 2 + 1"
            else:
                value = 1
                text = "1"
            self.consts[name] = value
            self.const_lines.append(f"const {name} = {text}")
        self.ops.add("const")

    def const_in(self, lo, hi, integer=True) -> list:
        """The consts whose value lies in [lo, hi] (whole numbers only, unless integer=False)."""
        return sorted(c for c, v in self.consts.items() if (isinstance(v, int) or not integer) and lo <= v <= hi)

    def same_size(self, size: int) -> list:
        return [n for n, s in self.dims.items() if s == size]

    def legs(self, lo=0, hi=3, unique=True) -> tuple:
        names = list(self.dims)
        if unique:
            return tuple(self.draw(st.lists(st.sampled_from(names), min_size=lo, max_size=hi, unique=True)))
        return tuple(self.draw(st.lists(st.sampled_from(names), min_size=lo, max_size=hi)))

    # -- calls (multi-line, with comments inside, when decorating)
    def call(self, func: str, parts: list) -> tuple:
        if self.decorate and len(parts) > 1 and self.coin(0.25):
            out = [parts[0]]
            for p in parts[1:]:
                if self.coin(0.5):
                    out.append(f",  # {self.comment()}\n    {p}")
                else:
                    out.append(f",\n    {p}")
            return f"{func}({''.join(out)})", ATOM
        return f"{func}({', '.join(parts)})", ATOM

    # -- leaves
    def declare(self, sc: _Scope, legs: tuple, kind: str, dtype="float", bound=None) -> str:
        name = self.fresh({"input": "X", "param": "W", "buffer": "B"}[kind] if dtype == "float" else ("ids" if dtype == "int" else "M"))
        shown = ", ".join(legs)
        if self.decorate and len(legs) > 1 and self.coin(0.15):  # a comment inside the leg list
            shown = f"{legs[0]},  # {self.comment()}\n    " + ", ".join(legs[1:])
        if kind == "input":
            dots = self.coin(0.15)
            shown = "..., " + shown if dots and shown else ("..." if dots else shown)
            suffix = {"float": "", "int": " : int", "bool": " : bool"}[dtype]
            sc.decls.append(f"input {name}[{shown}]{suffix}")
            self.inputs[name] = (legs, dtype, bound)
            sc.tensors[name] = _Tensor(legs, True, dtype, "input")
        else:
            sc.decls.append(f"{kind} {name}[{shown}]{self.init(legs)}")
            sc.tensors[name] = _Tensor(legs, False, dtype, kind)
        if sc.is_block:
            sc.size_dims |= set(legs)  # a param fixes its legs' sizes: the block may read them
        return name

    def init(self, legs) -> str:
        options = [" ~ normal(std=0.5)", " ~ normal(mean=0.1, std=0.3)", " ~ uniform(a=-1, b=1)", " ~ xavier",
                   " ~ constant(value=0.7)", " ~ ones", "", " ~ xavier(gain=2)", " ~ fan_in"]
        if len(legs) == 2:
            options.append(" ~ eye")
        options += [f" ~ normal(std={c})" for c in self.const_in(0, 3, integer=False)]
        options += [f" ~ constant(value={c})" for c in sorted(self.consts)[:1]]
        return self.pick(options)

    def leaf(self, sc: _Scope, T: tuple, unbatched: bool):
        found = [n for n, t in sc.tensors.items() if t.legs == T and t.dtype == "float" and not (unbatched and t.batched)]
        if found and self.coin(0.7):
            name = self.pick(found)
        else:
            kind = "param" if (sc.is_block or unbatched or self.coin(0.4)) else "input"
            if kind == "param" and self.coin(0.1):
                kind = "buffer"
            name = self.declare(sc, T, kind)
        self.ops.add("ref")
        return name, ATOM, sc.tensors[name].batched

    # -- scalars: numbers, dim sizes, shapes, and arithmetic of them
    def number(self, positive=False) -> tuple:
        text = self.pick(["2", "3", "0.5", "1.5", "2.0", "1e-1", "0.25"] + ([] if positive else ["-2", "-0.5"]))
        return text, UNARY if text.startswith("-") else ATOM

    def scalar(self, sc: _Scope, depth: int, positive=False) -> tuple:
        """A plain number (of dims, shapes, literals); positive=True: never zero or negative."""
        dims = sorted(sc.size_dims)
        shaped = [(n, i) for n, t in sc.tensors.items() for i, l in enumerate(t.legs) if l in sc.size_dims]
        choice = self.pick(["num", "dim", "sqrt", "shape", "sfunc", "const", "sbin"][: 7 if depth > 0 else 6])
        usable = self.const_in(0.25, 10, integer=False) if positive else sorted(self.consts)
        if choice == "const" and usable:
            self.ops.add("const")
            c = self.pick(usable)
            return (f"({c})" if self.consts[c] < 0 and self.coin(0.5) else c), ATOM
        if choice == "dim" and dims:
            self.ops.add("dimsize")
            return self.pick(dims), ATOM
        if choice == "sqrt" and dims:
            self.ops.add("sfunc")
            d = self.pick(dims)
            return self.pick([f"sqrt({d})", f"sqrt({d} * 2)", f"{d} ** 0.5"]), ATOM
        if choice == "shape" and shaped:
            self.ops.add("dimsize")
            n, i = self.pick(shaped)
            if self.coin(0.3):
                i -= len(sc.tensors[n].legs)
            return f"{n}.shape[{i}]", ATOM
        if choice == "sfunc":
            self.ops.add("sfunc")
            return self.pick(["abs(-2)", "exp(1)", "log(3)", "sqrt(2)", "abs(1.5)"]), ATOM
        if choice == "sbin" and dims:
            self.ops.add("sbin")
            d = self.pick(dims)
            if positive:
                return self.pick([f"({d} + 1)", f"{d} * 2", f"{d} / 2", f"({d} + 1) ** 2"]), ATOM
            return self.pick([f"({d} - 3)", f"({d} // 2)", f"{d} * -1", f"(2 ** -{d})"]), ATOM
        self.ops.add("num")
        return self.number(positive)

    # -- tensor expressions for target legs T
    def expr(self, sc: _Scope, T: tuple, depth: int, unbatched=False) -> tuple:
        """(text, precedence, batched) of a float expression whose legs are exactly T."""
        if depth <= 0:
            return self.leaf(sc, T, unbatched)
        unique = len(set(T)) == len(T)
        options = ["leaf", "unary", "neg", "binop", "binop", "scalar_binop", "einsum", "einsum", "where", "detach",
                   "dropout", "clamp", "minmax"]
        if unique:
            options += ["reduce"]
        if T and unique:
            options += ["softmax", "norm", "topk", "rope"]
        if not sc.is_block and unique:
            options += ["gather"]
        if unique:
            options += ["rearrange", "einreduce", "select"]
        if T and unique:
            options += ["einrepeat", "slice"]
        if len(T) == 1:
            options += ["arange"]
        if any(l in self.sums for l in T) and unique:
            options += ["concat", "concat"]  # rare shapes: take them when they come
        if any(l in self.prods for l in T) and unique:
            options += ["flatten", "flatten"]  # rare shapes: take them when they come
        if unique and any(T[i:i + 2] in [p for p in self.prods.values()] for i in range(len(T))):
            options += ["unflatten", "unflatten"]  # rare shapes: take them when they come
        if any(b.outs == [T] for b in sc.blocks):
            options += ["block", "block"]
        choice = self.pick(options)
        result = getattr(self, "_" + choice)(sc, T, depth - 1, unbatched)
        if result is None:  # this production does not fit T: a leaf
            return self.leaf(sc, T, unbatched)
        if self.coin(0.05) and result[1] < ATOM:  # parentheses the meaning does not need
            result = (f"({result[0]})", ATOM, result[2])
        return result

    def _leaf(self, sc, T, depth, unbatched):
        return self.leaf(sc, T, unbatched)

    def _arange(self, sc, T, depth, unbatched):
        """`arange(t)`: the positions along a leg (a float tensor, never batched)."""
        self.ops.add("arange")
        return f"arange({T[0]})", ATOM, False

    def _unary(self, sc, T, depth, unbatched):
        f = self.pick(UNARY_FUNCS)
        self.ops.add("unary")
        x = self.expr(sc, T, depth, unbatched)
        if f == "log":  # keep the argument positive: values stay finite
            inner = f"abs({x[0]}) + 1"
            return self.call("log", [inner])[0], ATOM, x[2]
        if f == "sqrt":
            return self.call("sqrt", [f"abs({x[0]}) + 0.5"])[0], ATOM, x[2]
        parts = [x[0]]
        for i, k in enumerate(ops.OPS[f].keywords):  # its keywords, by the row's rules: by name or by position
            if k.default is not None and self.coin(0.5):
                break
            values = {"bound": ["-0.5", "0.5", "0.0", "-inf"], "finite": ["0.2", "-0.5", "1.5"]}[k.rule]
            value = self.pick(values + sorted(self.consts))
            parts.append(value if len(parts) == i + 1 and k.name in ops.OPS[f].args and self.coin(0.5) else f"{k.name}={value}")
        return self.call(f, parts)[0], ATOM, x[2]

    def _minmax(self, sc, T, depth, unbatched):
        """max(a, b) / min(a, b) entry by entry: a second operand on a subset of the legs, or a number."""
        f = self.pick(["max", "min"])
        self.ops.add(f)
        a = self.expr(sc, T, depth, unbatched)
        if self.coin(0.3):  # a float literal or a const (a whole-number literal would be refused as a leg)
            b = (self.pick(["0.25", "-0.5", "0.0"] + sorted(self.consts)), ATOM, False)
            first, second = (a, b) if self.coin(0.5) else (b, a)
        else:  # the result takes the legs of the operand with more legs, the left one on a tie: T's first
            b = self.expr(sc, self.subset(T) if len(set(T)) == len(T) else T, depth, unbatched)
            first, second = a, b
        return self.call(f, [first[0], second[0]])[0], ATOM, a[2] or b[2]

    def _neg(self, sc, T, depth, unbatched):
        self.ops.add("neg")
        x = self.expr(sc, T, depth, unbatched)
        return "-" + _wrap(x, UNARY), UNARY, x[2]

    def _detach(self, sc, T, depth, unbatched):
        self.ops.add("detach")
        x = self.expr(sc, T, depth, unbatched)
        if self.coin(0.5):
            return _wrap(x, ATOM) + ".detach()", ATOM, x[2]
        return f"detach({x[0]})", ATOM, x[2]

    def _dropout(self, sc, T, depth, unbatched):
        self.ops.add("dropout")
        x = self.expr(sc, T, depth, unbatched)
        p = self.pick(["", ", p=0.5", ", 0.2", ", p=0"])
        return f"dropout({x[0]}{p})", ATOM, x[2]

    def _clamp(self, sc, T, depth, unbatched):
        self.ops.add("clamp")
        x = self.expr(sc, T, depth, unbatched)
        dims = sorted(sc.size_dims)
        bounds = ["min=-0.5", "max=0.5", "min=-0.5, max=0.5", "-1, 1", "min=0", "max=inf", "min=-inf, max=1"]
        if dims:
            d = self.pick(dims)
            bounds.append(f"min=-{d}, max={d}")
        for c in self.const_in(0, 10, integer=False)[:1]:
            bounds.append(f"min=-{c}, max={c}")
        return f"clamp({x[0]}, {self.pick(bounds)})", ATOM, x[2]

    def subset(self, T: tuple, proper=False) -> tuple:
        """Some of T's legs, in any order."""
        n = self.draw(st.integers(0, max(0, len(T) - (1 if proper else 0))))
        return tuple(self.draw(st.permutations(list(T))))[:n]

    def _binop(self, sc, T, depth, unbatched):
        unique = len(set(T)) == len(T)
        op = self.pick(["+", "-", "*", "/", "**", "//", "+", "*"])
        self.ops.add("binop")
        left = self.expr(sc, T, depth, unbatched)
        # the other operand: a subset of T by name, T itself, or same-size legs by position
        if unique and self.coin(0.7):
            S = self.subset(T)
        else:
            S = tuple(self.pick(self.same_size(self.dims[l])) for l in T)  # by position (or by name)
        right = self.expr(sc, S, depth, unbatched)
        batched = left[2] or right[2]
        if op == "/":  # divide by something positive
            right = (f"(abs({right[0]}) + 1)", ATOM, right[2])
        elif op == "**":  # a positive base, a bounded exponent
            left = (f"(abs({left[0]}) + 1)", ATOM, left[2])
            right = (f"tanh({right[0]})", ATOM, right[2])
        elif op == "//":  # floor division has no gradient: divide detached values
            left = (_wrap(left, ATOM) + ".detach()", ATOM, left[2])
            right = (f"(abs({right[0]}) + 1).detach()", ATOM, right[2])
        return self.binary(op, left, right), BINPREC[op], batched

    def binary(self, op, a, b) -> str:
        p = BINPREC[op]
        if op == "**":
            return f"{_wrap(a, ATOM)} ** {_wrap(b, UNARY)}"
        return f"{_wrap(a, p)} {op} {_wrap(b, p + 1)}"

    def _scalar_binop(self, sc, T, depth, unbatched):
        self.ops.add("binop")
        x = self.expr(sc, T, depth, unbatched)
        form = self.pick(["x*s", "s*x", "x+s", "s-x", "x/s", "s/x", "x**k", "s**x", "x//s"])
        s = self.scalar(sc, depth)
        if form == "x*s":
            return self.binary("*", x, s), MUL, x[2]
        if form == "s*x":
            return self.binary("*", s, x), MUL, x[2]
        if form == "x+s":
            return self.binary("+", x, s), ADD, x[2]
        if form == "s-x":
            return self.binary("-", s, x), ADD, x[2]
        if form == "x/s":
            return self.binary("/", x, self.scalar(sc, depth, positive=True)), MUL, x[2]
        if form == "s/x":
            return self.binary("/", s, (f"(abs({x[0]}) + 1)", ATOM)), MUL, x[2]
        if form == "x**k":
            return self.binary("**", x, (self.pick(["2", "3", "1"]), ATOM)), POW, x[2]
        if form == "s**x":
            return self.binary("**", self.number(positive=True), (f"tanh({x[0]})", ATOM)), POW, x[2]
        return self.binary("//", (_wrap(x, ATOM) + ".detach()", ATOM), self.scalar(sc, depth, positive=True)), MUL, x[2]

    def leg_arg(self, T: tuple, i: int, keyword=True) -> str:
        """Leg i of T, by name when it is unique, else by position (dim=i or dim=i-n)."""
        if T.count(T[i]) == 1 and self.coin(0.7):
            return T[i]
        j = i - len(T) if self.coin(0.5) else i
        return f"dim={j}" if keyword else str(j)

    def _softmax(self, sc, T, depth, unbatched):
        f = self.pick(["softmax", "log_softmax"])
        self.ops.add(f)
        x = self.expr(sc, T, depth, unbatched)
        i = self.draw(st.integers(0, len(T) - 1))
        return self.call(f, [x[0], self.leg_arg(T, i)])[0], ATOM, x[2]

    def norm_param(self, sc, leg) -> str:
        found = [n for n, t in sc.tensors.items() if t.kind in ("param", "buffer") and t.legs == (leg,)]
        if found and self.coin(0.5):
            return self.pick(found)
        return self.declare(sc, (leg,), "param")

    def _norm(self, sc, T, depth, unbatched):
        f = self.pick(["layernorm", "rmsnorm"])
        self.ops.add(f)
        i = self.draw(st.integers(0, len(T) - 1))
        if sc.is_block and T[i] not in sc.size_dims and f == "layernorm":
            return None  # layernorm reads its leg's size, which a block learns only from its arguments
        x = self.expr(sc, T, depth, unbatched)
        parts = [x[0]]
        if i != len(T) - 1 or self.coin(0.5):
            parts.append(self.leg_arg(T, i))
        if self.coin(0.6):
            parts.append(f"weight={self.norm_param(sc, T[i])}")
        if f == "layernorm" and self.coin(0.4):
            parts.append(f"bias={self.norm_param(sc, T[i])}")
        if self.coin(0.3):
            parts.append(self.pick(["eps=1e-5", "eps=0.001", "eps=1e-6"] + [f"eps={c}" for c in self.const_in(1e-6, 10, integer=False)]))
        return self.call(f, parts)[0], ATOM, x[2]

    def _topk(self, sc, T, depth, unbatched):
        self.ops.add("topk")
        i = self.draw(st.integers(0, len(T) - 1))
        x = self.expr(sc, T, depth, unbatched)
        return self.call("topk", [x[0], self.leg_arg(T, i), self.k_arg(sc, T[i])])[0], ATOM, x[2]

    def k_arg(self, sc, leg) -> str:
        n = self.dims[leg]
        consts = self.const_in(1, n)
        if consts and self.coin(0.3):
            self.ops.add("const")
            return f"k={self.pick(consts)}"
        smaller = [d for d in sc.size_dims if self.dims[d] <= n]
        if smaller and self.coin(0.3):
            return f"k={self.pick(sorted(smaller))}"
        return f"k={self.draw(st.integers(1, n))}"

    def _rope(self, sc, T, depth, unbatched):
        even = [i for i, l in enumerate(T) if self.dims[l] % 2 == 0]
        if len(T) < 2 or not even:
            return None
        self.ops.add("rope")
        axis = self.pick(even)
        pos = self.pick([i for i in range(len(T)) if i != axis])
        x = self.expr(sc, T, depth, unbatched)
        parts = [x[0], self.leg_arg(T, pos, keyword=False), self.leg_arg(T, axis, keyword=False)]
        if self.coin(0.4):
            dims = sorted(sc.size_dims)
            parts.append(self.pick(["base=100", "base=10000", "base=10.5"] + [f"base={d}" for d in dims if self.dims[d] > 1]))
        return self.call("rope", parts)[0], ATOM, x[2]

    def _reduce(self, sc, T, depth, unbatched):
        f = self.pick(["sum", "mean", "max", "min"])
        self.ops.add("reduce")
        extra = self.pick(list(self.dims))
        i = self.draw(st.integers(0, len(T)))
        inner = T[:i] + (extra,) + T[i:]
        x = self.expr(sc, inner, depth, unbatched)
        return self.call(f, [x[0], self.leg_arg(inner, i)])[0], ATOM, x[2]

    # einops: rearrange, reduce, repeat -------------------------------------------------------------
    def _only_product(self, ab) -> str | None:
        """The product dim declared as exactly `a * b` when there is one only (a merge names it)."""
        found = [m for m, xy in self.prods.items() if xy == ab]
        return found[0] if len(found) == 1 else None

    def einops_pattern(self, T: tuple, kind: str):
        """(inner legs, pattern, drops_batch) for kind(x, pattern) whose result has legs T: merges on
        the right (product dims), splits on the left, `1`/`()` legs, `...` on both sides or (reduce)
        on the left only, new legs (repeat, alone or inside a merge), reduced legs (reduce)."""
        used = set(T)
        right = []  # ["names", [axes]] or ["dots"]
        for l in T:
            ab = self.prods.get(l)
            if ab and self._only_product(ab) == l and not (set(ab) & used) and self.coin(0.35):
                right.append(["names", list(ab)])
                used |= set(ab)
            else:
                right.append(["names", [l]])
        # '...' over a run of single legs of the right side (empty runs too)
        dots = []
        if self.coin(0.3):
            singles = [i for i, e in enumerate(right) if len(e[1]) == 1]
            i = self.pick(singles + [len(right)]) if singles else len(right)
            j = i
            while j < len(right) and len(right[j][1]) == 1 and self.coin(0.5):
                j += 1
            dots = [e[1][0] for e in right[i:j]]
            right[i:j] = [["dots"]]
        axes = [a for e in right if e[0] == "names" for a in e[1]]
        new = []
        if kind == "repeat":
            new = list(self.draw(st.permutations(axes)))[: self.draw(st.integers(1, min(2, len(axes))))] if axes else []
        left_axes = [a for a in axes if a not in new]
        drops = False
        left_dots = list(dots) if dots or any(e[0] == "dots" for e in right) else None
        if kind == "reduce":
            spare = [d for d in self.dims if d not in used and d not in dots]
            extra = list(self.draw(st.permutations(spare)))[: self.draw(st.integers(0, min(2, len(spare))))] if spare else []
            left_axes += extra
            used |= set(extra)
            if left_dots is None and self.coin(0.25):  # '...' on the left only: reduced, batch legs too
                spare = [d for d in self.dims if d not in used]
                left_dots = list(self.draw(st.permutations(spare)))[: self.draw(st.integers(0, min(2, len(spare))))] if spare else []
                drops = True
        order = list(self.draw(st.permutations(left_axes)))
        left = []  # ["names", [axes], leg] | ["unit", text, leg] | ["dots", legs]
        i = 0
        while i < len(order):
            pair = tuple(order[i:i + 2])
            splits = [m for m, xy in self.prods.items() if xy == pair] if len(pair) == 2 else []
            if splits and self.coin(0.5):
                left.append(["names", list(pair), self.pick(splits)])
                i += 2
            else:
                left.append(["names", [order[i]], order[i]])
                i += 1
        ones = [d for d, n in self.dims.items() if n == 1]
        if ones and self.coin(0.25):
            left.insert(self.draw(st.integers(0, len(left))), ["unit", self.pick(["1", "()", "(1)"]), self.pick(ones)])
        if left_dots is not None:
            left.insert(self.draw(st.integers(0, len(left))), ["dots", left_dots])
        if not left and not right:
            return None
        inner = []
        for e in left:
            inner += e[1] if e[0] == "dots" else [e[2]]

        def group(names):
            if len(names) == 1 and not self.coin(0.1):
                return names[0]
            return "(" + " ".join(names) + ")"

        lhs = " ".join("..." if e[0] == "dots" else e[1] if e[0] == "unit" else group(e[1]) for e in left)
        rhs = " ".join("..." if e[0] == "dots" else group(e[1]) for e in right)
        return tuple(inner), f"{lhs} -> {rhs}".strip(), drops

    def _einops(self, sc, T, depth, unbatched, kind):
        built = self.einops_pattern(T, kind)
        if built is None:
            return None
        inner, pattern, drops = built
        self.ops.add(kind)
        x = self.expr(sc, inner, depth, unbatched)
        parts = [x[0], repr(pattern)]
        if kind == "reduce":
            parts.append(repr(self.pick(REDUCTIONS)))
        return self.call(kind, parts)[0], ATOM, x[2] and not drops

    def _rearrange(self, sc, T, depth, unbatched):
        return self._einops(sc, T, depth, unbatched, "rearrange")

    def _einreduce(self, sc, T, depth, unbatched):
        return self._einops(sc, T, depth, unbatched, "reduce")

    def _einrepeat(self, sc, T, depth, unbatched):
        return self._einops(sc, T, depth, unbatched, "repeat")

    # select and slice ------------------------------------------------------------------------------
    def index_arg(self, sc, lo, hi) -> str:
        """A whole number in [lo, hi]: a literal, a const or a dim's size."""
        consts = self.const_in(lo, hi)
        dims = [d for d in sorted(sc.size_dims) if lo <= self.dims[d] <= hi]
        choice = self.pick(["num", "num", "num", "const", "dim"])
        if choice == "const" and consts:
            self.ops.add("const")
            return self.pick(consts)
        if choice == "dim" and dims:
            return self.pick(dims)
        return str(self.draw(st.integers(lo, hi)))

    def _select(self, sc, T, depth, unbatched):
        self.ops.add("select")
        l = self.pick(list(self.dims))
        n = self.dims[l]
        i = self.draw(st.integers(0, len(T)))
        inner = T[:i] + (l,) + T[i:]
        x = self.expr(sc, inner, depth, unbatched)
        index = self.index_arg(sc, 0, n - 1) if self.coin(0.7) else str(self.draw(st.integers(-n, -1)))
        return self.call("select", [x[0], self.leg_arg(inner, i, keyword=False), index])[0], ATOM, x[2]

    def _slice(self, sc, T, depth, unbatched):
        j = self.draw(st.integers(0, len(T) - 1))
        k = T[j]
        m = self.dims[k]
        sources = [d for d, n in self.dims.items() if n >= m]
        l = self.pick(sources)
        n = self.dims[l]
        self.ops.add("slice")
        inner = T[:j] + (l,) + T[j + 1:]
        x = self.expr(sc, inner, depth, unbatched)
        start = self.index_arg(sc, 0, n - m) if self.coin(0.7) else str(self.draw(st.integers(0, n - m)) - n)
        leg = self.leg_arg(inner, j, keyword=False)
        form = self.pick(["dim", "into", "positional"])
        if form == "dim":
            parts = [x[0], leg, start, k]
        elif form == "into":
            parts = [x[0], leg, start, str(m), f"into={k}"]
        else:
            parts = [x[0], leg, start, str(m), k]
        return self.call("slice", parts)[0], ATOM, x[2]

    def _gather(self, sc, T, depth, unbatched):
        if unbatched:
            return None
        self.ops.add("gather")
        k = self.draw(st.integers(0, len(T)))
        rest = T[k:]
        vocab = self.pick([d for d in self.dims if d not in rest] or list(self.dims))
        table = self.expr(sc, (vocab,) + rest, depth, unbatched=True)
        found = [n for n, t in sc.tensors.items() if t.dtype == "int" and t.legs == T[:k] and self.inputs[n][2] <= self.dims[vocab]]
        ids = self.pick(found) if found and self.coin(0.5) else self.declare(sc, T[:k], "input", "int", self.dims[vocab])
        return self.call("gather", [table[0], ids])[0], ATOM, True

    def _concat(self, sc, T, depth, unbatched):
        at = [i for i, l in enumerate(T) if l in self.sums]
        i = self.pick(at)
        a, b = self.sums[T[i]]
        self.ops.add("concat")
        parts, batched = [], []
        for p in (a, b):
            legs = T[:i] + (p,) + T[i + 1:]
            x = self.expr(sc, legs, depth, unbatched)
            parts.append(x[0])
            batched.append(x[2])
        first = T[:i] + (a,) + T[i + 1:]
        return self.call("concat", [f"[{', '.join(parts)}]", self.leg_arg(first, i, keyword=False), T[i]])[0], ATOM, any(batched)

    def _flatten(self, sc, T, depth, unbatched):
        at = [i for i, l in enumerate(T) if l in self.prods]
        i = self.pick(at)
        a, b = self.prods[T[i]]
        self.ops.add("flatten")
        inner = T[:i] + (a, b) + T[i + 1:]
        x = self.expr(sc, inner, depth, unbatched)
        if inner.count(a) == 1 and inner.count(b) == 1 and self.coin(0.7):
            legs = f"[{a}, {b}]"
        else:
            legs = f"[{i}, {i + 1}]" if self.coin(0.5) else f"[{i - len(inner)}, {i + 1 - len(inner)}]"
        return self.call("flatten", [x[0], legs, T[i]])[0], ATOM, x[2]

    def _unflatten(self, sc, T, depth, unbatched):
        at = [i for i in range(len(T) - 1) if T[i:i + 2] in list(self.prods.values())]
        i = self.pick(at)
        whole = self.pick([m for m, ab in self.prods.items() if ab == T[i:i + 2]])
        self.ops.add("unflatten")
        inner = T[:i] + (whole,) + T[i + 2:]
        x = self.expr(sc, inner, depth, unbatched)
        return self.call("unflatten", [x[0], self.leg_arg(inner, i, keyword=False), f"[{T[i]}, {T[i + 1]}]"])[0], ATOM, x[2]

    def _block(self, sc, T, depth, unbatched):
        cands = [b for b in sc.blocks if b.outs == [T]]
        if not cands:
            return None
        b = self.pick(cands)
        self.ops.add("block")
        args, batched = [], False
        for _, legs in b.formals:
            renamed = tuple(l if self.coin(0.8) else self.pick(self.same_size(self.dims[l])) for l in legs)
            x = self.expr(sc, renamed, depth, unbatched)
            args.append(x[0])
            batched = batched or x[2]
        return self.call(b.name, args)[0], ATOM, batched

    # where ---------------------------------------------------------------------------------------
    def _where(self, sc, T, depth, unbatched):
        self.ops.add("where")
        unique = len(set(T)) == len(T)
        # legs of (cond, a, b): T, a subset of T, or (a, b only) a plain number
        full = self.draw(st.integers(0, 2))
        if unique and len(T) >= 2 and all(l in sc.size_dims for l in T) and self.coin(0.3):
            full = self.pick([1, 2])  # a mask on two of T's legs
            # two of T's legs (T itself when it has two: the first full-size operand sets the order)
            two = T if len(T) == 2 else tuple(self.draw(st.permutations(list(T))))[:2]
            cond = self.condition(sc, two, depth, unbatched, mask=True)
        else:
            cond = None
        legs = []
        for j in range(3):
            if j == full or not unique:
                legs.append(T)
            elif j > 0 and self.coin(0.3):
                legs.append(None)
            else:
                legs.append(self.subset(T, proper=True))
        first_full = next(j for j in range(3) if legs[j] is not None and len(legs[j]) == len(T))
        if unique:
            for j in range(3):
                if j > first_full and legs[j] is not None and len(legs[j]) == len(T) and self.coin(0.5):
                    legs[j] = tuple(self.draw(st.permutations(list(T))))
        if cond is None:
            cond = self.condition(sc, legs[0], depth, unbatched)
        vals = []
        for j in (1, 2):
            if legs[j] is None:
                vals.append((self.pick(["0", "1.5", "-1", "-inf"]) if j == 2 else self.pick(["0", "2.0", "-1"]), ATOM, False))
            else:
                vals.append(self.expr(sc, legs[j], depth, unbatched))
        batched = cond[2] or any(v[2] for v in vals)
        return self.call("where", [cond[0], vals[0][0], vals[1][0]])[0], ATOM, batched

    def condition(self, sc, T, depth, unbatched, mask=False) -> tuple:
        """A bool expression with legs T (mask=True: a causal mask, T being two dims)."""
        unique = len(set(T)) == len(T)
        options = ["compare", "compare"]
        if len(T) == 2 and unique and all(l in sc.size_dims for l in T):
            options = ["causal"] if mask else options + ["causal", "causal"]
        if T and unique:
            options.append("topk_mask")
        if not sc.is_block and not unbatched:
            options.append("input")
        choice = self.pick(options)
        if choice == "causal":
            self.ops.add("mask")
            if self.coin(0.5):
                return f"causal({T[0]}, {T[1]})", ATOM, False
            return f"block_causal({T[0]}, {T[1]}, block={self.pick(['1', '2', T[0]])})", ATOM, False
        if choice == "topk_mask":
            self.ops.add("topk_mask")
            i = self.draw(st.integers(0, len(T) - 1))
            x = self.expr(sc, T, depth, unbatched)
            return self.call("topk_mask", [x[0], self.leg_arg(T, i), self.k_arg(sc, T[i])])[0], ATOM, x[2]
        if choice == "input":
            found = [n for n, t in sc.tensors.items() if t.dtype == "bool" and t.legs == T]
            name = self.pick(found) if found and self.coin(0.5) else self.declare(sc, T, "input", "bool")
            return name, ATOM, True
        self.ops.add("compare")
        op = self.pick(COMPARE)
        left = self.expr(sc, T, depth, unbatched)
        if self.coin(0.5) and unique:
            right = self.expr(sc, self.subset(T), depth, unbatched)
        else:
            right = self.scalar(sc, depth) + (False,)
        return f"{_wrap(left, ADD)} {op} {_wrap(right, ADD)}", CMP, left[2] or right[2]

    # einsum --------------------------------------------------------------------------------------
    def _einsum(self, sc, T, depth, unbatched):
        if len(set(T)) != len(T):
            return None
        self.ops.add("einsum")
        n_ops = self.pick([1, 2, 2, 2, 3, 3, 4])
        size = dict((l, self.dims[l]) for l in T)
        contracted = []
        for _ in range(self.draw(st.integers(0, 2))):
            if self.coin(0.5):
                pool = [d for d in self.dims if d not in size]
                if pool:
                    d = self.pick(pool)
                    size[d] = self.dims[d]
                    contracted.append(d)
            else:
                pool = [f for f in FRESH_LABELS if f not in size]
                f = self.pick(pool)
                size[f] = self.dims[self.pick(list(self.dims))]
                contracted.append(f)
        labels = list(T) + contracted
        terms = []
        for _ in range(n_ops):
            k = self.draw(st.integers(0, min(3, len(labels))))
            terms.append(list(self.draw(st.permutations(labels)))[:k])
        for l in labels:  # every label in some term
            if not any(l in t for t in terms):
                terms[self.draw(st.integers(0, n_ops - 1))].append(l)
        if self.coin(0.15):  # a diagonal: one label twice in a term
            t = self.pick([t for t in terms if t] or [terms[0]])
            if t:
                t.insert(self.draw(st.integers(0, len(t))), self.pick(t))
        term_legs = []
        for t in terms:
            legs = []
            for l in t:
                if l in self.dims and self.coin(0.8):
                    legs.append(l)
                else:
                    legs.append(self.pick(self.same_size(size[l])))
            term_legs.append(legs)
        ones = [d for d, n in self.dims.items() if n == 1]
        if ones and self.coin(0.2):  # size-1 broadcasting: one use of a label gets a size-1 leg
            uses = [(i, j) for i, t in enumerate(terms) for j, l in enumerate(t) if size[l] > 1 and t.count(l) == 1
                    and sum(l in u for u in terms) > 1]
            if uses:
                i, j = self.pick(uses)
                term_legs[i][j] = self.pick(ones)
        # '...': none (batch legs come for free), kept everywhere, summed away, or covering legs
        mode = self.pick(["none", "none", "none", "keep", "sum", "cover"])
        dots = [None] * n_ops  # where '...' stands in each term (None: not written)
        out = list(T)
        out_dots = None
        if mode == "keep":
            dots = [self.draw(st.integers(0, len(t))) for t in terms]
            out_dots = self.draw(st.integers(0, len(out)))
        elif mode == "sum":
            for i in self.draw(st.lists(st.integers(0, n_ops - 1), min_size=1, unique=True)):
                dots[i] = self.draw(st.integers(0, len(terms[i])))
        elif mode == "cover" and T:
            a = self.draw(st.integers(0, len(T) - 1))
            b = self.draw(st.integers(a + 1, len(T)))
            covered = T[a:b]  # these legs of one operand stand under its '...'
            for t, legs in zip(terms, term_legs):
                keep = [k for k, l in enumerate(t) if l not in covered]
                t[:], legs[:] = [t[k] for k in keep], [legs[k] for k in keep]
            i = self.draw(st.integers(0, n_ops - 1))
            cut = self.draw(st.integers(0, len(terms[i])))
            dots[i] = cut
            term_legs[i][cut:cut] = list(covered)
            out = list(T[:a]) + list(T[b:])
            out_dots = a
        else:
            mode = "none"
        operands, batched = [], []
        for legs in term_legs:
            x = self.expr(sc, tuple(legs), depth, unbatched)
            operands.append(x[0])
            batched.append(x[2])
        if mode == "sum":
            result_batched = any(batched) and not any(b and d is not None for b, d in zip(batched, dots))
        else:
            result_batched = any(batched)
        spaced = any(len(l) > 1 for l in labels)
        if spaced:  # a spaced spec whose letters fit the operands reads as letters, as torch reads it
            letters = [sum(len(l) for l in t) for t in terms]
            if all(n == len(legs) if d is None else n <= len(legs) for n, legs, d in zip(letters, term_legs, dots)):
                return None
        join = " ".join if spaced else "".join

        def term(labels_, at):
            if at is None:
                return join(labels_)
            return join(list(labels_[:at]) + ["..."] + list(labels_[at:]))

        lhs = (", " if spaced else ",").join(term(t, d) for t, d in zip(terms, dots))
        arrow = " -> " if spaced else "->"
        spec = f"{lhs}{arrow}{term(out, out_dots)}"
        once = sorted(l for l in labels if sum(t.count(l) for t in terms) == 1)
        if not spaced and mode == "none" and tuple(once) == T and self.coin(0.3):
            spec = lhs  # implicit output: the labels used once, sorted
        if mode != "none":
            self.ops.add("einsum..." + mode)
        return self.call("einsum", [repr(spec)] + operands)[0], ATOM, result_batched

    # statements ----------------------------------------------------------------------------------
    def statement(self, sc: _Scope, depth: int):
        kinds = ["assign", "assign", "assign", "reassign", "comment", "stated"]
        if self.sums:
            kinds.append("split")
        if any(len(b.outs) >= 1 for b in sc.blocks):
            kinds += ["call"]
        if not sc.is_block:
            kinds += ["attention", "label"]
        kind = self.pick(kinds)
        getattr(self, "_stmt_" + kind)(sc, depth)

    def target(self) -> tuple:
        """The legs of a statement's value: any dims, or shapes that invite the shape operations."""
        if self.coin(0.1):
            return self.legs(2, 2, unique=False)
        if self.coin(0.3) and (self.prods or self.sums):
            pick = self.pick(sorted(self.prods) + sorted(self.sums))
            extra = [d for d in self.legs(0, 1) if d != pick]
            if pick in self.prods and self.coin(0.5):
                a, b = self.prods[pick]
                core = (a, b) if a != b else (pick,)
            else:
                core = (pick,)
            legs = tuple(extra) + core if self.coin(0.5) else core + tuple(extra)
            return legs if len(set(legs)) == len(legs) else core
        return self.legs(0, 3)

    def assign(self, sc, name, T, value, batched, modifiers=""):
        if self.decorate and self.coin(0.05):  # a backslash continuation
            value = "\\\n    " + value
        sc.lines.append(f"{name} = {value}{modifiers}{self.note()}")
        sc.tensors[name] = _Tensor(T, batched)

    def _stmt_assign(self, sc, depth):
        T = self.target()
        x = self.expr(sc, T, depth)
        self.assign(sc, self.fresh("h"), T, x[0], x[2])

    def _stmt_stated(self, sc, depth):
        """`h[a, b, c] = tanh(x + y)`: stated legs, the operands on legs no one of them holds all
        of (aligned by name: an outer sum, product or power), each a leaf or a function of one."""
        T = self.legs(2, 3)
        if len(T) < 2:
            return self._stmt_assign(sc, depth)
        self.ops.add("stated")
        first = self.draw(st.integers(1, len(T) - 1))  # each side misses a leg of T; some legs on both
        A = set(T[:first]) | {l for l in T[first:] if self.coin(0.3)}
        B = set(T[first:]) | {l for l in T[:first] if self.coin(0.3)}
        if A >= set(T) or B >= set(T):
            A, B = set(T[:first]), set(T[first:])
        sides = []
        for legs in (A, B):
            order = tuple(self.draw(st.permutations(sorted(legs))))
            x = self.expr(sc, order, 0)  # a leaf: a by-position pair inside would align by name here
            if self.coin(0.3):
                x = (f"tanh({x[0]})", ATOM, x[2])
            sides.append(x)
        op = self.pick(["+", "-", "*", "**"])
        a, b = sides
        if op == "**":  # a positive base, a bounded exponent
            a, b = (f"(abs({a[0]}) + 1)", ATOM, a[2]), (f"tanh({b[0]})", ATOM, b[2])
        value = self.binary(op, a, b)
        if self.coin(0.3):
            value = f"sigmoid({value})"
        name = self.fresh("h")
        sc.lines.append(f"{name}[{', '.join(T)}] = {value}{self.note()}")
        sc.tensors[name] = _Tensor(T, a[2] or b[2])

    def _stmt_reassign(self, sc, depth):
        own = [n for n, t in sc.tensors.items() if t.kind in ("local", "input", "formal") and t.dtype == "float"]
        if not own:
            return self._stmt_assign(sc, depth)
        name = self.pick(own)
        T = sc.tensors[name].legs
        x = self.expr(sc, T, depth)
        sc.lines.append(f"{name} = {x[0]}{self.note()}")
        sc.tensors[name] = _Tensor(T, x[2], "float", "local")  # SSA: a new version of the name

    def _stmt_comment(self, sc, depth):
        if self.coin(0.5):
            sc.lines.append(f"# {next(self.comment_no)}) Step caption. Yields: something.")
        else:
            sc.lines.append(f"# {self.comment()}")

    def _stmt_split(self, sc, depth):
        X = self.pick(sorted(self.sums))
        a, b = self.sums[X]
        self.ops.add("split")
        T = list(self.legs(0, 2))
        i = self.draw(st.integers(0, len(T)))
        inner = tuple(T[:i] + [X] + T[i:])
        if inner.count(X) > 1:
            return self._stmt_assign(sc, depth)
        x = self.expr(sc, inner, depth)
        u, v = self.fresh("h"), self.fresh("h")
        sc.lines.append(f"{u}, {v} = split({x[0]}, {self.leg_arg(inner, i, keyword=False)}, [{a}, {b}]){self.note()}")
        sc.tensors[u] = _Tensor(inner[:i] + (a,) + inner[i + 1:], x[2])
        sc.tensors[v] = _Tensor(inner[:i] + (b,) + inner[i + 1:], x[2])

    def _stmt_call(self, sc, depth):
        b = self.pick(sc.blocks)
        self.ops.add("block")
        args, batched = [], sc.is_block
        callable_blocks, sc.blocks = sc.blocks, []  # 'as' and 'repeat' name the statement's one call
        for _, legs in b.formals:
            x = self.expr(sc, legs, depth)
            args.append(x[0])
            batched = batched or x[2]
        sc.blocks = callable_blocks
        call = f"{b.name}({', '.join(args)})"
        names = [self.fresh("h") for _ in b.outs]
        modifiers = ""
        # repeatable: one result with the first argument's legs (the others reach every copy)
        repeatable = len(b.outs) == 1 and b.outs[0] == b.formals[0][1]

        def instance(base):  # a name, or a dotted path (a submodule's state-dict path: net.0, net.sub)
            if self.coin(0.3):
                return f"{self.fresh(base)}.{self.pick(['0', '1', 'sub'])}" + (f".{self.pick(['0', 'inner'])}" if self.coin(0.3) else "")
            return self.fresh(base)

        if repeatable and self.coin(0.4):
            shared = " shared" if self.coin(0.3) else ""  # one instance applied N times
            modifiers = f" repeat {self.pick(['1', '2'] + [d for d in self.dims if self.dims[d] <= 2])}{shared} as {instance('layers')}"
        elif self.coin(0.5):
            modifiers = f" as {instance('inst')}"
        sc.lines.append(f"{', '.join(names)} = {call}{modifiers}{self.note()}")
        for n, legs in zip(names, b.outs):
            sc.tensors[n] = _Tensor(legs, batched)

    def _stmt_label(self, sc, depth):
        free = [n for n in sc.tensors if n not in sc.labelled]
        if free:
            n = self.pick(free)
            sc.labelled.add(n)
            sc.lines.append(f'label {n} "the {n} tensor"')

    def _stmt_attention(self, sc, depth):
        """Scores, an optional mask, softmax and a convex combination: the pattern the compiler
        fuses into one scaled_dot_product_attention call (heads optional)."""
        self.ops.add("attention")
        names = [d for d in self.dims if len(d) == 1]
        if len(names) < 3:
            return self._stmt_assign(sc, depth)
        t, p, d = self.draw(st.permutations(names))[:3]
        e = self.pick([d] + [n for n in names if n not in (t, p)])
        heads = (self.pick([n for n in names if n not in (t, p, d, e)]),) if self.coin(0.3) and len(names) > 4 else ()
        H = "".join(heads)
        q = self.expr(sc, heads + (t, d), max(depth - 1, 0))
        k = self.expr(sc, heads + (p, d), max(depth - 1, 0))
        v = self.expr(sc, heads + (p, e), max(depth - 1, 0))
        s, a, y = self.fresh("s"), self.fresh("a"), self.fresh("y")
        scale = self.pick(["", f" / sqrt({d})", " * 0.5"])
        sc.lines.append(f"{s} = einsum('{H}{t}{d},{H}{p}{d}->{H}{t}{p}', {q[0]}, {k[0]}){scale}")
        mask = self.pick(["none", "causal", "bool", "additive"])
        if mask == "causal":
            sc.lines.append(f"{s} = where(causal({t}, {p}), {s}, -inf)")
        elif mask == "bool":  # a random mask may hide a whole row: a large negative, not -inf
            m = self.declare(sc, (t, p), "input", "bool")
            sc.lines.append(f"{s} = where({m}, {s}, -1e4)")
        elif mask == "additive":
            sc.lines.append(f"{s} = {s} + {self.leaf(sc, (t, p), False)[0]}")
        sc.tensors[s] = _Tensor(heads + (t, p), True)
        if self.coin(0.5):
            sc.lines.append(f"{a} = softmax({s}, {p})")
            sc.lines.append(f"{y} = einsum('{H}{t}{p},{H}{p}{e}->{H}{t}{e}', {a}, {v[0]})")
            sc.tensors[a] = _Tensor(heads + (t, p), True)
        else:
            sc.lines.append(f"{y} = einsum('{H}{t}{p},{H}{p}{e}->{H}{t}{e}', softmax({s}, {p}), {v[0]})")
        sc.tensors[y] = _Tensor(heads + (t, e), True)

    # blocks and the program -------------------------------------------------------------------
    def block(self, depth: int) -> list:
        name = self.fresh("blk")
        n_formals = self.pick([1, 1, 2])
        formals = [(self.fresh("x"), self.legs(1, 3)) for _ in range(n_formals)]
        sc = _Scope(True, {l for _, legs in formals for l in legs}, blocks=list(self.blocks))
        for f, legs in formals:
            sc.tensors[f] = _Tensor(legs, True, "float", "formal")
        for _ in range(self.draw(st.integers(0, 2))):
            self.statement(sc, depth)
        if self.coin(0.6):
            outs = [formals[0][1]]  # repeatable: the result has the first argument's legs
        else:
            outs = [self.legs(0, 3) for _ in range(self.pick([1, 1, 2]))]
        values = [self.expr(sc, legs, depth)[0] for legs in outs]
        sep = f",  # {self.comment()}\n    " if self.decorate and self.coin(0.3) else ", "
        shown = sep.join(f"{f}[{', '.join(legs)}]" for f, legs in formals)
        close = "}" + (f"  # {self.comment()}" if self.decorate and self.coin(0.5) else "")
        opening = f"block {name}({shown}) {{" + (f"  # {self.comment()}" if self.decorate and self.coin(0.3) else "")
        body = ["  " + line for line in sc.decls + sc.lines] + [f"  return {', '.join(values)}{self.note()}"]
        self.blocks.append(_Block(name, formals, outs))
        return [opening] + body + [close]

    def program(self) -> Program:
        dims = self.draw_dims()
        depth = self.draw(st.integers(1, 3))
        head = list(dims)
        blocks = []
        for _ in range(self.pick([0, 0, 1, 1, 2])):
            blocks.append(self.block(max(depth - 1, 1)))
        sc = _Scope(False, set(self.dims), blocks=list(self.blocks))
        for _ in range(self.draw(st.integers(1, 5))):
            self.statement(sc, depth)
        if not any(t.kind == "input" for t in sc.tensors.values()):  # masks take their device from an input
            self.declare(sc, self.legs(0, 2), "input")
        floats = [n for n, t in sc.tensors.items() if t.dtype == "float" and t.kind not in ("param", "buffer")]
        if not floats:
            self._stmt_assign(sc, depth)
            floats = [n for n, t in sc.tensors.items() if t.dtype == "float" and t.kind not in ("param", "buffer")]
        recent = floats[-3:]
        outs = self.draw(st.lists(st.sampled_from(recent), min_size=1, max_size=2, unique=True))
        lines = head[:] + self.const_lines
        late = set(re.findall(r"(\w+) =", dims[-1])) if dims else set()
        late_dim = self.coin(0.2) and len(dims) > 1 and not blocks and not (late & self.const_dims)
        if late_dim:
            lines.pop(len(dims) - 1)
        if self.decorate and self.coin(0.3):
            lines.insert(0, "# index legend: " + ", ".join(f"{d} leg {d}" for d in self.dims))
        for b in blocks:
            lines.append("")
            lines += b
        lines.append("")
        lines += sc.decls
        lines += sc.lines
        lines.append(f"output {', '.join(outs)}{self.note()}")
        if late_dim:
            lines.append(dims[-1])  # a dim declared at the end: dims are collected first
        if self.decorate:
            lines = self.sprinkle(lines)
        return Program("\n".join(lines) + "\n", dict(self.dims), dict(self.inputs), frozenset(self.ops))

    def sprinkle(self, lines: list) -> list:
        """Comment lines and blank lines between statements (not inside multi-line calls)."""
        out = []
        for line in lines:  # one item per statement (a multi-line call is one item)
            if self.coin(0.15):
                out.append(("  " if line.startswith("  ") else "") + f"# {self.comment()}")
            out.append(line)
        return out


@st.composite
def programs(draw, decorate: bool = False, consts: bool = False, hostile: bool = False) -> Program:
    """A whole random `.pen` program that type-checks by construction (consts=True: it declares
    at least one const; hostile=True: its tensors, blocks and instances are often named with
    the names of HOSTILE_NAMES that the checker accepts)."""
    return _Gen(draw, decorate, consts, hostile).program()


# ---- names that Python, torch and the generated module use ---------------------------------------

GENERATED_NAMES = [  # what generated source defines or reads, and its locals without their '_'
    "self", "torch", "collections", "ShapeError", "Model", "Outputs", "extra", "unexpected", "sizes", "device",
    "dtype", "split", "generator", "recurse", "module", "sub", "super", "abs", "namedtuple", "Diagram",
    "reset_parameters", "extra_repr", "Container", "EQUATIONS", "INPUTS", "check_inputs", "chain", "remember",
    "CONSTANTS", "inf", "nan", "math", "blocks", "fixed", "method", "x", "values", "spec", "kind", "free", "batch",
]


def hostile_names() -> list:
    """Python's keywords and builtins, the run-time helpers' names, torch's attribute names and
    the generated names, those valid as `.pen` identifiers that the checker accepts as input,
    param, local, block and instance names (the others are refused: tests/language/test_names.py)."""
    if not _HOSTILE:
        _HOSTILE.extend(n for n in candidate_names() if _accepted(n))
    return _HOSTILE


_HOSTILE: list = []


def candidate_names() -> list:
    import builtins
    import keyword

    import torch

    from penrose import runtime

    names = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | set(dir(runtime)) | set(GENERATED_NAMES)
    torch_names = sorted(n for n in set(dir(torch)) | set(dir(torch.Tensor)) if not n.startswith("_"))
    names |= set(torch_names[::12]) | set(dir(torch.nn.Module)) | {n.lstrip("_") for n in dir(runtime)}
    return sorted(n for n in names if re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", n))


def _accepted(name: str) -> bool:
    import warnings

    import penrose
    from penrose.errors import PenroseError

    if name in BASE_DIMS + WORD_DIMS + DERIVED_DIMS + FRESH_LABELS + CONST_NAMES:
        return False
    programs = [
        f"dim e = 2\ninput {name}[e]\n{name}2 = {name} * 2\noutput {name}2",
        f"dim e = 2\ninput x[e]\n{name} = x * 2\noutput {name}",
        f"dim e = 2\ninput x[e]\nparam {name}[e]\ny = x * {name}\noutput y",
        f"dim e = 2\nblock {name}(a[e]) {{\n  return a\n}}\ninput x[e]\ny = {name}(x) as {name}2\noutput y",
        f"dim e = 2\nblock f(a[e]) {{\n  return a\n}}\ninput x[e]\ny = f(x) as {name}\noutput y",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for text in programs:
                penrose.load(text)
        except PenroseError:
            return False
    return True


DEEP_WRAPPERS = [
    "tanh({})", "sigmoid({})", "-({})", "({} + x)", "({} * 0.5)", "clamp({}, min=-1)", "einsum('ab->ab', {})",
    "einsum('ax,xb->ab', {}, W)", "softmax({}, b)", "layernorm({}, b)", "where(x > 0, {}, x)", "tanh({}) ** 2",
    "2 / (abs({}) + 1)", "({}) - sqrt(b)", "relu({})", "rmsnorm({}, dim=-1)",
]
# every term [a, c] (sizes 2, 3) as x is: a bare W [b, c] (3, 3) made a sum that cannot check, which the
# derandomized examples of a whole-file run happened to miss and the test run alone drew
DEEP_TERMS = ["x", "tanh(x)", "x * 2", "einsum('bc,ab->ac', W, x)", "sqrt(b)", "einsum('ab,bc->ac', x, W)", "-x", "x / 3"]


@st.composite
def deep_programs(draw) -> str:
    """One statement nested hundreds of levels deep, or a flat sum of thousands of terms."""
    head = "dim a = 2, b = 3, c = 3\ninput x[a, b]\nparam W[b, c] ~ normal(std=0.3)\n"
    if draw(st.booleans()):
        n = draw(st.integers(200, 1000))
        kinds = draw(st.lists(st.sampled_from(DEEP_WRAPPERS), min_size=n, max_size=n))
        expr = "x"
        for k in kinds:
            expr = k.format(expr)
    else:
        n = draw(st.integers(500, 2500))
        first = draw(st.lists(st.sampled_from(DEEP_TERMS), min_size=8, max_size=8))
        terms = [first[i % 8] for i in range(n)]
        ops = draw(st.lists(st.sampled_from([" + ", " - "]), min_size=7, max_size=7))
        expr = terms[0] + "".join(ops[i % 7] + t for i, t in enumerate(terms[1:]))
    return head + f"y = {expr}\noutput y\n"
