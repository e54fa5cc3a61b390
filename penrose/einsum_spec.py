"""Einsum specs: the one parser, with torch.einsum's rules plus penrose's batch legs.

The syntax, as torch.einsum reads it, with penrose's spaced word form:

    spec   := inputs [ "->" output ]         at most one "->"
    inputs := term { "," term }              one term per operand
    term   := { label | "..." }              at most one "..." per term, anywhere in it
    label  := [A-Za-z]                       letter form: spaces are ignored, as torch ignores them
            | [A-Za-z][A-Za-z0-9_]*          word form: labels apart by spaces ('tok emb, emb hd -> tok hd')

Reading (`lex`): a spec reads as letters, exactly as torch reads it, unless it holds a space
between two of its characters and its letters do not fit the operands (a term without '...'
whose letter count differs from its operand's leg count, or one with '...' and more letters
than legs) while its words do fit, or some term holds two spaced labels one of which is longer
than a letter. So every spec torch accepts reads as torch reads it, and a spec without spaces is
always letters.

Meaning (`resolve`), torch's, with penrose's batch legs:

- In a term, '...' covers the operand's declared legs that the labels do not name: labels before
  it bind the first legs, labels after it the last ones. It also covers a batched operand's batch
  dims, which always lie outermost. A batched operand whose term has no '...' gets an implicit
  leading one: batch legs come for free.
- The declared legs under '...' get the synthetic labels '...k', k counting from the right
  (k = 0 is the rightmost), so they broadcast across operands right-aligned, as torch's do.
- With '->', an output without '...' sums the ellipsis dims, and when some batched operand wrote
  an explicit '...' its batch dims are summed too (`sum_batch`); an output with '...' keeps them
  where it stands (batch dims still outermost). Without '->' the output is '...' (whenever any
  ellipsis dim exists; batch dims are always kept), then the labels used exactly once, sorted
  (uppercase before lowercase, as torch sorts).

A spec torch refuses is refused here with a `PenroseCheckError` placed on the offending
characters inside the spec string: `spec_span`.

Imports only `penrose.errors` and the standard library.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

from penrose.errors import NOWHERE, PenroseCheckError, Span

ELLIPSIS = "..."
LETTERS = frozenset(string.ascii_letters)
_WORD_CHARS = frozenset(string.ascii_letters + string.digits + "_")


def ellipsis_label(k: int) -> str:
    """The synthetic label of the k-th ellipsis dim from the right.

    >>> ellipsis_label(0)
    '...0'
    """
    return f"{ELLIPSIS}{k}"


def is_ellipsis_label(label: str) -> bool:
    """Whether a label stands for a dim under '...' (user labels never start with a dot)."""
    return label.startswith(ELLIPSIS)


def spec_span(span: Span, start: int, end: int | None = None) -> Span:
    """The span of characters start..end of a spec whose string literal (quotes included) is `span`.

    Strings have no escapes and sit on one line, so character i is at column span.col + 1 + i.
    """
    if not span.line:
        return span
    end = start + 1 if end is None or end <= start else end
    return Span(span.file, span.line, span.col + 1 + start, span.line, span.col + 1 + end, span.source_line)


@dataclass(frozen=True)
class Label:
    name: str
    start: int  # offsets into the spec
    end: int


@dataclass(frozen=True)
class Term:
    """One term as written: its labels, where '...' stands among them, its place in the spec."""

    labels: tuple[Label, ...]
    ellipsis: int | None  # how many labels stand before '...'; None without one
    ellipsis_at: int | None  # offset of '...' in the spec
    start: int  # offsets of the term's text without surrounding spaces
    end: int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(l.name for l in self.labels)


@dataclass(frozen=True)
class Parsed:
    """A spec read into terms, before it meets its operands."""

    text: str
    inputs: tuple[Term, ...]
    output: Term | None  # None without '->'
    words: bool  # read in the spaced word form


@dataclass(frozen=True)
class Einsum:
    """A spec resolved against its operands: the contract the checker hands on.

    `terms`: per operand, one label per declared leg, in leg order (synthetic '...k' under '...');
    `out`: the labels of the result's declared legs; `sum_batch`: batch dims are summed;
    `where`: per operand and leg, the (start, end) offsets of the characters that bind it.
    """

    parsed: Parsed
    terms: tuple[tuple[str, ...], ...]
    out: tuple[str, ...]
    sum_batch: bool
    width: int  # the most declared legs any '...' covers
    where: tuple[tuple[tuple[int, int], ...], ...]


# ---- reading ---------------------------------------------------------------------------------


def lex(text: str, span: Span = NOWHERE, leg_counts: Sequence[int] | None = None) -> Parsed:
    """Read a spec into terms, in the letter or word form (see the module docstring).

    `leg_counts` (the operands' declared leg counts) decides a spaced spec; without them a
    spaced spec reads as words when some label would be longer than one letter.

    >>> p = lex('ij,j...->i...')
    >>> [t.names for t in p.inputs], p.inputs[1].ellipsis, p.output.names
    ([('i', 'j'), ('j',)], 1, ('i',))
    >>> lex('tok emb, emb hd -> tok hd').inputs[0].names
    ('tok', 'emb')
    """
    letters, letters_error = _try(text, span, words=False)
    if " " not in text.strip(" "):
        if letters_error is not None:
            raise letters_error
        return letters
    words, words_error = _try(text, span, words=True)
    if letters is not None and words is not None and leg_counts is None:
        return words if any(len(l.name) > 1 for t in _all(words) for l in t.labels) else letters
    if letters is not None and _fits(letters, leg_counts):
        return letters
    if words is not None and (_fits(words, leg_counts) or _spaced_style(words)):
        return words
    if letters is not None:
        return letters
    if words is not None:
        return words
    multichar = any(len(tok) > 1 for tok in re.split(r"[ ,]|->", text.replace(ELLIPSIS, " ")))
    raise words_error if multichar else letters_error


def _try(text, span, words):
    try:
        return _lex(text, span, words), None
    except PenroseCheckError as err:
        return None, err


def _all(p: Parsed) -> tuple[Term, ...]:
    return p.inputs + ((p.output,) if p.output is not None else ())


def _fits(p: Parsed, leg_counts) -> bool:
    if leg_counts is None or len(p.inputs) != len(leg_counts):
        return False
    return all(
        len(t.labels) == n if t.ellipsis is None else len(t.labels) <= n for t, n in zip(p.inputs, leg_counts)
    )


def _spaced_style(p: Parsed) -> bool:
    """Some term holds two labels apart by spaces, one longer than a letter."""
    return any(len(t.labels) > 1 and any(len(l.name) > 1 for l in t.labels) for t in _all(p))


def _lex(text: str, span: Span, words: bool) -> Parsed:
    arrow = text.find("->")
    if arrow >= 0:
        second = text.find("->", arrow + 2)
        if second >= 0:
            raise PenroseCheckError("an einsum spec has at most one '->'", spec_span(span, second, second + 2))
    lhs_end = arrow if arrow >= 0 else len(text)
    inputs: list[Term] = []
    start = 0
    while True:
        comma = text.find(",", start, lhs_end)
        stop = comma if comma >= 0 else lhs_end
        inputs.append(_term(text, start, stop, f"term {len(inputs) + 1}", words, span))
        if comma < 0:
            break
        start = comma + 1
    output = _term(text, arrow + 2, len(text), "output", words, span) if arrow >= 0 else None
    return Parsed(text, tuple(inputs), output, words)


def _term(text: str, a: int, b: int, where: str, words: bool, span: Span) -> Term:
    labels: list[Label] = []
    ellipsis = ellipsis_at = None
    i = a
    while i < b:
        ch = text[i]
        if ch == " ":
            i += 1
            continue
        if ch == ".":
            run = i
            while run < b and text[run] == ".":
                run += 1
            if ellipsis is not None:
                raise PenroseCheckError(
                    f"a second '...' in einsum {where}; a term has at most one", spec_span(span, i, min(run, i + 3))
                )
            if run - i < 3:
                raise PenroseCheckError(f"'.' that is not part of '...' in einsum {where}", spec_span(span, i, run))
            ellipsis, ellipsis_at = len(labels), i
            i += 3
            continue
        if words and ch in _WORD_CHARS:
            j = i
            while j < b and text[j] in _WORD_CHARS:
                j += 1
            if ch not in LETTERS:
                raise PenroseCheckError(
                    f"invalid leg {text[i:j]!r} in the einsum spec ({where}); a leg word starts with a letter",
                    spec_span(span, i, j),
                )
            labels.append(Label(text[i:j], i, j))
            i = j
            continue
        if not words and ch in LETTERS:
            labels.append(Label(ch, i, i + 1))
            i += 1
            continue
        if ch == "," and where == "output":
            why = "the output is one term"
        elif ch in "->":
            why = "the arrow is '->', once"
        elif words:
            why = "legs are words of letters, digits and '_'"
        else:
            why = "a leg is one letter a-z or A-Z (or a word, in the spaced form 'tok emb, emb hd -> tok hd')"
        raise PenroseCheckError(f"invalid leg {ch!r} in the einsum spec ({where}); {why}", spec_span(span, i))
    body = text[a:b]
    lead = len(body) - len(body.lstrip(" "))
    trail = len(body.rstrip(" "))
    start, end = (a + lead, a + trail) if body.strip(" ") else (a, a)
    return Term(tuple(labels), ellipsis, ellipsis_at, start, end)


# ---- meaning ---------------------------------------------------------------------------------


def resolve(
    p: Parsed,
    leg_counts: Sequence[int],
    batched: Sequence[bool] = (),
    span: Span = NOWHERE,
    names: Sequence[str] = (),
    legs: Sequence[Sequence[str]] = (),
) -> Einsum:
    """Bind a read spec to operands with `leg_counts` declared legs (`batched`: may carry batch dims).

    `names` and `legs` (the operands' descriptions and leg names) only enrich error messages.

    >>> e = resolve(lex('i...->...'), [3], [True])
    >>> e.terms, e.out, e.sum_batch
    ((('i', '...1', '...0'),), ('...1', '...0'), False)
    >>> resolve(lex('...a->'), [1], [True]).sum_batch
    True
    """
    n = len(leg_counts)
    batched = tuple(batched) or (False,) * n
    text = p.text

    def op(i):
        desc = f" {names[i]}" if i < len(names) else ""
        return f"operand {i + 1}{desc}"

    if len(p.inputs) != n:
        if len(p.inputs) > n:  # from the comma before the first term too many
            a, b = text.rfind(",", 0, p.inputs[n].start), p.inputs[-1].end
        else:
            a, b = p.inputs[0].start, p.inputs[-1].end
        raise PenroseCheckError(
            f"the einsum spec has {len(p.inputs)} input term(s) but {n} operand(s) follow it", spec_span(span, a, b)
        )
    terms, where, width = [], [], 0
    for i, (t, k) in enumerate(zip(p.inputs, leg_counts)):
        m = len(t.labels)
        shown = text[t.start : t.end]
        if t.ellipsis is None and m != k or t.ellipsis is not None and m > k:
            have = f"{k}: [{', '.join(legs[i])}]" if i < len(legs) else str(k)
            besides = " besides '...'" if t.ellipsis is not None else ""
            only = "only " if t.ellipsis is not None else ""
            write = ""
            if i < len(legs) and t.ellipsis is None and legs[i]:
                named = "".join(legs[i]) if all(len(l) == 1 for l in legs[i]) else " ".join(legs[i])
                write = f"; write one label per leg, as '{named}', or '...' for the legs it leaves out"
            raise PenroseCheckError(
                f"einsum term {i + 1} '{shown}' has {m} leg(s){besides} but {op(i)} has {only}{have}{write}",
                spec_span(span, t.start, t.end),
            )
        if t.ellipsis is None:
            labels, at = t.names, tuple((l.start, l.end) for l in t.labels)
        else:
            w = k - m
            width = max(width, w)
            before, after = t.labels[: t.ellipsis], t.labels[t.ellipsis :]
            assert t.ellipsis_at is not None  # set together with t.ellipsis by _term
            dots = (t.ellipsis_at, t.ellipsis_at + 3)
            labels = tuple(l.name for l in before) + tuple(ellipsis_label(w - 1 - j) for j in range(w))
            labels += tuple(l.name for l in after)
            at = tuple((l.start, l.end) for l in before) + (dots,) * w + tuple((l.start, l.end) for l in after)
        terms.append(labels)
        where.append(at)
    counts: dict[str, int] = {}
    for t in p.inputs:
        for name in t.names:
            counts[name] = counts.get(name, 0) + 1
    dims = tuple(ellipsis_label(k) for k in reversed(range(width)))
    if p.output is None:
        out = dims + tuple(sorted(l for l, c in counts.items() if c == 1))
        sum_batch = False
    else:
        o = p.output
        seen: set[str] = set()
        for l in o.labels:
            if l.name in seen:
                raise PenroseCheckError(
                    f"output leg {l.name!r} appears twice in the einsum output", spec_span(span, l.start, l.end)
                )
            seen.add(l.name)
            if l.name not in counts:
                inputs = ", ".join(repr(n) for n in counts)
                raise PenroseCheckError(
                    f"output leg {l.name!r} appears in no input of the einsum; write only the inputs' labels "
                    f"({inputs}) after '->'", spec_span(span, l.start, l.end)
                )
        if o.ellipsis is None:
            out = o.names
            sum_batch = any(b and t.ellipsis is not None for b, t in zip(batched, p.inputs))
        else:
            out = o.names[: o.ellipsis] + dims + o.names[o.ellipsis :]
            sum_batch = False
    return Einsum(p, tuple(terms), tuple(out), sum_batch, width, tuple(where))


def parse(
    text: str,
    span: Span = NOWHERE,
    leg_counts: Sequence[int] = (),
    batched: Sequence[bool] = (),
    names: Sequence[str] = (),
    legs: Sequence[Sequence[str]] = (),
) -> Einsum:
    """Read and resolve a spec for operands with `leg_counts` declared legs.

    >>> e = parse('ij...,j->ij...', leg_counts=[3, 1])
    >>> e.terms, e.out
    ((('i', 'j', '...0'), ('j',)), ('i', 'j', '...0'))
    >>> parse('tok emb, emb hd -> tok hd', leg_counts=[2, 2]).out
    ('tok', 'hd')
    """
    return resolve(lex(text, span, leg_counts), leg_counts, batched, span, names, legs)


def label_text(label: str) -> str:
    """A label as an error message shows it.

    >>> label_text('i'), label_text('...0'), label_text('...1')
    ("'i'", "'...' (its last dim)", "'...' (dim 2 from its right)")
    """
    if not is_ellipsis_label(label):
        return repr(label)
    k = int(label[len(ELLIPSIS) :])
    return "'...' (its last dim)" if k == 0 else f"'...' (dim {k + 1} from its right)"


def respell(p: Parsed, renames: dict[str, str]) -> str:
    """The spec `p` with its labels renamed (in every term), as it was written otherwise; in the
    spaced word form when a new label is longer than a letter. The hints of the checker's
    messages write specs with it.

    >>> respell(lex('kd,de->ke'), {'e': 'd', 'd': 'a'})
    'ka,ad->kd'
    >>> respell(lex('kd,de->ke'), {'e': 'hd'})
    'k d, d hd -> k hd'
    """
    if not p.words and any(len(new) > 1 for new in renames.values()):
        def term(t: Term) -> str:
            names = [renames.get(n, n) for n in t.names]
            if t.ellipsis is not None:
                names.insert(t.ellipsis, ELLIPSIS)
            return " ".join(names)

        return ", ".join(term(t) for t in p.inputs) + (f" -> {term(p.output)}" if p.output is not None else "")
    out, at = [], 0
    for label in sorted((l for t in (*p.inputs, *([p.output] if p.output else [])) for l in t.labels), key=lambda l: l.start):
        out += [p.text[at:label.start], renames.get(label.name, label.name)]
        at = label.end
    return "".join(out) + p.text[at:]
