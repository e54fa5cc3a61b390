"""Shapes: reshape, permute, squeeze, expand, split, concat, select, slice, gather."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from penrose.tracing.common import INT64_MAX, BatchAxis, _describe, _overload, torch_name
from penrose.tracing.model import BATCH, Call, Cls, Leg, LegList, Num, Pattern, Ref, TensorList, View


def _is_cat(node) -> bool:
    return getattr(node, "op", None) == "call_function" and "cat" in str(getattr(node, "target", ""))


class Shapes:
    """Handlers of `Lowerer` (shapes); the table in `penrose.tracing.aten` names them."""

    if TYPE_CHECKING:  # a part of `Lowerer`: the rest of it (emit, unsupported, the other parts) is there

        def __getattr__(self, name: str) -> Any: ...

    # ---- shapes -------------------------------------------------------------------------------------
    def reshape(self, x: View, new_full) -> View:
        """x viewed with the sizes `new_full` (the batch's first, in batch mode): its legs split where
        a new axis takes part of one (`(h d)` out of the width), merged where a new axis takes several;
        a merge with the batch (explicit mode: `x.view(-1, e)`, `(batch * heads, t, d)`) is virtual,
        the legs kept apart and the axis read as their product until a view splits it again, so
        the diagram's batch stays free."""
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        done = self.regrouped(x, [int(s) for s in new_full])
        if done is not None:
            return done
        if any(self.is_virtual(c) for c in x.axes):
            x = self.solid(x)
        return self.reshape_merging(x, new_full)

    def past_batch(self, x: View, new_full) -> list:
        """A reshape's sizes after the batch (which must stay first, whole: else `BatchAxis`)."""
        if not x.batched:
            return new_full
        if not new_full or new_full[0] != self.batch_size:
            raise BatchAxis
        return new_full[1:]

    def reshape_merging(self, x: View, new_full) -> View:
        """`reshape` where a new axis takes parts of two legs (merge them first, then split)."""
        new_full = [int(s) for s in new_full]
        new = self.past_batch(x, new_full)
        old_big = [(j, c) for j, c in enumerate(x.axes) if c is not None and c.size != 1]
        ones = [c for c in x.axes if c is not None and c.size == 1]
        new_big = [(j, s) for j, s in enumerate(new) if s != 1]
        if math.prod(c.size for _, c in old_big) != math.prod(s for _, s in new_big):
            self.fail(f"{torch_name(self.node)}: internal: sizes do not match")
        groups, i, j = [], 0, 0
        while i < len(old_big) or j < len(new_big):
            if i >= len(old_big) or j >= len(new_big):
                self.fail(f"{torch_name(self.node)}: a reshape with an axis of size 0")
            go, gn = [old_big[i]], [new_big[j]]
            po, pn = old_big[i][1].size, new_big[j][1]
            i, j = i + 1, j + 1
            while po != pn:
                if po < pn:
                    go.append(old_big[i])
                    po *= old_big[i][1].size
                    i += 1
                else:
                    gn.append(new_big[j])
                    pn *= new_big[j][1]
                    j += 1
            groups.append((go, gn))
        if any(len(go) > 1 and len(gn) > 1 for go, gn in groups):  # regrouped: merge first, then split
            mid = []
            for go, gn in groups:
                mid += [math.prod(c.size for _, c in go)] if len(gn) > 1 else [c.size for _, c in go]
            x = self.reshape_merging(x, ([self.batch_size] if x.batched else []) + mid)
            return self.reshape_merging(x, new_full)
        axes = [None] * len(new)
        split_of, right, changed = {}, [], bool(ones)
        for go, gn in groups:
            if len(go) == 1 and len(gn) == 1:
                axes[gn[0][0]] = go[0][1]
                right.append(go[0][1])
            elif len(go) == 1:
                n = len(gn)
                roles = ["part"] * (n - 2) + ["head", "headdim"]  # (3, heads, head dim) of a fused qkv too
                src = go[0][1]
                merged = self.C.find(src).merge
                if merged and [self.C.find(f).size for f in merged] == [sz for _, sz in gn] and not any(
                        self.C.same(f, l) for f in merged for l in x.pval.legs):
                    parts = list(merged)  # a merge undone: the legs it was made of
                else:
                    parts = None
                parts = parts or [self.C.new(s, role=r, origin=f"{'first' if k == 0 else 'last' if k == n - 1 else 'middle'} factor of a view of {_describe(src)}")
                         for k, ((_, s), r) in enumerate(zip(gn, roles))]
                split_of[id(self.C.find(src))] = tuple(parts)
                for (jj, _), p in zip(gn, parts):
                    axes[jj] = p
                right.extend(parts)
                changed = True
            else:
                factors = tuple(c for _, c in go)
                m = self.C.new(gn[0][1], role="merge", merge=factors, origin="")
                axes[gn[0][0]] = m
                right.append(factors)
                changed = True
        if not changed:
            return View(x.pval, axes, x.batched)
        left: list[Any] = []  # "1", a split (a tuple of classes) or a leg class
        for l in x.pval.legs:
            r = id(self.C.find(l))
            if l.size == 1:
                left.append("1")
            elif r in split_of:
                left.append(split_of[r])
            else:
                left.append(l)
        legs = [c for c in axes if c is not None]
        p = self.emit(Call("rearrange", [Ref(x.pval), Pattern(left, right)]), legs, x.batched, x.pval.dtype)
        return View(p, axes, x.batched)

    def regrouped(self, x: View, new_full):
        """`reshape` by consuming x's legs (virtual merges read as their factors) in order, each new
        axis taking whole legs, or the first part of one that it splits; None where a new axis
        would need parts of two legs (then `reshape_merging`)."""
        new = self.past_batch(x, new_full)
        queue = [l for c in x.axes if c is not None for l in self.flat(c) if l.size != 1]
        if math.prod(c.size for c in queue) != math.prod(new):
            self.fail(f"{torch_name(self.node)}: internal: sizes do not match")
        parts: dict = {id(self.C.find(l)): [l] for l in x.pval.legs}  # a leg of x -> the legs it is cut into
        fresh: dict = {}  # a leg of x -> the new classes cut from it (roles, legend)
        owner = {id(self.C.find(l)): id(self.C.find(l)) for l in x.pval.legs}

        def cut(c, need):  # c split into (need, rest)
            root = owner[id(self.C.find(c))]
            merged = self.C.find(c).merge
            if merged and not self.is_virtual(c) and not any(self.C.same(f, l) for f in merged for l in x.pval.legs):
                pieces = list(merged)  # a merge undone: the legs it was made of
            else:
                pieces = [self.C.new(need, origin=""), self.C.new(c.size // need, origin="")]
                fresh.setdefault(root, []).extend(pieces)
            seq = parts[root]
            k = next(i for i, l in enumerate(seq) if self.C.same(l, c))
            parts[root] = seq[:k] + pieces + seq[k + 1:]
            for pc in pieces:
                owner[id(self.C.find(pc))] = root
            return pieces

        groups: list[list | None] = []
        for s in new:
            if s == 1:
                groups.append(None)
                continue
            group, have = [], 1
            while have < s:
                if not queue:
                    return None
                c = queue.pop(0)
                if have * c.size <= s:
                    group.append(c)
                    have *= c.size
                    continue
                if s % have or c.size % (s // have):
                    return None
                pieces = cut(c, s // have)
                queue = pieces + queue
            groups.append(group)
        for root, new_legs in fresh.items():  # as the view names them: (3, heads, head dim) of a fused qkv too
            src = next(l for l in x.pval.legs if id(self.C.find(l)) == root)
            seq = [l for l in parts[root] if any(l is f for f in new_legs)]
            n = len(seq)
            roles = ["part"] * (n - 2) + ["head", "headdim"] if n > 1 else ["part"]
            key = (self.C.find(src).role, src.size, tuple(l.size for l in seq))
            for k, (l, role) in enumerate(zip(seq, roles)):
                l.role = role
                l.origin = f"{'first' if k == 0 else 'last' if k == n - 1 else 'middle'} factor of a view of {_describe(src)}"
                for other in self.views_of.get(key, [])[k:k + 1]:
                    self.C.wish(l, other)  # q's, k's and v's heads and head dims, split alike: one leg each
            self.views_of.setdefault(key, list(seq))
        axes: list[Any] = []
        right: list[Any] = []
        legs: list[Any] = []
        changed = any(l.size == 1 for l in x.pval.legs) or any(len(parts[id(self.C.find(l))]) > 1 for l in x.pval.legs)
        for grp in groups:
            if grp is None:
                axes.append(None)
            elif len(grp) == 1:
                axes.append(grp[0])
                right.append(grp[0])
                legs.append(grp[0])
            elif any(self.batchy(c) for c in grp):  # the batch merged with other legs: kept apart
                axes.append(self.virtual_class(grp))
                right.extend(grp)
                legs.extend(grp)
            else:
                m = self.C.new(math.prod(c.size for c in grp), role="merge", merge=tuple(grp), origin="")
                axes.append(m)
                right.append(tuple(grp))
                legs.append(m)
                changed = True
        if not changed:
            return View(x.pval, axes, x.batched)
        left: list[Any] = []
        for l in x.pval.legs:
            seq = parts[id(self.C.find(l))]
            left.append("1" if l.size == 1 else tuple(seq) if len(seq) > 1 else l)
        p = self.emit(Call("rearrange", [Ref(x.pval), Pattern(left, right)]), legs, x.batched, x.pval.dtype)
        return View(p, axes, x.batched)

    # ---- virtual merges: the batch merged with other legs, kept apart ------------------------------------
    def batchy(self, c) -> bool:
        """A leg that is the batch (explicit mode: axis 0 of the inputs that carry it)."""
        return any(self.C.same(c, b) for b in self.batch_legs)

    def is_virtual(self, c) -> bool:
        return isinstance(c, Cls) and self.C.find(c).role == "virtual"

    def flat(self, c) -> list:
        """The legs of a tensor an axis stands for: a virtual merge's factors, else the leg itself."""
        if c is None:
            return []
        if self.is_virtual(c):
            return [l for f in self.C.find(c).merge for l in self.flat(f)]
        return [c]

    def virtual_class(self, group) -> Cls:
        key = tuple(id(self.C.find(c)) for c in group)
        v = self.virtuals.get(key)
        if v is None:
            v = self.virtuals[key] = self.C.new(math.prod(c.size for c in group), role="virtual", merge=tuple(group),
                                                origin="")
        return v

    def solid(self, v):
        """v with its virtual merges made real legs (a rearrange merging them): what an op that reads
        that axis as one leg needs. A merge of the batch fixes the diagram's batch: noted, and the
        trace refuses it unless batch=False."""
        if not isinstance(v, View) or not any(self.is_virtual(c) for c in v.axes):
            return v
        v = self.materialize(v)
        axes, right = [], []
        for c in v.axes:
            if self.is_virtual(c):
                group = tuple(self.flat(c))
                m = self.C.new(c.size, role="merge", merge=group, origin="")
                axes.append(m)
                right.append(group)
                if not self.fixed_batch:
                    self.fixed_batch.append(self.where(self.node))
            elif c is not None:
                axes.append(c)
                right.append(c)
            else:
                axes.append(None)
        legs = [a for a in axes if a is not None]
        p = self.emit(Call("rearrange", [Ref(v.pval), Pattern(list(v.pval.legs), right)]), legs, v.batched, v.pval.dtype)
        return View(p, axes, v.batched)

    def reshape_node(self, node):
        return self.reshape(self.view_arg(node.args[0]), self.out_shape())


    def permute(self, x: View, perm) -> View:
        full = x.full
        n = len(full)
        perm = [p % n for p in perm]
        new = [full[p] for p in perm]
        if x.batched:
            if new[0] is not BATCH:
                raise BatchAxis
            new = new[1:]
        return View(x.pval, new, x.batched)

    def op_permute(self, node):
        x = self.view_arg(node.args[0])
        perm = list(node.args[1])
        if x.batched and perm and perm[0] % len(x.full) != 0 and all(self.picks_front(u) for u in node.users):
            return ("front", x, [p % len(x.full) for p in perm])  # `qkv.permute(2, 0, 3, 1, 4)` then `.unbind(0)`
        return self.permute(x, perm)

    @staticmethod
    def picks_front(node) -> bool:
        """An op that takes entries of axis 0 one at a time (`unbind(0)`, `x[0]`)."""
        from penrose.tracing.common import _packet

        if _packet(node) == "unbind":
            return (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) == 0
        return _packet(node) == "select" and node.args[1] == 0

    def front(self, entry, index) -> View:
        """Entry `index` of axis 0 of a permuted view that put a non-batch axis first: selected on the
        view before the permute, the rest of the permute applied after (the batch stays in front)."""
        _, x, perm = entry
        y = self.select(x, perm[0], index)
        rest = [p - (1 if p > perm[0] else 0) for p in perm[1:]]
        return self.permute(y, rest)

    def op_transpose(self, node):
        x = self.view_arg(node.args[0])
        n = len(x.full)
        d0, d1 = node.args[1] % n, node.args[2] % n
        perm = list(range(n))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.permute(x, perm)


    def op_t(self, node):
        x = self.view_arg(node.args[0])
        return self.permute(x, list(range(len(x.full)))[::-1])


    def op_mT(self, node):
        x = self.view_arg(node.args[0])
        n = len(x.full)
        perm = list(range(n))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return self.permute(x, perm)


    def op_movedim(self, node):
        x = self.view_arg(node.args[0])
        n = len(x.full)
        src, dst = node.args[1], node.args[2]
        src = [s % n for s in (src if isinstance(src, (list, tuple)) else [src])]
        dst = [d % n for d in (dst if isinstance(dst, (list, tuple)) else [dst])]
        order = [i for i in range(n) if i not in src]
        perm = [None] * n
        for s, d in zip(src, dst):
            perm[d] = s
        it = iter(order)
        perm = [p if p is not None else next(it) for p in perm]
        return self.permute(x, perm)


    def op_unsqueeze(self, node):
        return self.unsqueezed(self.view_arg(node.args[0]), node.args[1])

    def unsqueezed(self, x: View, d: int) -> View:
        """x with a size-1 axis inserted at d (counted from the end when negative), as op_unsqueeze."""
        full = x.full
        d = d % (len(full) + 1)
        new = full[:d] + [None] + full[d:]
        if x.batched:
            if new[0] is not BATCH:
                raise BatchAxis
            new = new[1:]
        return View(x.pval, new, x.batched)

    def op_squeeze(self, node):
        x = self.view_arg(node.args[0])
        full = x.full
        n = len(full)
        dims = node.args[1] if len(node.args) > 1 else list(range(n))
        dims = [d % n for d in (dims if isinstance(dims, (list, tuple)) else [dims])] if n else []
        drop_present, remove = [], set()
        for d in dims:
            e = full[d]
            if e is BATCH:
                if self.batch_size == 1:
                    raise BatchAxis
                continue
            j = d - (1 if x.batched else 0)
            if e is None:
                remove.add(j)
            elif e.size == 1:
                drop_present.append(j)
                remove.add(j)
        if drop_present:
            x = self.drop_ones(x, drop_present)
        return View(x.pval, [c for j, c in enumerate(x.axes) if j not in remove], x.batched)

    def op_expand(self, node):
        return self.expand(self.view_arg(node.args[0]), list(node.args[1]))

    def op_expand_as(self, node):
        return self.expand(self.view_arg(node.args[0]), self.out_shape())

    def expand(self, x, sizes):
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        full = x.full
        pad = len(sizes) - len(full)
        if pad < 0:
            self.unsupported(why="expanding to fewer axes")
        if self.batch and not x.batched and sizes and sizes[0] == self.batch_size and (
                pad > 0 or full[0] is None or full[0].size == 1):
            # learned tokens copied over the batch (`cls_token.expand(B, -1, -1)`, `S.repeat(B, 1, 1)`): the
            # tensor itself, which every batched tensor it meets broadcasts over the batch
            if pad == 0 and full[0] is not None:
                self.batch_ones.append(full[0])
                x = self.drop_ones(x, [0])
            rest = self.expand(View(x.pval, x.axes[0 if pad else 1:], False), list(sizes[1:]))
            return View(rest.pval, rest.axes, True)
        if x.batched and pad:
            raise BatchAxis
        new_axes, drops, grown = [], [], False
        for pos, s in enumerate(sizes):
            e = full[pos - pad] if pos >= pad else None
            if e is BATCH:
                if s not in (-1, self.batch_size):
                    raise BatchAxis
                continue
            if s == -1 or (isinstance(e, Cls) and e.size == s) or (e is None and s == 1):
                new_axes.append(e)
                continue
            if isinstance(e, Cls) and e.size == 1:
                drops.append(pos - pad - (1 if x.batched else 0))
            new_axes.append(self.C.new(s, role="copy", origin="a copied axis (expand)"))
            grown = True
        if not grown:
            return View(x.pval, new_axes, x.batched)
        if drops:
            x = self.drop_ones(x, drops)
        present = [l for c in new_axes for l in self.flat(c)]
        p = self.emit(Call("repeat", [Ref(x.pval), Pattern(list(x.pval.legs), present)]), present, x.batched, x.pval.dtype)
        return View(p, new_axes, x.batched)


    # ---- split, concat, select, slice --------------------------------------------------------------------
    def split(self, x: View, dim, sizes):
        if self.is_virtual(x.axes[self.axis(x, dim)]):
            x = self.solid(x)
        j = self.axis(x, dim)
        c = x.axes[j]
        if c is None or len(sizes) == 1:
            return [x]
        parts = [self.C.new(s, role="piece", origin=f"a piece of {_describe(c)} (split)") for s in sizes]
        for a, b in zip(parts, parts[1:]):
            if a.size == b.size:
                self.C.wish(a, b)  # q, k, v of a fused projection: one leg, split(qkv, f, [e, e, e])
        outs = [[p if self.C.same(l, c) else l for l in x.pval.legs] for p in parts]
        pvals = self.emit(Call("split", [Ref(x.pval), Leg(c), LegList(parts)]), None, x.batched, x.pval.dtype, outs=outs)
        return [View(pv, [p if a is c else a for a in x.axes], x.batched) for pv, p in zip(pvals, parts)]

    def split_node(self, node):
        x = self.view_arg(node.args[0])
        a = self.args(node)
        dim = a.get("dim", 0)
        vals = node.meta.get("val")
        sizes = [int(v.shape[dim]) for v in vals]
        return self.split(x, dim, sizes)


    def op_unbind(self, node):
        a = self.args(node)
        dim = a.get("dim", 0)
        n = len(node.meta["val"])
        got = self.get(node.args[0])
        if isinstance(got, tuple) and got and got[0] == "front":
            return [self.front(got, i) for i in range(n)]
        x = self.view_arg(node.args[0])
        return [self.select(x, dim, i) for i in range(n)]

    def concat(self, views, dim):
        views = [v for v in views]
        if not all(isinstance(v, View) for v in views):
            self.unsupported(why="a plain-number part")
        if len({v.batched for v in views}) > 1:
            raise BatchAxis
        parts = []
        for v in views:
            j = self.axis(v, dim)
            if v.axes[j] is None:
                one = self.C.new(1, role="one", origin="a size-1 axis (to stack along)")
                axes = list(v.axes)
                axes[j] = one
                present = [c for c in axes if c is not None]
                p = self.emit(Call("repeat", [Ref(v.pval), Pattern(list(v.pval.legs), present)]), present, v.batched, v.pval.dtype)
                v = View(p, axes, v.batched)
            parts.append(v)
        if any(self.is_virtual(v.axes[self.axis(v, dim)]) for v in parts):
            parts = [self.solid(v) for v in parts]
        j0 = self.axis(parts[0], dim)
        for v in parts[1:]:
            if [a is None for a in v.axes] != [a is None for a in parts[0].axes]:
                self.unsupported(why="parts with size-1 axes in different places")
        parts = self.in_one_order(parts)
        first = parts[0]
        for v in parts[1:]:
            for k, (c1, c2) in enumerate(zip(first.axes, v.axes)):
                if k != j0 and c1 is not None:
                    self.unify(c1, c2)
                elif k == j0 and c1.size == c2.size:
                    self.C.wish(c1, c2)  # the halves of rotate_half: one leg, as a person writes concat([-x2, x1], u, d)
        total = sum(v.axes[j0].size for v in parts)
        into = self.C.new(total, role="joined", origin=f"{_describe(first.axes[j0])} joined with {len(parts) - 1} more (concat)")
        self.joined.append((into, [v.axes[j0] for v in parts]))
        leg = first.axes[j0]
        legs = [into if self.C.same(l, leg) else l for l in first.pval.legs]
        p = self.emit(Call("concat", [TensorList([Ref(v.pval) for v in parts]), Leg(leg), Leg(into)]), legs, first.batched, first.pval.dtype)
        axes = list(first.axes)
        axes[j0] = into
        return View(p, axes, first.batched)

    def in_one_order(self, parts) -> list:
        """Parts whose legs follow the first part's own order (the language's concat pairs them by
        position): the first as it is, the others rearranged where their order differs; where the
        first is a view of its tensor in another order, all of them in the torch order."""
        first = parts[0]
        order = [next((k for k, c in enumerate(first.axes) if c is not None and self.C.same(c, l)), None) for l in first.pval.legs]
        if None in order or any(self.is_virtual(c) for v in parts for c in v.axes):
            return [self.materialize(v) for v in parts]
        out = [first]
        for v in parts[1:]:
            want = [v.axes[k] for k in order]
            if len(want) != len(v.pval.legs) or any(w is None for w in want) or not all(
                    any(self.C.same(w, l) for l in v.pval.legs) for w in want):
                return [self.materialize(x) for x in parts]
            if not all(self.C.same(w, l) for w, l in zip(want, v.pval.legs)):
                p = self.emit(Call("rearrange", [Ref(v.pval), Pattern(list(v.pval.legs), want)]), want, v.batched, v.pval.dtype)
                v = View(p, list(v.axes), v.batched)
            out.append(v)
        return out

    def op_cat(self, node):
        a = self.args(node)
        # an empty constant (Hugging Face's fresh key-value cache, torch.tensor([])) adds nothing
        parts = [t for t in a["tensors"] if not (self.empty_constant(t))
                 and not (isinstance(self.values.get(t), tuple) and self.values[t][:1] == ("empty",))]
        tensors = [self.view_arg(t) for t in parts]
        tensors = [t for t in tensors if not (isinstance(t, View) and any(c is not None and c.size == 0 for c in t.axes))]
        if len(tensors) == 1:
            return tensors[0]
        return self.concat(tensors, a.get("dim", 0))


    def empty_constant(self, x) -> bool:
        value = self.consts.get(x) if hasattr(x, "op") else None
        return isinstance(value, torch.Tensor) and value.numel() == 0

    def op_stack(self, node):
        a = self.args(node)
        tensors = [self.view_arg(t) for t in a["tensors"]]
        dim = a.get("dim", 0)
        n = len(tensors[0].full) + 1
        d = dim % n
        stacked = self.stacked(tensors, d)
        if stacked is not None:
            return stacked
        ups = []
        for t in tensors:
            full = t.full
            new = full[:d] + [None] + full[d:]
            if t.batched:
                if new[0] is not BATCH:
                    raise BatchAxis
                new = new[1:]
            ups.append(View(t.pval, new, t.batched))
        return self.concat(ups, d)

    def stacked(self, tensors, d):
        """torch.stack(parts, d) as a person writes it: the parts joined along an axis they have, cut
        into (part, axis), the part's leg put at d (`rearrange(concat([a, b], u, f), 't (k u) -> t u k')`
        once a flatten merges it: the sinusoidal positions' sin and cos, interleaved). None where a part
        lacks an axis to join along (then a size-1 leg each, joined)."""
        full = tensors[0].full
        along = d if d < len(full) else len(full) - 1
        if not full or any(len(t.full) != len(full) for t in tensors) or any(
                t.full[along] is None or t.full[along] is BATCH for t in tensors):
            return None
        size = tensors[0].full[along].size
        if any(t.full[along].size != size for t in tensors):
            return None
        joined = self.concat(tensors, along)
        sizes = self.full_shape(joined)
        cut = self.reshape(joined, sizes[:along] + [len(tensors), size] + sizes[along + 1:])
        part, leg = cut.axes[along - (1 if cut.batched else 0)], cut.axes[along + 1 - (1 if cut.batched else 0)]
        self.unify(leg, tensors[0].full[along])
        part.role = "stack"
        if d < len(full):
            return cut
        order = list(range(len(cut.full)))
        order[along], order[along + 1] = order[along + 1], order[along]
        return self.permute(cut, order)

    def select(self, x: View, dim, index):
        if self.is_virtual(x.axes[self.axis(x, dim)]):
            x = self.solid(x)
        j = self.axis(x, dim)
        c = x.axes[j]
        axes = x.axes[:j] + x.axes[j + 1 :]
        if c is None:
            return View(x.pval, axes, x.batched)
        legs = [l for l in x.pval.legs if not self.C.same(l, c)]
        p = self.emit(Call("select", [Ref(x.pval), Leg(c), Num(int(index))]), legs, x.batched, x.pval.dtype)
        return View(p, axes, x.batched)

    def op_select(self, node):
        a = self.args(node)
        got = self.get(a["self"])
        if isinstance(got, tuple) and got and got[0] == "front":
            return self.front(got, a["index"])
        return self.select(self.view_arg(a["self"]), a["dim"], a["index"])

    def narrow(self, x: View, dim, start, end):
        full = x.full
        n = len(full)
        d = dim % n
        e = full[d]
        size = self.batch_size if e is BATCH else (1 if e is None else e.size)
        start = 0 if start is None else int(start)
        end = size if end is None else int(end)
        if start < 0:
            start += size
        if end < 0:
            end += size
        start, end = max(0, min(start, size)), max(0, min(end, size))
        if start == 0 and end == size:
            return x
        if e is BATCH:
            raise BatchAxis
        if self.is_virtual(e):
            x = self.solid(x)
            full = x.full
            e = full[d]
        if e is not None and end <= start and self.node is not None and any(_is_cat(u) for u in self.node.users):
            return ("empty", self.node)  # Phi-3's `q[..., rotary_dim:]` of a rotation over the whole head: the cat drops it
        if e is None or end <= start:
            self.unsupported(why="an empty slice")
        j = self.axis(x, dim)
        new = self.C.new(end - start, role="slice", origin=f"indices {start} to {end - 1} of {_describe(e)}")
        for other in self.slices.setdefault((start, end, e.size), []):
            self.C.wish(new, other)  # the same part of legs of one size (the halves of q's and k's head dims): one leg
        self.slices[(start, end, e.size)].append(new)
        legs = [new if self.C.same(l, e) else l for l in x.pval.legs]
        p = self.emit(Call("slice", [Ref(x.pval), Leg(e), Num(start), Leg(new)]), legs, x.batched, x.pval.dtype)
        axes = list(x.axes)
        axes[j] = new
        return View(p, axes, x.batched)

    def op_slice(self, node):
        a = self.args(node)
        if a.get("step", 1) not in (1, None):
            return self.strided(self.view_arg(a["self"]), a.get("dim", 0), a.get("start"), a.get("end"), a["step"])
        end = a.get("end")
        if end is not None and end >= INT64_MAX:
            end = None
        return self.narrow(self.view_arg(a["self"]), a.get("dim", 0), a.get("start"), end)

    def strided(self, x, dim, start, end, step):
        """`x[..., start::step]` over a whole axis whose size step divides (GPT-J's interleaved rotary,
        `x[..., ::2]` and `x[..., 1::2]`): the axis viewed as (size / step, step), entry `start` of the second."""
        if not isinstance(x, View):
            self.unsupported(why="a slice with a step of a plain number")
        full = x.full
        d = dim % len(full)
        sizes = [self.batch_size if c is BATCH else 1 if c is None else c.size for c in full]
        n = sizes[d]
        start = int(start or 0)
        end = n if end is None or end >= n else int(end)
        if full[d] is BATCH or full[d] is None or not 0 <= start < step or n % step or end < n - step + start + 1:
            self.unsupported(why="a slice with a step (only x[..., k::step] over a whole axis that step divides is expressible)")
        y = self.reshape(x, sizes[:d] + [n // step, step] + sizes[d + 1 :])
        return self.select(y, d + 1, start)

    def op_narrow(self, node):
        a = self.args(node)
        start = a["start"]
        return self.narrow(self.view_arg(a["self"]), a["dim"], start, start + a["length"])

    def op_arange(self, node):
        """Positions 0, 1, ... : only as an embedding's ids (rows start..end of the table: a slice)."""
        a = self.args(node)
        if _overload(node) == "default":
            start, end, step = 0, a.get("end"), 1
        else:
            start, end, step = a.get("start", 0), a.get("end"), a.get("step", 1) or 1
        if any(hasattr(v, "op") for v in (start, end, step)):
            self.unsupported(why="positions of a size known only at run time")
        return ("arange", int(start), int(end), int(step), node)

    def op_index_select(self, node):
        """table.index_select(0, ids): rows of a two-axis table, as an embedding is (gather)."""
        a = self.args(node)
        if a["dim"] % 2 != 0:
            self.unsupported(why="selecting along another axis than the table's first")
        return self.gather_rows(a["self"], a["index"])

    def op_embedding(self, node):
        a = self.args(node)
        pad = a.get("padding_idx")
        return self.gather_rows(a["weight"], a["indices"], pad if isinstance(pad, int) and pad >= 0 else None)

    def gather_rows(self, weight, indices, pad=None):
        w, ids = self.view_arg(weight), self.get(indices)
        if pad is not None and isinstance(w, View) and not w.batched and len(w.axes) == 2 and w.axes[0] is not None:
            # nn.Embedding(padding_idx=p): row p takes no gradient, the table read with that row detached
            n = w.axes[0].size
            parts = [self.narrow(w, 0, 0, pad)] if pad > 0 else []
            parts.append(self.unary_call("detach", self.narrow(w, 0, pad, pad + 1)))
            if pad + 1 < n:
                parts.append(self.narrow(w, 0, pad + 1, n))
            table = w.pval.param
            w = self.concat(parts, 0)
            if isinstance(w, View) and table and w.pval.hint is None:
                w.pval.hint = table  # the table still, one row's gradient stopped: named as the table (`weight2`), not `cat`
        if isinstance(ids, tuple) and ids and ids[0] == "arange":  # rows start..end of the table
            _, start, end, step, _n = ids
            if step != 1 or not isinstance(w, View):
                self.unsupported(why="an embedding of positions with a step")
            fqn = getattr(w.pval.region, "fqn", "")
            self.fixed_length.append((end - start, f"{fqn + '.' if fqn else ''}{w.pval.param}" if w.pval.param else "a position table"))
            return self.narrow(self.materialize(w), 0, start, end)
        if isinstance(ids, tuple) and ids and ids[0] == "ids_fill":  # one id everywhere: that row, broadcast
            if not isinstance(w, View) or w.batched or len(w.axes) != 2:
                self.unsupported(why="an embedding needs a two-axis table and integer ids")
            row = self.select(self.materialize(w), 0, ids[1])
            shape = self.out_shape() or []
            return View(row.pval, [None] * (len(shape) - 1) + row.axes, False)
        ids = self.view_arg(indices)
        if isinstance(w, View) and not w.batched and len(w.axes) == 2 and isinstance(ids, View) and ids.pval.dtype == "float":
            # ids the diagram computes (RoBERTa's positions counted from the padding, T5's buckets): one-hot rows
            return self.einsum_view([self.materialize(w), self.one_hot(ids, w.axes[0].size)],
                                    [["K", "e"], [("i", j) for j in range(len(ids.full))] + ["K"]],
                                    [("i", j) for j in range(len(ids.full))] + ["e"])
        if not isinstance(w, View) or w.batched or len(w.axes) != 2 or not isinstance(ids, View) or ids.pval.dtype != "int":
            self.unsupported(why="an embedding needs a two-axis table and integer ids")
        w = self.materialize(w)
        legs = list(ids.pval.legs) + [w.pval.legs[1]]
        p = self.emit(Call("gather", [Ref(w.pval), Ref(ids.pval)]), legs, ids.batched)
        return View(p, list(ids.axes) + [w.axes[1]], ids.batched)

    def op_index(self, node):
        """`mask[batch_idx, kv_idx]` with every index a constant `torch.arange` over the whole of its
        axis, broadcast along an axis of its own (Hugging Face's padding mask, `masking_utils`'s
        `batch_indices[:, None, None, None]`, `kv_indices[None, None, None, :]`): each index reads
        its axis in order, so the result is the tensor itself with size-1 axes put in (no gather).
        Indices of other values (or made from the tensors of the diagram) are refused."""
        x = self.view_arg(node.args[0])
        indices = list(node.args[1])
        picked = self.picked(x, indices)
        if picked is not None:
            return picked
        consts = [self.consts.get(i) if hasattr(i, "op") else None for i in indices]
        given = [k for k, i in enumerate(indices) if i is not None]
        if isinstance(x, View) and len(given) == 1 and given[0] > 0:  # `x[..., [-2], :]` (Falcon's one key head): a slice
            k, c = given[0], consts[given[0]]
            n = int(node.args[0].meta["val"].shape[k])
            flat = c.reshape(-1).cpu() if isinstance(c, torch.Tensor) and c.dim() == 1 and not c.is_floating_point() \
                and c.dtype != torch.bool else None
            if flat is not None and flat.numel() and -n <= int(flat[0]) < n:
                start = int(flat[0]) % n
                if flat.numel() == 1 and n > 1:  # one position: a size-1 axis, as torch keeps it (broadcast_to expands it)
                    return self.unsqueezed(self.select(x, k, start), k)
                if start + flat.numel() <= n and torch.equal(flat % n, torch.arange(start, start + flat.numel())):
                    return self.narrow(x, k, start, start + flat.numel())
            return self.picked(x, indices, rebuilt=True) or self.unsupported(
                why="indexing by a tensor of indices (only consecutive constant positions, a slice, are expressible)")
        full = x.full if isinstance(x, View) else []
        if not isinstance(x, View) or any(not isinstance(c, torch.Tensor) or c.is_floating_point() or c.dtype == torch.bool
                                           for c in consts) or len(indices) > len(full):
            return self.picked(x, indices, rebuilt=True) or self.unsupported()
        shape = list(torch.broadcast_shapes(*[c.shape for c in consts]))
        sizes = list(node.args[0].meta["val"].shape)
        for k, c in enumerate(consts):  # consecutive positions start..end (GPT-J's `embed_positions[position_ids]`): rows of the table
            flat = c.reshape(-1).cpu()
            start = int(flat[0]) if flat.numel() else 0
            if 0 < flat.numel() < sizes[k] and start + flat.numel() <= sizes[k] \
                    and torch.equal(flat, torch.arange(start, start + flat.numel())):
                x = self.materialize(x)
                if len(consts) == 1 and x.pval.param:
                    fqn = getattr(x.pval.region, "fqn", "")
                    self.fixed_length.append((flat.numel(), f"{fqn + '.' if fqn else ''}{x.pval.param}"))
                x = self.narrow(x, k, start, start + flat.numel())
                if not isinstance(x, View):
                    self.unsupported()
                sizes[k] = flat.numel()
                consts[k] = c - start
        full = x.full
        out: list = [None] * len(shape)
        taken: set = set()
        for k, c in enumerate(consts):
            n = sizes[k]
            along = [j for j, s in enumerate([1] * (len(shape) - c.dim()) + list(c.shape)) if s != 1]
            if n == 1 and not along and k < len(shape) and k not in taken and not c.any():
                along = [k]  # a size-1 axis read at 0
            if len(along) != 1 or along[0] in taken or not torch.equal(c.reshape(-1).cpu(), torch.arange(n)):
                return self.picked(self.view_arg(node.args[0]), indices, rebuilt=True) or self.unsupported(
                    why="indexing by a tensor of indices that the diagram cannot make")
            taken.add(along[0])
            out[along[0]] = full[k]
        out += full[len(indices):]
        if x.batched:
            if out[0] is not BATCH:
                raise BatchAxis
            out = out[1:]
        if any(a is BATCH for a in out):
            raise BatchAxis
        return View(x.pval, out, x.batched)

    # ---- indexing by tensors of the diagram: a one-hot contraction --------------------------------------
    def one_hot(self, ids, n: int) -> View:
        """`where(ids == k, 1, 0)` over a new leg k of size n, positions from an `~ arange` buffer: the
        rows ids pick, as a tensor a contraction reads (`x[ids]` is the einsum of x with it)."""
        if isinstance(ids, tuple) and ids and ids[0] == "argmax":
            return self.first_max(ids[1], ids[2], n)
        k = self.arange_view(n, "rows" if n > 1 else None)
        hit = self.binop("==", self.unsqueezed(ids, len(ids.full)), k, dtype="bool")
        return self.where_(hit, 1.0, 0.0)

    def first_max(self, x: View, j: int, n: int) -> View:
        """One at the first position of the largest entry along axis j of x, zeros elsewhere: what
        `x.argmax(j)` points at (`(ids == eos).int().argmax(-1)`: the first eos), written as the
        entries equal to the maximum, less those with an equal one before them (a causal count)."""
        hit = self.where_(self.binop("==", x, self.reduce(x, [j - len(x.axes)], True, "max"), dtype="bool"), 1.0, 0.0)
        first = self.where_(self.binop("==", self.running_sum(hit, j, fresh=False), 1.0, dtype="bool"), hit, 0.0)
        return View(first.pval, [a for i, a in enumerate(first.axes) if i != j] + [first.axes[j]], first.batched)

    def picked(self, x, indices, rebuilt=False):
        """`x[ids]`, `table[index.view(-1)]`, `h[torch.arange(B), ids.argmax(-1)]`: indices that are
        tensors of the diagram (or constants rebuilt as such, an argmax), with constant
        `torch.arange`s over whole axes beside them, as the contraction of x with the one-hot rows
        they pick. None when no index is a tensor of the diagram (the other forms below)."""
        if not isinstance(x, View):
            return None
        given = [(k, i) for k, i in enumerate(indices) if i is not None]
        tensors = []
        for k, i in given:
            v = self.values.get(i) if hasattr(i, "op") else None
            if isinstance(v, tuple) and v and v[0] == "argmax" or isinstance(v, View):
                tensors.append((k, v))
            elif rebuilt and isinstance(v, tuple) and v and v[0] == "const" and not self.whole_arange(i, indices):
                tensors.append((k, self.rebuild(i)))  # constant ids (T5's relative-position buckets), rebuilt
        if len(tensors) != 1:
            return None
        (k, ids), = tensors
        if not isinstance(ids, View) and not (isinstance(ids, tuple) and ids and ids[0] == "argmax"):
            self.unsupported(why="indexing by a tensor of indices that is not a tensor of the diagram")
        keys_of = {}
        sizes = list(self.node.args[0].meta["val"].shape)
        rank_b = max(len(list(i.meta["val"].shape)) for _, i in given)  # the broadcast shape of the indices
        if [k2 for k2, _ in given] != list(range(given[0][0], given[-1][0] + 1)):
            self.unsupported(why="advanced indices that are not side by side")
        for k2, i in given:
            if k2 == k:
                continue
            c = self.consts.get(i)
            shape = [1] * (rank_b - c.dim()) + list(c.shape) if isinstance(c, torch.Tensor) else None
            along = [d for d, sz in enumerate(shape or []) if sz != 1]
            if not (shape and len(along) == 1 and torch.equal(c.reshape(-1).cpu(), torch.arange(sizes[k2]))):
                self.unsupported(why="indexing by tensors of indices other than one tensor and torch.arange over whole axes")
            keys_of[k2] = ("r", along[0])
        id_rank = len(list(self.node.args[1][k].meta["val"].shape))
        ids_keys = [("r", rank_b - id_rank + d) for d in range(id_rank)]
        x_keys = [keys_of.get(a, ("x", a)) for a in range(len(x.full))]
        x_keys[k] = "K"
        first = given[0][0]
        out = x_keys[:first] + [("r", d) for d in range(rank_b)] + x_keys[given[-1][0] + 1:]
        hot = self.one_hot(ids, sizes[k])
        if isinstance(ids, tuple):  # the argmax's own axes: x's less the one it ran along
            ids_keys = [("r", rank_b - id_rank + d) for d in range(len(ids[1].full) - 1)]
        return self.einsum_view([x, hot], [x_keys, ids_keys + ["K"]], out)

    def whole_arange(self, i, indices) -> bool:
        """An index that is torch.arange over the whole axis it indexes (the tensor read in order)."""
        c = self.consts.get(i) if hasattr(i, "op") else None
        k = indices.index(i)
        n = int(self.node.args[0].meta["val"].shape[k])
        return isinstance(c, torch.Tensor) and c.numel() == n and torch.equal(c.reshape(-1).cpu(), torch.arange(n))
