"""Each statement of a checked diagram explained: its index equation and its geometric readings.

The glue between the checked IR and the two pure helpers: `equations` (sympy → LaTeX) and
`readings` (contraction patterns → prose). A statement's equation is built from its value tree
with the einsum letters as indices (the paper writes q_te = Σ_d Z_td W_q,de); each contraction
in it is read geometrically, and each non-linear step gets a one-line reading of its own.
Each operation's equation is its rule in `equations.EQUATION`, its reading its rule in
`READING` (both keyed by the names of `penrose.ops.OPS`). Long and deep statements (a
10,000-term sum, 1,000 nested calls) are explained flat: one reading for the whole sum, one for
a step repeated in a row; past the room `penrose.stack.deep` gives, a positioned PenroseError.

    >>> from penrose.checker import check
    >>> from penrose.parser import parse
    >>> c = check(parse("dim d = 3, e = 2\\ninput Z[t, d]\\nparam W[d, e]\\ndim t = 4\\nq = einsum('td,de->te', Z, W)\\noutput q"))
    >>> statement_latex(c, statements(c)[0])
    'q_{te} = \\\\sum_{d} Z_{td} \\\\, W_{de}'
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from penrose.attrs import Axis, BlockCall, Clamp, Dropout, Einop, Einsum, Flatten, Mask, Num, Ref, Rope, Select, Slice, Split, TopK, Unflatten
from penrose import ir
from penrose.checker import Checked, CStmt, V
from penrose.ops import ELEMENTWISE, OPS
from penrose.rendering import equations as eq
from penrose.rendering.figure import _fmt, _scalar_text, subscript
from penrose.rendering.readings import Contraction, Operand, classify, read_normalisation
from penrose.stack import deep, too_deep
from penrose.views import legend, producers, refs, statements

__all__ = ["READING", "Reading", "statement_equation", "statement_latex", "statement_readings", "statements"]


@dataclass(frozen=True)
class Reading:
    """A reading of one step of a statement: a title and a sentence (kind from readings.KINDS
    for contractions; 'activation', 'softmax', 'residual' ... for the other operations)."""

    kind: str
    title: str
    text: str


# ---- equations ---------------------------------------------------------------------------------


@deep
def statement_equation(c: Checked, s: CStmt) -> sympy.Eq:
    """The equation of one computing statement: target entries = the value's expression
    (a block's `return` is written as the entries of `out`); each operation by its rule in
    `equations.EQUATION`. A merged leg of an einops result is indexed by its group
    (y_{t,(h d)} = x_{htd}); a statement that is one select or slice also shows the
    contraction it is (y_{e} = x_{0,e} = Σ_t x_{te} δ_{t,0})."""
    st = s.stmt
    v = s.value
    assert v is not None and isinstance(st, (ir.Assign, ir.Return)), "a computing statement: an assignment or a return"
    try:
        if isinstance(st, ir.Return):
            vals = list(v.args)
            rhs = [eq.value_entry(v, eq.entry_names(v)) for v in vals]
            lhs = [eq.tensor_entry("out" if len(vals) == 1 else f"out{i}", eq.entry_names(v)) for i, v in enumerate(vals)]
            if len(vals) == 1:
                return sympy.Eq(lhs[0], rhs[0], evaluate=False)
            return sympy.Eq(sympy.Tuple(*lhs), sympy.Tuple(*rhs), evaluate=False)
        types = s.types
        if len(st.targets) == 1:
            names = eq.entry_names(v)
            rhs = eq.value_entry(v, names)
            if v.key in ("select", "slice"):
                rhs = eq.Chain(rhs, eq.basis_contraction(v, names))
            return sympy.Eq(eq.tensor_entry(st.targets[0], names), rhs, evaluate=False)
        lhs = sympy.Tuple(*[eq.tensor_entry(t, ty.legs) for t, ty in zip(st.targets, types)])
        return sympy.Eq(lhs, eq.value_entry(v, tuple(types[0].legs)), evaluate=False)
    except RecursionError:
        raise too_deep(st.span) from None


@deep
def statement_latex(c: Checked, s: CStmt) -> str:
    """The LaTeX of a statement's equation (mathtext-safe: `equations.latex_to_svg` draws it)."""
    try:
        return eq.to_latex(statement_equation(c, s))
    except RecursionError:
        raise too_deep(s.stmt.span) from None


# ---- readings ----------------------------------------------------------------------------------


@deep
def statement_readings(c: Checked, s: CStmt, body: Checked | None = None) -> list[Reading]:
    """The geometric reading of each contraction in a statement, and of each other step,
    innermost first (sigmoid(einsum(...)) reads the contraction, then the activation); each
    operation by its rule in `READING`. A step repeated in a row (tanh(tanh(x))) is read once."""
    body = body or c
    found, deps = producers(body, s)
    assert s.value is not None, "a computing statement has a value"
    target = s.stmt.targets[0] if isinstance(s.stmt, ir.Assign) and len(s.stmt.targets) == 1 else None
    values = list(s.value.args) if isinstance(s.stmt, ir.Return) else [s.value]
    reader = _Reader(legend(c.diagram), found, deps)
    try:
        for v in values:
            reader.read(v, target)
    except RecursionError:
        raise too_deep(s.stmt.span) from None
    if not reader.out:  # `zL = z2`, `return h`: a name for a tensor already there
        names = _and([_name(v) for v in values])
        what = f"{target} is" if target is not None else "The result is" if isinstance(s.stmt, ir.Assign) else "The block returns"
        reader.add(Reading("copy", "Same tensor", f"{what} {names}, unchanged: a new name for the same entries."))
    return _runs(reader.out)


LONG_RUN = 4  # this many steps of one kind in a row, or more, are read as one


def _runs(readings: list) -> list:
    """Readings in a row that are equal become one that says how many times the step repeats;
    LONG_RUN or more of one kind and title (the terms of a long sum, each rescaled) become the
    first of them and a count."""
    out: list = []
    i = 0
    while i < len(readings):
        r = readings[i]
        j = i + 1
        while j < len(readings) and (readings[j].kind, readings[j].title) == (r.kind, r.title):
            j += 1
        run = readings[i:j]
        if len(run) >= LONG_RUN and any(x != r for x in run):
            out.append(Reading(r.kind, r.title, f"{r.text} (The first of {len(run):,} such steps in a row.)"))
        else:
            for x in run:
                if out and isinstance(out[-1], list) and out[-1][0] == x:
                    out[-1][1] += 1
                else:
                    out.append([x, 1])
        i = j
    return [r if isinstance(r, Reading) else r[0] if r[1] == 1 else Reading(r[0].kind, r[0].title, f"{r[0].text} ({_times(r[1])} in a row.)")
            for r in out]


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n:,} times"


class _Reader:
    """Reads a value tree: `read` dispatches each operation to its rule in READING, which adds
    its readings (and reads its operands, innermost first)."""

    def __init__(self, legend: dict, producers: dict, deps: dict):
        self.legend = legend
        self.producers = producers
        self.deps = deps
        self.out: list[Reading] = []

    def read(self, v, target=None):
        """`target` is the statement's target when `v` is its whole value (residual updates)."""
        if not isinstance(v, V) or v.type.dtype == "scalar":
            return  # a plain number is read with the step that uses it (a rescale)
        key = v.key
        if key is None:
            if v.op == "block":
                self.args(v)
                rep = v.of(BlockCall).repeat
                shared = v.of(BlockCall).shared
                more = f", {rep} times in a chain, " + ("the same weights each time" if shared else "each copy with its own weights") if rep else ""
                if rep and len(v.args) > 1:
                    more += " and the same further arguments"
                self.add(Reading("block", "Block", f"Apply block {v.of(BlockCall).block}{more}."))
            return  # a tensor
        READING[key](self, v, target)

    def args(self, v):
        for a in v.args:
            self.read(a)

    def add(self, r):
        if r is not None:
            self.out.append(Reading(r.kind, r.title, r.text))


def _name(v: V) -> str:
    """How a reading names an operand: its tensor's name (through detach and dropout, which
    keep the values), else what it is."""
    if v.op == "ref":
        return v.of(Ref).name
    if v.key in ("detach", "dropout") and v.args and v.args[0].op == "ref":
        return v.args[0].of(Ref).name
    if v.key == "arange":
        return f"the positions along {v.type.legs[0]}"
    return "the contraction" if v.key == "einsum" else "the result"


def _norm_pair(v: V, producers: dict):
    """x / sqrt(einsum('i,i->', x, x)) or x / n**0.5 with n that einsum: (numerator, Contraction)."""
    a, b = v.args
    if a.op != "ref":
        return None
    inner = b
    if inner.key == "sqrt":
        inner = inner.args[0]
    elif inner.key == "**" and inner.args[1].op in ("num", "const") and inner.args[1].of(Num).value == 0.5:
        inner = inner.args[0]
    else:
        return None
    if inner.op == "ref" and inner.of(Ref).name in producers:
        inner = producers[inner.of(Ref).name]
    if inner.key != "einsum" or len(inner.args) != 2:
        return None
    names = [_name(x) for x in inner.args]
    return a.of(Ref).name, Contraction(tuple(Operand(n, t) for n, t in zip(names, inner.of(Einsum).terms)), inner.of(Einsum).out)


def _over(v: V) -> str:
    x = v.args[0]
    return x.type.legs[v.of(Axis).axis] if x.type.legs else "?"


def _each(legs, legend) -> str:
    legs = tuple(legs)
    if not legs:
        return ""
    words = [f"{legend[l]} {l}" if l in legend else l for l in legs]
    return "for each " + (words[0] if len(words) == 1 else "(" + ", ".join(words) + ")")


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


# ---- the reading of each operation: one entry per name of `penrose.ops.OPS` -----------------------
#
# A rule is called as rule(reader, v, target): it reads what it needs of its operands (most read
# them all first, through `_after_args`) and adds its readings.


def _after_args(text):
    """A rule that reads the operands, then adds `text(reader, v)` (a Reading or None)."""

    def rule(reader: _Reader, v: V, target):
        reader.args(v)
        reader.add(text(reader, v))

    return rule


def _row_reading(name: str):
    """An element-wise function: its row's sentence, with its keywords' values as written."""
    row = OPS[name]
    return _after_args(lambda r, v: Reading("activation", "Activation", row.reading.format(**{k.name: _written(v, k.name) for k in row.keywords})))


def _contraction(r: _Reader, v: V, target):
    r.args(v)
    names = [_name(x) for x in v.args]
    probs = set()
    normalised = set()
    for n, x in zip(names, v.args):
        src = r.producers.get(n) if x.op == "ref" else None
        if src is not None and src.key == "softmax":
            probs.add(n)
        if src is not None and src.key == "/" and src.op == "binop" and _norm_pair(src, r.producers) is not None:
            normalised.add(n)
    roles = {n: x.of(Ref).kind for n, x in zip(names, v.args) if x.op == "ref"}
    contraction = Contraction(
        tuple(Operand(n, t, roles.get(n, "tensor")) for n, t in zip(names, v.of(Einsum).terms)),
        v.of(Einsum).out, frozenset(normalised), frozenset(probs),
    )
    r.add(classify(contraction, r.legend))


def _is_tensor_pair(v: V) -> bool:
    return v.op == "binop" and all(x.type.dtype != "scalar" for x in v.args)


def _rescale(v: V) -> Reading:
    a, b = v.args
    tensor, other = (a, b) if b.type.dtype == "scalar" else (b, a)
    o = v.key  # None (no table row) reads as the defaults
    verbs: dict[str | None, str] = {"/": "Divide", "*": "Multiply", "+": "Shift", "-": "Shift", "**": "Raise"}
    preps: dict[str | None, str] = {"/": "by", "*": "by", "**": "to the power"}
    verb, prep = verbs.get(o, "Combine"), preps.get(o, "by")
    return Reading("rescale", "Rescale", f"{verb} every entry of {_name(tensor)} {prep} {_scalar_text(other)}.")


def _sum(r: _Reader, v: V, target):
    """a + b - c ...: the terms along the left spine are read first, then one reading of the
    whole sum (a residual update when the first term is the target and the others read it)."""
    if not _is_tensor_pair(v):
        r.args(v)
        r.add(_rescale(v))
        return
    chain = []  # the + and - between tensors, outermost first
    node = v
    while node.key in ("+", "-") and _is_tensor_pair(node):
        chain.append(node)
        node = node.args[0]
    terms = [node] + [n.args[1] for n in reversed(chain)]
    ops = [n.key for n in reversed(chain)]
    for t in terms:
        r.read(t)
    names = [_name(t) for t in terms]
    first, rest = names[0], names[1:]
    later = set()
    for t in terms[1:]:
        later |= refs(t)
        later |= set().union(*(r.deps.get(n, set()) for n in refs(t))) if refs(t) else set()
    if target is not None and first == target and first in later:
        verb, to = ("Add", "to") if set(ops) == {"+"} else ("Subtract", "from") if set(ops) == {"-"} else ("Add and subtract", "to")
        r.add(Reading("residual", "Residual update", f"{verb} {_and(rest)} {to} the stream {first}, entry by entry: {first} keeps flowing past this step, so the gradient reaches earlier layers directly."))
        return
    if len(terms) == 2:
        title, verb = ("Sum", "Add") if ops == ["+"] else ("Difference", "Subtract")
        r.add(Reading("elementwise", title, f"{verb} {first} and {rest[0]} entry by entry (legs aligned by name)."))
        return
    named = all(t.op == "ref" for t in terms)
    shown = "" if not named else " " + (_and(names) if len(names) <= 6 else f"{names[0]}, {names[1]}, …, {names[-1]}")
    title, verb = ("Sum", "Add") if set(ops) == {"+"} else ("Sum and difference", "Add and subtract")
    r.add(Reading("elementwise", title, f"{verb} the {len(terms):,} terms{shown} entry by entry (legs aligned by name)."))


def _elementwise(title: str, verb: str):
    def text(r, v):
        if not _is_tensor_pair(v):
            return _rescale(v)
        a, b = v.args
        return Reading("elementwise", title, f"{verb} {_name(a)} and {_name(b)} entry by entry (legs aligned by name).")

    return _after_args(text)


def _divide(r: _Reader, v: V, target):
    """x / ||x||: a normalisation (read as a whole); any other division entry by entry."""
    if v.op == "binop":
        pair = _norm_pair(v, r.producers)
        if pair is not None:
            reading = read_normalisation(pair[0], pair[1], result=target, legend=r.legend)
            if reading is not None:
                r.add(reading)
                return
    _elementwise("Element-wise ratio", "Divide")(r, v, target)


def _power(r, v):
    if not _is_tensor_pair(v):
        return _rescale(v)
    a, b = v.args
    return Reading("elementwise", "Element-wise power", f"Raise each entry of {_name(a)} to the power of the matching entry of {_name(b)} (legs aligned by name).")


def _floor_div(r, v):
    if not _is_tensor_pair(v):
        a, b = v.args
        tensor, other = (a, b) if b.type.dtype == "scalar" else (b, a)
        return Reading("rescale", "Floor division", f"Divide every entry of {_name(tensor)} by {_scalar_text(other)}, rounding down.")
    a, b = v.args
    return Reading("elementwise", "Floor division", f"Divide {_name(a)} by {_name(b)} entry by entry, rounding down (legs aligned by name).")


def _compare(r, v):
    a, b = v.args
    other = _scalar_text(b) if b.type.dtype == "scalar" else _name(b)
    return Reading("compare", "Comparison", f"Compare {_name(a)} and {other} entry by entry ({_name(a)} {v.key} {other}): a bool mask.")


def _softmax(r, v):
    leg = _over(v)
    rest = [l for l in v.type.legs if l != leg]
    each = _each(rest, r.legend)
    prefix = f"{each[0].upper()}{each[1:]}, t" if each else "T"
    log = " (in log space)" if v.key == "log_softmax" else ""
    return Reading("softmax", "Softmax", f"{prefix}urn the affinities along {leg} into probabilities: non-negative, summing to one over {leg}.{log}")


def _norm(r, v):
    leg = _over(v)
    if v.key == "layernorm":
        return Reading("norm", "Normalisation", f"For every slice along {leg}, re-centre and rescale its entries to unit variance (then a learned per-entry scale).")
    return Reading("norm", "Normalisation", f"For every slice along {leg}, rescale its entries to unit root mean square (then a learned per-entry scale).")


def _topk(r, v):
    return Reading("topk", "Top-k filter", f"Along {_over(v)}, keep the {v.of(TopK).k} largest entries; the others are filtered out (set to zero).")


def _topk_mask(r, v):
    leg = _over(v)
    return Reading("mask", "Top-k mask", f"Along {leg}, mark the {v.of(TopK).k} largest entries: a bool mask, true where an entry ranks among the top {v.of(TopK).k} of its {leg}-slice.")


def _reduce(r, v):
    verb = {"sum": "Sum", "mean": "Average", "max": "Take the maximum of", "min": "Take the minimum of"}[v.key]
    return Reading("reduce", "Reduction", f"{verb} all {_over(v)}-th slices of {_name(v.args[0])}.")


def _minmax(r, v):
    """max over a leg (a reduction), or the larger of two operands entry by entry."""
    if v.op == "reduce":
        return _reduce(r, v)
    a, b = (_scalar_text(x) if x.type.dtype == "scalar" else _name(x) for x in v.args)
    which, title = ("larger", "Maximum") if v.key == "max" else ("smaller", "Minimum")
    return Reading("elementwise", f"Element-wise {title.lower()}", f"Keep the {which} of {a} and {b}, entry by entry (legs aligned by name).")


def _causal(r, v):
    t, p = v.type.legs
    return Reading("mask", "Causal mask", f"True where {p} ≤ {t}: position {t} may only see positions {p} at or before it.")


def _arange(r, v):
    (t,) = v.type.legs
    return Reading("mask", "Positions", f"The positions along {t}: 0, 1, ..., one less than its size (the size the inputs give).")


def _block_causal(r, v):
    t, p = v.type.legs
    b = v.of(Mask).block
    return Reading("mask", "Block-causal mask",
                   f"True where ⌊{p}/{b}⌋ ≤ ⌊{t}/{b}⌋: positions are grouped into blocks of {b}; within a block every position "
                   f"sees every other (bidirectional), and across blocks {t} sees only the blocks at or before its own (causal).")


def _flatten(r, v):
    x = v.args[0]
    a, b = v.of(Flatten).start, v.of(Flatten).end
    legs = x.type.legs[a:b + 1]
    return Reading("reshape", "Flatten", f"Merge the adjacent legs {_and(legs)} of {_name(x)} into one leg {v.type.legs[a]}: the same entries, "
                   f"{legs[-1]} running fastest (row-major).")


def _unflatten(r, v):
    x = v.args[0]
    axis = v.of(Axis).axis
    n = len(v.type.legs) - len(x.type.legs) + 1
    legs = v.type.legs[axis:axis + n]
    return Reading("reshape", "Unflatten", f"Split leg {x.type.legs[axis]} of {_name(x)} into the legs {_and(legs)} "
                   f"(sizes {' × '.join(map(str, v.of(Unflatten).sizes))}): the same entries, {legs[-1]} running fastest.")


def _rope(r, v):
    x = v.args[0]
    d, t = x.type.legs[v.of(Axis).axis], x.type.legs[v.of(Rope).pos]
    return Reading("rope", "Rotary position embedding",
                   f"Rotate {_name(x)} by its position: along {d}, entry i and entry i + n/2 form a pair (n the size of {d}), "
                   f"turned by the angle {t}·ω_i with ω_i = {v.of(Rope).base:g}^(−2i/n), so the dot product of two rotated "
                   f"vectors depends on how far apart their positions {t} are.")


def _legs_of(legs, legend) -> str:
    """'t (token) and d' — legs with their legend meanings."""
    return _and([f"{l} ({legend[l]})" if l in legend else l for l in legs]) if legs else "no leg"


def _regroup(v: V, fastest: bool = True, sg: str = "") -> list[str]:
    """What an einops pattern does to the legs, in words: splits, dropped unit legs, merges
    (imperative; `sg='s'` for the third person)."""
    a = v.of(Einop)
    x = v.args[0]
    shown = {aid: leg for aid, _, leg in a.axes}
    parts = []
    for group, leg in zip(a.left, x.type.legs):
        if not group:
            parts.append(f"drop{sg} the size-1 leg {leg}")
        elif len(group) > 1:
            axes = [shown[aid] for aid in group]
            parts.append(f"split{sg} leg {leg} into {_and(axes)}" + (f" ({axes[-1]} running fastest)" if fastest else ""))
    for group, leg in zip(a.right, v.type.legs):
        if len(group) > 1:
            axes = [shown[aid] for aid in group]
            parts.append(f"merge{sg} {_and(axes)} into one leg {leg}" + (f" ({axes[-1]} running fastest)" if fastest else ""))
    renamed = [(leg, shown[g[0]]) for g, leg in zip(a.left, x.type.legs) if len(g) == 1 and shown[g[0]] != leg]
    for old, new in renamed:
        parts.append(f"rename{sg} leg {old} to {new}")
    return parts


def _rearrange(r, v):
    x = v.args[0]
    a = v.of(Einop)
    parts = _regroup(v)
    order = ", ".join(v.type.legs)
    if not parts:
        if tuple(x.type.legs) == tuple(v.type.legs):
            return Reading("reshape", "Rearrange", f"Leave the legs of {_name(x)} as they are ({order}): the same tensor.")
        title = "Transpose" if len(v.type.legs) == 2 else "Permutation"
        return Reading("reshape", title, f"Reorder the legs of {_name(x)} from ({', '.join(x.type.legs)}) to ({order}): "
                       "the same entries, only the legs rewired (pattern '" + a.pattern + "').")
    return Reading("reshape", "Rearrange", f"Regroup the legs of {_name(x)}: {_and(parts)}, giving the legs ({order}); "
                   "the same entries, rewired (pattern '" + a.pattern + "').")


_REDUCTION_WORDS = {
    "sum": ("Sum", "the sum over"),
    "mean": ("Mean", "the mean over"),
    "max": ("Maximum", "the maximum over"),
    "min": ("Minimum", "the minimum over"),
    "prod": ("Product", "the product over"),
}


def _einops_reduce(r, v):
    x = v.args[0]
    a = v.of(Einop)
    shown = {aid: leg for aid, _, leg in a.axes}
    title, words = _REDUCTION_WORDS[a.reduction]
    over = [shown[aid] for aid in a.reduced]
    what = _legs_of(over, r.legend) + (" and the batch legs" if a.sum_batch else "")
    each = _each(v.type.legs, r.legend)
    regroup = _regroup(v, fastest=False, sg="s")
    first = f"; the pattern first {_and(regroup)}" if regroup else ""
    rest = f", {each}" if each else ""
    return Reading("reduce", f"Reduction: {title.lower()}",
                   f"Take {words} {what} of {_name(x)}{rest}: those legs are reduced away (pattern '{a.pattern}'{first}).")


def _repeat(r, v):
    x = v.args[0]
    a = v.of(Einop)
    shown = {aid: leg for aid, _, leg in a.axes}
    new = [shown[aid] for aid in a.new]
    regroup = _regroup(v, fastest=False, sg="s")
    then = f"; the pattern also {_and(regroup)}" if regroup else ""
    slices = "slice" if len(new) == 1 else "slice along them"
    return Reading("repeat", "Repeat",
                   f"Copy {_name(x)} along the new leg{'s' if len(new) > 1 else ''} {_legs_of(new, r.legend)}: every {'-'.join(new)}-{slices} "
                   f"is the same {_name(x)} (an outer product with a vector of ones){then}.")


def _select(r, v):
    x = v.args[0]
    leg = x.type.legs[v.of(Axis).axis]
    i = v.of(Select).index
    which = f"index {i}" if i >= 0 else f"index {i} (counted from the end)"
    return Reading("select", "Select",
                   f"Pick {which} of leg {leg} of {_name(x)} (a contraction with the basis vector e{subscript(i)}): the leg {leg} disappears.")


def _slice(r, v):
    x = v.args[0]
    axis = v.of(Axis).axis
    leg, into = x.type.legs[axis], v.type.legs[axis]
    start, n = v.of(Slice).start, v.of(Slice).length
    if n <= 0:
        keep = f"Keep no index of leg {leg} of {_name(x)}: leg {into} is empty"
    elif n == 1:
        keep = f"Keep index {start} of leg {leg} of {_name(x)} as leg {into}"
    else:
        keep = f"Keep indices {start} to {start + n - 1} of leg {leg} of {_name(x)} as leg {into}"
    shift = f"{start} + i" if start else "i"
    return Reading("slice", "Slice", f"{keep} (a contraction with a selection matrix: index i of {into} is index {shift} of {leg}).")


READING: dict = {
    # element-wise functions
    **{name: _row_reading(name) for name in sorted(ELEMENTWISE)},
    # operators
    "+": _sum,
    "-": _sum,
    "*": _elementwise("Element-wise product", "Multiply"),
    "/": _divide,
    "//": _after_args(_floor_div),
    "**": _after_args(_power),
    **{op: _after_args(_compare) for op in ("<", "<=", ">", ">=", "==", "!=")},
    "neg": _after_args(lambda r, v: Reading("elementwise", "Negation", "Flip the sign of every entry.")),
    "einsum": _contraction,
    # over one leg
    "softmax": _after_args(_softmax),
    "log_softmax": _after_args(_softmax),
    "layernorm": _after_args(_norm),
    "rmsnorm": _after_args(_norm),
    "topk": _after_args(_topk),
    "topk_mask": _after_args(_topk_mask),
    "sum": _after_args(_reduce),
    "mean": _after_args(_reduce),
    "max": _after_args(_minmax),
    "min": _after_args(_minmax),
    # element-wise with options
    "dropout": _after_args(lambda r, v: Reading("dropout", "Dropout", f"During training, zero each entry with probability {v.of(Dropout).p} and rescale the rest; the identity at evaluation.")),
    "detach": _after_args(lambda r, v: Reading("detach", "Stop gradient", "The same values, but no gradient flows back through this copy.")),
    "clamp": _after_args(lambda r, v: Reading("clamp", "Clamp", f"Clip every entry into the range [{_bound(v.of(Clamp).min, '−∞', v, 'min')}, {_bound(v.of(Clamp).max, '∞', v, 'max')}].")),
    "where": _after_args(lambda r, v: Reading("mask", "Masking", "Choose, entry by entry, the first value where the mask holds and the second elsewhere.")),
    # masks
    "causal": _after_args(_causal),
    "arange": _after_args(_arange),
    "block_causal": _after_args(_block_causal),
    # indexing and shapes
    "gather": _after_args(lambda r, v: Reading("lookup", "Lookup", f"Pick the rows of {_name(v.args[0])} named by the ids in {_name(v.args[1])}: an embedding lookup.")),
    "split": _after_args(lambda r, v: Reading("split", "Split", f"Cut leg {_over(v)} into parts of sizes {', '.join(map(str, v.of(Split).sizes))}.")),
    "concat": _after_args(lambda r, v: Reading("concat", "Concatenate", f"Join the parts along leg {v.type.legs[v.of(Axis).axis]}.")),
    "flatten": _after_args(_flatten),
    "unflatten": _after_args(_unflatten),
    "rope": _after_args(_rope),
    # einops patterns
    "rearrange": _after_args(_rearrange),
    "reduce": _after_args(_einops_reduce),
    "repeat": _after_args(_repeat),
    # picking indices
    "select": _after_args(_select),
    "slice": _after_args(_slice),
}


def _bound(x, infinite: str, v=None, key=None) -> str:
    if x is None:
        return infinite
    return _written(v, key) if v is not None else _fmt(x)


def _written(v, key: str) -> str:
    """A keyword's value as the diagram writes it (`min=-alpha`: -alpha), else the number."""
    shown = v.attrs.written(key)
    return shown.text if shown is not None else _fmt(v.attrs.keyword(key))
