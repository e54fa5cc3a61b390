"""Einsum exactly as torch.einsum: the checker accepts what torch accepts, with torch's shapes,
refuses what torch refuses with a position inside the spec string, and the compiled module
computes torch.einsum's values and gradients (float64) on the same tensors.

The corpus is drawn from other projects' test suites (each entry names its source):
PyTorch's test/test_linalg.py (test_einsum, test_einsum_corner_cases, test_einsum_error_cases)
and its OpInfo samples (sample_inputs_einsum), opt_einsum's tests/test_contract.py, and
NumPy's numpy/_core/tests/test_einsum.py, plus the cases of issue 10.

Semantics on batched operands (docs/language.md, "einsum"): a run with leading batch dims
computes what torch.einsum computes on each batch element (torch.vmap), batch dims outermost,
and, when some term writes '...' and the output (after '->') does not, sums them too.
"""

from __future__ import annotations

import random
import re
import string

import pytest
import torch

import penrose
from penrose.einsum_spec import lex, parse
from penrose.errors import PenroseCheckError

pytestmark = pytest.mark.usefixtures("one_thread")

# a size per letter, never the same for neighbours, so a transposed result cannot pass
SIZES = {c: 2 + i % 3 for i, c in enumerate(string.ascii_letters)}

# x (5,), y (7,), A (3, 5), B (2, 5), C (2, 3, 5), D (2, 5, 7), E (7, 9), F (2, 3, 3, 5),
# G (5, 4, 6), H (4, 4), I (2, 3, 2): the operands of PyTorch's test_einsum
_X, _Y, _A, _B, _C, _D, _E, _F, _G, _H, _I = (5,), (7,), (3, 5), (2, 5), (2, 3, 5), (2, 5, 7), (7, 9), (2, 3, 3, 5), (5, 4, 6), (4, 4), (2, 3, 2)
_AT = (5, 3)  # A.t()

# (spec, operand shapes or None for SIZES per letter, source)
CORPUS = [
    # -- PyTorch test_linalg.py test_einsum
    ("i->", [_X], "torch test_einsum: sum"),
    ("i,i->", [_X, _X], "torch test_einsum: dot"),
    ("i,i->i", [_X, _X], "torch test_einsum: element-wise product"),
    ("i,j->ij", [_X, _Y], "torch test_einsum: outer"),
    ("ij->ji", [_A], "torch test_einsum: transpose"),
    ("ij->j", [_A], "torch test_einsum: row sum"),
    ("ij->i", [_A], "torch test_einsum: column sum"),
    ("ij,ij->ij", [_A, _A], "torch test_einsum: matrix element-wise product"),
    ("ij,j->i", [_A, _X], "torch test_einsum: matrix-vector"),
    ("ij,kj->ik", [_A, _B], "torch test_einsum: matmul"),
    ("ij,ab->ijab", [_A, _E], "torch test_einsum: matrix outer product"),
    ("Aij,Ajk->Aik", [_C, _D], "torch test_einsum: batch matmul"),
    ("ijk,jk->i", [_C, _A], "torch test_einsum: tensor-matrix contraction"),
    ("aij,jk->aik", [_D, _E], "torch test_einsum: tensor-matrix contraction"),
    ("abCd,dFg->abCFg", [_F, _G], "torch test_einsum: tensor-tensor contraction"),
    ("ijk,jk->ik", [_C, _A], "torch test_einsum: double indices"),
    ("ijk,jk->ij", [_C, _A], "torch test_einsum: double indices"),
    ("ijk,ik->j", [_C, _B], "torch test_einsum: non contiguous"),
    ("ijk,ik->jk", [_C, _B], "torch test_einsum: non contiguous, double indices"),
    ("ii", [_H], "torch test_einsum: trace"),
    ("ii->i", [_H], "torch test_einsum: diagonal"),
    ("iji->j", [_I], "torch test_einsum: non-contiguous trace"),
    ("ngrg...->nrg...", [(2, 1, 3, 1, 4)], "torch test_einsum: diagonal with '...'"),
    ("i...->...", [_H], "torch test_einsum: ellipsis"),
    ("ki,...k->i...", [_AT, _B], "torch test_einsum: ellipsis"),
    ("k...,jk->...", [_AT, _B], "torch test_einsum: ellipsis"),
    ("...ik, ...j -> ...ij", [_C, _X], "torch test_einsum: ellipsis, spaces"),
    ("Bik,k...j->i...j", [_C, (5, 3)], "torch test_einsum: ellipsis in the middle"),
    ("i...j, ij... -> ...ij", [_C, (2, 5, 2, 3)], "torch test_einsum: ellipsis broadcast"),
    ("bn,anm,bm->ba", [(5, 4), (6, 4, 3), (5, 3)], "torch test_einsum: bilinear"),
    ("bn,Anm,bm->bA", [(5, 2), (6, 2, 3), (5, 3)], "torch test_einsum: bilinear, uppercase"),
    # -- PyTorch test_einsum_corner_cases
    (" ", [()], "torch corner: blank"),
    (" -> ", [()], "torch corner: blank with arrow"),
    (" , ", [(), ()], "torch corner: two scalars"),
    (" , , ", [(), (), ()], "torch corner: three scalars"),
    (" , -> ", [(), ()], "torch corner: two scalars, arrow"),
    (" i ", [(1,)], "torch corner: spaced letter"),
    (" i -> ", [(1,)], "torch corner"),
    (" i -> i ", [(1,)], "torch corner"),
    (" i , i ", [(1,), (1,)], "torch corner"),
    (" i , i -> i ", [(1,), (1,)], "torch corner"),
    ("i,j", [(1,), (2,)], "torch corner: broadcasting"),
    ("i,ij->ij", [(2,), (2, 3)], "torch corner: broadcasting"),
    ("...", [()], "torch corner: ellipsis of a scalar"),
    ("...->", [()], "torch corner"),
    ("...->...", [()], "torch corner"),
    ("...", [(1,)], "torch corner"),
    ("...->", [(1,)], "torch corner"),
    ("z...->z", [(1,)], "torch corner"),
    ("Z...->...Z", [(1,)], "torch corner"),
    ("...a->", [(2, 1)], "torch corner: '...a->' sums everything"),
    ("a...b->ab", [(2, 2, 1)], "torch corner"),
    # -- PyTorch OpInfo sample_inputs_einsum
    ("i,j->ij", [(3,), (4,)], "torch OpInfo: outer"),
    ("ij,kj->ik", [(2, 3), (1, 3)], "torch OpInfo: matmul"),
    ("ij,Ab->ijAb", [(2, 3), (4, 4)], "torch OpInfo: matrix outer product"),
    ("aij,ajk->aik", [(1, 2, 3), (1, 3, 4)], "torch OpInfo: batch matmul"),
    ("aij,jk->aik", [(1, 3, 4), (4, 4)], "torch OpInfo: tensor-matrix"),
    ("ijk,ik->j", [(1, 2, 3), (1, 3)], "torch OpInfo: non contiguous"),
    ("iji->j", [(1, 3, 1)], "torch OpInfo: non-contiguous trace"),
    ("i...->...", [(3, 3)], "torch OpInfo: ellipsis"),
    ("...ik, ...j -> ij", [(1, 2, 3), (3,)], "torch OpInfo: ellipsis summed"),
    # -- size-1 broadcasting, as torch.einsum does it
    ("ij,jk->ik", [(2, 1), (3, 4)], "broadcast: contracted 1 vs 3"),
    ("ij,jk->ik", [(2, 3), (1, 4)], "broadcast: contracted 3 vs 1"),
    ("ij,ij->ij", [(1, 3), (2, 1)], "broadcast: both ways"),
    ("i,i->", [(1,), (3,)], "broadcast: dot"),
    ("i,i", [(1,), (3,)], "broadcast: implicit output"),
    ("i,i,i->i", [(1,), (3,), (1,)], "broadcast: three operands"),
    ("ijk,jk->i", [(2, 1, 4), (3, 1)], "broadcast: two labels"),
    ("ab,b", [(2, 3), (1,)], "broadcast: summed label"),
    ("...a,...a->...", [(2, 1, 3), (4, 3)], "broadcast: ellipsis dims"),
    ("...a,...a->...", [(2, 1, 3), (4, 1)], "broadcast: ellipsis dims and a label"),
    ("a...b,...b->a...", [(2, 3, 4, 5), (4, 5)], "broadcast: fewer ellipsis dims"),
    ("a...b,...b->a...", [(2, 3, 4, 5), (1, 5)], "broadcast: ellipsis dim of size 1"),
    ("a...b,...b->a...", [(2, 3, 4, 5), (3, 1, 5)], "broadcast: ellipsis dims right-aligned"),
    ("a...b,...b", [(2, 3, 4, 5), (3, 1, 5)], "broadcast: implicit output"),
    ("...,...->...", [(2, 3), (3,)], "broadcast: bare ellipses"),
    ("i...,i...->i", [(2, 3), (2, 1)], "broadcast: summed ellipsis"),
    ("i...,i->...i", [(2, 3), (2,)], "ellipsis moves to the front"),
    ("ba...,ab->...", [(2, 3, 4), (3, 2)], "ellipsis kept, labels summed"),
    ("...ij,...jk", [(5, 2, 3), (3, 4)], "implicit output with '...'"),
    # -- issue 10
    ("ij...,j->ij...", [(2, 3, 4), (3,)], "issue 10: '...' last"),
    ("i...->...", [(2, 3)], "issue 10: '...' after a label"),
    ("Ba", [(2, 3)], "implicit output: uppercase sorts first"),
    ("aB", [(2, 3)], "implicit output: uppercase sorts first"),
    ("bA,c", [(2, 3), (4,)], "implicit output: sorted"),
    ("ij k->kji", [(2, 3, 4)], "a spaced spec torch reads as letters"),
    ("i j->j i", [(2, 3)], "a spaced spec torch reads as letters"),
    ("ab c, c -> ab c", [(2, 3, 4), (4,)], "spaced, letters fit: read as letters"),
    # -- opt_einsum tests/test_contract.py
    ("a,ab,abc->abc", None, "opt_einsum: hadamard-like"),
    ("a,b,ab->ab", None, "opt_einsum: hadamard-like"),
    ("ea,fb,gc,hd,abcd->efgh", None, "opt_einsum: index transformation"),
    ("ea,fb,abcd,gc,hd->efgh", None, "opt_einsum: index transformation"),
    ("abcd,ea,fb,gc,hd->efgh", None, "opt_einsum: index transformation"),
    ("acdf,jbje,gihb,hfac,gfac,gifabc,hfac", None, "opt_einsum: complex"),
    ("cd,bdhe,aidb,hgca,gc,hgibcd,hgac", None, "opt_einsum: complex"),
    ("abhe,hidj,jgba,hiab,gab", None, "opt_einsum: complex"),
    ("bde,cdh,agdb,hica,ibd,hgicd,hiac", None, "opt_einsum: complex"),
    ("chd,bde,agbc,hiad,hgc,hgi,hiad", None, "opt_einsum: complex"),
    ("chd,bde,agbc,hiad,bdi,cgh,agdb", None, "opt_einsum: complex"),
    ("bdhe,acad,hiab,agac,hibd", None, "opt_einsum: complex"),
    ("ab,ab,c->", None, "opt_einsum: collapse"),
    ("ab,ab,c->c", None, "opt_einsum: collapse"),
    ("ab,ab,cd,cd->", None, "opt_einsum: collapse"),
    ("ab,ab,cd,cd->ac", None, "opt_einsum: collapse"),
    ("ab,ab,cd,cd->cd", None, "opt_einsum: collapse"),
    ("ab,ab,cd,cd,ef,ef->", None, "opt_einsum: collapse"),
    ("ab,cd,ef->abcdef", None, "opt_einsum: outer"),
    ("ab,cd,ef->acdf", None, "opt_einsum: outer"),
    ("ab,cd,de->abcde", None, "opt_einsum: outer"),
    ("ab,cd,de->be", None, "opt_einsum: outer"),
    ("ab,bcd,cd->abcd", None, "opt_einsum: outer"),
    ("ab,bcd,cd->abd", None, "opt_einsum: outer"),
    ("eb,cb,fb->cef", None, "opt_einsum: previously failed"),
    ("dd,fb,be,cdb->cef", None, "opt_einsum: previously failed"),
    ("bca,cdb,dbf,afc->", None, "opt_einsum: previously failed"),
    ("dcc,fce,ea,dbf->ab", None, "opt_einsum: previously failed"),
    ("fdf,cdd,ccd,afe->ae", None, "opt_einsum: previously failed"),
    ("abcd,ad", None, "opt_einsum: previously failed"),
    ("ed,fcd,ff,bcf->be", None, "opt_einsum: previously failed"),
    ("baa,dcf,af,cde->be", None, "opt_einsum: previously failed"),
    ("bd,db,eac->ace", None, "opt_einsum: previously failed"),
    ("fff,fae,bef,def->abd", None, "opt_einsum: previously failed"),
    ("efc,dbc,acf,fd->abe", None, "opt_einsum: previously failed"),
    ("ab,ab", None, "opt_einsum: inner"),
    ("ab,ba", None, "opt_einsum: inner"),
    ("abc,abc", None, "opt_einsum: inner"),
    ("abc,bac", None, "opt_einsum: inner"),
    ("abc,cba", None, "opt_einsum: inner"),
    ("ab,bc", None, "opt_einsum: GEMM"),
    ("ab,cb", None, "opt_einsum: GEMM"),
    ("ba,bc", None, "opt_einsum: GEMM"),
    ("ba,cb", None, "opt_einsum: GEMM"),
    ("abcd,cd", None, "opt_einsum: GEMM"),
    ("abcd,ab", None, "opt_einsum: GEMM"),
    ("abcd,cdef", None, "opt_einsum: GEMM"),
    ("abcd,cdef->feba", None, "opt_einsum: GEMM"),
    ("abcd,efdc", None, "opt_einsum: GEMM"),
    ("aab,bc->ac", None, "opt_einsum: inner than dot"),
    ("ab,bcc->ac", None, "opt_einsum: inner than dot"),
    ("aab,bcc->ac", None, "opt_einsum: inner than dot"),
    ("baa,bcc->ac", None, "opt_einsum: inner than dot"),
    ("aab,ccb->ac", None, "opt_einsum: inner than dot"),
    ("aab,fa,df,ecc->bde", None, "opt_einsum: random"),
    ("ecb,fef,bad,ed->ac", None, "opt_einsum: random"),
    ("bcf,bbb,fbf,fc->", None, "opt_einsum: random"),
    ("bb,ff,be->e", None, "opt_einsum: random"),
    ("bcb,bb,fc,fff->", None, "opt_einsum: random"),
    ("fbb,dfd,fc,fc->", None, "opt_einsum: random"),
    ("afd,ba,cc,dc->bf", None, "opt_einsum: random"),
    ("adb,bc,fa,cfc->d", None, "opt_einsum: random"),
    ("bbd,bda,fc,db->acf", None, "opt_einsum: random"),
    ("dba,ead,cad->bce", None, "opt_einsum: random"),
    ("aef,fbc,dca->bde", None, "opt_einsum: random"),
    ("hbc,bdef,cdkj,ji,ikeh,lfo", None, "opt_einsum: constants"),
    ("ijab,acd,bce,df,ef->ji", None, "opt_einsum: constants"),
    ("ab,cd,ad,cb", None, "opt_einsum: constants"),
    ("ab,bc,cd", None, "opt_einsum: constants"),
    # -- NumPy numpy/_core/tests/test_einsum.py
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)], "numpy: matmul with '...'"),
    ("...i,...i", [(2, 3), (3,)], "numpy: '...' dot"),
    ("ij...,j...->i...", [(2, 3, 4), (3, 4)], "numpy"),
    ("ik...,k...->i...", [(2, 3, 4), (3, 4)], "numpy"),
    ("ik...,...kj->i...j", [(2, 3, 4), (4, 3, 5)], "numpy"),
    ("ik,k...->i...", [(2, 3), (3, 4)], "numpy"),
    ("...lmn,lmno->...o", [(2, 2, 3, 4), (2, 3, 4, 5)], "numpy"),
    ("...lmn,...lmno->...o", [(2, 3, 4), (3, 2, 3, 4, 5)], "numpy"),
    ("...kl,k...", [(3, 2, 4), (2, 3)], "numpy"),
    ("...kl,k", [(3, 2, 4), (2,)], "numpy"),
    ("...k,kj", [(3, 2), (2, 4)], "numpy"),
    ("ij...,j->ij...", [(3, 2, 4, 1), (2,)], "numpy"),
    ("ij...,...j->ij...", [(2, 3, 4), (4, 3)], "numpy"),
    ("...ft,mf->...mt", [(2, 3, 4), (5, 3)], "numpy"),
    ("ii...->i...", [(3, 3, 2)], "numpy: diagonal with '...'"),
    ("ii...->...i", [(3, 3, 2)], "numpy"),
    ("i...i->i...", [(3, 2, 3)], "numpy"),
    ("i...i->...i", [(3, 2, 3)], "numpy"),
    ("...ii->i...", [(2, 3, 3)], "numpy"),
    ("...ii->...i", [(2, 3, 3)], "numpy"),
    ("i..., i...", [(2, 3), (2, 3)], "numpy: spaced ellipses"),
    ("..., ...", [(2, 3), (3,)], "numpy"),
    ("...,...", [(2, 3), (3,)], "numpy"),
    ("i...k->...", [(2, 3, 4)], "numpy"),
    ("...i->...", [(2, 3)], "numpy"),
    ("jii->ij", None, "numpy"),
    ("iii->i", None, "numpy"),
    ("ijk->jik", None, "numpy"),
    ("ijk,jil->kl", None, "numpy"),
    ("ijk, jil -> kl", None, "numpy: spaced"),
    ("cehgbaifff,fhhdegih->cdghbi", None, "numpy: many labels"),
    ("baegffahgc,hdggeff->dhg", None, "numpy: many labels"),
    ("gah,cdbcghefg->ef", None, "numpy: many labels"),
    ("jhcabhijaci,dfijejgh->fgje", None, "numpy: many labels"),
    ("cacc,bcb->", None, "numpy"),
    ("ijp,ipq,ikq->ijk", None, "numpy"),
    ("ji,i->", None, "numpy"),
    ("i,ij->", None, "numpy"),
    ("ij,i->", None, "numpy"),
    ("ji,j", None, "numpy"),
    ("ij, j", None, "numpy: spaced"),
    ("ij, jh", None, "numpy: spaced"),
    ("x,yx,zx->xzy", None, "numpy"),
    ("ijklm,ijn->", None, "numpy"),
    ("ijklm,ijn,ijn->", None, "numpy"),
    ("z,mz,zm->", None, "numpy"),
    ("obk,ijk->ioj", None, "numpy"),
    ("mi,mi,mi->m", None, "numpy"),
    ("im,im,im->m", None, "numpy"),
    ("ijkl,k->ijl", None, "numpy"),
    ("ijkl,k", None, "numpy"),
    ("ijk,kl,jl,i->i", None, "numpy"),
    ("ijk,kl,jl", None, "numpy"),
    ("ijk,j->ijk", None, "numpy"),
    ("ijij->", None, "numpy"),
    ("cab,cdd->ab", None, "numpy"),
    ("bbcdc->d", None, "numpy"),
    ("ba,ac,da->bcd", None, "numpy"),
    ("abjk,kl,jl,ab->ab", None, "numpy"),
    ("abjk,kl,jl", None, "numpy"),
    ("aabcb,abc", None, "numpy"),
    ("aabb->ab", None, "numpy"),
    ("a,b,c->abc", None, "numpy"),
    ("a,ac,ab,ad,cd,bd,bc->", None, "numpy"),
    ("a,a,a->a", None, "numpy"),
    ("ab,bc,cd,de->ae", None, "numpy"),
    ("cl, cpxy->lpxy", None, "numpy: spaced"),
    ("cl, cpx->lpx", None, "numpy: spaced"),
    ("i,i,i->i", None, "numpy"),
    ("i,i,i,i->", None, "numpy"),
    ("i->i", None, "numpy"),
    ("ij->", None, "numpy"),
    ("ij,jk,kl", None, "numpy"),
    (",i->", [(), (3,)], "numpy: scalar operand"),
    (",i->i", [(), (3,)], "numpy: scalar operand"),
    ("i,->", [(3,), ()], "numpy: scalar operand"),
    ("i,->i", [(3,), ()], "numpy: scalar operand"),
    ("i,i", None, "numpy"),
]
IDS = [f"{i}:{s}" for i, (s, _, _) in enumerate(CORPUS)]


def _shapes(spec, shapes):
    if shapes is not None:
        return [tuple(s) for s in shapes]
    lhs = spec.split("->")[0]
    return [tuple(SIZES[c] for c in term if c != " ") for term in lhs.split(",")]


def diagram(spec, shapes, kinds=None):
    """A diagram with one operand per shape: x0, x1, … (inputs unless `kinds` says params)."""
    kinds = kinds or ["input"] * len(shapes)
    dims = [f"d{i}_{j} = {n}" for i, s in enumerate(shapes) for j, n in enumerate(s)]
    lines = ["dim " + ", ".join(dims)] if dims else []
    for i, (s, kind) in enumerate(zip(shapes, kinds)):
        lines.append(f"{kind} x{i}[{', '.join(f'd{i}_{j}' for j in range(len(s)))}]")
    lines.append(f"y = einsum('{spec}', {', '.join(f'x{i}' for i in range(len(shapes)))})")
    lines.append("output y")
    return "\n".join(lines)


def _tensors(shapes, batch=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((*batch, *s), generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]


def _sums_batch(spec):
    """torch's rule on batched operands: some term writes '...' and the output (after '->') does not."""
    lhs, arrow, rhs = spec.partition("->")
    return bool(arrow) and "..." in lhs and "..." not in rhs


def _assert_same(got, want, leaves):
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    cot = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    g1 = torch.autograd.grad(got, leaves, cot, allow_unused=True)
    g2 = torch.autograd.grad(want, leaves, cot, allow_unused=True)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


# ---- the checker alone: torch's shapes -------------------------------------------------------


@pytest.mark.parametrize("spec,shapes,source", CORPUS, ids=IDS)
def test_checker_gives_torch_shape(spec, shapes, source):
    shapes = _shapes(spec, shapes)
    want = torch.einsum(spec, *[torch.zeros(s) for s in shapes]).shape
    c = penrose.load(diagram(spec, shapes))
    (_, ty), = c.outputs
    assert [c.size(cl) for cl in ty.cls] == list(want), source
    assert ty.batched == (not _sums_batch(spec))


def test_corpus_size():
    assert len(CORPUS) >= 200
    assert len({(s, str(sh)) for s, sh, _ in CORPUS}) == len(CORPUS)


# ---- compiled: torch.einsum's values and gradients --------------------------------------------


@pytest.mark.parametrize("spec,shapes,source", CORPUS, ids=IDS)
def test_compiled_matches_torch(spec, shapes, source):
    shapes = _shapes(spec, shapes)
    model = penrose.compile(diagram(spec, shapes)).double()
    xs = _tensors(shapes)
    got = model(**{f"x{i}": x for i, x in enumerate(xs)})
    _assert_same(got, torch.einsum(spec, *xs), xs)


@pytest.mark.parametrize("spec,shapes,source", CORPUS, ids=IDS)
def test_compiled_batched_is_torch_per_element(spec, shapes, source):
    """Leading batch dims: torch.einsum per batch element, batch outermost; summed with the '...'."""
    shapes = _shapes(spec, shapes)
    model = penrose.compile(diagram(spec, shapes)).double()
    xs = _tensors(shapes, batch=(2,))
    got = model(**{f"x{i}": x for i, x in enumerate(xs)})
    want = torch.vmap(lambda *a: torch.einsum(spec, *a))(*xs)
    if _sums_batch(spec):
        want = want.sum(0)
    _assert_same(got, want, xs)


TWO = [(i, c) for i, c in enumerate(CORPUS) if len(_shapes(c[0], c[1])) == 2]


@pytest.mark.parametrize("kinds", [("input", "param"), ("param", "input")], ids=["input-param", "param-input"])
@pytest.mark.parametrize("spec,shapes,source", [c for _, c in TWO], ids=[IDS[i] for i, _ in TWO])
def test_compiled_with_a_param_matches_torch(spec, shapes, source, kinds):
    """One operand a param (no batch legs): the lowerings to matmul and linear see these."""
    shapes = _shapes(spec, shapes)
    model = penrose.compile(diagram(spec, shapes, kinds), seed=0).double()
    for batch in ((), (2,)):
        xs = _tensors(shapes, batch=batch)
        params = dict(model.named_parameters())
        operands = [x if k == "input" else params[f"x{i}"] for i, (x, k) in enumerate(zip(xs, kinds))]
        inputs = {f"x{i}": x for i, (x, k) in enumerate(zip(xs, kinds)) if k == "input"}
        got = model(**inputs)
        fn = lambda *a: torch.einsum(spec, *a)  # noqa: E731
        if batch:
            fn = torch.vmap(fn, in_dims=tuple(0 if k == "input" else None for k in kinds))
        want = fn(*operands)
        if batch and _sums_batch(spec) and "..." in spec.split("->")[0].split(",")[kinds.index("input")]:
            want = want.sum(0)
        _assert_same(got, want, list(inputs.values()) + list(params.values()))


# ---- batch legs: the contract and its meaning ------------------------------------------------

BATCH_CASES = [
    # (diagram, expected attrs (terms, out, sum_batch), result batched, in_dims for vmap or None)
    ("dim a = 3\ninput A[..., a]\ny = einsum('...a->', A)\noutput y",
     ((("a",),), (), True), False),
    ("dim a = 3\ninput A[a]\nparam w[a]\ny = einsum('...a,a->', A, w)\noutput y",
     ((("a",), ("a",)), (), True), False),
    ("dim t = 2, e = 3, d = 4\ninput Z[t, e]\nparam W[e, d]\ny = einsum('te,ed->td', Z, W)\noutput y",
     ((("t", "e"), ("e", "d")), ("t", "d"), False), True),
    ("dim i = 2, j = 3\ninput A[i, j]\ny = einsum('i...->...', A)\noutput y",
     ((("i", "...0"),), ("...0",), False), True),
    ("dim i = 2, j = 3, k = 4\ninput A[i, j, k]\nparam b[j]\ny = einsum('ij...,j->ij...', A, b)\noutput y",
     ((("i", "j", "...0"), ("j",)), ("i", "j", "...0"), False), True),
    ("dim i = 2, j = 3\ninput A[i, j]\ninput b[j]\ny = einsum('...j,j->...', A, b)\noutput y",
     ((("...0", "j"), ("j",)), ("...0",), False), True),
    # an explicit '...' on an unbatched param only: the batch legs still come for free
    ("dim a = 2, t = 3, d = 4\nparam W[a, d]\ninput Z[t, d]\ny = einsum('...d,td->t', W, Z)\noutput y",
     ((("...0", "d"), ("t", "d")), ("t",), False), True),
    ("dim a = 2, b = 3\nparam W[a, b]\ny = einsum('...->', W)\noutput y",
     ((("...1", "...0"),), (), False), False),
    # output '...' not first: batch dims stay outermost
    ("dim i = 2, j = 3\ninput A[i, j]\ny = einsum('i...->...i', A)\noutput y",
     ((("i", "...0"),), ("...0", "i"), False), True),
    # implicit output keeps the batch legs
    ("dim i = 2, j = 3\ninput A[i, j]\ny = einsum('...j', A)\noutput y",
     ((("...0", "j"),), ("...0", "j"), False), True),
]


def _einsum_value(c):
    return next(s.value for s in c.stmts if s.value is not None and s.value.op == "einsum")


@pytest.mark.parametrize("text,attrs,batched", BATCH_CASES, ids=[t.split("einsum(")[1].split(",")[0] for t, _, _ in BATCH_CASES])
def test_batch_contract(text, attrs, batched):
    v = _einsum_value(penrose.load(text))
    assert (v.attrs.terms, v.attrs.out, v.attrs.sum_batch) == attrs
    assert v.type.batched == batched


def _run_batched(text, batch):
    """The compiled module on batched inputs against torch.einsum per batch element (vmap)."""
    model = penrose.compile(text, seed=0).double()
    c = model.penrose_checked
    v = _einsum_value(c)
    spec = v.attrs.spec
    names = [a.attrs.name for a in v.args]
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(0)
    inputs = {}
    for d in c.inputs:
        shape = tuple(c.size(cl) for cl in d.type.cls)
        inputs[d.tensor.name] = torch.randn((*batch, *shape), generator=g, dtype=torch.float64, requires_grad=True)
    operands = [inputs.get(n, params.get(n)) for n in names]
    got = model(**inputs)
    fn = lambda *a: torch.einsum(spec, *a)  # noqa: E731
    for _ in batch if inputs else ():
        fn = torch.vmap(fn, in_dims=tuple(0 if n in inputs else None for n in names))
    want = fn(*operands)
    if v.attrs.sum_batch and inputs:
        want = want.sum(tuple(range(len(batch))))
    _assert_same(got, want, list(inputs.values()) + list(params.values()))


@pytest.mark.parametrize("text", [t for t, _, _ in BATCH_CASES], ids=[t.split("einsum(")[1].split(",")[0] for t, _, _ in BATCH_CASES])
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=["unbatched", "one batch dim", "two batch dims"])
def test_batch_semantics_compiled(text, batch):
    _run_batched(text, batch)


def test_issue_sum_of_everything():
    # issue 10: einsum('...a->', A) with input A[..., a] returned the batch instead of summing it
    m = penrose.compile("dim a = 3\ninput A[..., a]\ny = einsum('...a->', A)\noutput y").double()
    A = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(m(A), A.sum())


# ---- broadcasting in the checker --------------------------------------------------------------


def test_broadcast_takes_the_larger_class():
    text = "dim i = 2, one = 1, j = 3\ninput A[i, one]\nparam b[j]\ny = einsum('ij,j->ij', A, b)\noutput y"
    c = penrose.load(text)
    (_, ty), = c.outputs
    assert ty.legs == ("i", "j") and [c.size(x) for x in ty.cls] == [2, 3]
    assert c.size(c.dims["one"]) == 1  # not unified with j


def test_broadcast_ellipsis_leg_names_come_from_the_larger_operand():
    text = "dim one = 1, u = 4, e = 3\ninput a[one, e]\ninput b[u, e]\ny = einsum('...e,...e->...', a, b)\noutput y"
    c = penrose.load(text)
    (_, ty), = c.outputs
    assert ty.legs == ("u",) and [c.size(x) for x in ty.cls] == [4]


def test_labels_of_unknown_size_still_unify():
    text = "dim t, e = 3\ninput a[t, e]\ninput b[t, e]\ny = einsum('te,te->t', a, b)\noutput y"
    c = penrose.load(text)
    assert c.sizes.find(c.dims["t"]) == c.sizes.find(c.dims["t"])


# ---- reading: letters as torch reads them, words where penrose adds them ----------------------


@pytest.mark.parametrize("spec,legs,words,out", [
    ("ij", [2], False, ("i", "j")),
    ("tok, tok -> tok", [1, 1], True, ("tok",)),
    ("tok emb, emb hd -> tok hd", [2, 2], True, ("tok", "hd")),
    ("alpha b, b -> alpha", [2, 1], True, ("alpha",)),
    ("i j -> j i", [2], False, ("j", "i")),
    ("ab c, c -> ab c", [3, 1], False, ("a", "b", "c")),  # torch accepts it: letters
    ("ab c, c -> ab", [2, 1], True, ("ab",)),  # letters do not fit, words do
    ("... tok emb, emb hd -> ... tok hd", [3, 2], True, ("...0", "tok", "hd")),
    ("tok...,tok", [2, 1], False, None),  # no spaces: letters, refused on leg counts
])
def test_letters_or_words(spec, legs, words, out):
    assert lex(spec, leg_counts=legs).words == words
    if out is None:
        with pytest.raises(PenroseCheckError):
            parse(spec, leg_counts=legs)
    else:
        assert parse(spec, leg_counts=legs).out == out


def test_many_word_legs():
    # more distinct legs than letters: the word form has no limit
    n = 60
    dims = ", ".join(f"l{i} = 1" for i in range(n))
    legs = ", ".join(f"l{i}" for i in range(n))
    words = " ".join(f"l{i}" for i in range(n))
    text = f"dim {dims}\ninput a[{legs}]\ny = einsum('{words} -> {words}', a)\noutput y"
    c = penrose.load(text)
    assert len(c.outputs[0][1].legs) == n


@pytest.mark.parametrize("spec,shapes", [
    ("tok emb, emb hd -> tok hd", [(2, 3), (3, 4)]),
    ("tok, tok -> tok", [(3,), (3,)]),
    ("b tok emb, emb -> tok b", [(2, 3, 4), (4,)]),
    ("... tok emb, emb hd -> ... hd tok", [(5, 2, 3), (3, 4)]),
    ("tok hd", [(2, 3)]),
])
def test_word_form_compiled(spec, shapes):
    """The word form means what its letters would: compare with torch on the letter spelling."""
    words = sorted(set(re.findall(r"[A-Za-z][A-Za-z0-9_]*", spec)), key=lambda w: -len(w))
    letters = dict(zip(words, "abcdefghij"))
    lspec = re.sub(r"[A-Za-z][A-Za-z0-9_]*", lambda m: letters[m.group()], spec).replace(" ", "")
    if "->" not in spec:  # implicit output: words sorted as words
        once = sorted(w for w in set(re.findall(r"[A-Za-z][A-Za-z0-9_]*", spec)))
        lspec += "->" + "".join(letters[w] for w in once)
    model = penrose.compile(diagram(spec, shapes)).double()
    xs = _tensors(shapes)
    _assert_same(model(**{f"x{i}": x for i, x in enumerate(xs)}), torch.einsum(lspec, *xs), xs)


# ---- refusals, placed inside the spec --------------------------------------------------------

B = "dim t = 2, e = 3, u = 4\ninput x[t, e]\ninput z[u, e]\ninput v[e]\n"  # statements start on line 5
Q = 12  # the column of the opening quote in "y = einsum('"


@pytest.mark.parametrize("spec,args,message,start,end", [
    ("te->t->e", "x", r"at most one '->'", 5, 7),
    ("t...e...->t", "x", r"a second '\.\.\.' in einsum term 1", 5, 8),
    ("t....->t", "x", r"a second '\.\.\.' in einsum term 1", 4, 5),
    ("t..e->t", "x", r"'\.' that is not part of '\.\.\.' in einsum term 1", 1, 3),
    ("te->t.", "x", r"'\.' that is not part of '\.\.\.' in einsum output", 5, 6),
    ("te->......", "x", r"a second '\.\.\.' in einsum output", 7, 10),
    ("t1->t", "x", r"invalid leg '1' in the einsum spec \(term 1\)", 1, 2),
    ("te->t,e", "x", r"invalid leg ',' in the einsum spec \(output\); the output is one term", 5, 6),
    ("t-e->t", "x", r"invalid leg '-'", 1, 2),
    ("te>t", "x", r"invalid leg '>'", 2, 3),
    ("té->t", "x", r"invalid leg 'é'", 1, 2),
    ("te->tt", "x", r"output leg 't' appears twice in the einsum output", 5, 6),
    ("te->tx", "x", r"output leg 'x' appears in no input of the einsum", 5, 6),
    ("te,te->t", "x", r"the einsum spec has 2 input term\(s\) but 1 operand\(s\) follow it", 2, 5),
    ("te->t", "x, x", r"the einsum spec has 1 input term\(s\) but 2 operand\(s\) follow it", 0, 2),
    ("te,->t", "x", r"the einsum spec has 2 input term\(s\) but 1 operand", 2, 3),
    ("tef->t", "x", r"einsum term 1 'tef' has 3 leg\(s\) but operand 1 'x' has 2: \[t, e\]", 0, 3),
    ("t->t", "x", r"einsum term 1 't' has 1 leg\(s\) but operand 1 'x' has 2", 0, 1),
    ("te,ij->t", "x, v", r"einsum term 2 'ij' has 2 leg\(s\) but operand 2 'v' has 1: \[e\]", 3, 5),
    ("tef...->t", "x", r"einsum term 1 'tef\.\.\.' has 3 leg\(s\) besides '\.\.\.' but operand 1 'x' has only 2", 0, 6),
    ("tt->t", "x", r"einsum label 't' is repeated in operand 1 'x' but its legs differ in size", 1, 2),
    ("te,et->t", "x, x", r"size of label 'e' for operand 2 'x' leg 't' \(2\) does not match operand 1 'x' leg 'e' \(3\)", 3, 4),
    ("...e,...e->...", "x, z", r"size of label '\.\.\.' \(its last dim\) for operand 2 'z' leg 'u' \(4\) does not match operand 1 'x' leg 't' \(2\)", 5, 8),
    ("tok emb, emb 1hd -> tok", "x, x", r"invalid leg '1hd' in the einsum spec \(term 2\)", 13, 16),
    ("  te,ij->t", "x, v", r"einsum term 2 'ij'", 5, 7),
])
def test_refused_inside_the_spec(spec, args, message, start, end):
    text = B + f"y = einsum('{spec}', {args})\noutput y"
    with pytest.raises(PenroseCheckError, match=message) as info:
        penrose.load(text)
    err = info.value
    assert (err.span.line, err.span.col, err.span.end_col) == (5, Q + 1 + start, Q + 1 + end), err.render()


@pytest.mark.parametrize("spec,args", [
    ("te->t->e", "x"), ("t...e...->t", "x"), ("t..e->t", "x"), ("t1->t", "x"), ("te->tt", "x"),
    ("te->tx", "x"), ("te,te->t", "x"), ("te->t", "x, x"), ("tef->t", "x"), ("tt->t", "x"),
    ("te,et->t", "x, x"), ("...e,...e->...", "x, z"), ("te->t,e", "x"), ("té->t", "x"),
])
def test_what_penrose_refuses_torch_refuses(spec, args):
    shapes = {"x": (2, 3), "z": (4, 3), "v": (3,)}
    with pytest.raises(RuntimeError, match=r"^einsum\(\): "):
        torch.einsum(spec, *[torch.zeros(shapes[a.strip()]) for a in args.split(",")])


def test_refusal_in_a_multiline_call():
    text = B + "y = einsum(\n    'te->tt',\n    x)\noutput y"
    with pytest.raises(PenroseCheckError, match="appears twice") as info:
        penrose.load(text)
    assert (info.value.line, info.value.col) == (6, 5 + 1 + 5)
    assert info.value.render().splitlines()[-1] == "    " + " " * 10 + "^"


def test_refusal_renders_a_caret_under_the_character():
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(B + "y = einsum('te->tx', x)\noutput y")
    lines = info.value.render().splitlines()
    assert lines[1] == "    y = einsum('te->tx', x)"
    assert lines[2] == "    " + " " * (Q + 5) + "^"


# torch's own error cases (test_einsum_error_cases): x (2,), y (2, 3)
TORCH_ERRORS = [
    (". ..", ["x"]), ("... ...", ["x"]), ("1", ["x"]), (",", ["x"]), ("", ["x", "x"]), ("", ["x"]),
    ("ai", ["x"]), ("ai...", ["x"]), ("a->... .", ["x"]), ("a->..", ["x"]), ("a->1", ["x"]),
    ("a->aa", ["x"]), ("a->i", ["x"]), ("aa", ["y"]), ("a, ba", ["x", "y"]),
    # numpy's
    ("i..", ["x"]), (".i...", ["x"]), ("j->..j", ["x"]), ("j->.j...", ["x"]), ("ij->jij", ["y"]),
]


@pytest.mark.parametrize("spec,ops", TORCH_ERRORS, ids=[f"{s!r}" for s, _ in TORCH_ERRORS])
def test_torch_error_cases_are_refused_inside_the_spec(spec, ops):
    shapes = {"x": (2,), "y": (2, 3)}
    with pytest.raises(RuntimeError, match=r"^einsum\(\): "):
        torch.einsum(spec, *[torch.zeros(shapes[o]) for o in ops])
    text = "dim a = 2, b = 3\ninput x[a]\ninput y[a, b]\n" + f"r = einsum('{spec}', {', '.join(ops)})\noutput r"
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    err = info.value
    assert err.span.line == 4
    assert 12 <= err.span.col <= 12 + max(1, len(spec)), err.render()


# ---- differential: random specs, the checker against torch -----------------------------------


def _random_case(rng: random.Random):
    """A random einsum in the style of PyTorch's test_einsum_random, sometimes broken."""
    pool = rng.sample(string.ascii_letters, rng.randint(1, 5))
    size = {l: rng.randint(1, 4) for l in pool}
    ell_shape = [rng.randint(1, 4) for _ in range(3)]
    terms, shapes, any_ell = [], [], False
    for _ in range(rng.randint(1, 3)):
        labels = [rng.choice(pool) for _ in range(rng.randint(0, 3))]
        shape = [size[l] if rng.random() > 0.15 else 1 for l in labels]
        if rng.random() < 0.4:
            w = rng.randint(0, 2)
            at = rng.randint(0, len(labels))
            ell = [s if rng.random() > 0.15 else 1 for s in ell_shape[3 - w :]] if w else []
            shape[at:at] = ell
            labels.insert(at, "...")
            any_ell = True
        if rng.random() < 0.1 and shape:  # a size mismatch torch refuses (unless it is 1)
            shape[rng.randrange(len(shape))] = rng.randint(1, 5)
        terms.append("".join(labels))
        shapes.append(tuple(shape))
    spec = ",".join(terms)
    if rng.random() < 0.6:
        used = sorted({c for t in terms for c in t if c != "."})
        out = rng.sample(used, rng.randint(0, len(used))) if used else []
        if rng.random() < 0.1:
            out.append(rng.choice(pool + ["Q"]))  # repeated or absent
        if any_ell and rng.random() < 0.6 or rng.random() < 0.1:
            out.insert(rng.randint(0, len(out)), "...")
        spec += "->" + "".join(out)
    if rng.random() < 0.15:  # a broken character
        i = rng.randint(0, len(spec))
        spec = spec[:i] + rng.choice([".", "-", ">", ",", "1", "_", "->", ".."]) + spec[i:]
    if rng.random() < 0.2:  # torch ignores spaces
        i = rng.randint(0, len(spec))
        spec = spec[:i] + " " + spec[i:]
    return spec, shapes


def test_random_specs_accepted_exactly_when_torch_accepts():
    rng = random.Random(10)
    seen = {"accepted": 0, "refused": 0}
    for _ in range(600):
        spec, shapes = _random_case(rng)
        try:
            want = torch.einsum(spec, *[torch.zeros(s) for s in shapes]).shape
        except Exception:
            want = None
        text = diagram(spec, shapes)
        try:
            c = penrose.load(text)
        except PenroseCheckError as err:
            assert want is None, (spec, shapes, err.render())
            assert err.span.line == text.count("\n") and 12 <= err.span.col <= 13 + len(spec), (spec, err.render())
            seen["refused"] += 1
            continue
        if want is None:  # penrose's addition: a spaced spec read as words
            assert lex(spec, leg_counts=[len(s) for s in shapes]).words, (spec, shapes)
            continue
        (_, ty), = c.outputs
        assert [c.size(cl) for cl in ty.cls] == list(want), (spec, shapes)
        seen["accepted"] += 1
    assert seen["accepted"] > 150 and seen["refused"] > 100, seen


def test_random_specs_compiled_match_torch():
    rng = random.Random(11)
    done = 0
    while done < 80:
        spec, shapes = _random_case(rng)
        try:
            torch.einsum(spec, *[torch.zeros(s) for s in shapes])
        except Exception:
            continue
        if lex(spec, leg_counts=[len(s) for s in shapes]).words:
            continue
        model = penrose.compile(diagram(spec, shapes)).double()
        xs = _tensors(shapes)
        _assert_same(model(**{f"x{i}": x for i, x in enumerate(xs)}), torch.einsum(spec, *xs), xs)
        done += 1
