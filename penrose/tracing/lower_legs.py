"""Ops over one leg: softmax, norms, reductions (and the distances that sum over one leg)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from penrose.tracing.common import _overload, _packet
from penrose.tracing.model import BinOp, Call, Cls, Leg, Num, Pattern, Ref, Str, View


class Reductions:
    """Handlers of `Lowerer` (ops over one leg); the table in `penrose.tracing.aten` names them."""

    if TYPE_CHECKING:  # a part of `Lowerer`: the rest of it (emit, unsupported, the other parts) is there

        def __getattr__(self, name: str) -> Any: ...

    # ---- legs: softmax, norms, reductions -------------------------------------------------------------
    def leg_of(self, v: View, dim: int) -> Cls:
        c = v.axes[self.axis(v, dim)]
        if self.is_virtual(c):
            self.unsupported(why="over the batch merged with another axis (internal: not merged first)")
        if c is None:
            self.unsupported(why="over an axis of size 1")
        return c

    def op_softmax(self, node):
        return self.over_leg("softmax", node)

    def op__softmax(self, node):
        return self.over_leg("softmax", node)

    def op_log_softmax(self, node):
        return self.over_leg("log_softmax", node)

    def op__log_softmax(self, node):
        return self.over_leg("log_softmax", node)

    def over_leg(self, fn, node):
        a = self.args(node)
        x = self.view_arg(a["self"])
        if self.is_virtual(x.axes[self.axis(x, a["dim"])]):
            x = self.solid(x)
        # softmax(x, dim, dtype=torch.float32) in a float64 model computes in float32: a down-cast
        # as `.to(torch.float32)` is (Hugging Face's eager attention writes it so)
        dtype, src = a.get("dtype"), self.out_dtype(node.args[0])
        if isinstance(dtype, torch.dtype) and src is not None and src.is_floating_point and dtype.is_floating_point:
            self.note_downcast(src, dtype)
        c = self.leg_of(x, a["dim"])
        p = self.emit(Call(fn, [Ref(x.pval), Leg(c)]), x.pval.legs, x.batched)
        return View(p, list(x.axes), x.batched)

    def norm_param(self, w, what):
        if w is None:
            return None
        v = self.view_arg(w)
        if not isinstance(v, View) or v.pval.kind not in ("param", "buffer") or v.pval.region is not self.cur or len(v.pval.legs) != 1:
            self.unsupported(why=f"its {what} is not a one-axis parameter of the module that calls it")
        return v

    def norm(self, fn, x, shape, weight, bias, eps):
        if len(shape) != 1:
            self.unsupported(why="normalising over more than one axis")
        if self.is_virtual(x.axes[-1]):
            x = self.solid(x)
        c = self.leg_of(x, -1)
        kwargs = []
        for key, w in (("weight", weight), ("bias", bias)):
            if w is not None:
                self.unify(w.pval.legs[0], c)
                kwargs.append((key, Ref(w.pval)))
        kwargs.append(("eps", Num(float(eps))))
        p = self.emit(Call(fn, [Ref(x.pval), Leg(c)], kwargs), x.pval.legs, x.batched)
        return View(p, list(x.axes), x.batched)

    def op_layer_norm(self, node):
        a = self.args(node)
        x = self.view_arg(a["input"])
        w, b = self.norm_param(a.get("weight"), "weight"), self.norm_param(a.get("bias"), "bias")
        return self.norm("layernorm", x, a["normalized_shape"], w, b, a.get("eps", 1e-5))

    def op_rms_norm(self, node):
        a = self.args(node)
        x = self.view_arg(a["input"])
        w = self.norm_param(a.get("weight"), "weight")
        eps = a.get("eps")
        if eps is None:
            eps = torch.finfo(node.args[0].meta["val"].dtype).eps
        return self.norm("rmsnorm", x, a["normalized_shape"], w, None, eps)

    def as_number(self, x):
        """A bool mask as torch promotes it in arithmetic and sums: where(mask, 1, 0)."""
        if isinstance(x, View) and x.pval.dtype == "bool":
            p = self.emit(Call("where", [Ref(x.pval), Num(1), Num(0)]), x.pval.legs, x.batched)
            return View(p, list(x.axes), x.batched)
        return x

    def reduced_axes(self, x: View, dims) -> list[int]:
        """The indices into x.axes of torch's reduction dims (None or [] is every axis; the batch
        axis is BatchAxis, as `axis` says)."""
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(len(x.full)))
        if isinstance(dims, int):
            dims = [dims]
        return sorted({self.axis(x, d) for d in dims})

    @staticmethod
    def dropped(v: View, idx) -> View:
        """A keepdim reduction's view without its kept size-1 axes at `idx` (the same tensor)."""
        return View(v.pval, [c for j, c in enumerate(v.axes) if j not in idx], v.batched)

    def reduce(self, x: View, dims, keepdim, kind):
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        if kind in ("sum", "mean", "prod"):
            x = self.as_number(x)
        idx = self.reduced_axes(x, dims)
        gone = [l for j in idx for l in self.flat(x.axes[j])]  # a virtual merge: each of its legs
        axes = [None if j in idx else c for j, c in enumerate(x.axes)] if keepdim else [c for j, c in enumerate(x.axes) if j not in idx]
        if not gone:
            return View(x.pval, axes, x.batched)
        drop = {id(self.C.find(c)) for c in gone}
        legs = [l for l in x.pval.legs if id(self.C.find(l)) not in drop]
        if len(gone) == 1 and kind in ("sum", "mean", "max"):
            expr = Call(kind, [Ref(x.pval), Leg(gone[0])])
        else:
            expr = Call("reduce", [Ref(x.pval), Pattern(list(x.pval.legs), legs), Str(kind)])
        p = self.emit(expr, legs, x.batched)
        return View(p, axes, x.batched)

    def op_linalg_vector_norm(self, node):
        """The 2-norm over dims: sqrt(sum(x * x)) (F.normalize is this, clamp_min and a division)."""
        a = self.args(node)
        if float(a.get("ord", 2)) != 2.0 or a.get("dtype") is not None:
            self.unsupported(why="a norm other than the 2-norm")
        x = self.view_arg(a["self"])
        total = self.reduce(self.binop("*", x, x), a.get("dim"), a.get("keepdim", False), "sum")
        return self.unary_call("sqrt", total)

    def op_var(self, node):
        """Variance over dims with torch's correction (Bessel's by default): sum((x - mean)²) / (n - c)."""
        return self.variance(node, sqrt=False)

    def op_std(self, node):
        return self.variance(node, sqrt=True)

    def variance(self, node, sqrt: bool):
        a = self.args(node)
        x = self.view_arg(a["self"])
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        dims = a.get("dim")
        correction = a.get("correction")
        if correction is None:
            correction = 1 if a.get("unbiased", True) else 0
        n = math.prod(x.axes[j].size if x.axes[j] is not None else 1 for j in self.reduced_axes(x, dims))
        if n - float(correction) <= 0:
            self.unsupported(why="fewer entries than the correction")
        centred = self.binop("-", x, self.reduce(x, dims, True, "mean"))
        total = self.reduce(self.binop("*", centred, centred), dims, a.get("keepdim", False), "sum")
        var = self.binop("/", total, float(n - float(correction)))
        return self.unary_call("sqrt", var) if sqrt else var

    def op_logsumexp(self, node):
        """log Σ exp(x) over dims, as m + log(sum(exp(x - m))) with m the maximum (its value and its
        gradient, softmax, are logsumexp's)."""
        a = self.args(node)
        x = self.view_arg(a["self"])
        dims, keepdim = a.get("dim"), a.get("keepdim", False)
        m = self.map_expr(self.reduce(x, dims, True, "max"), lambda r: Call("detach", [r]))  # once, kept dims
        total = self.unary_call("log", self.reduce(self.unary_call("exp", self.binop("-", x, m)), dims, keepdim, "sum"))
        return self.binop("+", total, m if keepdim else self.dropped(m, self.reduced_axes(x, dims)))

    def op_sum(self, node):
        a = self.args(node)
        if a.get("dtype") is not None:
            self.unsupported(why="a dtype argument")
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "sum")

    def op_mean(self, node):
        a = self.args(node)
        if a.get("dtype") is not None:
            self.unsupported(why="a dtype argument")
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "mean")

    def op_amax(self, node):
        a = self.args(node)
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "max")

    def op_amin(self, node):
        a = self.args(node)
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "min")

    def op_prod(self, node):
        a = self.args(node)
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "prod")

    def op_max(self, node):
        return self.extremum(node, "max")

    def op_min(self, node):
        return self.extremum(node, "min")

    def extremum(self, node, kind):
        """torch.max / torch.min: over a dim (values; the indices only if unread), over everything, or
        of two tensors entry by entry (`torch.min(a, b)`, T5's bucket limit)."""
        a = self.args(node)
        if _overload(node) == "other":
            return self.extreme(kind)
        if "dim" in a and _overload(node) == "dim":
            return (self.reduce(self.view_arg(a["self"]), a["dim"], a.get("keepdim", False), kind), None)
        if _overload(node) == "default":
            return self.reduce(self.view_arg(a["self"]), None, False, kind)
        self.unsupported(why=f"{kind} in this form")

    def op_cumsum(self, node):
        """`x.cumsum(dim)`: the sum of the entries up to each position, an einsum with the causal
        mask as numbers, `einsum('bs,ts->bt', x, where(causal(t, s), 1, 0))` (OPT's and RoBERTa's
        positions counted from the mask)."""
        a = self.args(node)
        if a.get("dtype") not in (None,) and not isinstance(a.get("dtype"), torch.dtype):
            self.unsupported(why="a dtype argument")
        x = self.as_number(self.view_arg(a["self"]))
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        j = self.axis(x, a["dim"])
        return x if x.axes[j] is None else self.running_sum(x, j, fresh=False)

    def running_sum(self, x: View, j: int, fresh: bool = True) -> View:
        """The sums of axis j of x up to each position (a causal contraction), on a leg of their own
        (the positions a mask numbers are another axis than the mask's), or on x's (`fresh=False`)."""
        if x.pval.dtype == "int":  # an integer mask counted (OPT's positions): einsum contracts numbers, `mask * 1`
            x = View(self.emit(BinOp("*", Ref(x.pval), Num(1)), x.pval.legs, x.batched), list(x.axes), x.batched)
        c = x.axes[j]
        s = self.C.new(c.size, role="key" if fresh else "sum",
                       origin=f"{c.origin.split(' (')[0]} (a second leg of that size)" if c.origin else "")
        t, s = (s, c) if fresh else (c, s)
        upto = self.emit(Call("where", [Call("causal", [Leg(t), Leg(s)]), Num(1), Num(0)]), [t, s], False, hint="upto")
        keys: list[Any] = [("a", i) for i in range(len(x.full))]
        keys[len(x.full) - len(x.axes) + j] = "s"
        out = [k if k != "s" else "t" for k in keys]
        return self.einsum_view([x, View(upto, [t, s], False)], [keys, ["t", "s"]], out)

    def op_argmax(self, node):
        """`x.argmax(dim)`: the position of the first largest entry, kept as what it points at (a
        one-hot along dim, `first_max`), for the indexing that reads it (`h[torch.arange(B), idx]`)."""
        a = self.args(node)
        x = self.as_number(self.view_arg(a["self"]))
        if a.get("dim") is None or a.get("keepdim"):
            self.unsupported(why="an argmax over every axis, or keepdim=True (only x.argmax(dim) that indexes x's rows is expressible)")
        for u in node.users:  # read only as an index
            if not (_packet(u) == "index" and node in list(u.args[1])):
                self.unsupported(why="its indices are read as numbers (only as an index, x[torch.arange(B), idx], is an argmax expressible)")
        return ("argmax", x, self.axis(x, a["dim"]))

    # distances: a sum over one leg
    def op_cdist(self, node):
        """torch.cdist(a (…, P, M), b (…, R, M)) with p = 2: sqrt(sum((a - b)², m)) between every
        row of a and every row of b (prototype distances)."""
        a = self.args(node)
        if float(a.get("p", 2.0)) != 2.0:
            self.unsupported(why="a p-norm distance other than p = 2")
        x1, x2 = self.view_arg(a["x1"]), self.view_arg(a["x2"])
        diff = self.binop("-", self.unsqueezed(x1, -2), self.unsqueezed(x2, -3))
        return self.unary_call("sqrt", self.reduce(self.binop("*", diff, diff), [-1], False, "sum"))

    def op_cosine_similarity(self, node):
        """F.cosine_similarity(a, b, dim, eps): sum(a/max(|a|, eps) * b/max(|b|, eps)) over dim."""
        a = self.args(node)
        x1, x2 = self.view_arg(a["x1"]), self.view_arg(a["x2"])
        dim, eps = a.get("dim", 1), float(a.get("eps", 1e-8))

        def unit(x):
            norm = self.unary_call("sqrt", self.reduce(self.binop("*", x, x), [dim], True, "sum"))
            return self.binop("/", x, self.unary_call("clamp", norm, min=eps))

        return self.reduce(self.binop("*", unit(x1), unit(x2)), [dim], False, "sum")
