"""Each statement of a checked diagram explained: its index equation and its geometric readings.

The glue between the checked IR and the two pure helpers: `equations` (sympy → LaTeX) and
`readings` (contraction patterns → prose). A statement's equation is built from its value tree
with the einsum letters as indices (the paper writes q_te = Σ_d Z_td W_q,de); each contraction
in it is read geometrically, and each non-linear step gets a one-line reading of its own.

    >>> from penrose.check import check
    >>> from penrose.parse import parse
    >>> c = check(parse("dim d = 3, e = 2\\ninput Z[t, d]\\nparam W[d, e]\\ndim t = 4\\nq = einsum('td,de->te', Z, W)\\noutput q"))
    >>> statement_latex(c, statements(c)[0])
    'q_{te} = \\\\sum_{d} Z_{td} \\\\, W_{de}'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from penrose import ir
from penrose.check import Checked, CStmt, V
from penrose.render import equations as eq
from penrose.render.figure import index_legend, statements
from penrose.render.readings import Contraction, Operand, classify, read_normalisation

__all__ = ["Reading", "statement_equation", "statement_latex", "statement_readings", "statements"]


@dataclass(frozen=True)
class Reading:
    """A reading of one step of a statement: a title and a sentence (kind from readings.KINDS
    for contractions; 'activation', 'softmax', 'residual' ... for the other operations)."""

    kind: str
    title: str
    text: str


# ---- equations ---------------------------------------------------------------------------------


class _Call(sympy.Function):
    """A diagram operation printed as \\mathrm{name}(args); never evaluated."""

    latex_name = r"\mathrm{f}"

    @classmethod
    def eval(cls, *args):
        return None

    def _latex(self, printer):
        return rf"{self.latex_name}\left({', '.join(printer._print(a) for a in self.args)}\right)"


def _call(latex_name: str, *args) -> sympy.Expr:
    key = "".join(ch for ch in latex_name if ch.isalnum())
    cls = type(f"penrose_call_{key}", (_Call,), {"latex_name": latex_name})
    return cls(*args)


def statement_equation(c: Checked, s: CStmt) -> sympy.Eq:
    """The equation of one computing statement: target entries = the value's expression
    (a block's `return` is written as the entries of `out`)."""
    st = s.stmt
    if isinstance(st, ir.Return):
        vals = list(s.value.args)
        rhs = [_entry(v, tuple(v.type.legs)) for v in vals]
        lhs = [eq.tensor_entry("out" if len(vals) == 1 else f"out{i}", v.type.legs) for i, v in enumerate(vals)]
        if len(vals) == 1:
            return sympy.Eq(lhs[0], rhs[0], evaluate=False)
        return sympy.Eq(sympy.Tuple(*lhs), sympy.Tuple(*rhs), evaluate=False)
    v = s.value
    types = s.types
    if len(st.targets) == 1:
        return eq.assign(st.targets[0], types[0].legs, _entry(v, tuple(types[0].legs)))
    lhs = sympy.Tuple(*[eq.tensor_entry(t, ty.legs) for t, ty in zip(st.targets, types)])
    return sympy.Eq(lhs, _entry(v, tuple(types[0].legs)), evaluate=False)


def statement_latex(c: Checked, s: CStmt) -> str:
    """The LaTeX of a statement's equation (mathtext-safe: `equations.latex_to_svg` draws it)."""
    return eq.to_latex(statement_equation(c, s))


def _fresh(letter: str, taken: set) -> str:
    name = letter
    while name in taken:
        name += "'"
    return name


def _entry(v: V, names: tuple) -> sympy.Expr:
    """The expression for the entry of `v` at index names `names` (one per leg of v)."""
    op = v.op
    if op == "ref":
        return eq.tensor_entry(v.attrs["name"], names)
    if op == "num":
        x = v.attrs["value"]
        if x == math.inf:
            return sympy.oo
        if x == -math.inf:
            return -sympy.oo
        return sympy.Integer(x) if isinstance(x, int) else sympy.Float(x, 4)
    if op == "dimsize":
        return eq.dim_size(v.attrs["name"])
    if op == "sbin":
        return eq.elementwise(v.attrs["op"] if v.attrs["op"] != "//" else "/", _entry(v.args[0], ()), _entry(v.args[1], ()))
    if op == "sfunc":
        return eq.apply_function(v.attrs["name"], _entry(v.args[0], ()))
    if op == "neg":
        return eq.elementwise("-", _entry(v.args[0], names))
    if op == "einsum":
        return _einsum_entry(v, names)
    if op == "binop":
        a, b = v.args
        parts = [_aligned(x, al, names) for x, al in zip((a, b), v.attrs["align"])]
        o = v.attrs["op"]
        if o in ("+", "-", "*", "/", "**"):
            return eq.elementwise(o, *parts)
        if o == "//":
            return sympy.floor(eq.elementwise("/", *parts), evaluate=False)
        rel = {"<": sympy.StrictLessThan, "<=": sympy.LessThan, ">": sympy.StrictGreaterThan,
               ">=": sympy.GreaterThan, "==": sympy.Eq, "!=": sympy.Ne}[o]
        return rel(*parts, evaluate=False)
    if op == "unary":
        return eq.apply_function(v.attrs["name"], _entry(v.args[0], names))
    if op in ("softmax", "log_softmax", "layernorm", "rmsnorm", "topk"):
        leg = names[v.attrs["axis"]]
        return eq.apply_function(op, _entry(v.args[0], names), leg)
    if op in ("dropout", "detach", "clamp"):
        return eq.apply_function(op, _entry(v.args[0], names))
    if op == "reduce":
        x = v.args[0]
        axis = v.attrs["axis"]
        leg = _fresh(x.type.legs[axis], set(names))
        inner = names[:axis] + (leg,) + names[axis:]
        return eq.apply_function(v.attrs["name"], _entry(x, inner), leg)
    if op == "where":
        parts = [_aligned(x, al, names) for x, al in zip(v.args, v.attrs["align"])]
        return _call(r"\mathrm{where}", *parts)
    if op == "mask":
        return eq.tensor_entry("causal" if v.attrs["kind"] == "causal" else "blockcausal", names)
    if op == "gather":
        table, ids = v.args
        n_ids = len(ids.type.legs)
        idx = _entry(ids, names[:n_ids])
        rest = [eq.leg_symbol(n) for n in names[n_ids:]]
        return sympy.IndexedBase(table.attrs["name"] if table.op == "ref" else "E")[(idx, *rest)]
    if op in ("split", "concat"):  # the parts keep their own leg along the axis
        axis = v.attrs["axis"]

        def at(x):
            own = list(names)
            own[axis] = _fresh(x.type.legs[axis], set(names) - {names[axis]})
            return _entry(x, tuple(own))

        return _call(rf"\mathrm{{{op}}}", *[at(x) for x in v.args])
    if op == "block":
        name = v.attrs["block"]
        latex = eq._roman(name) + (rf"^{{\times {v.attrs['repeat']}}}" if v.attrs["repeat"] else "")
        args = [_entry(x, tuple(x.type.legs)) for x in v.args]
        return _call(latex, *args)
    return sympy.Symbol(op)


def _aligned(x: V, align, names: tuple) -> sympy.Expr:
    if x.type.dtype == "scalar" or align is None:
        return _entry(x, ())
    sub = [None] * len(x.type.legs)
    for i, j in enumerate(align):
        if j is not None:
            sub[j] = names[i]
    sub = [s if s is not None else leg for s, leg in zip(sub, x.type.legs)]
    return _entry(x, tuple(sub))


def _einsum_entry(v: V, names: tuple) -> sympy.Expr:
    terms, out = v.attrs["terms"], v.attrs["out"]
    mapping = dict(zip(out, names))
    taken = set(names)
    for t in terms:
        for letter in t:
            if letter not in mapping:
                mapping[letter] = _fresh(letter, taken)
                taken.add(mapping[letter])
    factors = [_entry(x, tuple(mapping[l] for l in t)) for x, t in zip(v.args, terms)]
    body = factors[0] if len(factors) == 1 else sympy.Mul(*factors, evaluate=False)
    summed = [mapping[l] for l in dict.fromkeys(l for t in terms for l in t) if l not in out]
    return eq._sum(body, summed) if summed else body


# ---- readings ----------------------------------------------------------------------------------


def statement_readings(c: Checked, s: CStmt, body: Checked | None = None) -> list[Reading]:
    """The geometric reading of each contraction in a statement, and of each other step,
    innermost first (sigmoid(einsum(...)) reads the contraction, then the activation)."""
    body = body or c
    legend = index_legend(c.diagram)
    producers, deps = _producers(body, s)
    out: list[Reading] = []
    target = s.stmt.targets[0] if isinstance(s.stmt, ir.Assign) and len(s.stmt.targets) == 1 else None
    values = list(s.value.args) if isinstance(s.stmt, ir.Return) else [s.value]
    ctx = {"legend": legend, "producers": producers, "deps": deps}
    for v in values:
        _read(v, out, ctx, target, top=True)
    return out


def _refs(v) -> set:
    if not isinstance(v, V):
        return set()
    found = {v.attrs["name"]} if v.op == "ref" else set()
    for a in v.args:
        found |= _refs(a)
    return found


def _producers(body: Checked, upto: CStmt):
    """name -> the value that last assigned it before `upto`, and name -> every name it was
    computed from (transitively)."""
    found: dict = {}
    deps: dict = {}
    for s in body.stmts:
        if s is upto:
            break
        if isinstance(s.stmt, ir.Assign):
            reads = _refs(s.value)
            closure = set(reads)
            for r in reads:
                closure |= deps.get(r, set())
            for t in s.stmt.targets:
                deps[t] = closure
            if len(s.stmt.targets) == 1:
                found[s.stmt.targets[0]] = s.value
    return found, deps


def _name(v: V) -> str:
    if v.op == "ref":
        return v.attrs["name"]
    if v.op in ("detach", "dropout") and v.args and v.args[0].op == "ref":
        return v.args[0].attrs["name"]
    return "the contraction" if v.op == "einsum" else "the result"


def _read(v: V, out: list, ctx: dict, target, top=False):
    if not isinstance(v, V):
        return
    legend, producers = ctx["legend"], ctx["producers"]
    if v.op == "binop" and v.attrs["op"] == "/":
        pair = _norm_pair(v, producers)
        if pair is not None:
            r = read_normalisation(pair[0], pair[1], result=target, legend=legend)
            if r is not None:
                out.append(Reading(r.kind, r.title, r.text))
                return
    for a in v.args:
        _read(a, out, ctx, None)
    op = v.op
    if op == "einsum":
        names = [_name(x) for x in v.args]
        probs = set()
        normalised = set()
        for n, x in zip(names, v.args):
            src = producers.get(n) if x.op == "ref" else None
            if src is not None and src.op == "softmax":
                probs.add(n)
            if src is not None and src.op == "binop" and _norm_pair(src, producers) is not None:
                normalised.add(n)
        roles = {}
        for n, x in zip(names, v.args):
            if x.op == "ref":
                roles[n] = x.attrs.get("kind", "tensor")
        contraction = Contraction(
            tuple(Operand(n, t, roles.get(n, "tensor")) for n, t in zip(names, v.attrs["terms"])),
            v.attrs["out"], frozenset(normalised), frozenset(probs),
        )
        r = classify(contraction, legend)
        out.append(Reading(r.kind, r.title, r.text))
        return
    r = _op_reading(v, target if top else None, legend, ctx)
    if r is not None:
        out.append(r)


def _is_normalisation(v: V) -> bool:
    return v.op == "binop" and v.attrs["op"] == "/" and _norm_pair(v, {}) is not None


def _norm_pair(v: V, producers: dict):
    """x / sqrt(einsum('i,i->', x, x)) or x / n**0.5 with n that einsum: (numerator, Contraction)."""
    a, b = v.args
    if a.op != "ref":
        return None
    inner = b
    if inner.op == "unary" and inner.attrs["name"] == "sqrt":
        inner = inner.args[0]
    elif inner.op == "binop" and inner.attrs["op"] == "**" and inner.args[1].op == "num" and inner.args[1].attrs["value"] == 0.5:
        inner = inner.args[0]
    else:
        return None
    if inner.op == "ref" and inner.attrs["name"] in producers:
        inner = producers[inner.attrs["name"]]
    if inner.op != "einsum" or len(inner.args) != 2:
        return None
    names = [_name(x) for x in inner.args]
    return a.attrs["name"], Contraction(tuple(Operand(n, t) for n, t in zip(names, inner.attrs["terms"])), inner.attrs["out"])


def _over(v: V) -> str:
    x = v.args[0]
    return x.type.legs[v.attrs["axis"]] if x.type.legs else "?"


def _each(legs, legend) -> str:
    legs = tuple(legs)
    if not legs:
        return ""
    words = [f"{legend[l]} {l}" if l in legend else l for l in legs]
    return "for each " + (words[0] if len(words) == 1 else "(" + ", ".join(words) + ")")


def _op_reading(v: V, target, legend, ctx) -> Reading | None:
    op = v.op
    if op == "unary":
        name = v.attrs["name"]
        if name in ("sigmoid", "sigma"):
            return Reading("activation", "Activation", "Squash every entry into (0, 1) independently (sigmoid): a soft on/off score.")
        return Reading("activation", "Activation", f"Apply {name} to every entry independently.")
    if op in ("softmax", "log_softmax"):
        leg = _over(v)
        rest = [l for l in v.type.legs if l != leg]
        each = _each(rest, legend)
        prefix = f"{each[0].upper()}{each[1:]}, t" if each else "T"
        return Reading("softmax", "Softmax", f"{prefix}urn the affinities along {leg} into probabilities: non-negative, summing to one over {leg}."
                       + (" (in log space)" if op == "log_softmax" else ""))
    if op in ("layernorm", "rmsnorm"):
        leg = _over(v)
        what = "re-centre and rescale" if op == "layernorm" else "rescale"
        return Reading("norm", "Normalisation", f"For every slice along {leg}, {what} its entries to unit {'variance' if op == 'layernorm' else 'root mean square'} (then a learned per-entry scale).")
    if op == "topk":
        leg = _over(v)
        return Reading("topk", "Top-k filter", f"Along {leg}, keep the {v.attrs['k']} largest entries; the others are filtered out (set to zero).")
    if op == "dropout":
        return Reading("dropout", "Dropout", f"During training, zero each entry with probability {v.attrs['p']} and rescale the rest; the identity at evaluation.")
    if op == "detach":
        return Reading("detach", "Stop gradient", "The same values, but no gradient flows back through this copy.")
    if op == "clamp":
        return Reading("clamp", "Clamp", "Clip every entry into the range [min, max].")
    if op == "mask":
        t, p = v.type.legs
        return Reading("mask", "Causal mask", f"True where {p} ≤ {t}: position {t} may only see positions {p} at or before it.")
    if op == "where":
        return Reading("mask", "Masking", "Choose, entry by entry, the first value where the mask holds and the second elsewhere.")
    if op == "gather":
        table, ids = v.args
        return Reading("lookup", "Lookup", f"Pick the rows of {_name(table)} named by the ids in {_name(ids)}: an embedding lookup.")
    if op == "reduce":
        leg = _over(v)
        verb = {"sum": "Sum", "mean": "Average", "max": "Take the maximum of"}[v.attrs["name"]]
        return Reading("reduce", "Reduction", f"{verb} all {leg}-th slices of {_name(v.args[0])}.")
    if op == "split":
        return Reading("split", "Split", f"Cut leg {_over(v)} into parts of sizes {', '.join(map(str, v.attrs['sizes']))}.")
    if op == "concat":
        return Reading("concat", "Concatenate", f"Join the parts along leg {v.type.legs[v.attrs['axis']]}.")
    if op == "block":
        rep = v.attrs["repeat"]
        more = f", {rep} times in a chain, each copy with its own weights" if rep else ""
        return Reading("block", "Block", f"Apply block {v.attrs['block']}{more}.")
    if op == "binop":
        a, b = v.args
        o = v.attrs["op"]
        if a.type.dtype == "scalar" or b.type.dtype == "scalar":
            tensor, other = (a, b) if b.type.dtype == "scalar" else (b, a)
            from penrose.render.figure import _scalar_text

            verb = {"/": "Divide", "*": "Multiply", "+": "Shift", "-": "Shift", "**": "Raise"}.get(o, "Combine")
            prep = {"/": "by", "*": "by", "**": "to the power"}.get(o, "by")
            return Reading("rescale", "Rescale", f"{verb} every entry of {_name(tensor)} {prep} {_scalar_text(other)}.")
        an, bn = _name(a), _name(b)
        if o in ("+", "-") and target is not None and an == target and an in ctx["deps"].get(bn, set()) | _refs(b):
            verb = "Add" if o == "+" else "Subtract"
            to = "to" if o == "+" else "from"
            return Reading("residual", "Residual update", f"{verb} {bn} {to} the stream {an}, entry by entry: {an} keeps flowing past this step, so the gradient reaches earlier layers directly.")
        words = {"+": ("Sum", "Add"), "-": ("Difference", "Subtract"), "*": ("Element-wise product", "Multiply"),
                 "/": ("Element-wise ratio", "Divide")}
        if o in words:
            title, verb = words[o]
            return Reading("elementwise", title, f"{verb} {an} and {bn} entry by entry (legs aligned by name).")
        return Reading("compare", "Comparison", f"Compare {an} and {bn} entry by entry: a bool mask.")
    if op == "neg":
        return Reading("elementwise", "Negation", "Flip the sign of every entry.")
    return None
