"""Geometric readings: every row of the paper's operations table (section 2.2), the patterns of
its later figures, batched and n-ary forms, and contractions no row describes."""

import pytest

from penrose.rendering.readings import (
    KINDS,
    Contraction,
    Operand,
    Reading,
    classify,
    parse_einsum,
    read_normalisation,
)


def read(spec, *names, legend=None, **hints):
    return classify(parse_einsum(spec, *names, **hints), legend=legend)


# (einsum, operand names, hints, kind, a phrase the text must hold)
PAPER_TABLE = [
    # Scalar multiplication: "Rescale point a using point b."
    (",->", "ab", {}, "scalar_multiplication", "Rescale point a using point b."),
    # Element-wise product
    ("i,i->i", "ab", {}, "elementwise_product",
     "Independently rescale elements of a with elements of b. Yields: rescaled vector a."),
    # Dot product
    ("i,i->", "ab", {}, "dot_product", '"Affinity" of a and b. Yields: unnormalised scalar.'),
    # Squared norm: the same tensor twice
    ("i,i->", "aa", {}, "squared_norm",
     "Affinity of a with itself. Yields: sum of squares of a (scalar)."),
    # Cosine similarity: both operands unit-normalised
    ("i,i->", ("an", "bn"), {"normalised": {"an", "bn"}}, "cosine_similarity",
     "Affinity of normalised vectors an and bn. Yields: normalised scalar in [-1, 1]."),
    # Convex combination: b holds probabilities
    ("i,i->", ("a", "bn"), {"probabilities": {"bn"}}, "convex_combination",
     'Convex combination of a scaled by probabilities bn. '
     'Yields: "center of mass" of the elements of a.'),
    # Sum of matrix slices
    ("ik->i", "B", {}, "sum_of_slices",
     "Sum all k-th slices of B. Yields: vector corresponding to the sum of all slices."),
    # Matrix-vector product
    ("ij,i->j", "Ab", {}, "matrix_vector",
     "Affinity of j-th slice of A and b. Yields: unnormalised scalar for each slice of A."),
    # Scaled matrix slices
    ("ij,i->ij", "Ab", {}, "scaled_slices", "Slices of A scaled by values of b"),
    # Matrix-matrix product
    ("ij,ik->jk", "AB", {}, "matrix_matrix",
     "Affinity of j-th slice of A and k-th slice of B. "
     "Yields: unnormalised scalar for each pair of slices of A and B."),
]


@pytest.mark.parametrize("spec, names, hints, kind, phrase", PAPER_TABLE,
                         ids=[row[3] for row in PAPER_TABLE])
def test_paper_table(spec, names, hints, kind, phrase):
    reading = read(spec, *names, **hints)
    assert reading.kind == kind
    assert phrase in reading.text


def test_normalisation_row():
    # an = a / asqn**0.5 with asqn = einsum('i,i->', a, a)
    reading = read_normalisation("a", parse_einsum("i,i->", "a", "a"), result="an")
    assert reading == Reading(
        "normalisation", "Normalisation",
        "Rescale vector length: divide a by its norm ||a||. Yields: normalised vector an.",
        contracted=("i",))


def test_normalisation_batched():
    # each token of x normalised over the embedding leg
    reading = read_normalisation("x", parse_einsum("te,te->t", "x", "x"))
    assert reading.kind == "normalisation"
    assert reading.batch == ("t",) and reading.contracted == ("e",)
    assert "t-th slice of x" in reading.text


@pytest.mark.parametrize("numerator, spec, names", [
    ("a", "i,i->", "ab"),    # a dot product, not a's norm
    ("b", "i,i->", "aa"),    # the norm of another tensor
    ("A", "ij,ji->", "AA"),  # A against its transpose
    ("A", "ij,ij->ij", "AA"),  # nothing summed: element-wise squares, not a norm
])
def test_normalisation_rejects(numerator, spec, names):
    assert read_normalisation(numerator, parse_einsum(spec, *names)) is None


# Later figures and the other kinds, each with the reason it is here.
FIGURES = [
    # attention logits: token t of q against token p of k
    ("te,pe->tp", ("q", "k"), {}, "matrix_matrix",
     "Affinity of t-th slice of q and p-th slice of k"),
    # attention output: probabilities over p combine the p-slices of v
    ("tp,pe->te", ("probs", "v"), {"probabilities": {"probs"}}, "convex_combination",
     "Convex combination of slices of v (indexed by p)"),
    # linear model / concept bottleneck: vector first
    ("d,dk->k", ("z", "W"), {}, "matrix_vector", "Affinity of z and k-th slice of W"),
    # concept embedding bottleneck: several kept legs
    ("d,dkse->kse", ("z", "W"), {}, "matrix_vector", "(k, s, e)-th slice of W"),
    # prototype map: normalised embedding against normalised prototypes
    ("d,dpk->pk", ("zn", "Pn"), {"normalised": {"zn", "Pn"}}, "cosine_similarity",
     "Cosine similarity of zn and (p, k)-th slice of Pn"),
    # prototype labels: a convex combination for each concept k
    ("pk,pk->k", ("probs", "p_true"), {"probabilities": {"probs"}}, "batched_convex_combination",
     "For each k, independently: convex combination of p_true"),
    # mixture of linear models
    ("m,mr->r", ("pr", "v"), {"probabilities": {"pr"}}, "convex_combination",
     '"center of mass" of the slices of v'),
    # neural additive model, layer 1: concept activations rescale slices of W1
    ("k,kri->kri", ("c", "W1"), {}, "scaled_slices", "Slices of W1 scaled by values of c"),
    # neural additive model, layer 2: each (k, r) transformed independently
    ("kri,krij->krj", ("h1", "W2"), {}, "batched_matrix_vector",
     "For each pair (k, r), independently: affinity of h1 and j-th slice of W2"),
    # neural additive model, last layer
    ("kre,kre->kr", ("he", "WL"), {}, "batched_dot_product", '"affinity" of he and WL'),
    # neural additive model: sum over concepts
    ("kr->r", ("hL",), {}, "sum_of_slices", "Sum all k-th slices of hL"),
    # concept embedding predictor
    ("kse,ks->kse", ("u", "c"), {}, "scaled_slices",
     "(k, s)-th slice of u times element (k, s) of c"),
    ("kse->ke", ("h",), {}, "sum_of_slices", "Sum all s-th slices of h. Yields: matrix"),
    # the MLP's batch leg b is a kept leg of X, not a batch leg: W has no b
    ("bj,ij->bi", ("X", "W0"), {}, "matrix_matrix",
     "Affinity of b-th slice of X and i-th slice of W0"),
]


@pytest.mark.parametrize("spec, names, hints, kind, phrase", FIGURES, ids=[r[0] for r in FIGURES])
def test_figures(spec, names, hints, kind, phrase):
    reading = read(spec, *names, **hints)
    assert reading.kind == kind
    assert phrase in reading.text


OTHERS = [
    # a scalar rescales a whole tensor
    (",ij->ij", ("s", "A"), "scalar_multiplication", "Rescale A using the scalar s"),
    ("i,j->ij", "ab", "outer_product", "Every element of a rescales a copy of b"),
    ("ii->", "A", "trace", "Sum the diagonal entries of A"),
    ("bii->b", "A", "batched_trace", "For each b, independently"),
    ("ij->ji", "A", "permutation", "from (i, j) to (j, i)"),
    ("ijk->kij", "A", "permutation", "from (i, j, k) to (k, i, j)"),
    ("ij->ij", "A", "permutation", "Copy A unchanged"),
    ("i->", "a", "sum_of_slices", "Sum all elements of a. Yields: scalar"),
    ("ijk->i", "A", "sum_of_slices", "Sum all (j, k)-th slices of A"),
    # batched forms: the batch leg is in every operand and in the output
    ("bij,bjk->bik", "AB", "batched_matrix_matrix",
     "For each b, independently: affinity of i-th slice of A and k-th slice of B"),
    ("bi,bi->b", "ab", "batched_dot_product", "for each b"),
    ("te,te->t", "xx", "batched_squared_norm", "affinity of x with itself"),
    ("bij,bj->bi", "Ax", "batched_matrix_vector", "For each b"),
    ("bi,bj->bij", "ab", "batched_outer_product", "For each b"),
    ("...ij,...jk->...ik", "AB", "batched_matrix_matrix", "For each leading batch index (...)"),
    # element-wise and scaled slices are batch-only by nature: no prefix
    ("bij,bij->bij", "AB", "elementwise_product", "rescaled order-3 tensor A"),
    ("bij,bi->bij", "AB", "scaled_slices", "Slices of A scaled by values of B"),
    ("i,i->i", "aa", "elementwise_product", "Square each element of a"),
    # the same tensor: Gram matrix, and the transpose is not a squared norm
    ("ij,ik->jk", "AA", "matrix_matrix", "(its Gram matrix)"),
    ("ij,ji->", "AA", "dot_product", '"Affinity" of A and its transpose'),
    # spaced form with multi-letter legs
    ("tok emb, emb hd -> tok hd", "ZW", "matrix_matrix", "Affinity of tok-th slice of Z and hd-th"),
    # n-ary
    ("i,i,i->i", "abc", "elementwise_product",
     "Independently multiply matching elements of a, b and c"),
    (",,->", "abc", "scalar_multiplication", "Multiply a, b and c"),
]


@pytest.mark.parametrize("spec, names, kind, phrase", OTHERS, ids=[r[0] for r in OTHERS])
def test_other_kinds(spec, names, kind, phrase):
    reading = read(spec, *names)
    assert reading.kind == kind
    assert phrase in reading.text


GENERIC = [
    # matrix chain: n-ary contraction
    ("ij,jk,kl->il", "ABC", "sum over j and k (contracted between operands); keep i and l free. "
                            "Yields: matrix over (i, l)."),
    # diagonal, not a trace
    ("ii->i", "A", "only the diagonal of A over i is used"),
    # j belongs to A alone and is summed away
    ("ij,i->", "Ab", "sum over j (legs of a single operand: a sum of its slices)"),
    # batch legs in a 3-operand contraction
    ("bij,bjk,bk->bi", "ABc", "batch legs b run through every operand"),
    # a scalar times a sum: not one of the table's rows
    (",ij->j", "sA", "Multiply the entries of s and A"),
]


@pytest.mark.parametrize("spec, names, phrase", GENERIC, ids=[r[0] for r in GENERIC])
def test_generic(spec, names, phrase):
    reading = read(spec, *names)
    assert reading.kind == "generic"
    assert reading.title == "Contraction"
    assert phrase in reading.text


def test_every_kind_is_known():
    rows = [r[:2] + (r[2] if isinstance(r[2], dict) else {},) for r in PAPER_TABLE + FIGURES]
    rows += [r[:2] + ({},) for r in OTHERS + GENERIC]
    for spec, names, hints in rows:
        kind = read(spec, *names, **hints).kind
        assert kind.removeprefix("batched_") in KINDS, spec


def test_leg_roles():
    # l = einsum('bte,bpe->btp', q, k): b batch, e contracted, t and p kept
    reading = read("bte,bpe->btp", "q", "k")
    assert (reading.batch, reading.contracted, reading.kept) == (("b",), ("e",), ("t", "p"))
    assert read("ij,i->", "A", "b").contracted == ("i", "j")
    assert read("i,i->i", "a", "b").batch == ("i",)


def test_legend_words():
    # "token t of q", as in the paper's attention figure
    legend = {"t": "token", "p": "token"}
    reading = read("te,pe->tp", "q", "k", legend=legend)
    assert reading.text.startswith("Affinity of token t of q and token p of k.")
    reading = read("tp,pe->te", "probs", "v", legend=legend, probabilities={"probs"})
    assert reading.text.endswith("for each token t.")


def test_projection_onto_unit_vector():
    # only one operand normalised: a projection, still a dot product
    reading = read("i,i->", "a", "bn", normalised={"bn"})
    assert reading.kind == "dot_product"
    assert "projection of a onto the direction of bn" in reading.text


def test_hints_on_the_same_tensor():
    # probabilities against themselves: still a squared norm
    assert read("i,i->", "p", "p", probabilities={"p"}).kind == "squared_norm"


def test_texts_are_sentences():
    for spec, names, *_ in PAPER_TABLE + FIGURES:
        text = read(spec, *names).text
        assert text.endswith(".") and "Yields: " in text, spec


def test_parse_einsum_forms():
    c = parse_einsum("tok emb, emb hd -> tok hd", "Z", "W", roles={"W": "param"})
    assert c.operands == (Operand("Z", ("tok", "emb")), Operand("W", ("emb", "hd"), "param"))
    assert c.spec == "tok emb, emb hd -> tok hd"
    assert parse_einsum("...ij,...jk->...ik", "A", "B").output == ("...", "i", "k")
    # implicit output: legs seen once, sorted
    assert parse_einsum("ij,jk", "A", "B").output == ("i", "k")
    assert parse_einsum("te,pe->tp", "q", "k").spec == "te,pe->tp"


def test_contraction_is_hashable_and_coerces_lists():
    a = Contraction([Operand("a", ["i"]), Operand("b", ["i"])], [], normalised={"a"})
    b = parse_einsum("i,i->", "a", "b", normalised={"a"})
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize("spec, names, message", [
    ("ij,jk->ix", "AB", "appear in no operand"),
    ("ij->ii", "A", "output legs repeat"),
    ("ij,jk->ik", "A", "2 operands but 1 names"),
])
def test_invalid_contractions(spec, names, message):
    with pytest.raises(ValueError, match=message):
        parse_einsum(spec, *names)
