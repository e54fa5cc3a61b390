"""The checker's rule for einops patterns (rearrange, reduce, repeat), beside their reader
penrose/einops_pattern.py: what the pattern's names mean (dims, sizes, groups, which side may hold what).

`_Einops` is a part of `penrose.checker._Checker`; its methods read the checker's state.
"""

from __future__ import annotations

import math

from penrose import ir
from penrose.check_base import _describe, _prod, _product_of, _State
from penrose.checked import TType, V
from penrose.attrs import Einop
from penrose.einops_pattern import REDUCTIONS
from penrose.einops_pattern import parse as parse_pattern
from penrose.einsum_spec import spec_span
from penrose.errors import PenroseCheckError, suggest


class _Einops(_State):
    """einops patterns: rearrange, reduce, repeat."""

    def _einop(self, sc, e: ir.Call) -> V:
        """einops' pattern language (penrose/einops_pattern.py) over the diagram's dims.

        The left side names the operand's legs in order (`...` the ones it skips); a group
        `(h d)` splits a leg into declared dims whose sizes multiply to the leg's; the right side
        gives the result's legs, a group merging legs into a declared dim (the one declared as
        that product, `dim hd = h * d`). Batch legs stay outermost, as in einsum; in `reduce` an
        ellipsis on the left only also reduces them."""
        kind = e.func
        x = self._tensor_arg(sc, e, 0, allow=("float",) if kind == "reduce" else ("float", "int", "bool"))
        node = e.args[1]
        if not isinstance(node, ir.String):
            raise PenroseCheckError(f"{kind}'s second argument is its pattern, as {kind}(x, 't (h d) -> h t d')", node.span)
        reduction = self._reduction(e) if kind == "reduce" else None
        pat = parse_pattern(node.value, node.span, kind)

        def at(a, b=None):
            return spec_span(node.span, a, b)

        self._axis_lengths(e, pat, node)
        left, right = pat.left, pat.right
        axes: dict[str, tuple] = {}  # axis id -> (size class, leg name); '...0' ... for the ellipsis' legs
        left_groups = self._left_side(e, x, left, node, at, axes)
        if right.ellipsis is not None and left.ellipsis is None:
            g = right.groups[right.ellipsis]
            raise PenroseCheckError(f"{kind}: '...' on the right but not on the left", at(g.start, g.end))
        if left.ellipsis is not None and right.ellipsis is None and kind != "reduce":
            g = left.groups[left.ellipsis]
            raise PenroseCheckError(f"{kind}: '...' on the left but not on the right (only reduce drops legs)", at(g.start, g.end))
        right_groups, out_legs, out_cls, new = self._right_side(kind, right, at, axes)
        reduced = self._reduced(e, reduction, left, at, axes, left_groups, right_groups)
        sum_batch = kind == "reduce" and left.ellipsis is not None and right.ellipsis is None and x.type.batched
        dtype = "float" if kind == "reduce" else x.type.dtype
        ty = TType(tuple(out_legs), tuple(out_cls), dtype, x.type.batched and not sum_batch)
        attrs = Einop(
            kind=kind, pattern=node.value, reduction=reduction,
            left=tuple(left_groups), right=tuple(right_groups),
            axes=tuple((a, c, leg) for a, (c, leg) in axes.items()), new=tuple(new), reduced=tuple(reduced),
            sum_batch=sum_batch,
        )
        return V("einop", (x,), attrs, ty, span=e.span)

    def _reduction(self, e: ir.Call) -> str:
        """reduce's reduction, by position or as reduction=: one of REDUCTIONS."""
        r = e.args[2] if len(e.args) > 2 else e.kwarg("reduction")
        if len(e.args) > 2 and e.kwarg("reduction") is not None:
            raise PenroseCheckError("reduce: the reduction is given twice, by position and as reduction=", e.kwarg("reduction").span)
        if r is None:
            raise PenroseCheckError("reduce needs its reduction: reduce(x, 't e -> e', 'mean') or reduction='mean'", e.span)
        if not isinstance(r, ir.String) or r.value not in REDUCTIONS:
            got = f" {r.value!r}" if isinstance(r, ir.String) else ""
            hint = suggest(r.value, REDUCTIONS) if isinstance(r, ir.String) else ""
            raise PenroseCheckError(
                f"reduce: the reduction{got} is one of {', '.join(repr(n) for n in REDUCTIONS)}{hint}", r.span
            )
        return r.value

    def _axis_lengths(self, e: ir.Call, pat, node: ir.String):
        """einops' axis lengths, h=2: each a dim of the pattern; its size, checked (or given, to a dim without one)."""
        kind = e.func
        in_pattern = {a.name for side in (pat.left, pat.right) for a in side.axes() if a.name is not None}
        for k, v in e.kwargs:
            if k == "reduction" and kind == "reduce":
                continue
            if k not in in_pattern:
                raise PenroseCheckError(f"{kind}: {k}= names no leg of the pattern {node.value!r} (keywords give the "
                                        "sizes of its dims, as einops' axis lengths)", v.span)
            if k not in self.dims:
                hint = suggest(k, self.dims) or f"; declare it with 'dim {k} = SIZE'"
                raise PenroseCheckError(f"{kind}: unknown dim {k!r}{hint}", v.span)
            n = self._static(v, f"{kind}: {k}=", integer=True)
            have = self.S.size(self.dims[k])
            if have is not None and have != n:
                raise PenroseCheckError(f"{kind}: {k}={n}, but dim {k!r} has size {have}", v.span)
            if have is None:
                if n < 1:
                    raise PenroseCheckError(f"{kind}: {k}={n}: a size is at least 1", v.span)
                self.S.unify(self.dims[k], self.S.new(k, n, (f"{k}={n}", v.span)), (f"{kind}: {k}=", v.span))

    def _left_side(self, e: ir.Call, x: V, left, node: ir.String, at, axes: dict) -> list[tuple]:
        """The left side against the operand's legs, in order: each group's axes (into `axes`)."""
        kind = e.func
        legs, lcls = x.legs, x.type.cls
        named = len(left.groups) - (left.ellipsis is not None)
        if named > len(legs) or (left.ellipsis is None and named != len(legs)):
            raise PenroseCheckError(
                f"{kind}: the left side of the pattern has {named} leg(s){' and ...' if left.ellipsis is not None else ''} "
                f"but {_describe(e.args[0])} has {len(legs)}: [{', '.join(legs)}]",
                at(left.start, left.end),
            )
        left_groups: list[tuple] = []
        li = 0
        for gi, g in enumerate(left.groups):
            if gi == left.ellipsis:
                if g.paren:
                    raise PenroseCheckError(f"{kind}: '...' inside parentheses on the left", at(g.start, g.end))
                for j in range(len(legs) - named):
                    axes[f"...{j}"] = (lcls[li], legs[li])
                    left_groups.append((f"...{j}",))
                    li += 1
                continue
            leg, c = legs[li], lcls[li]
            li += 1
            if g.unit:
                n = self.S.size(c)
                if n is not None and n != 1:
                    raise PenroseCheckError(f"{kind}: {node.value[g.start:g.end]!r} is a leg of size 1, but leg {leg!r} has size {n}", at(g.start, g.end))
                self.S.unify(c, self.S.new("1", 1, ("a leg of size 1", at(g.start, g.end))), (f"{kind}: leg {leg!r}", at(g.start, g.end)))
                self._baked(c)  # squeezed: an input carrying it is checked to have size 1
                left_groups.append(())
                continue
            for a in g.axes:
                if a.name is not None:
                    self._pattern_dim(a, kind, at)
            names = g.names
            if len(names) == 1:
                self.S.unify(c, self.dims[names[0]], (f"{kind}: {names[0]!r} for leg {leg!r} of {_describe(e.args[0])}", at(g.start, g.end)))
                axes[names[0]] = (c, names[0])
            else:
                self._split_group(e, g, leg, c, node, at)
                for nm in names:
                    axes[nm] = (self.dims[nm], nm)
                self._baked(c, *(self.dims[nm] for nm in names))
            left_groups.append(names)
        return left_groups

    def _split_group(self, e: ir.Call, g, leg: str, c: int, node: ir.String, at):
        """A left group `(h d)` splits leg `leg` (class c): its dims' sizes multiply to the leg's; one
        unknown size follows from the others, a leg only inputs carry takes the group's size."""
        kind, names = e.func, g.names
        sizes = [self.S.size(self.dims[n]) for n in names]
        n = self.S.size(c)
        group_span = at(g.start, g.end)
        if sizes.count(None) == 1 and n is not None:  # one factor unknown: the leg's size over the others'
            missing = names[sizes.index(None)]
            known = math.prod(s for s in sizes if s is not None)
            if known == 0 or n % known:
                raise PenroseCheckError(
                    f"{kind}: leg {leg!r} of size {n} does not split into {node.value[g.start:g.end]} "
                    f"with the other sizes multiplying to {known}", group_span)
            self.S.unify(self.dims[missing], self.S.new(missing, n // known, (f"dim {missing!r} (from the group)", group_span)),
                         (f"{kind}: dim {missing!r}", group_span))
            sizes = [self.S.size(self.dims[nm]) for nm in names]
        elif None not in sizes and n is None:  # a leg only inputs carry: the group fixes its size
            self.S.unify(c, self.S.new(leg, _prod(sizes), (f"leg {leg!r} (split by the group)", group_span)),
                         (f"{kind}: leg {leg!r}", group_span))
            n = _prod(sizes)
        if None not in sizes and n is not None and _prod(sizes) != n:
            raise PenroseCheckError(
                f"{kind}: the group {node.value[g.start:g.end]} holds {' * '.join(map(str, sizes))} = {_prod(sizes)} "
                f"entries but leg {leg!r} of {_describe(e.args[0])} has size {n}",
                at(g.start, g.end),
            )
        if sum(s is None for s in sizes) > 1 or (None in sizes and n is None):
            missing = next(nm for nm, sz in zip(names, sizes) if sz is None)
            raise PenroseCheckError(f"{kind}: dim {missing!r} in a group needs a size", at(g.start, g.end))

    def _right_side(self, kind: str, right, at, axes: dict) -> tuple[list[tuple[str, ...]], list, list, list]:
        """The result's legs from the right side: its groups' axes, legs, size classes, and the
        legs repeat adds (into `axes` too)."""
        right_groups: list[tuple[str, ...]] = []
        out_legs, out_cls, new = [], [], []
        for gi, g in enumerate(right.groups):
            if gi == right.ellipsis and not g.paren:  # `...`: the ellipsis' legs, each its own
                for aid in (a for a in axes if a.startswith("...")):
                    right_groups.append((aid,))
                    out_legs.append(axes[aid][1])
                    out_cls.append(axes[aid][0])
                continue
            ids: list[str] = []  # the group's axes: its names and, in `(...)` or `(a ...)`, the ellipsis' legs
            for a in g.axes:
                if a.ellipsis:
                    ids.extend(aid for aid in axes if aid.startswith("..."))
                    continue
                if a.name is None:
                    continue
                if a.name not in axes:
                    self._pattern_dim(a, kind, at)
                    if kind != "repeat":
                        hint = " (repeat adds legs)" if kind == "rearrange" else " (reduce only removes legs; repeat adds them)"
                        raise PenroseCheckError(f"{kind}: {a.name!r} is on the right but not on the left{hint}", at(a.start, a.end))
                    if self.S.size(self.dims[a.name]) is None:
                        raise PenroseCheckError(
                            f"repeat: the new leg {a.name!r} needs a size: give it as einops does, repeat(..., {a.name}=SIZE), "
                            f"or declare it with 'dim {a.name} = SIZE'", at(a.start, a.end))
                    axes[a.name] = (self.dims[a.name], a.name)
                    self._baked(self.dims[a.name])
                    new.append(a.name)
                ids.append(a.name)
            if not ids:  # `1`, `()` or an empty `(...)`: a new leg of size 1, named '1', as einops makes it
                right_groups.append(())
                out_legs.append("1")
                out_cls.append(self.S.new("1", 1, ("a leg of size 1", at(g.start, g.end))))
                continue
            if len(ids) == 1:
                out_legs.append(axes[ids[0]][1])
                out_cls.append(axes[ids[0]][0])
            else:
                merged = self._merged_dim([axes[a][1] for a in ids], [axes[a][0] for a in ids], kind, at(g.start, g.end))
                out_legs.append(merged)
                out_cls.append(self.dims[merged])
                self._baked(self.dims[merged], *(axes[a][0] for a in ids))
            right_groups.append(tuple(ids))
        return right_groups, out_legs, out_cls, new

    def _reduced(self, e: ir.Call, reduction, left, at, axes: dict, left_groups, right_groups) -> list:
        """The axes of the left side the right drops: only reduce drops any, and not over a leg of size 0
        with max, min or mean."""
        kind = e.func
        kept = {a for grp in right_groups for a in grp}
        reduced = [a for grp in left_groups for a in grp if a not in kept]
        if reduced and kind != "reduce":
            first = reduced[0]
            where = next((a for a in left.axes() if a.name == first), None)
            label = axes[first][1] if first.startswith("...") else first
            span = at(where.start, where.end) if where is not None else at(left.start, left.end)
            raise PenroseCheckError(f"{kind}: {label!r} is on the left but not on the right (reduce removes legs)", span)
        if reduction in ("max", "min", "mean"):
            for a in reduced:
                if self.S.size(axes[a][0]) == 0:
                    raise PenroseCheckError(f"reduce: {reduction} over leg {axes[a][1]!r}, which has size 0: there are no entries to reduce", e.span)
        return reduced

    def _pattern_dim(self, a, kind, at):
        if a.name not in self.dims:
            hint = suggest(a.name, self.dims) or f"; declare it with 'dim {a.name} = SIZE'"
            raise PenroseCheckError(f"{kind}: unknown dim {a.name!r} in the pattern{hint}", at(a.start, a.end))

    def _merged_dim(self, names, classes, kind, span) -> str:
        """The declared dim a group of legs merges into: the one declared as their product in
        order (`dim hd = h * d`), else the one named by their names run together (`hd`), else
        the only dim of that size."""
        sizes = [self.S.size(c) for c in classes]
        group = "(" + " ".join(names) + ")"
        if None in sizes:
            raise PenroseCheckError(f"{kind}: every leg merged by {group} needs a size", span)
        total = _prod(sizes)
        for name, d in self.dim_decl.items():
            if _product_of(d.size) == tuple(names) and self.S.size(self.dims[name]) == total:
                return name
        joined = "".join(names)
        if joined in self.dims and self.S.size(self.dims[joined]) == total:
            return joined
        same = [n for n in self.dims if n not in names and self.S.size(self.dims[n]) == total]
        if len(same) == 1:
            return same[0]
        if same:
            raise PenroseCheckError(
                f"{kind}: {group} merges into a leg of size {total}, and dims {', '.join(same)} all have that size; "
                f"declare which: dim {joined} = {' * '.join(names)}",
                span,
            )
        raise PenroseCheckError(f"{kind}: {group} merges into a leg of size {total}; declare it: dim {joined} = {' * '.join(names)}", span)
