"""Recognise attention in a checked body so the compiler can call scaled_dot_product_attention.

The diagram keeps its tensor-level statements (scores, mask, softmax, convex combination); when
they form exactly

    l = einsum(<q legs>, <k legs> -> <score legs>, Q, K) [/ c | * c]
    l = where(mask, l, -inf)  |  l + additive_mask        (optional)
    y = einsum(<score legs>, <v legs> -> <out legs>, softmax(l, s), V)

with every intermediate used once, the compiler emits one fused attention call instead. The
result is the same function (tests compare both); only the memory and time differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from penrose.attrs import Aligned, Axis, BinOp, Einsum, Mask, Num, Ref
from penrose import ir
from penrose.checked import Checked, V
from penrose.views import labels_agree, read_counts


@dataclass
class Attention:
    q: V
    k: V
    v: V
    q_legs: tuple
    k_legs: tuple
    v_legs: tuple
    heads: tuple  # score legs other than t and s, in score order
    t: str
    s: str
    d: str
    e: str
    out: tuple  # output legs of the final einsum
    scale_value: object  # a V scalar (divide by it) or a float multiplier
    scale_op: str  # '/' | '*' | ''
    mask: V | None
    mask_kind: str  # 'bool' | 'additive' | 'causal' | ''
    absorbed: list  # CStmt objects folded into the call
    scores: V  # the score einsum


def find_attention(c: Checked, uses: dict | None = None) -> dict:
    """Map id(CStmt) of each fusable final statement to its Attention description. `uses`: c's
    read_counts, when the caller has them already."""
    uses = read_counts(c) if uses is None else uses
    defs = {}
    for s in c.stmts:
        if isinstance(s.stmt, ir.Assign) and len(s.targets) == 1 and s.value is not None and s.value.op != "block":
            defs[(s.targets[0], s.versions[0])] = s
    out = {}
    taken: set = set()

    def resolve(v: V, absorbed: list):
        while v.op == "ref" and (ref := v.of(Ref)).kind == "local":
            key = (ref.name, ref.version)
            if uses.get(key, 0) != 1 or key not in defs or id(defs[key]) in taken:
                return v
            absorbed.append(defs[key])
            value = defs[key].value
            assert value is not None  # defs holds only statements with a value
            v = value
        return v

    for s in c.stmts:
        if not isinstance(s.stmt, ir.Assign) or s.value is None or s.value.op != "einsum" or len(s.value.args) != 2:
            continue
        absorbed: list = []
        att = _match(s.value, resolve, absorbed)
        if att is not None and not (labels_agree(c.sizes, s.value) and labels_agree(c.sizes, att.scores)):
            att = None  # size-1 broadcasting inside an einsum: the fused kernels do not broadcast so
        if att is not None:
            att.absorbed = absorbed
            out[id(s)] = att
            taken.update(id(a) for a in absorbed)
    return out


def _sums_batch(v: V) -> bool:
    """An einsum whose output drops the batch legs its operands carry (torch's '...' rule)."""
    return any(a.type.batched for a in v.args) and not v.type.batched


def _match(final: V, resolve, absorbed) -> Attention | None:
    (p_legs, v_legs), out = final.of(Einsum).terms, final.of(Einsum).out
    probs = resolve(final.args[0], absorbed)
    if probs.op != "softmax":
        return None
    score_legs_actual = probs.type.legs
    x = resolve(probs.args[0], absorbed)
    mask, kind = None, ""
    if x.op == "where":
        m, a, b = x.args
        align = x.of(Aligned).alignment
        if b.op != "num" or b.of(Num).value != -math.inf or align[0] is None:
            return None
        if any(al is not None and al != tuple(range(len(al))) for al in align[1:2]):
            return None
        if m.op == "mask" and m.of(Mask).kind == "causal":
            kind = "causal"
        else:
            kind = "bool"
        mask = m
        x_mask_align = align[0]
        x = resolve(a, absorbed)
    elif x.op == "binop" and x.of(BinOp).op == "+" and x.args[1].type.dtype == "float" and x.args[1].type.legs:
        al = x.of(Aligned).align
        if al[0] != tuple(range(len(x.type.legs))):
            return None
        mask, kind = x.args[1], "additive"
        x_mask_align = al[1]
        x = resolve(x.args[0], absorbed)
    else:
        x_mask_align = None
    scale_op, scale_value = "", 1.0
    if x.op == "binop" and (op := x.of(BinOp).op) in ("/", "*") and x.args[1].type.dtype == "scalar":
        scale_op, scale_value = op, x.args[1]
        x = resolve(x.args[0], absorbed)
    if x.op != "einsum" or len(x.args) != 2 or _sums_batch(x) or _sums_batch(final):
        return None
    (q_legs, k_legs), score_legs = x.of(Einsum).terms, x.of(Einsum).out
    # the score's letters as the softmax and final einsum see them
    if tuple(score_legs) != tuple(score_legs_actual) or len(p_legs) != len(score_legs):
        return None
    s_pos = probs.of(Axis).axis
    s = score_legs[s_pos]
    contracted = [l for l in q_legs if l in k_legs and l not in score_legs]
    if len(contracted) != 1 or len(set(q_legs)) != len(q_legs) or len(set(k_legs)) != len(k_legs):
        return None
    d = contracted[0]
    t_candidates = [l for l in score_legs if l in q_legs and l not in k_legs]
    if s not in k_legs or s in q_legs or not t_candidates:
        return None
    # the query leg: the mask's first leg, else the query-only leg nearest before s; other
    # query-only legs (query heads of a key/value group) act as heads
    if mask is not None and mask.type.legs and mask.type.legs[0] in t_candidates:
        t = mask.type.legs[0]
    else:
        t = t_candidates[-1]
    heads = tuple(l for l in score_legs if l not in (t, s))
    if any(l not in heads + (t, d) for l in q_legs) or any(l not in heads + (s, d) for l in k_legs):
        return None
    if set(q_legs) != set(heads) | {t, d}:
        return None
    # the final einsum: probs legs p_legs (renamed letters) and V legs
    ren = dict(zip(p_legs, score_legs))  # final-einsum letter -> score letter
    if len(set(p_legs)) != len(p_legs):
        return None
    contracted2 = [l for l in p_legs if l in v_legs and l not in out]
    if contracted2 != [p_legs[s_pos]]:
        return None
    e_candidates = [l for l in v_legs if l not in p_legs]
    if len(e_candidates) != 1:
        return None
    e = e_candidates[0]
    v_heads = [ren[l] for l in v_legs if l in p_legs and l != p_legs[s_pos]]
    if any(h not in heads for h in v_heads) or set(k_legs) - {s, d} - set(heads):
        return None
    expected_out = {ren[l] if l in ren else l for l in out}
    if expected_out != set(heads) | {t, e} or len(out) != len(heads) + 2:
        return None
    if mask is not None and (tuple(mask.type.legs) != (t, s) or x_mask_align is None):
        return None
    return Attention(
        q=x.args[0], k=x.args[1], v=final.args[1], q_legs=q_legs, k_legs=k_legs,
        v_legs=tuple(ren.get(l, l) if l in p_legs else l for l in v_legs),
        heads=heads, t=t, s=s, d=d, e=e, out=tuple(ren.get(l, l) for l in out),
        scale_value=scale_value, scale_op=scale_op, mask=mask, mask_kind=kind, absorbed=[], scores=x,
    )
