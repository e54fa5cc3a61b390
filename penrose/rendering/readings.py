"""Geometric readings of contractions: the paper's "Rosetta stone", filled in with real names.

A contraction is read from its leg pattern alone (plus a few hints about its operands), so this
module imports neither torch nor the IR. Every leg of a contraction plays one role:

    batch       in every operand and in the output (only with two or more operands)
    kept        in the output, but not in every operand (a free leg)
    contracted  not in the output: summed over

Kinds (the paper's table, section 2.2, then the patterns its figures use):

    scalar_multiplication  ',->'           Rescale point a using point b.
    elementwise_product    'i,i->i'        Independently rescale elements of a with elements of b.
    dot_product            'i,i->'         "Affinity" of a and b.
    squared_norm           'i,i->' (a, a)  Affinity of a with itself.
    cosine_similarity      'i,i->' (both operands unit-normalised)
    convex_combination     'i,i->' (one operand holds probabilities)
    sum_of_slices          'ik->i'         Sum all k-th slices of B.
    matrix_vector          'ij,i->j'       Affinity of j-th slice of A and b.
    scaled_slices          'ij,i->ij'      Slices of A scaled by values of b.
    matrix_matrix          'ij,ik->jk'     Affinity of j-th slice of A and k-th slice of B.
    outer_product          'i,j->ij'       Every element of a rescales a copy of b.
    trace                  'ii->'          Sum of the diagonal entries of A.
    permutation            'ij->ji'        Reorder the legs of A (titled "Transpose" for two legs).
    generic                anything else: which legs are contracted, kept and batch.

Contraction kinds with batch legs get the prefix ``batched_`` ('bij,bjk->bik' is
``batched_matrix_matrix``); element-wise products and scaled slices are batch-only by nature and
keep their plain names. The division ``x / sqrt(einsum('i,i->', x, x))`` is read separately by
`read_normalisation`, since it is not a single contraction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from penrose.einsum_spec import ELLIPSIS, lex
from penrose.errors import PenroseError


KINDS = (
    "scalar_multiplication",
    "elementwise_product",
    "dot_product",
    "squared_norm",
    "cosine_similarity",
    "convex_combination",
    "sum_of_slices",
    "matrix_vector",
    "scaled_slices",
    "matrix_matrix",
    "outer_product",
    "trace",
    "permutation",
    "normalisation",
    "generic",
)


@dataclass(frozen=True)
class Operand:
    """One input of a contraction: a tensor name and its legs, in order.

    >>> Operand("W_q", ("e", "d"), role="param")
    Operand(name='W_q', legs=('e', 'd'), role='param')
    """

    name: str
    legs: tuple[str, ...]
    role: str = "tensor"

    def __post_init__(self) -> None:
        object.__setattr__(self, "legs", tuple(self.legs))


@dataclass(frozen=True)
class Contraction:
    """An einsum pattern over named operands, with hints about what the operands hold.

    The same name twice means the same tensor (einsum('i,i->', a, a) is a squared norm).
    `normalised` names operands known to have unit norm over the contracted legs;
    `probabilities` names operands known to sum to one over them (softmax outputs).

    >>> c = Contraction((Operand("q", ("t", "e")), Operand("k", ("p", "e"))), ("t", "p"))
    >>> c.spec
    'te,pe->tp'
    """

    operands: tuple[Operand, ...]
    output: tuple[str, ...]
    normalised: frozenset[str] = frozenset()
    probabilities: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "operands", tuple(self.operands))
        object.__setattr__(self, "output", tuple(self.output))
        object.__setattr__(self, "normalised", frozenset(self.normalised))
        object.__setattr__(self, "probabilities", frozenset(self.probabilities))
        if not self.operands:
            raise ValueError("a contraction needs at least one operand")
        if len(set(self.output)) != len(self.output):
            raise ValueError(f"output legs repeat: {self.spec!r}")
        present = {leg for op in self.operands for leg in op.legs}
        missing = [leg for leg in self.output if leg not in present]
        if missing:
            raise ValueError(f"output legs {missing} appear in no operand: {self.spec!r}")

    @property
    def spec(self) -> str:
        """The einsum string: compact when every leg is one letter, spaced otherwise."""
        terms = [op.legs for op in self.operands] + [self.output]
        compact = all(len(leg) == 1 or leg == ELLIPSIS for t in terms for leg in t)
        join = "".join if compact else " ".join
        inputs = ("," if compact else ", ").join(join(t) for t in terms[:-1])
        arrow = "->" if compact else " -> "
        return f"{inputs}{arrow}{join(self.output)}"


@dataclass(frozen=True)
class Reading:
    """A geometric reading: a kind from `KINDS` (maybe ``batched_``), a title, and prose.

    `contracted` lists the legs summed over, `kept` the free legs of the result that are not
    batch legs, and `batch` the legs carried through every operand.
    """

    kind: str
    title: str
    text: str
    contracted: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    batch: tuple[str, ...] = ()


def parse_einsum(
    spec: str,
    *names: str,
    normalised: Iterable[str] = (),
    probabilities: Iterable[str] = (),
    roles: Mapping[str, str] | None = None,
) -> Contraction:
    """A `Contraction` from an einsum string and operand names (compact or spaced form).

    The spec is read by `penrose.einsum_spec.lex`, the one parser: letters as torch reads them,
    or the spaced form ('tok emb, emb hd -> tok hd') when a spaced spec has a label longer than a
    letter. '...' is one leg named '...'. Without '->' the output is '...' (if any term has it),
    then the legs seen once, sorted.

    >>> parse_einsum('ij,i->j', 'A', 'b').output
    ('j',)
    >>> parse_einsum('i...,i->...', 'A', 'b').operands[0].legs
    ('i', '...')
    """
    try:
        parsed = lex(spec)
    except PenroseError as err:
        raise ValueError(f"{spec!r}: {err.message}") from None
    if len(parsed.inputs) != len(names):
        raise ValueError(f"{spec!r} has {len(parsed.inputs)} operands but {len(names)} names were given")

    def legs_of(term) -> tuple[str, ...]:
        legs = term.names
        if term.ellipsis is None:
            return legs
        return legs[: term.ellipsis] + (ELLIPSIS,) + legs[term.ellipsis :]

    legs = [legs_of(t) for t in parsed.inputs]
    if parsed.output is not None:
        output = legs_of(parsed.output)
    else:
        counts: dict[str, int] = {}
        for term in legs:
            for leg in term:
                counts[leg] = counts.get(leg, 0) + 1
        once = sorted(leg for leg, n in counts.items() if n == 1 and leg != ELLIPSIS)
        output = ((ELLIPSIS,) if ELLIPSIS in counts else ()) + tuple(once)
    roles = roles or {}
    operands = tuple(Operand(n, ls, roles.get(n, "tensor")) for n, ls in zip(names, legs))
    return Contraction(operands, output, frozenset(normalised), frozenset(probabilities))


# ---------------------------------------------------------------------------------------------
# Classification


@dataclass(frozen=True)
class _Roles:
    """Where each leg goes; tuples keep first-appearance order (output order for kept legs)."""

    batch: tuple[str, ...]
    kept: tuple[str, ...]
    contracted: tuple[str, ...]  # not in the output, shared by two or more operands
    dangling: tuple[str, ...]  # not in the output, in one operand only
    repeated: tuple[str, ...]  # twice or more within one operand (a diagonal)


def _roles(c: Contraction) -> _Roles:
    order: list[str] = []
    count: dict[str, int] = {}
    repeated: list[str] = []
    for op in c.operands:
        for leg in op.legs:
            if leg not in count:
                order.append(leg)
                count[leg] = 0
            if op.legs.count(leg) > 1 and leg not in repeated:
                repeated.append(leg)
        for leg in set(op.legs):
            count[leg] += 1
    n = len(c.operands)
    batch = tuple(leg for leg in c.output if n >= 2 and count[leg] == n)
    kept = tuple(leg for leg in c.output if leg not in batch)
    summed = [leg for leg in order if leg not in c.output]
    return _Roles(
        batch=batch,
        kept=kept,
        contracted=tuple(leg for leg in summed if count[leg] >= 2),
        dangling=tuple(leg for leg in summed if count[leg] == 1),
        repeated=tuple(repeated),
    )


def classify(contraction: Contraction, legend: Mapping[str, str] | None = None) -> Reading:
    """Read a contraction geometrically; `legend` maps legs to words ({'t': 'token'}).

    >>> classify(parse_einsum('ij,i->j', 'A', 'b')).text
    'Affinity of j-th slice of A and b. Yields: unnormalised scalar for each slice of A.'
    """
    roles = _roles(contraction)
    words = _Words(legend or {})
    reading: Reading | None = None
    if len(contraction.operands) == 1:
        reading = _read_unary(contraction, roles, words)
    elif not roles.repeated:
        if len(contraction.operands) == 2:
            reading = _read_binary(contraction, roles, words)
        else:
            reading = _read_nary(contraction, roles, words)
    return reading or _read_generic(contraction, roles, words)


def read_normalisation(
    numerator: str,
    squared_norm: Contraction,
    result: str | None = None,
    legend: Mapping[str, str] | None = None,
) -> Reading | None:
    """Read ``numerator / sqrt(squared_norm)``; None unless `squared_norm` is numerator's.

    Batched squared norms ('te,te->t') normalise each slice over the contracted legs.

    >>> read_normalisation('a', parse_einsum('i,i->', 'a', 'a'), result='an').text
    'Rescale vector length: divide a by its norm ||a||. Yields: normalised vector an.'
    """
    ops = squared_norm.operands
    if len(ops) != 2 or any(op.name != numerator for op in ops) or ops[0].legs != ops[1].legs:
        return None
    roles = _roles(squared_norm)
    if roles.kept or roles.dangling or roles.repeated or not roles.contracted:
        return None
    words = _Words(legend or {})
    over = roles.contracted
    noun = _noun(len(over))
    action = f"Rescale {noun} length: divide {numerator} by its norm ||{numerator}||"
    yields = f"normalised {noun}" + (f" {result}" if result else "")
    if roles.batch:
        action = f"For {words.each(roles.batch)}, rescale {noun} length over {_and(over)}: " \
                 f"divide {words.slice(numerator, roles.batch)} by its norm"
        yields = f"{yields} (unit length for {words.each(roles.batch)})"
    return Reading("normalisation", "Normalisation", f"{action}. Yields: {yields}.",
                   contracted=over, batch=roles.batch)


def _read_unary(c: Contraction, roles: _Roles, words: _Words) -> Reading | None:
    (a,) = c.operands
    if roles.repeated:
        twice = all(a.legs.count(leg) == 2 for leg in roles.repeated)
        traced = set(roles.dangling) == set(roles.repeated)
        if twice and traced and not set(roles.repeated) & set(c.output):
            mat = a.name
            legs = _and(roles.repeated)
            action = f"Sum the diagonal entries of {mat} (where both {legs} legs agree)"
            yields = f"trace of {mat} (scalar)"
            return _make("trace", "Trace", action, yields, roles, words, batch=roles.kept)
        return None
    if not roles.dangling:
        if a.legs == c.output:
            return _make("permutation", "Identity", f"Copy {a.name} unchanged", f"{a.name}",
                         roles, words)
        title = "Transpose" if len(a.legs) == 2 else "Permutation"
        action = f"Reorder the legs of {a.name} from {_tuple(a.legs)} to {_tuple(c.output)}"
        return _make("permutation", title, action, "the same entries, rearranged", roles, words)
    if not roles.kept:
        action = f"Sum all elements of {a.name}"
        yields = "scalar corresponding to the sum of all elements"
    else:
        action = f"Sum all {words.th(roles.dangling)} slices of {a.name}"
        yields = f"{_noun(len(roles.kept))} corresponding to the sum of all slices"
    return _make("sum_of_slices", "Sum of slices", action, yields, roles, words)


def _read_binary(c: Contraction, roles: _Roles, words: _Words) -> Reading | None:
    a, b = c.operands
    sa, sb, so = set(a.legs), set(b.legs), set(c.output)
    if not sa and not sb:
        action = f"Rescale point {a.name} using point {b.name}"
        return _make("scalar_multiplication", "Scalar multiplication", action,
                     "rescaled point", roles, words)
    for s, t, st in ((a, b, sb), (b, a, sa)):
        if not s.legs and st == so:
            action = f"Rescale {t.name} using the scalar {s.name}"
            yields = f"{_noun(len(t.legs))} {t.name} with every element scaled by {s.name}"
            return _make("scalar_multiplication", "Scalar multiplication", action, yields,
                         roles, words)
    if sa == sb == so:
        if a.name == b.name:
            action = f"Square each element of {a.name} independently"
            yields = f"{_noun(len(so))} of squared elements of {a.name}"
        else:
            action = f"Independently rescale elements of {a.name} with elements of {b.name}"
            yields = f"rescaled {_noun(len(so))} {a.name}"
        return _make("elementwise_product", "Element-wise product", action, yields, roles,
                     words, prefix=False)
    for t, s, st, ss in ((a, b, sa, sb), (b, a, sb, sa)):
        if st == so and ss < st:
            action = f"Slices of {t.name} scaled by values of {s.name} " \
                     f"({words.th(s.legs)} slice of {t.name} times element {_tuple(s.legs)} " \
                     f"of {s.name})"
            return _make("scaled_slices", "Scaled slices", action,
                         f"scaled slices of {t.name}", roles, words, prefix=False)
    if roles.dangling:
        return None
    kept_a = tuple(leg for leg in roles.kept if leg in sa)
    kept_b = tuple(leg for leg in roles.kept if leg in sb)
    if not roles.contracted:
        if kept_a and kept_b:
            action = f"Every element of {a.name} rescales a copy of {b.name}"
            yields = f"{_noun(len(kept_a) + len(kept_b))} of all pairwise products"
            return _make("outer_product", "Outer product", action, yields, roles, words)
        return None
    return _read_affinity(c, roles, words, kept_a, kept_b)


def _read_affinity(c: Contraction, roles: _Roles, words: _Words,
                   kept_a: tuple[str, ...], kept_b: tuple[str, ...]) -> Reading:
    """Binary contractions over shared legs: dot products of slices, and their hinted forms."""
    a, b = c.operands
    probs = [op for op in (a, b) if op.name in c.probabilities]
    if probs and a.name != b.name:
        weights = probs[0]
        values = b if weights is a else a
        kept_w = kept_a if weights is a else kept_b
        kept_v = kept_b if weights is a else kept_a
        w = words.slice(weights.name, kept_w)
        if kept_v:
            action = f"Convex combination of slices of {values.name} " \
                     f"(indexed by {_and(roles.contracted)}) weighted by probabilities in {w}"
            yields = f'"center of mass" of the slices of {values.name}'
        else:
            action = f"Convex combination of {values.name} scaled by probabilities " \
                     f"{'in ' if kept_w else ''}{w}"
            yields = f'"center of mass" of the elements of {values.name}'
        if kept_w:
            yields += f" for {words.each(kept_w)}"
        return _make("convex_combination", "Convex combination", action, yields, roles, words)

    sa, sb = words.slice(a.name, kept_a), words.slice(b.name, kept_b)
    cosine = a.name != b.name and {a.name, b.name} <= c.normalised
    if not kept_a and not kept_b:
        if a.name == b.name and a.legs == b.legs:
            action = f"Affinity of {a.name} with itself"
            yields = f"sum of squares of {a.name} (scalar)"
            return _make("squared_norm", "Squared norm", action, yields, roles, words)
        if cosine:
            action = f"Affinity of normalised vectors {a.name} and {b.name}"
            return _make("cosine_similarity", "Cosine similarity", action,
                         "normalised scalar in [-1, 1]", roles, words)
        if a.name == b.name:
            twin = "its transpose" if len(a.legs) == 2 else "a permutation of its legs"
            action = f'"Affinity" of {a.name} and {twin}'
        else:
            action = f'"Affinity" of {a.name} and {b.name}'
        text_yields = "unnormalised scalar"
        for unit, other in ((b, a), (a, b)):
            if unit.name in c.normalised and other.name not in c.normalised:
                text_yields += f": the length of the projection of {other.name} " \
                               f"onto the direction of {unit.name}"
                break
        return _make("dot_product", "Dot product", action, text_yields, roles, words)

    if cosine:
        action = f"Cosine similarity of {sa} and {sb}"
        kept = kept_a + kept_b
        yields = f"normalised scalar in [-1, 1] for {words.each(kept)}"
        return _make("cosine_similarity", "Cosine similarity", action, yields, roles, words)
    if not kept_a or not kept_b:
        matrix = a if kept_a else b
        action = f"Affinity of {sa} and {sb}"
        yields = f"unnormalised scalar for each slice of {matrix.name}"
        return _make("matrix_vector", "Matrix–vector product", action, yields, roles, words)
    action = f"Affinity of {sa} and {sb}"
    if a.name == b.name:
        yields = f"unnormalised scalar for each pair of slices of {a.name} (its Gram matrix)"
    else:
        yields = f"unnormalised scalar for each pair of slices of {a.name} and {b.name}"
    return _make("matrix_matrix", "Matrix–matrix product", action, yields, roles, words)


def _read_nary(c: Contraction, roles: _Roles, words: _Words) -> Reading | None:
    names = _and([op.name for op in c.operands])
    if all(not op.legs for op in c.operands):
        return _make("scalar_multiplication", "Scalar multiplication", f"Multiply {names}",
                     "product of the scalars", roles, words)
    so = set(c.output)
    if all(set(op.legs) == so for op in c.operands):
        action = f"Independently multiply matching elements of {names}"
        yields = f"{_noun(len(so))} of element-wise products"
        return _make("elementwise_product", "Element-wise product", action, yields, roles,
                     words, prefix=False)
    return None


def _read_generic(c: Contraction, roles: _Roles, words: _Words) -> Reading:
    names = _and(_unique(op.name for op in c.operands))
    if len(c.operands) == 1:
        parts = [f"Take the entries of {names}"]
    else:
        parts = [f"Multiply the entries of {names} that agree on shared legs"]
    for op in c.operands:
        rep = _unique(leg for leg in op.legs if op.legs.count(leg) > 1)
        if rep:
            parts.append(f"only the diagonal of {op.name} over {_and(rep)} is used "
                         f"(the repeated legs take equal values)")
    if roles.contracted:
        parts.append(f"sum over {_and(roles.contracted)} (contracted between operands)")
    if roles.dangling:
        parts.append(f"sum over {_and(roles.dangling)} (legs of a single operand: "
                     f"a sum of its slices)")
    if roles.batch:
        parts.append(f"batch legs {_and(roles.batch)} run through every operand: "
                     f"the same contraction is done independently for each")
    if roles.kept:
        parts.append(f"keep {_and(roles.kept)} free")
    action = "; ".join(parts)
    out = c.output
    yields = "scalar" if not out else f"{_noun(len(out))} over {_tuple(out)}"
    return Reading("generic", "Contraction", f"{action}. Yields: {yields}.",
                   contracted=roles.contracted + roles.dangling, kept=roles.kept,
                   batch=roles.batch)


# ---------------------------------------------------------------------------------------------
# Prose


def _make(kind: str, title: str, action: str, yields: str, roles: _Roles, words: _Words,
          batch: tuple[str, ...] | None = None, prefix: bool = True) -> Reading:
    """Assemble a reading. With batch legs and `prefix`, the kind becomes ``batched_<kind>``
    and the sentence is wrapped in "For each b"; element-wise kinds are batch-only by nature
    and pass ``prefix=False``."""
    batch = roles.batch if batch is None else batch
    kept = tuple(leg for leg in roles.kept + roles.batch if leg not in batch)
    if batch and prefix:
        kind = f"batched_{kind}"
        title = f"Batched {title[0].lower()}{title[1:]}"
        action = f"For {words.each(batch)}, independently: {_lower_first(action)}"
        yields = f"{yields}, for {words.each(batch)}"
    return Reading(kind, title, f"{action}. Yields: {yields}.",
                   contracted=roles.contracted + roles.dangling, kept=kept, batch=batch)


@dataclass(frozen=True)
class _Words:
    legend: Mapping[str, str] = field(default_factory=dict)

    def th(self, legs: Iterable[str]) -> str:
        """'j-th', '(k, s)-th'."""
        return f"{_tuple(legs)}-th"

    def slice(self, name: str, legs: tuple[str, ...]) -> str:
        """'j-th slice of A', or with a legend 'token t of q'; a bare name without legs."""
        if not legs:
            return name
        if all(leg in self.legend for leg in legs):
            return ", ".join(f"{self.legend[leg]} {leg}" for leg in legs) + f" of {name}"
        return f"{self.th(legs)} slice of {name}"

    def each(self, legs: tuple[str, ...]) -> str:
        """'each j', 'each pair (t, p)', 'each token t'."""
        if legs == (ELLIPSIS,):
            return "each leading batch index (...)"
        if all(leg in self.legend for leg in legs):
            inner = ", ".join(f"{self.legend[leg]} {leg}" for leg in legs)
            return f"each {inner}" if len(legs) == 1 else f"each ({inner})"
        if len(legs) == 2:
            return f"each pair {_tuple(legs)}"
        return f"each {_tuple(legs)}"


def _tuple(legs: Iterable[str]) -> str:
    legs = tuple(legs)
    return legs[0] if len(legs) == 1 else f"({', '.join(legs)})"


def _and(items: Iterable[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def _noun(order: int) -> str:
    return {0: "scalar", 1: "vector", 2: "matrix"}.get(order, f"order-{order} tensor")


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _lower_first(text: str) -> str:
    for i, ch in enumerate(text):
        if ch.isalpha():
            return text[:i] + ch.lower() + text[i + 1:]
    return text
