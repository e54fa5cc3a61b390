"""The checker's per-op type rules, registered by name in `TYPE_RULES` (a row's `ops.Op.rule`).

`_Ops` is a part of `penrose.checker._Checker`; its methods read the checker's state.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from typing import NamedTuple

from penrose import ir
from penrose.check_base import _a, _describe, _State
from penrose.check_einops import _Einops
from penrose.checked import SCALAR, TType, V
from penrose.attrs import Clamp, Concat, Dropout, Einsum, Flatten, LayerNorm, Mask, NONE, Pair, RMSNorm, Reduce, Rope, Select, Slice, Softmax, Split, TopK, Unary, Unflatten, Where
from penrose.einsum_spec import is_ellipsis_label, label_text, respell, spec_span
from penrose.einsum_spec import parse as parse_einsum
from penrose.errors import PenroseCheckError, Span, suggest
from penrose.fmt import format_expr
from penrose.ops import OPS


class _Ops(_State):
    """The per-op type rules, one `_fn_*` method (or a shared one) a row of `penrose.ops.OPS`."""

    def _elementwise(self, sc, e: ir.Call) -> V:
        """An element-wise function of the table: its keywords by name, or by position after x."""
        f, row = e.func, OPS[e.func]
        a = self._expr(sc, e.args[0])
        if a.type.dtype == "scalar":
            if row.scalar:
                return V("sfunc", (a,), Unary(f), SCALAR, span=e.span)
            raise PenroseCheckError(f"{f} of a plain number; apply it to a tensor", e.span)
        self._numeric(a, e.args[0].span, f"apply {f} to")
        keywords: list[tuple[str, float]] = []
        for kw, node in zip(row.keywords, [*e.args[1:], *[None] * len(row.keywords)]):
            if node is not None and e.kwarg(kw.name) is not None:
                raise PenroseCheckError(f"{f}: {kw.name} is given twice, by position and as {kw.name}=", e.kwarg(kw.name).span)
            value = self._number_kw(e, kw.name, node=node)
            if value is None:
                raise PenroseCheckError(f"{f} needs {kw.name}, as {f}(x, {kw.name}=0)", e.span)
            keywords.append((kw.name, float(value)))
        return V("unary", (a,), Unary(f, tuple(keywords)), a.type, span=e.span)

    # einsum ------------------------------------------------------------------------------------
    def _fn_einsum(self, sc, e: ir.Call) -> V:
        """torch.einsum's rules (penrose/einsum_spec.py); a label bound to sizes 1 and n broadcasts to n."""
        if not e.args or not isinstance(e.args[0], ir.String):
            raise PenroseCheckError("einsum's first argument is its spec string, as einsum('te,ed->td', Z, W)", e.span)
        spec_node = e.args[0]
        operands = [self._expr(sc, a) for a in e.args[1:]]
        for i, (v, a) in enumerate(zip(operands, e.args[1:])):
            if v.type.dtype == "scalar":
                raise PenroseCheckError(f"einsum operand {i + 1} is a plain number; einsum contracts tensors", a.span)
            if v.type.dtype != "float":
                raise PenroseCheckError(
                    f"einsum operand {i + 1} {_describe(a)} is {_a(v.type.dtype)} tensor; use gather(E, ids) for ids", a.span
                )
        key = (spec_node.value, tuple(v.legs for v in operands), tuple(v.type.batched for v in operands))
        ein = _EINSUM_SPECS.get(key)
        if ein is None:  # a spec read once per operand shapes; an error is raised (and positioned) afresh each time
            ein = parse_einsum(
                spec_node.value, spec_node.span, [len(v.legs) for v in operands],
                batched=[v.type.batched for v in operands], names=[_describe(a) for a in e.args[1:]],
                legs=[v.legs for v in operands],
            )
            if len(_EINSUM_SPECS) > 4096:
                _EINSUM_SPECS.clear()
            _EINSUM_SPECS[key] = ein
        size = self.S.size
        label_cls: dict[str, int] = {}  # the class each label takes in the result: a size-1 one only if all are
        label_leg: dict[str, str] = {}  # the leg name a synthetic '...k' label gives the result
        label_origin: dict[str, _Where] = {}
        for i, (term, v, a) in enumerate(zip(ein.terms, operands, e.args[1:])):
            in_term: dict[str, tuple[int, _Where]] = {}
            for j, (label, c, leg) in enumerate(zip(term, v.type.cls, v.legs)):
                where = _Where(i, a, leg)  # message text and position, built only for an error
                here = _Here(spec_node.span, ein.where[i][j])
                if label in in_term:  # a diagonal: torch needs equal sizes, 1 does not broadcast here
                    c0, where0 = in_term[label]
                    va, vb = size(c0), size(c)
                    if va is not None and vb is not None and va != vb:
                        raise PenroseCheckError(
                            f"einsum label {label_text(label)} is repeated in operand {i + 1} {_describe(a)} "
                            f"but its legs differ in size: {where0} ({va}), leg {leg!r} ({vb})",
                            here.span,
                        )
                    self.S.unify(c0, c, (f"einsum label {label_text(label)}", here.span))
                    continue
                in_term[label] = (c, where)
                if label not in label_cls:
                    label_cls[label], label_leg[label], label_origin[label] = c, leg, where
                    continue
                va, vb = size(label_cls[label]), size(c)
                if vb == 1 and va != 1:  # broadcasts against the label's other legs: it must stay 1
                    self._baked(c)
                    continue
                if va == 1 and vb != 1:
                    self._baked(label_cls[label])
                    label_cls[label], label_leg[label], label_origin[label] = c, leg, where
                    continue
                if va is not None and vb is not None and va != vb:
                    raise PenroseCheckError(
                        f"size of label {label_text(label)} for {where} ({vb}) does not match {label_origin[label]} ({va})",
                        here.span,
                    )
                if self.S.find(label_cls[label]) != self.S.find(c):
                    self.S.unify(label_cls[label], c, (f"einsum label {label_text(label)}", here.span))
        self._output_letters(spec_node, ein, operands, label_cls, label_leg, label_origin)
        legs = tuple(label_leg[l] if is_ellipsis_label(l) else l for l in ein.out)
        batched = any(v.type.batched for v in operands) and not ein.sum_batch
        ty = TType(legs, tuple(label_cls[l] for l in ein.out), "float", batched)
        attrs = Einsum(terms=ein.terms, out=ein.out, sum_batch=ein.sum_batch, spec=spec_node.value)
        return V("einsum", tuple(operands), attrs, ty, span=e.span)

    def _output_letters(self, spec_node, ein, operands, label_cls, label_leg, label_origin):
        """An output letter names the result's leg: one that renames the leg it takes ('kd,de->ke'
        on a square W[d, d] makes W's leg 'd' the result's leg 'e') is kept in `relabels`, so
        that a later statement refused over the renamed leg is reported at the letter
        (`_letter_cause`); a warning at the letter when it names a declared dim of another size.
        Either says what to write: the spec with the legs' own names."""
        renamed = {l: label_leg[l] for l in ein.out if not is_ellipsis_label(l) and label_leg[l] != l}
        if not renamed or ein.parsed.output is None:
            return
        hint = _keep_names_hint(ein, renamed, {leg for v in operands for leg in v.legs} | set(self.dims))
        size = self.S.size
        for letter in ein.parsed.output.labels:
            if letter.name not in renamed:
                continue
            c, origin = label_cls[letter.name], label_origin[letter.name]
            span = spec_span(spec_node.span, letter.start, letter.end)
            n, m = size(c), size(self.dims[letter.name]) if letter.name in self.dims else None
            clash = (m, n) if n is not None and m is not None and m != n else None
            self.relabels.append(_Relabel(letter.name, renamed[letter.name], c, span, str(origin), hint, clash))
            if clash is not None:
                self.warnings.append((
                    f"einsum output letter {letter.name!r} names dim {letter.name!r} (size {m}), but it takes {origin} "
                    f"(size {n}): the result's leg {letter.name!r} has size {n}; {hint}", span))

    def _letter_cause(self, ex, v: V, legs, cls, span, what: str) -> None:
        """Raise at the einsum output letter when it caused this refusal to broadcast `ex` against
        `legs`: with the renamed leg named back, the legs would align by name."""
        S = self.S
        for r in reversed(self.relabels):
            root = S.find(r.cls)

            def back(ls, cs, r=r, root=root):
                return tuple(r.leg if l == r.letter and S.find(c) == root else l for l, c in zip(ls, cs))

            a, b = back(v.type.legs, v.type.cls), back(legs, cls)
            if (a, b) != (tuple(v.type.legs), tuple(legs)) and len(set(a)) == len(a) and len(set(b)) == len(b) and set(a) <= set(b):
                line = getattr(ex, "span", span).line
                raise PenroseCheckError(
                    f"einsum output letter {r.letter!r} names the result's leg {r.letter!r}, but it takes {r.origin}, "
                    f"so {what} on line {line} cannot broadcast {_describe(ex)} with legs [{', '.join(v.type.legs)}] "
                    f"against [{', '.join(legs)}]; {r.hint}", r.span,
                    notes=((f"{what} refused here", getattr(ex, "span", span)),))

    def _blame_letter(self, err: PenroseCheckError) -> PenroseCheckError:
        """A size conflict below an einsum output letter that names a dim of another size, over
        that letter and those two sizes: the error at the letter, the conflict in its message."""
        for r in reversed(self.relabels):
            if r.clash is None or r.span.file != err.span.file or err.span.line <= r.span.line:
                continue
            m, n = r.clash
            if f"{r.letter!r}" in err.message and f"{m}" in err.message and f"{n}" in err.message:
                return PenroseCheckError(
                    f"einsum output letter {r.letter!r} names dim {r.letter!r} (size {m}), but it takes {r.origin} (size {n}), "
                    f"so line {err.span.line} fails: {err.message}; {r.hint}", r.span,
                    notes=((f"line {err.span.line} refused here", err.span), *err.notes))
        return err

    # one-tensor functions over a leg ---------------------------------------------------------------
    def _over_leg(self, sc, e: ir.Call, default_last=True, v: V | None = None):
        v = self._tensor_arg(sc, e, 0, v=v)
        if not v.legs:
            raise PenroseCheckError(f"{e.func} needs a tensor with legs", e.args[0].span)
        leg_arg = e.args[1] if len(e.args) > 1 else e.kwarg("dim")
        if len(e.args) > 1 and e.kwarg("dim") is not None:
            raise PenroseCheckError(f"{e.func}: give the leg once (a name or dim=i)", e.span)
        if leg_arg is None:
            if not default_last:
                raise PenroseCheckError(f"{e.func} needs the leg to act on, as {e.func}(x, p) or dim=-1", e.span)
            axis = len(v.legs) - 1
        else:
            axis = self._leg_arg(v, leg_arg, e)
        return v, axis

    def _fn_softmax(self, sc, e):
        v, axis = self._over_leg(sc, e, default_last=False)
        return V(e.func, (v,), Softmax(axis), v.type, span=e.span)

    def _norm_param(self, sc, e, key, v, axis):
        node = e.kwarg(key)
        if node is None:
            return None
        if not isinstance(node, ir.Name):
            raise PenroseCheckError(f"{e.func}: {key} names a param of the diagram", node.span)
        ty = self._lookup(sc, node.id, node.span)
        decl = sc.decls.get(node.id)
        if decl is None or decl.tensor.kind not in ("param", "buffer"):
            raise PenroseCheckError(f"{e.func}: {key} {node.id!r} must be a declared param", node.span)
        if len(ty.legs) != 1:
            raise PenroseCheckError(f"{e.func}: {key} {node.id!r} must have one leg, it has {len(ty.legs)}", node.span)
        self.S.unify(ty.cls[0], v.type.cls[axis], (f"{e.func} {key} {node.id!r} against leg {v.legs[axis]!r}", node.span))
        return node.id

    def _fn_layernorm(self, sc, e):
        v, axis = self._over_leg(sc, e)
        w = self._norm_param(sc, e, "weight", v, axis)
        b = self._norm_param(sc, e, "bias", v, axis)
        eps = self._number_kw(e, "eps")
        return V("layernorm", (v,), LayerNorm(axis=axis, weight=w, bias=b, eps=eps), v.type, span=e.span)

    def _fn_rmsnorm(self, sc, e):
        v, axis = self._over_leg(sc, e)
        w = self._norm_param(sc, e, "weight", v, axis)
        eps = self._number_kw(e, "eps")
        return V("rmsnorm", (v,), RMSNorm(axis=axis, weight=w, eps=eps), v.type, span=e.span)

    def _fn_topk(self, sc, e):
        v, axis = self._over_leg(sc, e)
        k = self._number_kw(e, "k")
        if k is None:
            raise PenroseCheckError("topk needs k, as topk(x, u, k=32)", e.span)
        n = self.S.size(v.type.cls[axis])
        if k <= 0 or (n is not None and k > n):
            raise PenroseCheckError(f"topk: k={k} must be between 1 and the size of leg {v.legs[axis]!r} ({n})", e.span)
        self._baked(v.type.cls[axis])
        return V("topk", (v,), TopK(axis=axis, k=k), v.type, span=e.span)

    def _fn_topk_mask(self, sc, e):
        t = self._fn_topk(sc, e)
        return V("topk_mask", t.args, t.attrs, TType(t.type.legs, t.type.cls, "bool", t.type.batched), span=e.span)

    def _reduce(self, sc, e, x: V | None = None):
        v, axis = self._over_leg(sc, e, default_last=False, v=x)
        if e.func in ("max", "min", "mean") and self.S.size(v.type.cls[axis]) == 0:
            # torch's max (min) of no entries raises, its mean is nan
            raise PenroseCheckError(f"{e.func} over leg {v.legs[axis]!r}, which has size 0: there are no entries to reduce", e.span)
        legs = v.legs[:axis] + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + v.type.cls[axis + 1 :]
        return V("reduce", (v,), Reduce(axis=axis, name=e.func), TType(legs, cls, "float", v.type.batched), span=e.span)

    def _fn_minmax(self, sc, e):
        """max(x, k) and min(x, k) over a leg of x (or dim=i); max(a, b) and min(a, b) of two
        operands entry by entry, a tensor and a tensor or a number, aligned as `+` aligns them."""
        x = self._expr(sc, e.args[0])
        second = e.args[1] if len(e.args) > 1 else None
        if second is None or e.kwarg("dim") is not None or (
                isinstance(second, ir.Name) and x.type.dtype != "scalar" and second.id in x.legs):
            return self._reduce(sc, e, x)
        literal = second.operand if isinstance(second, ir.Neg) else second
        if isinstance(literal, ir.Number) and isinstance(literal.value, int):
            n = format_expr(second)
            raise PenroseCheckError(f"{e.func}(x, {n}) is ambiguous: write {e.func}(x, dim={n}) for the {e.func}imum over leg {n}, "
                                    f"or {e.func}(x, {n}.0) for the {e.func}imum with the number, entry by entry", second.span)
        a, b = self._unambiguous(sc, x), self._unambiguous(sc, self._expr(sc, second))
        for v, node in ((a, e.args[0]), (b, second)):
            if v.type.dtype in ("bool", "int"):
                raise PenroseCheckError(f"{e.func}: {_describe(node)} must be a float tensor or a number", node.span)
        if a.type.dtype == b.type.dtype == "scalar":
            raise PenroseCheckError(f"{e.func} of two plain numbers; apply it to a tensor", e.span)
        legs, cls, align = self._align([a, b], [e.args[0], second], e.span, e.func)
        ty = TType(legs, cls, "float", a.type.batched or b.type.batched)
        return V("pair", (a, b), Pair(name=e.func, align=align), ty, span=e.span)

    def _fn_dropout(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        if len(e.args) == 2:
            if e.kwarg("p") is not None:
                raise PenroseCheckError("dropout: p is given twice, by position and as p=", e.kwarg("p").span)
            if not isinstance(e.args[1], ir.Number):
                raise PenroseCheckError("dropout: p must be a number", e.args[1].span)
            p = e.args[1].value
        else:
            p = self._number_kw(e, "p")
        if not 0 <= p < 1:
            raise PenroseCheckError(f"dropout: p={p} must be in [0, 1)", e.span)
        return V("dropout", (v,), Dropout(p), v.type, span=e.span)

    def _fn_detach(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        return V("detach", (v,), NONE, v.type, span=e.span)

    def _fn_clamp(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        pos = [a for a in e.args[1:]]
        lo = hi = None
        if pos:
            for a in pos:
                if not isinstance(a, ir.Number):
                    raise PenroseCheckError("clamp bounds are numbers", a.span)
                self._literal_ok(a)
            lo = pos[0].value
            hi = pos[1].value if len(pos) > 1 else None
            for key, _node in zip(("min", "max"), pos):
                if e.kwarg(key) is not None:
                    raise PenroseCheckError(f"clamp: {key} is given twice, by position and as {key}=", e.kwarg(key).span)
        lo = self._number_kw(e, "min", lo)
        hi = self._number_kw(e, "max", hi)
        if lo is None and hi is None:
            raise PenroseCheckError("clamp needs min= or max=", e.span)
        if lo is not None and hi is not None and lo > hi:
            raise PenroseCheckError(f"clamp: min={lo} is above max={hi}", e.span)
        return V("clamp", (v,), Clamp(min=lo, max=hi), v.type, span=e.span)

    def _fn_where(self, sc, e):
        m = self._expr(sc, e.args[0])
        if m.type.dtype != "bool":
            raise PenroseCheckError("where: the first argument must be a bool mask (a comparison, causal(t, p), or a bool input)", e.args[0].span)
        a, b = self._unambiguous(sc, self._expr(sc, e.args[1])), self._unambiguous(sc, self._expr(sc, e.args[2]))
        for v, x in ((a, e.args[1]), (b, e.args[2])):
            if v.type.dtype in ("bool", "int"):
                raise PenroseCheckError(f"where: {_describe(x)} must be a float tensor or a number", x.span)
        legs, cls, align = self._align([m, a, b], list(e.args), e.span, "where")
        batched = any(v.type.batched for v in (m, a, b))
        return V("where", (m, a, b), Where(align=align), TType(legs, cls, "float", batched), span=e.span)

    def _mask(self, sc, e, block):
        legs = []
        usage = f"{e.func} takes two dims, as {e.func}(t, p)" if len(e.args) == 2 else f"{e.func} takes a dim, as {e.func}(t)"
        for a in e.args:
            if isinstance(a, ir.Name) and a.id not in self.dims:
                if a.id in sc.vars:
                    raise PenroseCheckError(f"{e.func}: {a.id!r} is a tensor, not a dim ({usage})", a.span)
                hint = suggest(a.id, self.dims) or f"; declare it with 'dim {a.id} = SIZE'"
                raise PenroseCheckError(f"{e.func}: undeclared dim {a.id!r}{hint} ({usage})", a.span)
            if not isinstance(a, ir.Name):
                raise PenroseCheckError(usage, a.span)
            legs.append(a.id)
        size = None
        if block:
            size = self._number_kw(e, "block")
            if size is None or size <= 0:
                raise PenroseCheckError("block_causal needs block=N with N > 0", e.span)
        cls = tuple(self.dims[l] for l in legs)
        dtype = "float" if e.func == "arange" else "bool"  # arange(t): the positions 0, 1, ... along t
        return V("mask", (), Mask(e.func, size), TType(tuple(legs), cls, dtype, False), span=e.span)

    def _fn_causal(self, sc, e):
        return self._mask(sc, e, False)

    def _fn_block_causal(self, sc, e):
        return self._mask(sc, e, True)

    def _fn_arange(self, sc, e):
        return self._mask(sc, e, False)

    def _fn_gather(self, sc, e):
        table = self._tensor_arg(sc, e, 0)
        ids = self._tensor_arg(sc, e, 1, allow=("int",))
        if table.type.batched:
            raise PenroseCheckError("gather: the table (first argument) must be a param or buffer without batch legs", e.args[0].span)
        if not table.legs:
            raise PenroseCheckError("gather: the table needs a leg to pick from", e.args[0].span)
        legs = ids.legs + table.legs[1:]
        cls = ids.type.cls + table.type.cls[1:]
        return V("gather", (table, ids), NONE, TType(legs, cls, "float", ids.type.batched), span=e.span)

    def _leg_list(self, node, e, what):
        if not isinstance(node, ir.ListExpr) or not node.items or not all(isinstance(i, ir.Name) for i in node.items):
            raise PenroseCheckError(f"{e.func}: {what} is a list of dims, as [f, f]", getattr(node, "span", e.span))
        for i in node.items:
            if i.id not in self.dims:
                raise PenroseCheckError(f"{e.func}: undeclared dim {i.id!r}{suggest(i.id, self.dims)}", i.span)
        return [i.id for i in node.items]

    def _baked(self, *classes):
        """Legs whose sizes the statement relies on (split pieces, flatten groups, top-k's k): fixed
        at their declared sizes, so an input that carries one is checked against it at run time
        instead of being read as a new size."""
        for c in classes:
            if self.S.size(c) is not None:
                self.S.mark(c, fixed=True)

    def _fn_split(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        axis = self._leg_arg(v, e.args[1], e)
        parts = self._leg_list(e.args[2], e, "the parts")
        sizes = [self.S.size(self.dims[p]) for p in parts]
        total = self.S.size(v.type.cls[axis])
        if any(s is None for s in sizes):
            raise PenroseCheckError("split: every part's dim needs a size", e.args[2].span)
        if total is not None and sum(sizes) != total:
            raise PenroseCheckError(
                f"split: parts [{', '.join(parts)}] add up to {sum(sizes)} but leg {v.legs[axis]!r} has size {total}", e.span
            )
        outs = []
        for p in parts:
            legs = v.legs[:axis] + (p,) + v.legs[axis + 1 :]
            cls = v.type.cls[:axis] + (self.dims[p],) + v.type.cls[axis + 1 :]
            outs.append(TType(legs, cls, v.type.dtype, v.type.batched))
        self._baked(v.type.cls[axis], *(self.dims[p] for p in parts))
        return V("split", (v,), Split(axis=axis, sizes=tuple(sizes)), outs[0], outs=tuple(outs), span=e.span)

    def _fn_concat(self, sc, e):
        if not isinstance(e.args[0], ir.ListExpr) or len(e.args[0].items) < 2:
            raise PenroseCheckError("concat takes a list of two or more tensors, as concat([a, b], f, f2)", e.args[0].span)
        parts = [self._expr(sc, x) for x in e.args[0].items]
        first = parts[0]
        for p, x in zip(parts, e.args[0].items):
            if p.type.dtype == "scalar":
                raise PenroseCheckError("concat: every part must be a tensor", x.span)
        axis = self._leg_arg(first, e.args[1], e)
        into = e.args[2]
        if not isinstance(into, ir.Name) or into.id not in self.dims:
            raise PenroseCheckError("concat: the third argument is the dim of the joined leg", into.span)
        total = 0
        for p, x in zip(parts, e.args[0].items):
            if len(p.legs) != len(first.legs):
                raise PenroseCheckError(f"concat: {_describe(x)} has {len(p.legs)} legs, the first part {len(first.legs)}", x.span)
            for j, (c1, c2) in enumerate(zip(first.type.cls, p.type.cls)):
                if j != axis:
                    self.S.unify(c1, c2, (f"concat: leg {first.legs[j]!r}", x.span))
            s = self.S.size(p.type.cls[axis])
            total = None if (s is None or total is None) else total + s
        c_into = self.dims[into.id]
        want = self.S.size(c_into)
        if total is not None and want is not None and total != want:
            raise PenroseCheckError(f"concat: the parts add up to {total} but dim {into.id!r} has size {want}", into.span)
        legs = first.legs[:axis] + (into.id,) + first.legs[axis + 1 :]
        cls = first.type.cls[:axis] + (c_into,) + first.type.cls[axis + 1 :]
        batched = any(p.type.batched for p in parts)
        self._baked(c_into, *(p.type.cls[axis] for p in parts))
        return V("concat", tuple(parts), Concat(axis), TType(legs, cls, first.type.dtype, batched), span=e.span)

    def _fn_unflatten(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        axis = self._leg_arg(v, e.args[1], e)
        parts = self._leg_list(e.args[2], e, "the new legs")
        sizes = [self.S.size(self.dims[p]) for p in parts]
        total = self.S.size(v.type.cls[axis])
        if all(s is not None for s in sizes) and total is not None and math.prod(sizes) != total:
            raise PenroseCheckError(
                f"unflatten: [{', '.join(parts)}] hold {math.prod(sizes)} entries but leg {v.legs[axis]!r} has size {total}", e.span
            )
        if any(s is None for s in sizes):
            raise PenroseCheckError("unflatten: every new leg's dim needs a size", e.args[2].span)
        legs = v.legs[:axis] + tuple(parts) + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + tuple(self.dims[p] for p in parts) + v.type.cls[axis + 1 :]
        self._baked(v.type.cls[axis], *(self.dims[p] for p in parts))
        return V("unflatten", (v,), Unflatten(axis=axis, sizes=tuple(sizes)), TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)

    def _fn_flatten(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        parts = []
        for node in e.args[1].items if isinstance(e.args[1], ir.ListExpr) else ():
            parts.append(self._leg_arg(v, node, e))
        if len(parts) < 2 or parts != list(range(parts[0], parts[0] + len(parts))):
            raise PenroseCheckError("flatten: give two or more adjacent legs in order, as flatten(x, [h, d], e)", e.args[1].span)
        into = e.args[2]
        if not isinstance(into, ir.Name) or into.id not in self.dims:
            raise PenroseCheckError("flatten: the third argument is the dim of the joined leg", into.span)
        sizes = [self.S.size(v.type.cls[i]) for i in parts]
        c_into = self.dims[into.id]
        want = self.S.size(c_into)
        if all(s is not None for s in sizes) and want is not None and math.prod(sizes) != want:
            raise PenroseCheckError(f"flatten: the legs hold {math.prod(sizes)} entries but dim {into.id!r} has size {want}", into.span)
        a, b = parts[0], parts[-1] + 1
        legs = v.legs[:a] + (into.id,) + v.legs[b:]
        cls = v.type.cls[:a] + (c_into,) + v.type.cls[b:]
        self._baked(c_into, *(v.type.cls[i] for i in parts))
        return V("flatten", (v,), Flatten(start=a, end=b - 1), TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)

    def _fn_rope(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        pos = self._leg_arg(v, e.args[1], e)
        axis = self._leg_arg(v, e.args[2], e)
        if pos == axis:
            raise PenroseCheckError("rope: the position leg and the rotated leg differ, as rope(q, t, d)", e.span)
        n = self.S.size(v.type.cls[axis])
        if n is not None and n % 2:
            raise PenroseCheckError(f"rope: leg {v.legs[axis]!r} has odd size {n}; rotate-half needs an even size", e.span)
        base = self._number_kw(e, "base")
        self._baked(v.type.cls[axis])
        return V("rope", (v,), Rope(axis=axis, pos=pos, base=float(base)), v.type, span=e.span)

    # select and slice ------------------------------------------------------------------------------
    def _fn_select(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        axis = self._leg_arg(v, e.args[1], e)
        i = self._static(e.args[2], "select: the index", integer=True)
        n = self.S.size(v.type.cls[axis])
        if n is not None and not -n <= i < n:
            raise PenroseCheckError(f"select: index {i} is out of range for leg {v.legs[axis]!r} of size {n}", e.args[2].span)
        legs = v.legs[:axis] + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + v.type.cls[axis + 1 :]
        return V("select", (v,), Select(axis=axis, index=i), TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)

    def _fn_slice(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        axis = self._leg_arg(v, e.args[1], e)
        leg = v.legs[axis]
        start = self._static(e.args[2], "slice: the start", integer=True)
        length_node = e.args[3]
        into = e.kwarg("into")
        if len(e.args) > 4:
            if into is not None:
                raise PenroseCheckError("slice: the result's dim is given twice, by position and as into=", into.span)
            into = e.args[4]
        if isinstance(length_node, ir.Name) and length_node.id in self.dims:
            length = self.S.size(self.dims[length_node.id])
            if length is None:
                raise PenroseCheckError(f"slice: dim {length_node.id!r} has no size", length_node.span)
            into = into or length_node
        else:
            length = self._static(length_node, "slice: the length", integer=True)
        if length < 0:
            raise PenroseCheckError(f"slice: the length must be at least 0, got {length}", length_node.span)
        if into is None:
            same = [d for d in self.dims if self.S.size(self.dims[d]) == length and self.S.find(self.dims[d]) != self.S.find(v.type.cls[axis])]
            if len(same) != 1:
                which = f"dims {', '.join(same)} all have size {length}" if same else f"no dim has size {length}"
                raise PenroseCheckError(
                    f"slice: {which}; name the result's leg: slice(x, {leg}, {start}, {length}, into=DIM)", e.span
                )
            into_name = same[0]
        else:
            if not isinstance(into, ir.Name) or into.id not in self.dims:
                raise PenroseCheckError("slice: the result's leg is a declared dim, as into=s", into.span)
            into_name = into.id
            size = self.S.size(self.dims[into_name])
            if size != length:
                raise PenroseCheckError(
                    f"slice: {length} indices do not fit dim {into_name!r} of size {size}", into.span
                )
        n = self.S.size(v.type.cls[axis])
        if n is not None:
            first = start + n if start < 0 else start
            if not 0 <= first <= n or first + length > n:
                raise PenroseCheckError(
                    f"slice: indices {start} to {start + length - 1} are outside leg {leg!r} of size {n}", e.span
                )
        self._baked(self.dims[into_name])
        legs = v.legs[:axis] + (into_name,) + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + (self.dims[into_name],) + v.type.cls[axis + 1 :]
        return V("slice", (v,), Slice(axis=axis, start=start, length=length), TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)



# the checker's type rules, by the names the table's rows give (ops.Op.rule)
TYPE_RULES: dict[str, Callable[..., V]] = {
    "elementwise": _Ops._elementwise,
    "einsum": _Ops._fn_einsum,
    "softmax": _Ops._fn_softmax,
    "layernorm": _Ops._fn_layernorm,
    "rmsnorm": _Ops._fn_rmsnorm,
    "topk": _Ops._fn_topk,
    "topk_mask": _Ops._fn_topk_mask,
    "reduce": _Ops._reduce,
    "minmax": _Ops._fn_minmax,
    "dropout": _Ops._fn_dropout,
    "detach": _Ops._fn_detach,
    "clamp": _Ops._fn_clamp,
    "where": _Ops._fn_where,
    "causal": _Ops._fn_causal,
    "arange": _Ops._fn_arange,
    "block_causal": _Ops._fn_block_causal,
    "gather": _Ops._fn_gather,
    "split": _Ops._fn_split,
    "concat": _Ops._fn_concat,
    "flatten": _Ops._fn_flatten,
    "unflatten": _Ops._fn_unflatten,
    "einop": _Einops._einop,
    "select": _Ops._fn_select,
    "slice": _Ops._fn_slice,
    "rope": _Ops._fn_rope,
}

_EINSUM_SPECS: dict = {}  # (spec, operand legs, batched) -> einsum_spec.Einsum, for specs read without error


class _Relabel(NamedTuple):
    """An einsum output letter that renames the leg it takes (`_Ops._output_letters`)."""

    letter: str
    leg: str  # the name of the leg it takes
    cls: int  # the leg's size class
    span: Span  # the letter in the spec
    origin: str  # "operand 2 'W' leg 'd'"
    hint: str  # "write einsum('ka,ad->kd', ...)"
    clash: tuple[int, int] | None = None  # (the size of the dim the letter names, the leg's size) when they differ


def _keep_names_hint(ein, renamed: dict[str, str], taken: set[str]) -> str:
    """'write einsum(SPEC, ...)': the spec whose output letters keep the names of the legs they
    take (a contracted letter of that name gets a fresh one); where two result legs would share
    a name, the advice in words."""
    kept = {l for l in ein.out if l not in renamed}
    new = list(renamed.values())
    renames = {l: n for l, n in renamed.items() if n not in kept and new.count(n) == 1}
    if not renames:
        return "write an output letter that is the name of the leg it takes"
    labels = {l for t in ein.terms for l in t}
    taken = taken | labels | set(renames.values())
    for label in sorted(labels - set(ein.out)):
        if label in renames.values():  # a contracted letter with the name a result leg takes
            pool = [f"{label}{k}" for k in range(2, 100)] if ein.parsed.words else list(string.ascii_lowercase + string.ascii_uppercase)
            fresh = next((x for x in pool if x not in taken), None)
            if fresh is None:
                return "write an output letter that is the name of the leg it takes"
            renames[label] = fresh
            taken.add(fresh)
    return f"write einsum('{respell(ein.parsed, renames)}', ...) to keep the legs' names"


class _Where:
    """'operand 2 'W' leg 'd'', formatted only when a message needs it."""

    __slots__ = ("i", "a", "leg")

    def __init__(self, i, a, leg):
        self.i, self.a, self.leg = i, a, leg

    def __str__(self):
        return f"operand {self.i + 1} {_describe(self.a)} leg {self.leg!r}"


class _Here:
    """The span of one leg's characters in the spec, built only when needed."""

    __slots__ = ("base", "at")

    def __init__(self, base, at):
        self.base, self.at = base, at

    @property
    def span(self):
        return spec_span(self.base, *self.at)
