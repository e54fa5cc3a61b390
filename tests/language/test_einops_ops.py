"""rearrange / reduce / repeat against einops itself, in values and gradients (float64).

    (a) hypothesis draws einops patterns of every kind (permutations, splits on the left, merges on
        the right, both, `1` / `()` / `(1)` on the left, `...` on both sides and, for reduce, on
        the left only, repeat with new legs alone and inside groups, the five reductions) with
        sizes, writes the .pen program (dims, product dims, the input), and compares the compiled
        module, the standalone source and penrose.interpret with einops.rearrange / reduce /
        repeat on the same tensor, unbatched and with leading batch legs;
    (b) hand-written cases from einops' documentation;
    (c) refusals, each at its line and at the offending characters inside the pattern string.

Nothing here is an output penrose produced: every expected value comes from einops.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import einops
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import penrose
from penrose.errors import PenroseCheckError, PenroseError, PenroseShapeError
from penrose.interpreter import interpret as interpret_diagram

from sources import quiet, standalone

pytestmark = pytest.mark.usefixtures("one_thread")

REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")
EXAMPLES = 25 if REDUCED else 60
RTOL, ATOL = 1e-9, 1e-11

POOL = ["a", "b", "c", "e", "f", "g", "k", "u", "v", "p", "h1", "w2"]
REDUCTIONS = ["sum", "mean", "max", "min", "prod"]
BATCH = "zb"  # the axis name the reference gives the (flattened) batch legs


# ---- running a program ---------------------------------------------------------------------------


def value_and_grad(fn, x, weight=None):
    """fn(x) and the gradient of sum(fn(x) * weight) with respect to x (None for int/bool x)."""
    if not x.is_floating_point():
        return fn(x), None
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    if weight is None:
        return y, None
    (g,) = torch.autograd.grad((y * weight).sum(), [x], allow_unused=True)
    return y, torch.zeros_like(x) if g is None else g


def three_ways(text, x, reference, **sizes):
    """Compiled module, standalone source and interpreter each equal `reference(x)` (einops) in
    value and in the gradient of a random weighting of the output."""
    want, _ = value_and_grad(reference, x)
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(want.shape, generator=g, dtype=torch.float64) if x.is_floating_point() else None
    want, want_grad = value_and_grad(reference, x, weight)
    compiled = quiet(penrose.compile, text, seed=0, **sizes).double().eval()
    alone = standalone(text, **sizes).double().eval()
    checked = quiet(penrose.load, text, **sizes)
    impls = [
        ("compiled", compiled),
        ("standalone", alone),
        ("interpreter", lambda t: interpret_diagram(checked, t)),
    ]
    for what, fn in impls:
        got, grad = value_and_grad(fn, x, weight)
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, einops gives {tuple(want.shape)}"
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, einops gives {want.dtype}"
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what} value: {m}")
        if want_grad is not None:
            torch.testing.assert_close(grad, want_grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what} gradient: {m}")


def einops_call(kind, x, pattern, reduction=None, **lengths):
    if kind == "rearrange":
        return einops.rearrange(x, pattern, **lengths)
    if kind == "reduce":
        return einops.reduce(x, pattern, reduction, **lengths)
    return einops.repeat(x, pattern, **lengths)


def batched_reference(kind, pattern, reduction, lengths, batch, drops_batch):
    """einops on a tensor with leading batch legs: they are flattened into one axis named in the
    pattern (kept outermost, or reduced with the rest when `drops_batch`), then restored."""
    left, right = pattern.split("->")

    def ref(x):
        if not batch:
            return einops_call(kind, x, pattern, reduction, **lengths)
        flat = x.reshape(math.prod(batch), *x.shape[len(batch):])
        p = f"{BATCH} {left} -> {right}" if drops_batch else f"{BATCH} {left} -> {BATCH} {right}"
        y = einops_call(kind, flat, p, reduction, **lengths)
        return y if drops_batch else y.reshape(*batch, *y.shape[1:])

    return ref


# ---- (a) drawn patterns --------------------------------------------------------------------------


@dataclass
class Case:
    kind: str
    pattern: str
    reduction: str | None
    text: str
    shape: tuple  # the declared shape of x
    lengths: dict  # every named axis' size, for einops
    left_dots: bool
    right_dots: bool

    def __repr__(self):
        return f"Case({self.kind}, {self.pattern!r}, {self.reduction!r}, lengths={self.lengths}, shape={self.shape})\n{self.text}"


def _cut(draw, seq):
    """seq cut into consecutive non-empty groups."""
    groups, cur = [], []
    for i, n in enumerate(seq):
        cur.append(n)
        if i == len(seq) - 1 or draw(st.booleans()):
            groups.append(cur)
            cur = []
    return groups


@st.composite
def einops_cases(draw, kinds=("rearrange", "reduce", "repeat")):
    kind = draw(st.sampled_from(kinds))
    n = draw(st.integers(1, 4))
    names = draw(st.lists(st.sampled_from(POOL), min_size=n, max_size=n, unique=True))
    sizes = {nm: draw(st.integers(1, 3)) for nm in names}
    sp = draw(st.sampled_from([" ", " ", " ", "  "]))  # the space between entries

    def show(names_, side):
        """One group's text: a bare name, or parentheses (with a `1` inside, sometimes)."""
        inner = list(names_)
        if len(inner) == 1 and not draw(st.integers(0, 6)) == 0:
            return inner[0]
        if draw(st.integers(0, 6)) == 0:
            inner.insert(draw(st.integers(0, len(inner))), "1")
        if draw(st.integers(0, 8)) == 0:
            return "( " + " ".join(inner) + " )"
        return "(" + " ".join(inner) + ")"

    # the left side: every name once, cut into groups; unit legs; perhaps '...'
    left = [("names", g) for g in _cut(draw, draw(st.permutations(names)))]
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        left.insert(draw(st.integers(0, len(left))), ("unit", draw(st.sampled_from(["1", "()", "(1)"]))))
    dots = draw(st.integers(0, 2)) == 0
    n_dots = draw(st.integers(0, 2)) if dots else 0
    dot_sizes = [draw(st.integers(1, 3)) for _ in range(n_dots)]
    if dots:
        left.insert(draw(st.integers(0, len(left))), ("dots",))

    # the right side
    new = []
    if kind == "rearrange":
        kept = list(draw(st.permutations(names)))
    elif kind == "reduce":
        kept = list(draw(st.permutations(names)))[: draw(st.integers(0, n))]
    else:
        spare = [nm for nm in POOL if nm not in names]
        new = draw(st.lists(st.sampled_from(spare), min_size=1, max_size=2, unique=True))
        for nm in new:
            sizes[nm] = draw(st.integers(1, 3))
        kept = list(draw(st.permutations(names + new)))
    right = [("names", g) for g in _cut(draw, kept)] if kept else []
    for _ in range(draw(st.sampled_from([0, 0, 0, 1]))):  # a new leg of size one: `b c h w -> b c 1 1`
        right.insert(draw(st.integers(0, len(right))), ("unit", draw(st.sampled_from(["1", "()"]))))
    right_dots = dots and (kind != "reduce" or draw(st.booleans()))
    if right_dots:
        right.insert(draw(st.integers(0, len(right))), ("dots",))
    reduction = draw(st.sampled_from(REDUCTIONS)) if kind == "reduce" else None

    # the diagram: dims, the product dims every group needs, the input's legs
    products: dict = {}  # names tuple -> dim name
    joined: dict = {}  # names tuple -> the dim named by the names run together, declared by its size

    def product(group):
        group = tuple(group)
        if group not in products and group not in joined:
            if draw(st.integers(0, 3)) == 0:  # `dim ab = 6`: the names run together name the leg
                joined[group] = "".join(group)
            else:
                products[group] = f"m{len(products)}"
        return products.get(group) or joined[group]

    legs, shape = [], []
    for entry in left:
        if entry[0] == "unit":
            legs.append("one")
            shape.append(1)
        elif entry[0] == "dots":
            legs += [f"z{i}" for i in range(n_dots)]
            shape += dot_sizes
        else:
            g = entry[1]
            legs.append(g[0] if len(g) == 1 else product(g))
            size = 1
            for nm in g:
                size *= sizes[nm]
            shape.append(size)
    for entry in right:
        if entry[0] == "names" and len(entry[1]) > 1:
            product(entry[1])

    def side(entries, which):
        out = []
        for entry in entries:
            out.append(entry[1] if entry[0] == "unit" else "..." if entry[0] == "dots" else show(entry[1], which))
        return sp.join(out)

    arrow = draw(st.sampled_from([" -> ", " -> ", "->", "  ->  "]))
    pattern = f"{side(left, 'left')}{arrow}{side(right, 'right')}"
    decl = [f"dim {', '.join(f'{nm} = {s}' for nm, s in sizes.items())}"]
    decl += [f"dim {d} = {' * '.join(g)}" for g, d in products.items()]
    decl += [f"dim {d} = {math.prod(sizes[nm] for nm in g)}" for g, d in joined.items()]
    if any(e[0] == "unit" for e in left):
        decl.append("dim one = 1")
    if n_dots:
        decl.append("dim " + ", ".join(f"z{i} = {s}" for i, s in enumerate(dot_sizes)))
    call = f"{kind}(x, '{pattern}'" + (f", '{reduction}')" if reduction else ")")
    text = "\n".join(decl + [f"input x[{', '.join(legs)}]", f"y = {call}", "output y"]) + "\n"
    return Case(kind, pattern, reduction, text, tuple(shape), dict(sizes), dots, right_dots)


def check_case(case: Case, batch: tuple, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch + case.shape, generator=g, dtype=torch.float64)
    drops = case.kind == "reduce" and case.left_dots and not case.right_dots
    ref = batched_reference(case.kind, case.pattern, case.reduction, case.lengths, batch, drops and bool(batch))
    three_ways(case.text, x, ref)


@settings(max_examples=EXAMPLES, deadline=None)
@given(einops_cases(), st.sampled_from([(), (2,), (2, 3)]))
def test_drawn_patterns_match_einops(case, batch):
    check_case(case, batch)


@settings(max_examples=max(EXAMPLES // 2, 10), deadline=None)
@given(einops_cases(kinds=("reduce",)), st.sampled_from([(), (3,), (1, 2)]))
def test_drawn_reductions_match_einops(case, batch):
    check_case(case, batch, seed=1)


@settings(max_examples=max(EXAMPLES // 2, 10), deadline=None)
@given(einops_cases(kinds=("repeat",)), st.sampled_from([(), (2,)]))
def test_drawn_repeats_match_einops(case, batch):
    check_case(case, batch, seed=2)


def test_the_strategy_draws_every_kind():
    """The strategy covers what it promises: each kind of entry and each reduction turns up."""
    seen = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(einops_cases())
    def collect(case):
        p = case.pattern
        left, right = p.split("->")
        seen.add(case.kind)
        if case.reduction:
            seen.add(case.reduction)
        if "(" in left and any(len(t.split()) > 1 for t in left.split("(")[1:]):
            seen.add("split")
        if "(" in right:
            seen.add("merge")
        if "1" in left.replace("h1", "") or "()" in left:
            seen.add("unit")
        if "..." in left and "..." in right:
            seen.add("dots both")
        if "..." in left and "..." not in right:
            seen.add("dots left only")
        if case.kind == "repeat" and "(" in right:
            seen.add("repeat in group")

    collect()
    want = {"rearrange", "reduce", "repeat", *REDUCTIONS, "split", "merge", "unit", "dots both", "dots left only", "repeat in group"}
    assert want <= seen, f"never drawn: {sorted(want - seen)}"


# ---- (b) einops' documentation -------------------------------------------------------------------

# (dims, legs of x, call, einops call on x, name); dims are declared as written
DOCS = [
    ("b = 2, h = 3, w = 4, c = 3", "b, h, w, c", "rearrange(x, 'b h w c -> b h w c')",
     lambda x: einops.rearrange(x, "b h w c -> b h w c"), "identity"),
    ("b = 2, h = 3, w = 4, c = 3", "b, h, w, c", "rearrange(x, 'b h w c -> b c h w')",
     lambda x: einops.rearrange(x, "b h w c -> b c h w"), "transpose"),
    ("b = 2, h = 3, w = 4, c = 3\ndim bh = b * h", "b, h, w, c", "rearrange(x, 'b h w c -> (b h) w c')",
     lambda x: einops.rearrange(x, "b h w c -> (b h) w c"), "concatenate along height"),
    ("b = 2, h = 3, w = 4, c = 3\ndim bw = b * w", "b, h, w, c", "rearrange(x, 'b h w c -> h (b w) c')",
     lambda x: einops.rearrange(x, "b h w c -> h (b w) c"), "concatenate along width"),
    ("b = 2, h = 3, w = 4, c = 3\ndim chw = c * h * w", "b, h, w, c", "rearrange(x, 'b h w c -> b (c h w)')",
     lambda x: einops.rearrange(x, "b h w c -> b (c h w)"), "flatten each image"),
    ("b = 2, h1 = 2, h = 3, w1 = 2, w = 2, c = 3\ndim H = h1 * h, W = w1 * w\ndim bhw = b * h1 * w1", "b, H, W, c",
     "rearrange(x, 'b (h1 h) (w1 w) c -> (b h1 w1) h w c')",
     lambda x: einops.rearrange(x, "b (h1 h) (w1 w) c -> (b h1 w1) h w c", h1=2, w1=2), "split into four"),
    ("b = 2, h = 3, h1 = 2, w = 2, w1 = 2, c = 3\ndim H = h * h1, W = w * w1\ndim chw = c * h1 * w1", "b, H, W, c",
     "rearrange(x, 'b (h h1) (w w1) c -> b h w (c h1 w1)')",
     lambda x: einops.rearrange(x, "b (h h1) (w w1) c -> b h w (c h1 w1)", h1=2, w1=2), "space to depth"),
    ("t = 4, b = 3, c = 5", "t, b, c", "reduce(x, 't b c -> b c', 'max')",
     lambda x: einops.reduce(x, "t b c -> b c", "max"), "max over the first axis"),
    ("b = 2, c = 3, h1 = 2, h2 = 2, w1 = 3, w2 = 2\ndim H = h1 * h2, W = w1 * w2", "b, c, H, W",
     "reduce(x, 'b c (h1 h2) (w1 w2) -> b c h1 w1', 'max')",
     lambda x: einops.reduce(x, "b c (h1 h2) (w1 w2) -> b c h1 w1", "max", h2=2, w2=2), "2d max pooling"),
    ("b = 2, c = 3, h = 4, h2 = 2, w = 3, w2 = 2\ndim H = h * h2, W = w * w2", "b, c, H, W",
     "reduce(x, 'b c (h h2) (w w2) -> b c h w', 'max')",
     lambda x: einops.reduce(x, "b c (h h2) (w w2) -> b c h w", "max", h2=2, w2=2), "max pooling, h h2 order"),
    ("b = 2, c = 3, h = 4, w = 5", "b, c, h, w", "reduce(x, 'b c h w -> b c', 'mean')",
     lambda x: einops.reduce(x, "b c h w -> b c", "mean"), "global average pooling"),
    ("b = 2, h = 2, h2 = 2, w = 3, w2 = 2, c = 3\ndim H = h * h2, W = w * w2\ndim bw = b * w", "b, H, W, c",
     "reduce(x, 'b (h h2) (w w2) c -> h (b w) c', 'mean')",
     lambda x: einops.reduce(x, "b (h h2) (w w2) c -> h (b w) c", "mean", h2=2, w2=2), "pool and concatenate"),
    ("h = 3, w = 4, c = 3", "h, w", "repeat(x, 'h w -> h w c')",
     lambda x: einops.repeat(x, "h w -> h w c", c=3), "grayscale to rgb"),
    ("h = 3, w = 4, rep = 2\ndim H = rep * h", "h, w", "repeat(x, 'h w -> (rep h) w')",
     lambda x: einops.repeat(x, "h w -> (rep h) w", rep=2), "repeat along height"),
    ("h = 3, w = 4, h2 = 2, w3 = 3\ndim H = h2 * h, W = w3 * w", "h, w", "repeat(x, 'h w -> (h2 h) (w3 w)')",
     lambda x: einops.repeat(x, "h w -> (h2 h) (w3 w)", h2=2, w3=3), "tile"),
    ("h = 3, w = 4, h2 = 2, w2 = 2\ndim H = h * h2, W = w * w2", "h, w", "repeat(x, 'h w -> (h h2) (w w2)')",
     lambda x: einops.repeat(x, "h w -> (h h2) (w w2)", h2=2, w2=2), "upsample 2x"),
    ("h = 2, h2 = 2, w = 2, w2 = 3\ndim H = h * h2, W = w * w2", "H, W", "repeat(reduce(x, '(h h2) (w w2) -> h w', 'mean'), 'h w -> (h h2) (w w2)')",
     lambda x: einops.repeat(einops.reduce(x, "(h h2) (w w2) -> h w", "mean", h2=2, w2=3), "h w -> (h h2) (w w2)", h2=2, w2=3),
     "pixelate"),
    # einops' tests: identity and equivalent patterns (test_ops.py)
    ("a = 2, b = 3, c = 1, d = 2, e = 3", "a, b, c, d, e", "rearrange(x, '...->...')",
     lambda x: einops.rearrange(x, "...->..."), "identity by ellipsis"),
    ("a = 2, b = 3, c = 1, d = 2, e = 3", "a, b, c, d, e", "rearrange(x, 'a b c d e ...-> ... a b c d e')",
     lambda x: einops.rearrange(x, "a b c d e ...-> ... a b c d e"), "empty ellipsis"),
    ("a = 2, b = 3, c = 1, d = 2, e = 3", "a, b, c, d, e", "rearrange(x, 'a ... e-> a ... e')",
     lambda x: einops.rearrange(x, "a ... e-> a ... e"), "ellipsis in the middle"),
    ("a = 2, b = 3, c = 1, d = 2, e = 3\ndim ab = a * b", "a, b, c, d, e", "rearrange(x, 'a b ... -> (a b) ... ')",
     lambda x: einops.rearrange(x, "a b ... -> (a b) ... "), "merge before an ellipsis"),
    ("a = 2, b = 3, c = 1, d = 2, e = 3\ndim cd = c * d", "a, b, c, d, e", "rearrange(x, '... c d e -> ... (c d) e')",
     lambda x: einops.rearrange(x, "... c d e -> ... (c d) e"), "merge after an ellipsis"),
    ("a = 2, b = 3, c = 1, d = 2, e = 3", "a, b, c, d, e", "reduce(x, ' ... ->  ', 'sum')",
     lambda x: einops.reduce(x, " ... ->  ", "sum"), "reduce everything by ellipsis"),
    ("a = 2, b = 3, c = 1, d = 2, e = 3\ndim ea = e * a", "a, b, c, d, e", "reduce(x, 'a ... e -> (e a)', 'max')",
     lambda x: einops.reduce(x, "a ... e -> (e a)", "max"), "reduce the ellipsis, merge the rest"),
    ("a = 2, b = 3, c = 1, d = 2, e = 3\ndim ae = a * e", "a, b, c, d, e", "reduce(x, ' a b c d e ... -> d (a e) ', 'prod')",
     lambda x: einops.reduce(x, " a b c d e ... -> d (a e) ", "prod"), "an empty ellipsis reduced"),
    # '(...)' and '(a ...)' on the right merge the ellipsis' legs (einops' test_ops.py); regression:
    # they were refused ("would merge legs into one without a name") even with the dim declared
    ("a = 2, b = 3, c = 2, d = 2, e = 3\ndim abcde = a * b * c * d * e", "a, b, c, d, e", "rearrange(x, '... ->  (...)')",
     lambda x: einops.rearrange(x, "... ->  (...)"), "merge the whole ellipsis"),
    ("a = 2, b = 3, c = 2, d = 2, e = 3", "a, b, c, d, e", "rearrange(x, 'a ... c d e -> a (...) c d e')",
     lambda x: einops.rearrange(x, "a ... c d e -> a (...) c d e"), "merge an ellipsis of one leg"),
    ("a = 2, b = 3, c = 2, d = 2, e = 3\ndim cde = c * d * e", "a, b, c, d, e", "rearrange(x, 'a b ... -> b (...) a')",
     lambda x: einops.rearrange(x, "a b ... -> b (...) a"), "merge the ellipsis between names"),
    ("a = 2, b = 3, c = 2, d = 2, e = 3\ndim acd = a * c * d", "a, b, c, d, e", "rearrange(x, 'a b ... e -> b (a ...) e')",
     lambda x: einops.rearrange(x, "a b ... e -> b (a ...) e"), "merge a name with the ellipsis"),
    ("a = 2, b = 3, c = 2, d = 2, e = 3\ndim ab = a * b", "a, b, c, d, e", "reduce(x, ' ... c d e  -> (...) ', 'max')",
     lambda x: einops.reduce(x, " ... c d e  -> (...) ", "max"), "reduce and merge the ellipsis"),
    ("a = 2, b = 3, c = 2, d = 2, e = 3\ndim bcd = b * c * d", "a, b, c, d, e", "reduce(x, 'a ... e -> (...)', 'min')",
     lambda x: einops.reduce(x, "a ... e -> (...)", "min"), "reduce the ends, merge the ellipsis"),
    ("a = 2, b = 3, c = 2, k = 3\ndim abc = a * b * c", "a, b, c", "repeat(x, '...  -> k (...)')",
     lambda x: einops.repeat(x, "...  -> k (...)", k=3), "repeat and merge the ellipsis"),
    ("a = 2, b = 3", "a, b", "rearrange(x, 'a b ... -> a b (...)')",
     lambda x: einops.rearrange(x, "a b ... -> a b (...)"), "merge an empty ellipsis into a unit leg"),
    # einops' axis lengths as keywords, and reduce's reduction by keyword (regression: refused as
    # "takes no keyword arguments")
    ("t = 5, h = 2, d = 3\ndim hd = h * d", "t, hd", "rearrange(x, 't (h d) -> h t d', h=2)",
     lambda x: einops.rearrange(x, "t (h d) -> h t d", h=2), "axis lengths as keywords"),
    ("t = 5, h, d = 3\ndim hd = 6", "t, hd", "rearrange(x, 't (h d) -> h t d', h=2)",
     lambda x: einops.rearrange(x, "t (h d) -> h t d", h=2), "an axis length gives a dim its size"),
    ("t = 5, hd = 6", "t, hd", "reduce(x, 't hd -> hd', reduction='max')",
     lambda x: einops.reduce(x, "t hd -> hd", reduction="max"), "the reduction by keyword"),
    ("t = 5, hd = 6, k = 4", "t, hd", "repeat(x, 't hd -> t hd k', k=4)",
     lambda x: einops.repeat(x, "t hd -> t hd k", k=4), "a new leg's length as a keyword"),
    # the issue's own example and the naming rules of merged legs
    ("t = 5, h = 2, d = 3\ndim hd = h * d", "t, hd", "rearrange(x, 't (h d) -> h t d')",
     lambda x: einops.rearrange(x, "t (h d) -> h t d", h=2), "the issue's example"),
    ("t = 5, h = 2, d = 3\ndim hd = 6", "t, hd", "rearrange(rearrange(x, 't (h d) -> t h d'), 't h d -> t (h d)')",
     lambda x: x, "merged into the dim named by the names run together"),
    ("t = 5, h = 2, d = 3\ndim q = 6", "t, q", "rearrange(rearrange(x, 't (h d) -> t h d'), 't h d -> (h d) t')",
     lambda x: x.T, "merged into the only dim of that size"),
    ("b = 2, c = 3, h = 2, w = 2", "b, c, h, w", "x - repeat(reduce(x, 'b c h w -> b c', 'mean'), 'b c -> b c h w')",
     lambda x: x - einops.reduce(x, "b c h w -> b c () ()", "mean"), "subtracting the per-image mean"),
    # einops' documentation writes unit legs on the right (keepdims): 'b c h w -> b c 1 1'
    ("b = 2, c = 3, h = 2, w = 2", "b, c, h, w", "reduce(x, 'b c h w -> b c 1 1', 'mean')",
     lambda x: einops.reduce(x, "b c h w -> b c 1 1", "mean"), "keepdims with 1"),
    ("b = 2, c = 3, h = 2, w = 2", "b, c, h, w", "reduce(x, 'b c h w -> b c () ()', 'mean')",
     lambda x: einops.reduce(x, "b c h w -> b c () ()", "mean"), "keepdims with ()"),
    ("b = 2, c = 3, h = 2, w = 2", "b, c, h, w", "reduce(x, 'b c h w -> 1 c 1 1', 'mean')",
     lambda x: einops.reduce(x, "b c h w -> 1 c 1 1", "mean"), "subtracting the mean over the batch"),
    ("b = 2, h = 3, w = 2, c = 3", "b, h, w, c", "rearrange(x, 'b h w c -> b 1 h w 1 c')",
     lambda x: einops.rearrange(x, "b h w c -> b 1 h w 1 c"), "rearrange adds unit legs"),
]


def _doc_text(dims, legs, call):
    return f"dim {dims}\ninput x[{legs}]\ny = {call}\noutput y\n"


@pytest.mark.parametrize("dims, legs, call, ref, name", DOCS, ids=[d[-1] for d in DOCS])
@pytest.mark.parametrize("batch", [(), (2,)], ids=["unbatched", "batched"])
def test_einops_documentation(dims, legs, call, ref, name, batch):
    text = _doc_text(dims, legs, call)
    checked = quiet(penrose.load, text)
    shape = tuple(checked.size(c) for c in checked.inputs[0].type.cls)
    x = torch.randn(batch + shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    m = re.fullmatch(r"reduce\(x, '([^']*)', '(\w+)'\)", call)
    drops = m is not None and "..." in m.group(1).split("->")[0] and "..." not in m.group(1).split("->")[1]

    def per_element(t):
        if not batch:
            return ref(t)
        each = torch.stack([ref(t[i]) for i in range(batch[0])])
        if drops:  # '...' on the left only: the batch legs are reduced with the rest
            return einops.reduce(each, "zb ... -> ...", m.group(2))
        return each

    three_ways(text, x, per_element)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_rearrange_and_repeat_keep_int_and_bool(dtype):
    """rearrange and repeat move entries, whatever their dtype."""
    suffix = " : int" if dtype == torch.int64 else " : bool"
    text = "dim t = 3, h = 2, d = 2, k = 2\ndim hd = h * d\ninput x[t, hd]" + suffix + "\n" \
        "y = repeat(rearrange(x, 't (h d) -> d t h'), 'd t h -> d k t h')\noutput y\n"
    x = (torch.arange(12).reshape(3, 4) % 5) if dtype == torch.int64 else torch.rand(3, 4) > 0.5
    want = einops.repeat(einops.rearrange(x, "t (h d) -> d t h", h=2), "d t h -> d k t h", k=2)
    for fn in (quiet(penrose.compile, text), standalone(text).double().eval(), lambda t: interpret_diagram(text, t)):
        got = fn(x)
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_sizes_come_from_the_dims_and_their_overrides():
    """compile(..., h=3) changes the split: the pattern reads the dims' sizes."""
    text = "dim t = 2, h = 2, d = 3\ndim hd = h * d\ninput x[t, hd]\ny = rearrange(x, 't (h d) -> d t h')\noutput y\n"
    x = torch.randn(2, 9, dtype=torch.float64)
    three_ways(text, x, lambda t: einops.rearrange(t, "t (h d) -> d t h", h=3), h=3)


def test_a_pattern_inside_a_block():
    text = """\
dim t = 3, h = 2, d = 2
dim hd = h * d
block heads(x[t, hd]) {
  return rearrange(x, 't (h d) -> h t d')
}
input z[t, hd]
y = heads(z)
output y
"""
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    three_ways(text, x, lambda t: einops.rearrange(t, "b t (h d) -> b h t d", h=2))


def test_reduce_with_dots_on_the_left_only_reduces_the_batch_too():
    """'... e -> e' on a batched x reduces the batch legs with the rest (the issue's rule)."""
    text = "dim a = 2, e = 3\ninput x[a, e]\ny = reduce(x, '... e -> e', 'sum')\noutput y\n"
    x = torch.randn(4, 5, 2, 3, dtype=torch.float64)
    three_ways(text, x, lambda t: einops.reduce(t, "... e -> e", "sum"))
    text2 = "dim a = 2, e = 3\ninput x[a, e]\ny = reduce(x, 'a e -> e', 'max')\noutput y\n"
    three_ways(text2, x, lambda t: einops.reduce(t, "b1 b2 a e -> b1 b2 e", "max"))


def test_one_unknown_factor_of_a_split_comes_from_the_leg():
    """'(h d)' on a leg of size 6 with h = 2 and d declared without a size: einops infers d = 3
    (the checker accepts one unknown factor when the leg's size is known); so must penrose."""
    text = "dim t = 2, m = 6, h = 2, d\ninput x[t, m]\ny = rearrange(x, 't (h d) -> t h d')\noutput y\n"
    x = torch.randn(2, 6, dtype=torch.float64)
    three_ways(text, x, lambda t: einops.rearrange(t, "... t (h d) -> ... t h d", h=2))


def test_a_split_of_a_free_leg_of_another_size_is_a_shape_error():
    """m has no size: it is read from the input; a leg of 7 cannot be split into (h d) = 6, and
    every implementation says so with PenroseShapeError, never a torch error."""
    text = "dim t, m, h = 2, d = 3\ninput x[t, m]\ny = rearrange(x, 't (h d) -> t h d')\noutput y\n"
    compiled = quiet(penrose.compile, text)
    ok = torch.randn(4, 6)
    torch.testing.assert_close(compiled(ok), einops.rearrange(ok, "t (h d) -> t h d", h=2))
    for fn in (compiled, lambda t: interpret_diagram(text, t)):  # the compiled module, the interpreter
        with pytest.raises(PenroseShapeError):
            fn(torch.randn(4, 7))


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_reducing_an_empty_batch_is_a_shape_error(reduction):
    """'... a -> a' reduces the batch legs too: with no batch entries there is nothing to take
    the max of; compiled module and interpreter both raise PenroseShapeError."""
    text = f"dim a = 2\ninput x[a]\ny = reduce(x, '... a -> a', '{reduction}')\noutput y\n"
    x = torch.randn(0, 2)
    for what, fn in (("compiled", quiet(penrose.compile, text)), ("interpreter", lambda t: interpret_diagram(text, t))):
        try:
            fn(x)
        except PenroseShapeError:
            continue
        except Exception as e:  # noqa: BLE001 - which kind of failure is the point
            raise AssertionError(f"{what} raises {type(e).__name__}: {e}") from None
        raise AssertionError(f"{what} reduces an empty batch without an error")


# ---- (c) refusals, at the characters inside the pattern ------------------------------------------

HEAD = "dim t = 5, h = 2, d = 3, k = 4\ndim hd = h * d\ninput x[t, hd]\n"

# (statement, offending characters, which occurrence of them from the pattern's opening quote on (0: the
# first), words of the message)
REFUSALS = [
    ("y = rearrange(x, 't (h q) -> h t q')", "q", 0, "unknown"),
    ("y = rearrange(x, 't hd -> hd tt')", "tt", 0, "unknown"),
    ("y = rearrange(x, 't (h k) -> h t k')", "(h k)", 0, "size"),
    ("y = rearrange(x, '(h d) hd -> h d hd')", "(h d)", 0, "size"),
    ("y = rearrange(x, 't hd -> t')", "hd", 0, "not on the right"),
    ("y = repeat(x, 't hd -> hd')", "t", 0, "not on the right"),
    ("y = repeat(x, 't (h d) -> t h k')", "d", 0, "not on the right"),
    ("y = rearrange(x, 't hd -> t hd k')", "k", 0, "not on the left"),
    ("y = reduce(x, 't hd -> k', 'sum')", "k", 0, "not on the left"),
    ("y = rearrange(x, 't (h h) -> t h')", "h", 1, "twice"),
    ("y = rearrange(x, 't hd -> hd hd')", "hd", 2, "twice"),
    ("y = reduce(x, 't hd -> t', 'avg')", "'avg'", 0, "reduction"),
    ("y = reduce(x, 't hd -> t', 'Sum')", "'Sum'", 0, "reduction"),
    ("y = rearrange(x, '... hd -> hd')", "...", 0, "..."),
    ("y = repeat(x, '... hd -> hd k')", "...", 0, "..."),
    ("y = rearrange(x, 't hd -> ... hd')", "...", 0, "..."),
    ("y = reduce(x, 't hd -> ... hd', 'sum')", "...", 0, "..."),
    ("y = rearrange(x, 't ((h) d) -> t h d')", "(", 1, "nest"),
    ("y = rearrange(x, 't (h d -> t h d')", "(", 0, "never closed"),
    ("y = rearrange(x, 't h d) -> t h d')", ")", 0, "closes no group"),
    ("y = rearrange(x, 't hd -> (t hd')", "(", 0, "never closed"),
    ("y = rearrange(x, 't hd -> t) hd')", ")", 0, "closes no group"),
    ("y = rearrange(x, 't 2 -> t')", "2", 0, "name"),
    ("y = rearrange(x, 't (h 3) -> t h')", "3", 0, "name"),
    ("y = rearrange(x, 't hd')", "t hd", 0, "->"),
    ("y = reduce(x, 't hd', 'sum')", "t hd", 0, "->"),
    ("y = rearrange(x, 't hd -> t -> hd')", "->", 1, "second"),
    ("y = rearrange(x, 't .. -> t')", ".", 0, "'.'"),
    ("y = rearrange(x, 't hd -> t hd!')", "!", 0, "not part"),
    ("y = rearrange(x, 't ... ... -> t ...')", "...", 1, "twice"),
    ("y = rearrange(x, 't 1 -> t')", "1", 0, "size 1"),
    ("y = rearrange(x, '(...) hd -> hd')", "(...)", 0, "..."),
    ("y = rearrange(x, 't (h d) -> h t d', h=3)", "3", 0, "h=3, but dim 'h' has size 2"),
    ("y = rearrange(x, 't hd -> t hd', q=2)", "2", 0, "q= names no leg of the pattern"),
    ("y = reduce(x, 't hd -> hd', 'sum', reduction='mean')", "'mean'", 0, "given twice"),
    ("y = rearrange(x, '... -> (...)')", "(...)", 0, "declare it: dim thd = t * hd"),
    ("y = rearrange(x, 't (h d) -> (t h) d')", "(t h)", 0, "size 10"),
    ("y = rearrange(x, 't hd -> t hd x')", "x", 0, "unknown"),  # the tensor's name is no dim
]


def _offset(line, sub, occurrence):
    """The 1-based column of the given occurrence of sub in line, counted from the pattern's
    opening quote."""
    at = line.index("'") - 1
    for _ in range(occurrence + 1):
        at = line.index(sub, at + 1)
    return at + 1


@pytest.mark.parametrize("stmt, sub, occurrence, words", REFUSALS, ids=[r[0][4:] for r in REFUSALS])
def test_refusal_points_inside_the_pattern(stmt, sub, occurrence, words):
    text = HEAD + stmt + "\noutput y\n"
    line_no = text.count("\n", 0, text.index(stmt)) + 1
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    e = info.value
    col = _offset(stmt, sub, occurrence)
    assert (e.line, e.col) == (line_no, col), f"at {e.line}:{e.col}, not {line_no}:{col} ({sub!r}): {e}"
    assert e.span.end_line == line_no and e.span.end_col == col + len(sub), f"the caret covers {stmt[e.col - 1:e.span.end_col - 1]!r}, not {sub!r}: {e}"
    assert words.lower() in str(e).lower(), str(e)
    # the same refusal from compile, and nothing reaches torch
    with pytest.raises(PenroseCheckError):
        penrose.compile(text)


@pytest.mark.parametrize("stmt", ["y = rearrange(x, 't hd k -> t hd k')", "y = rearrange(x, 't -> t')",
                                  "y = reduce(x, 'a b c ... -> a', 'sum')"])
def test_left_side_with_the_wrong_number_of_legs(stmt):
    """The caret starts at the left side of the pattern and stays on it."""
    text = HEAD + "dim a = 1, b = 1, c = 1\n" + stmt + "\noutput y\n"
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    e = info.value
    start = stmt.index("'") + 2
    left_end = stmt.index("->") + 1
    assert e.line == 5 and e.col == start and e.span.end_col <= left_end, e.render()
    assert "left side" in str(e)


def test_a_merge_into_one_of_several_dims_of_its_size_is_ambiguous():
    """(h d) merges into a leg of size 6; q and r both have that size and neither is declared as
    h * d: refused at the group."""
    stmt = "y = rearrange(x, 't h d -> t (h d)')"
    text = "dim t = 3, h = 2, d = 3, q = 6, r = 6\ninput x[t, h, d]\n" + stmt + "\noutput y\n"
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    e = info.value
    col = stmt.index("(h d)") + 1
    assert (e.line, e.col, e.span.end_col) == (3, col, col + 5), e.render()
    # declared as the product: no ambiguity, and the leg is named by it
    text = "dim t = 3, h = 2, d = 3, q = 6, r = h * d\ninput x[t, h, d]\n" + stmt + "\noutput y\n"
    assert penrose.load(text).outputs[0][1].legs == ("t", "r")
    x = torch.randn(3, 2, 3, dtype=torch.float64)
    three_ways(text, x, lambda t: einops.rearrange(t, "t h d -> t (h d)"))


def test_a_const_is_no_dim_in_a_pattern():
    stmt = "y = rearrange(x, 't (h c) -> t h')"
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(HEAD + "const c = 3\n" + stmt + "\noutput y\n")
    e = info.value
    assert (e.line, e.col) == (5, stmt.index("c)") + 1), e.render()


def test_refusal_inside_a_multiline_call_is_positioned_on_its_own_line():
    text = HEAD + "y = rearrange(\n    x,\n    't (h q) -> h t q',\n)\noutput y\n"
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    e = info.value
    assert (e.line, e.col) == (6, len("    't (h ") + 1), e.render()


def test_the_pattern_is_a_string():
    with pytest.raises(PenroseError) as info:
        penrose.load(HEAD + "y = rearrange(x, t)\noutput y\n")
    assert info.value.line == 4


def test_reduce_refuses_int_input():
    with pytest.raises(PenroseCheckError) as info:
        penrose.load("dim t = 3, e = 2\ninput x[t, e] : int\ny = reduce(x, 't e -> t', 'sum')\noutput y\n")
    assert info.value.line == 3


def test_penrose_interpret_stays_callable():
    """`penrose.interpret(...)` is the interpreter's entry point; calling it imports the submodule
    penrose.interpret, which must not replace the function (a second call must work too)."""
    code = (
        "import penrose, torch\n"
        "text = 'dim e = 2\\ninput x[e]\\ny = rearrange(x, \"e -> e\")\\noutput y\\n'\n"
        "a = penrose.interpret(text, torch.ones(2))\n"
        "b = penrose.interpret(text, torch.ones(2))\n"
        "assert torch.equal(a, b)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
