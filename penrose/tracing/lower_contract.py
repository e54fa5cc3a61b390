"""Contractions: matmul, linear, einsum, bilinear, attention."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from penrose.tracing.common import BatchAxis, torch_name
from penrose.tracing.model import BATCH, BinOp, Call, Cls, Einsum, Leg, Num, Ref, View


class Contractions:
    """Handlers of `Lowerer` (contractions); the table in `penrose.tracing.aten` names them."""

    if TYPE_CHECKING:  # a part of `Lowerer`: the rest of it (emit, unsupported, the other parts) is there

        def __getattr__(self, name: str) -> Any: ...

    # ---- contractions ---------------------------------------------------------------------------------
    def contract(self, ops, keys, out, hint=None, inline_ok=True):
        """An einsum over views: `keys[i]` names each torch axis of ops[i] (batch included). An axis
        that is a virtual merge (the batch with other legs, kept apart) stands for its legs, each
        under a key of its own, where every operand with that key has the same merge; else it is
        merged first (`solid`)."""
        ops, keys, flat_out, groups = self.unmerged(list(ops), [list(k) for k in keys], list(out))
        expr, legs, axes, batched = self.contract_flat(ops, keys, flat_out)
        if not groups:
            return expr, legs, axes, batched
        regrouped, i = [], 0  # (virtual merges come only in explicit mode: no batch key to skip)
        for k in out:
            if k in groups:
                n = len(groups[k])
                part = axes[i:i + n]
                regrouped.append(self.virtual_class(part) if all(c is not None for c in part) else None)
                i += n
            else:
                regrouped.append(axes[i])
                i += 1
        return expr, legs, regrouped, batched

    def unmerged(self, ops, keys, out):
        """The operands' virtual merges as their legs: ops with their axes so (torch order, merged
        legs side by side), keys and out with a key per leg; {key: its legs' keys} for the merged keys."""
        by_key = defaultdict(list)
        for v, ks in zip(ops, keys):
            for e, k in zip(v.full, ks):
                if isinstance(e, Cls) and e.size != 1:
                    by_key[k].append(e)
        spread = set()
        for k, es in by_key.items():
            virt = [e for e in es if self.is_virtual(e)]
            if virt and all(self.is_virtual(e) and [c.size for c in self.flat(e)] == [c.size for c in self.flat(virt[0])]
                            for e in es):
                spread.add(k)
        for i, (v, ks) in enumerate(zip(ops, keys)):
            if any(self.is_virtual(e) and k not in spread for e, k in zip(v.full, ks)):
                ops[i] = self.solid(v)
        groups = {}
        new_ops, new_keys = [], []
        for v, ks in zip(ops, keys):
            axes, nk = [], []
            full = v.full
            for e, k in zip(full, ks):
                if k in spread and self.is_virtual(e):
                    legs = self.flat(e)
                    groups[k] = [(k, "leg", j) for j in range(len(legs))]
                    nk.extend(groups[k])
                    axes.extend(legs)
                elif k in spread:  # a size-1 axis against a merged one: each leg of size 1
                    n = len(groups.get(k) or self.flat(next(x for x in by_key[k] if self.is_virtual(x))))
                    groups.setdefault(k, [(k, "leg", j) for j in range(n)])
                    nk.extend(groups[k])
                    axes.extend([e] + [None] * (n - 1))
                else:
                    nk.append(k)
                    axes.append(e)
            batched = bool(full) and full[0] is BATCH
            new_ops.append(View(v.pval, axes[1:] if batched else axes, v.batched))
            new_keys.append(nk)
        out = [x for k in out for x in (groups[k] if k in groups else [k])]
        return new_ops, new_keys, out, {k: g for k, g in groups.items()}

    def contract_flat(self, ops, keys, out):
        """`contract` over operands with no virtual merge."""
        entries = defaultdict(list)
        for i, (v, ks) in enumerate(zip(ops, keys)):
            if len(ks) != len(v.full):
                self.fail(f"{torch_name(self.node)}: internal: {len(ks)} indices for {len(v.full)} axes")
            for j, (e, k) in enumerate(zip(v.full, ks)):
                entries[k].append((i, j, e))
        bkeys = {k for k, es in entries.items() if any(e is BATCH for _, _, e in es)}
        if len(bkeys) > 1:
            raise BatchAxis
        bk = next(iter(bkeys), None)
        if bk is not None:
            if not out or out[0] != bk:
                raise BatchAxis
            for i, j, e in entries[bk]:
                if isinstance(e, Cls):
                    if e.size != 1:
                        raise BatchAxis
                    keys[i][j] = ("summed-one", i, j)  # a size-1 axis against the batch: summed away
            entries = defaultdict(list)
            for i, (v, ks) in enumerate(zip(ops, keys)):
                for j, (e, k) in enumerate(zip(v.full, ks)):
                    entries[k].append((i, j, e))
        out_cls, binds, axes, used = {}, {}, [], set()
        for k in out:
            if k == bk:
                continue
            es = [e for _, _, e in entries.get(k, []) if isinstance(e, Cls)]
            cand = [e for e in es if e.size != 1] or es
            if not cand:
                axes.append(None)
                continue
            c = cand[0]
            for e in cand[1:]:
                if e.size == c.size:
                    self.C.wish(c, e)
            if id(self.C.find(c)) in used:
                c = self.C.new(c.size, role="key", origin=f"{c.origin} (a second leg of that size)" if c.origin else "")
            used.add(id(self.C.find(c)))
            out_cls[k] = c
            axes.append(c)
        for k, es in entries.items():
            cl = [e for _, _, e in es if isinstance(e, Cls)]
            binds[k] = ([out_cls[k]] if k in out_cls else []) + cl
            if k not in out_cls:
                big = [e for e in cl if e.size != 1]
                for e in big[1:]:
                    if e.size == big[0].size:
                        self.C.wish(big[0], e)
        terms = []
        for v, ks in zip(ops, keys):
            by_root = {}
            for e, k in zip(v.full, ks):
                if isinstance(e, Cls):
                    by_root[id(self.C.find(e))] = k
            terms.append([by_root[id(self.C.find(l))] for l in v.pval.legs])
        out_term = [k for k in out if k in out_cls]
        legs = [out_cls[k] for k in out_term]
        expr = Einsum([Ref(v.pval) for v in ops], terms, out_term, binds, out_cls)
        batched = bk is not None
        return expr, legs, axes, batched

    def einsum_view(self, ops, keys, out, extra=None, hint=None, inline_ok=True):
        expr, legs, axes, batched = self.contract(ops, keys, out)
        if extra is not None:
            expr = extra(expr)
        p = self.emit(expr, legs, batched, hint=hint, inline_ok=inline_ok)
        return View(p, axes, batched)

    def matmul_keys(self, a: View, b: View):
        ra, rb = len(a.full), len(b.full)
        if ra == 0 or rb == 0:
            self.unsupported(why="a scalar operand")
        ka = ["m", "k"] if ra >= 2 else ["k"]
        kb = ["k", "n"] if rb >= 2 else ["k"]
        nba, nbb = ra - len(ka), rb - len(kb)
        nb = max(nba, nbb)
        ba = [("b", nb - nba + j) for j in range(nba)]
        bb = [("b", nb - nbb + j) for j in range(nbb)]
        out = [("b", j) for j in range(nb)] + (["m"] if ra >= 2 else []) + (["n"] if rb >= 2 else [])
        return [ba + ka, bb + kb], out

    def matmul(self, a, b, hint=None, inline_ok=True):
        if not isinstance(a, View) or not isinstance(b, View):
            self.unsupported(why="a plain-number operand")
        keys, out = self.matmul_keys(a, b)
        return self.einsum_view([a, b], keys, out, hint=hint, inline_ok=inline_ok)

    def op_matmul(self, node):
        return self.matmul(self.view_arg(node.args[0]), self.view_arg(node.args[1]))


    def op_outer(self, node):
        """torch.outer(a, b): every product, einsum('i,j->ij')."""
        a, b = self.view_arg(node.args[0]), self.view_arg(node.args[1])
        if not isinstance(a, View) or not isinstance(b, View):
            self.unsupported(why="a plain-number operand")
        return self.einsum_view([a, b], [["i"], ["j"]], ["i", "j"])

    def op_conv(self, node):
        """A convolution whose kernel is 1 along every spatial axis (`nn.Conv1d(c, o, 1)`, a 1x1
        `nn.Conv2d`: talking heads, token mixing written as a conv), groups 1, no padding: a
        contraction over the channels, `einsum('bchw,ockl->bohw', x, weight) + bias` (k, l the
        kernel's legs of size 1); a stride s reads every s-th position (`x[..., ::s]`)."""
        a = self.args(node)
        x, w = self.view_arg(a["input"]), self.view_arg(a["weight"])
        if not isinstance(x, View) or not isinstance(w, View):
            self.unsupported(why="a plain-number operand")
        shape = list(a["weight"].meta["val"].shape)
        n = len(shape) - 2
        spread = lambda v: list(v) * n if len(v) == 1 else list(v)  # noqa: E731 - (1,) is every axis
        stride, padding, dilation = (spread(a.get(k) or [1]) for k in ("stride", "padding", "dilation"))
        if a.get("transposed") or any(k != 1 for k in shape[2:]) or a.get("groups", 1) != 1 \
                or any(isinstance(p, str) and p != "valid" or isinstance(p, int) and p != 0 for p in padding):
            self.unsupported(why="a convolution: the language has no sliding windows (a kernel of size 1, groups=1, "
                                 "no padding, is an einsum over the channels)")
        for j in range(n):  # a stride reads every s-th position
            if stride[j] != 1:
                x = self.strided(x, j - n, 0, None, stride[j])
        for c in w.axes[2:]:  # the kernel's legs, of size 1, summed
            if c is not None and self.C.find(c).role in ("one", "feat", ""):
                self.C.find(c).role = "kernel"
        kx = [("x", j) for j in range(len(x.full) - n - 1)] + ["c"] + [("s", j) for j in range(n)]
        kw = ["o", "c"] + [("k", j) for j in range(n)]
        out = kx[:len(x.full) - n - 1] + ["o"] + [("s", j) for j in range(n)]
        y = self.einsum_view([x, w], [kx, kw], out)
        if a.get("bias") is None:
            return y
        bias = self.view_arg(a["bias"])
        return self.fuse_add(y, View(bias.pval, list(bias.axes) + [None] * n, bias.batched))

    def op_addmm(self, node):
        a = self.args(node)
        if a.get("beta", 1) != 1 or a.get("alpha", 1) != 1:
            self.unsupported(why="beta or alpha other than 1")
        m = self.matmul(self.view_arg(a["mat1"]), self.view_arg(a["mat2"]))
        return self.binop("+", m, self.view_arg(a["self"]))

    def op_baddbmm(self, node):
        """beta * input + alpha * (batch1 @ batch2) (Bloom's, GPT-NeoX's scores): an einsum, scaled, plus input."""
        a = self.args(node)
        y = self.matmul(self.view_arg(a["batch1"]), self.view_arg(a["batch2"]))
        alpha, beta = a.get("alpha", 1), a.get("beta", 1)
        if alpha != 1:
            y = self.binop("*", y, alpha)
        if beta == 0:
            return y
        base = self.view_arg(a["self"])
        return self.binop("+", y, base if beta == 1 else self.binop("*", base, beta))

    def op_linear(self, node):
        a = self.args(node)
        x, w, b = self.view_arg(a["input"]), self.view_arg(a["weight"]), a.get("bias")
        if not isinstance(x, View) or not isinstance(w, View):
            self.unsupported(why="a plain-number operand")
        rx = len(x.full)
        kx = [("x", j) for j in range(rx - 1)] + ["k"]
        kw = ["o", "k"] if len(w.full) == 2 else ["k"]
        out = kx[:-1] + (["o"] if len(w.full) == 2 else [])
        if w.batched:
            self.unsupported(why="a weight with a batch axis")
        y = self.einsum_view([x, w], [kx, kw], out)
        if b is None:
            return y
        bias = self.view_arg(b)
        return self.fuse_add(y, bias)

    def fuse_add(self, y: View, bias: View) -> View:
        """y + bias, as one expression (the einsum of a linear map and its bias)."""
        (ex, eb), legs, axes, batched = self.broadcast([y, bias])
        if isinstance(ex, Ref) and ex.pval is y.pval and y.pval.stmt is not None and y.pval.stmt is self.cur.items[-1]:
            st = self.cur.items.pop()  # fold the einsum into the sum
            for l in y.pval.legs:
                self.C.find(l).vals.discard(y.pval.id)
            ex = st.expr
        p = self.emit(BinOp("+", ex, eb), legs, batched)
        return View(p, axes, batched)

    def op_einsum(self, node):
        a = self.args(node)
        spec, tensors = a["equation"], a["tensors"]
        ops = [self.view_arg(t) for t in tensors]
        if not all(isinstance(v, View) for v in ops):
            self.unsupported(why="a plain-number operand")
        keys, out = self.torch_spec(spec, [len(v.full) for v in ops])
        y = self.einsum_view(ops, keys, out)
        for v, ks in zip(ops, keys):  # the user's letters are the legs' names, where they can be
            for e, k in zip(v.full, ks):
                if isinstance(e, Cls) and isinstance(k, str) and self.C.find(e).pref is None:
                    self.C.find(e).pref = k
        e = y.pval.stmt.expr if isinstance(y.pval.stmt.expr, Einsum) else None
        if e is not None:
            for k, c in e.out_cls.items():
                if isinstance(k, str) and self.C.find(c).pref is None:
                    self.C.find(c).pref = k
        return y

    def op_bilinear(self, node):
        """nn.Bilinear, torch.bilinear(a, b, W, bias): einsum('...i,oij,...j->...o') + bias."""
        a = self.args(node)
        ops = [self.view_arg(a["input1"]), self.view_arg(a["weight"]), self.view_arg(a["input2"])]
        if not all(isinstance(v, View) for v in ops):
            self.unsupported(why="a plain-number operand")
        keys, out = self.torch_spec("...i,oij,...j->...o", [len(v.full) for v in ops])
        y = self.einsum_view(ops, keys, out)
        bias = self.view_arg(a["bias"]) if a.get("bias") is not None else None
        return y if bias is None else self.binop("+", y, bias)

    def torch_spec(self, spec: str, ranks):
        s = spec.replace(" ", "")
        lhs, arrow, rhs = s.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(ranks):
            self.unsupported(why=f"spec {spec!r} has {len(terms)} terms for {len(ranks)} operands")
        parsed, ell = [], 0
        for t, r in zip(terms, ranks):
            before, dots, after = t.partition("...")
            n = r - len(before) - len(after) if dots else 0
            if n < 0 or (not dots and len(t) != r):
                self.unsupported(why=f"spec {spec!r} does not fit the operands")
            ell = max(ell, n)
            parsed.append((before, bool(dots), n, after))
        keys = []
        for before, _dots, n, after in parsed:
            ks = list(before) + [("...", ell - n + j) for j in range(n)] + list(after)
            keys.append(ks)
        if arrow:
            before, dots, after = rhs.partition("...")
            out = list(before) + ([("...", j) for j in range(ell)] if dots else []) + list(after)
        else:
            counts: defaultdict[Any, int] = defaultdict(int)
            for t in terms:
                for ch in t.replace("...", ""):
                    counts[ch] += 1
            out = [("...", j) for j in range(ell)] + sorted(ch for ch, n in counts.items() if n == 1)
        return keys, out

    def op_scaled_dot_product_attention(self, node):
        a = self.args(node)
        q, k, v = (self.view_arg(a[n]) for n in ("query", "key", "value"))
        if a.get("enable_gqa"):  # grouped-query heads: each key-value head serves h / g query heads
            hq, hk = self.full_shape(q)[-3], self.full_shape(k)[-3]
            if hq != hk:
                if len(k.full) < 3 or hq % hk:
                    self.unsupported(why="enable_gqa=True with query heads that are not a multiple of the key-value heads")
                k = self.tile(k, len(k.full) - 3, hq // hk, interleave=True)
                v = self.tile(v, len(v.full) - 3, hq // hk, interleave=True)
        mask, p, causal, scale = a.get("attn_mask"), a.get("dropout_p", 0.0), a.get("is_causal", False), a.get("scale")
        kk = [("b", j) for j in range(len(k.full) - 2)] + ["s", "e"]
        kq = [("b", j) for j in range(len(q.full) - 2)] + ["l", "e"]
        out = kq[:-1] + ["s"]
        e_cls = q.axes[-1]
        if scale is None:
            div = Call("sqrt", [Leg(e_cls)])
            scores = self.einsum_view([q, k], [kq, kk], out, extra=lambda ex: BinOp("/", ex, div), hint="scores", inline_ok=False)
        else:
            scores = self.einsum_view([q, k], [kq, kk], out, extra=lambda ex: BinOp("*", ex, Num(scale)), hint="scores", inline_ok=False)
        t_cls, s_cls = scores.axes[-2], scores.axes[-1]
        if causal:
            if mask is not None:
                self.unsupported(why="attn_mask together with is_causal")
            p_ = self.emit(Call("where", [Call("causal", [Leg(t_cls), Leg(s_cls)]), Ref(scores.pval), Num(float("-inf"))]),
                           scores.pval.legs, scores.batched, hint="scores", inline_ok=False)
            scores = View(p_, list(scores.axes), scores.batched)
        elif mask is not None and self.get(mask) is not True and self.get(mask) != 0.0:  # True, 0: a mask made from constants keeping every key
            m = self.view_arg(mask)
            if not isinstance(m, View):
                self.unsupported(why="a plain-number mask")
            scores = self.where_(m, scores, float("-inf")) if m.pval.dtype == "bool" else self.binop("+", scores, m)
        probs = self.emit(Call("softmax", [Ref(scores.pval), Leg(s_cls)]), scores.pval.legs, scores.batched, hint="probs", inline_ok=False)
        probs = View(probs, list(scores.axes), scores.batched)
        if p:
            probs = self.unary_call("dropout", probs, p=float(p))
        kp = kq[:-1] + ["s"]
        kv = [("b", j) for j in range(len(v.full) - 2)] + ["s", "f"]
        return self.einsum_view([probs, v], [kp, kv], kq[:-1] + ["f"])
