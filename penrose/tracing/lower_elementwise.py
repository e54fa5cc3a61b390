"""Element-wise ATen ops: arithmetic, functions, masks, fills, casts."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch

from penrose.tracing.common import BatchAxis, _dtype, _overload, _packet
from penrose.tracing.model import BATCH, BinOp, Call, Cls, Einsum, Leg, Neg, Num, Pattern, Ref, Stmt, View


class Elementwise:
    """Handlers of `Lowerer` (element-wise aten ops); the table in `penrose.tracing.aten` names them."""

    if TYPE_CHECKING:  # a part of `Lowerer`: the rest of it (emit, unsupported, the other parts) is there

        def __getattr__(self, name: str) -> Any: ...

    # ---- element-wise ---------------------------------------------------------------------------------
    def identity(self):
        """contiguous, clone, alias, and conversions: the same tensor. A diagram has one float
        dtype (the model's), so a cast between float dtypes is the same tensor (`softmax(x,
        dtype=torch.float32).to(x.dtype)`, `.float()` in a float32 model); a bool mask made a
        number is `where(mask, 1, 0)`; a conversion between kinds (float to int, int to float)
        is refused."""
        x = self.get(self.node.args[0])
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return x  # torch.tensor(-1e4) and its copies: a number
        if not isinstance(x, View):
            self.unsupported()
        src = self.node.args[0].meta.get("val") if hasattr(self.node.args[0], "meta") else None
        want = self.out_dtype()
        if want is None or not isinstance(src, torch.Tensor) or src.dtype == want:
            return x
        if src.is_floating_point() and want.is_floating_point:
            self.note_downcast(src.dtype, want)
            return x
        if src.dtype == torch.bool and want.is_floating_point:
            return self.as_number(x)
        if _dtype(src.dtype) == _dtype(want):
            return x
        if want == torch.bool and x.pval.dtype in ("int", "float"):  # a 0/1 mask (Hugging Face's attention_mask) as a bool one
            return self.map_expr(x, lambda r: BinOp("!=", r, Num(0)), dtype="bool")
        if src.dtype == torch.bool:  # `(ids == eos).int()`: 1 and 0, as for a float
            return self.as_number(x)
        if x.pval.dtype == "float" and src.dtype.is_floating_point is False:  # positions rebuilt from `~ arange` buffers
            return x
        whole = self.consts.get(self.node), self.consts.get(self.node.args[0])
        if self.rebuilding and all(isinstance(v, torch.Tensor) for v in whole) and x.pval.dtype == "float":
            if torch.equal(whole[0].double(), whole[1].double()):
                return x  # a whole number cast to an integer: the same value
            if bool((whole[1] >= 0).all()):
                return self.map_expr(x, lambda r: BinOp("//", r, Num(1)))  # truncation of non-negative values: floor
            return self.map_expr(x, lambda r: Call("where", [BinOp("<", r, Num(0)), Neg(BinOp("//", Neg(r), Num(1))),
                                                              BinOp("//", r, Num(1))]))  # toward zero
        self.unsupported(why=f"it converts {src.dtype} to {want}; a diagram converts only bool masks to numbers, "
                             "integer and float masks to bool (x != 0) and one float dtype to another")

    def note_downcast(self, src, want):
        """A float cast to less precision than the model's dtype (`.to(torch.float32)` in a float64
        model): the diagram computes in the model's dtype, so its values differ from the module's by
        that rounding; recorded (dtypes and the user's line) for the warning and the header."""
        model = self.model_dtype
        if model is None or torch.finfo(want).eps <= torch.finfo(model).eps:
            return  # an upcast, or a cast back to the model's dtype: the same values
        arg = self.values.get(self.node.args[0]) if hasattr(self.node.args[0], "op") else None
        if isinstance(arg, tuple) and arg and arg[0] == "state" and arg[2] not in self.persistent:
            return  # rotary frequencies the module made for itself, cast to float32: the tables the diagram makes are float32 too
        span = self.deeper(self.node, self.where(self.node))
        where = f"{span.file}:{span.line}" if span is not None else "an unknown line"
        code = f" ({span.source_line.strip()})" if span is not None and span.source_line.strip() else ""
        key = (str(model).removeprefix("torch."), str(want).removeprefix("torch."), where, code)
        if key not in self.downcasts:
            self.downcasts.append(key)

    def op_detach(self, node):
        x = self.view_arg(node.args[0])
        if not isinstance(x, View):
            return x  # a number has no gradient to stop
        return self.unary_call("detach", x)

    def unary(self, fn, **kw):
        x = self.view_arg(self.node.args[0])
        if not isinstance(x, View):
            self.unsupported(why="applied to a plain number")
        return self.unary_call(fn, x, **kw)

    def unary_call(self, fn, x: View, **kw):
        kwargs = [(k, Num(v)) for k, v in kw.items()]
        p = self.emit(Call(fn, [Ref(x.pval)], kwargs), x.pval.legs, x.batched, x.pval.dtype)
        return View(p, list(x.axes), x.batched)

    def map_expr(self, x: View, make, dtype="float"):
        """A new tensor with x's legs made by `make(Ref(x))`."""
        p = self.emit(make(Ref(x.pval)), x.pval.legs, x.batched, dtype)
        return View(p, list(x.axes), x.batched)

    def broadcast(self, operands):
        """Torch's broadcasting of element-wise operands, as penrose's alignment by name.

        Returns the operand expressions, the result's legs (penrose order), its view axes and
        whether it is batched."""
        operands = self.renamed(self.apart(self.matched_virtuals(operands)))
        tensors = [(i, v) for i, v in enumerate(operands) if isinstance(v, View)]
        if not tensors:
            self.unsupported(why="no tensor operand")
        fulls = {i: v.full for i, v in tensors}
        rank = max(len(f) for f in fulls.values())
        result = [None] * rank
        drops = defaultdict(list)
        for pos in range(1, rank + 1):
            entries = [(i, f[-pos]) for i, f in fulls.items() if len(f) >= pos]
            big = [(i, e) for i, e in entries if isinstance(e, Cls) and e.size != 1]
            if any(e is BATCH for _, e in entries):
                if big or rank - pos != 0:
                    raise BatchAxis
                result[0] = BATCH
                for i, e in entries:
                    if isinstance(e, Cls):
                        drops[i].append(len(operands[i].axes) - pos)
                        self.batch_ones.append(e)
            elif big:
                first = big[0][1]
                for _, e in big[1:]:
                    self.unify(first, e)
                for i, e in entries:
                    if isinstance(e, Cls) and e.size == 1:
                        drops[i].append(len(operands[i].axes) - pos)
                result[rank - pos] = first
            else:
                ones = [e for _, e in entries if isinstance(e, Cls)]
                for e in ones[1:]:
                    self.unify(ones[0], e)
                result[rank - pos] = ones[0] if ones else None
        ops = list(operands)
        for i, positions in drops.items():
            ops[i] = self.drop_ones(ops[i], positions)
        batched = bool(result) and result[0] is BATCH
        axes = result[1:] if batched else result
        present = [l for c in axes for l in self.flat(c)]
        tens = [(i, v) for i, v in enumerate(ops) if isinstance(v, View)]
        batchy = [c for c in present if self.batchy(c)]  # the lead carries the batch: a repeat over it would fix it
        li, lead = max(tens, key=lambda iv: (all(any(self.C.same(c, l) for l in iv[1].pval.legs) for c in batchy),
                                              len(iv[1].pval.legs), -iv[0]))
        have = {id(self.C.find(l)) for l in lead.pval.legs}
        if any(id(self.C.find(c)) not in have for c in present):
            left = list(lead.pval.legs)
            p = self.emit(Call("repeat", [Ref(lead.pval), Pattern(left, present)]), present, lead.batched, lead.pval.dtype)
            ops[li] = lead = View(p, list(lead.axes), lead.batched)
        exprs = [Ref(v.pval) if isinstance(v, View) else Num(v) for v in ops]
        return exprs, list(lead.pval.legs), axes, batched

    def matched_virtuals(self, operands) -> list:
        """Operands whose virtual merges meet, at each axis, only the same merge (or size 1): kept;
        a virtual merge against a leg of its own size is merged first (`solid`)."""
        views = [v for v in operands if isinstance(v, View)]
        if not any(self.is_virtual(c) for v in views for c in v.axes):
            return list(operands)
        rank = max(len(v.full) for v in views)
        bad = set()
        for pos in range(1, rank + 1):
            es = [(i, v.full[-pos]) for i, v in enumerate(operands) if isinstance(v, View) and len(v.full) >= pos]
            big = [(i, e) for i, e in es if isinstance(e, Cls) and e.size != 1]
            virt = [e for _, e in big if self.is_virtual(e)]
            if virt and not all(self.is_virtual(e) and self.C.can_union(e, virt[0]) for _, e in big):
                bad |= {i for i, e in big if self.is_virtual(e)}
        return [self.solid(v) if i in bad else v for i, v in enumerate(operands)]

    def apart(self, operands) -> list:
        """The operands with one leg read at two torch axes of the result (`pos[:, None] - pos[None, :]`,
        a tensor against its own transpose) given a leg of its own there: torch pairs every entry
        of one with every entry of the other, so they are two indices."""
        out = list(operands)
        seen: dict = {}  # leg class -> its axis, counted from the end
        for i, v in enumerate(out):
            if not isinstance(v, View):
                continue
            for pos in range(1, len(v.axes) + 1):
                c = v.axes[-pos]
                if c is None or c.size == 1:
                    continue
                if seen.setdefault(id(self.C.find(c)), pos) != pos:
                    v = out[i] = self.relabel(v, len(v.axes) - pos)
                    seen[id(self.C.find(v.axes[-pos]))] = pos
        return out

    def renamed(self, operands) -> list:
        """The operands with an axis that meets, at one axis of the result, a leg of its size it cannot be
        (the other operand carries both) given a leg of its own there: OPT's padding mask, whose axis
        numbers the queries' positions (a running sum of it) and is added to the scores over the keys."""
        out = list(operands)
        views = [v for v in out if isinstance(v, View)]
        rank = max((len(v.full) for v in views), default=0)
        for pos in range(1, rank + 1):
            big = [(i, v.full[-pos]) for i, v in enumerate(out) if isinstance(v, View) and len(v.full) >= pos
                   and isinstance(v.full[-pos], Cls) and v.full[-pos].size != 1]
            for i, e in big[1:]:
                first = big[0][1]
                if e.size == first.size and not self.C.same(first, e) and not self.C.can_union(first, e):
                    out[i] = self.relabel(out[i], len(out[i].axes) - pos)
        return out

    def relabel(self, v: View, j: int) -> View:
        """The same values with axis j on a new leg (`rearrange(pos, 's -> s')` renames pos's t)."""
        c = v.axes[j]
        p = v.pval
        if p.kind == "buffer" and p.made is not None and len(p.legs) == 1 and p.region is self.cur:
            twin = self.made_buffer(p.region, p.param, [c.size], p.made, "", fresh=True)  # positions of another axis
            self.C.find(twin.legs[0]).origin = f"{c.origin.split(' (')[0]} (a second leg of that size)" if c.origin else ""
            return View(twin, [twin.legs[0] if k == j else a for k, a in enumerate(v.axes)], v.batched)
        new = self.C.new(c.size, role="key", origin=f"{c.origin.split(' (')[0]} (a second leg of that size)" if c.origin else "")
        legs = [new if self.C.same(l, c) else l for l in v.pval.legs]
        p = self.emit(Call("rearrange", [Ref(v.pval), Pattern(legs, legs)]), legs, v.batched, v.pval.dtype)
        return View(p, [new if k == j else a for k, a in enumerate(v.axes)], v.batched)

    def binary(self, op, dtype="float", swap=False):
        a = self.args(self.node)
        names = list(a)
        x, y = self.view_arg(a[names[0]]), self.view_arg(a[names[1]])
        if swap:
            x, y = y, x
        return self.binop(op, x, y, dtype, alpha=a.get("alpha", 1))

    def binop(self, op, x, y, dtype="float", alpha=1):
        if op in ("*", "/") and isinstance(x, View) and isinstance(y, (int, float)) and not isinstance(y, bool) and y == 1:
            return x  # torch writes 1 / t as reciprocal(t) * 1
        if alpha not in (1, None):
            if isinstance(y, View):
                y = self.map_expr(y, lambda r: BinOp("*", r, Num(alpha)))
            else:
                y = y * alpha
        if op in ("+", "-", "*", "/", "//", "**") and dtype != "bool":  # torch promotes a bool mask to 1 and 0
            x, y = self.as_number(x), self.as_number(y)
        if not isinstance(x, View) and not isinstance(y, View):
            fold = {"+": lambda p, q: p + q, "-": lambda p, q: p - q, "*": lambda p, q: p * q}.get(op)
            if fold is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
                return fold(x, y)  # two numbers (full_like(x, 2) * ones_like(x)): their value
            self.unsupported(why="both operands are plain numbers")
        (ex, ey), legs, axes, batched = self.broadcast([x, y])
        expr = self.scaled(op, x, y, ex, ey) or BinOp(op, ex, ey)
        p = self.emit(expr, legs, batched, dtype)
        return View(p, axes, batched)

    def scaled(self, op, x, y, ex, ey):
        """`einsum(...) * (1 / sqrt(n))` and `/ sqrt(n)`, n the size of a summed leg: `/ sqrt(d)`."""
        if not isinstance(x, View) or not isinstance(y, (int, float)) or isinstance(y, bool) or y <= 0:
            return None
        e = x.pval.stmt.expr if x.pval.stmt is not None and isinstance(x.pval.stmt, Stmt) else None
        if not isinstance(e, Einsum):
            return None
        summed = [c for k, cs in e.binds.items() if k not in e.out_cls for c in cs[:1]]
        for c in summed:
            n = c.size
            if op == "*" and math.isclose(y, 1 / math.sqrt(n), rel_tol=1e-12):
                return BinOp("/", ex, Call("sqrt", [Leg(c)]))
            if op == "/" and math.isclose(y, math.sqrt(n), rel_tol=1e-12):
                return BinOp("/", ex, Call("sqrt", [Leg(c)]))
        return None

    def op_add(self, node):
        return self.binary("+")

    def op_sub(self, node):
        return self.binary("-")

    def op_rsub(self, node):
        a = self.args(node)
        x, y = self.view_arg(a["self"]), self.view_arg(a["other"])
        alpha = a.get("alpha", 1)
        if alpha not in (1, None):
            x = self.map_expr(x, lambda r: BinOp("*", r, Num(alpha))) if isinstance(x, View) else x * alpha
        return self.binop("-", y, x)

    def op_mul(self, node):
        return self.binary("*")

    def op_div(self, node):
        a = self.args(node)
        mode = a.get("rounding_mode")
        if mode == "floor":
            return self.binary("//")
        if mode is not None:
            self.unsupported(why=f"rounding_mode={mode!r}")
        return self.binary("/")

    def op_floor_divide(self, node):
        return self.binary("//")

    def op_true_divide(self, node):
        return self.binary("/")

    def op_pow(self, node):
        a = self.args(node)
        if _overload(node) == "Scalar":
            base, x = a["self"], self.view_arg(a["exponent"])
            return self.binop("**", base, x)
        return self.binop("**", self.view_arg(a["self"]), self.view_arg(a["exponent"]))

    def op_neg(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: Neg(r))

    def op_rsqrt(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: BinOp("/", Num(1), Call("sqrt", [r])))

    def op_reciprocal(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: BinOp("/", Num(1), r))

    def op_square(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: BinOp("**", r, Num(2)))

    def op_softplus(self, node):
        """softplus(x, beta) = softplus(beta·x) / beta: torch's threshold acts on beta·x, so the
        language's softplus (threshold 20) is exact for any beta at the default threshold."""
        a = self.args(node)
        beta = float(a.get("beta", 1))
        if a.get("threshold", 20) != 20 or beta <= 0:
            self.unsupported(why="softplus with a threshold other than 20 (or beta <= 0)")
        if beta == 1.0:
            return self.unary_call("softplus", self.view_arg(a["self"]))
        return self.map_expr(self.view_arg(a["self"]), lambda r: BinOp("/", Call("softplus", [BinOp("*", r, Num(beta))]), Num(beta)))

    def op_leaky_relu(self, node):
        a = self.args(node)
        return self.unary_call("leaky_relu", self.view_arg(a["self"]), slope=float(a.get("negative_slope", 0.01)))

    def op_clamp(self, node):
        a = self.args(node)
        lo, hi = a.get("min"), a.get("max")
        if hasattr(lo, "op") or hasattr(hi, "op"):
            self.unsupported(why="tensor bounds")
        kw = {}
        if lo is not None:
            kw["min"] = float(lo)
        if hi is not None:
            kw["max"] = float(hi)
        return self.unary_call("clamp", self.view_arg(a["self"]), **kw)

    def op_clamp_min(self, node):
        a = self.args(node)
        return self.unary_call("clamp", self.view_arg(a["self"]), min=float(a["min"]))

    def op_clamp_max(self, node):
        a = self.args(node)
        return self.unary_call("clamp", self.view_arg(a["self"]), max=float(a["max"]))

    def op_dropout(self, node):
        a = self.args(node)
        x = self.view_arg(a["input"])
        p = float(a.get("p", 0.5))
        if p == 0:
            return x
        return self.unary_call("dropout", x, p=p)


    def op_pad(self, node):
        """F.pad by nothing (timm's Swin pads its windows to a multiple of their size: zeros when it
        already is one): the tensor itself. Padding by more is refused."""
        a = self.args(node)
        pads = a.get("pad") or a.get("padding") or []
        if any(not isinstance(p, int) or p != 0 for p in pads):
            self.unsupported(why="padding (borders the language has no axis for)")
        return self.view_arg(node.args[0])

    def op_maximum(self, node):
        """torch.maximum(a, b) (torch.max of two tensors): the language's max(a, b) entry by entry."""
        return self.extreme("max")

    def op_minimum(self, node):
        return self.extreme("min")

    def extreme(self, fn):
        a = self.args(self.node)
        x, y = (self.as_number(self.view_arg(a[k])) for k in ("self", "other"))
        if not isinstance(x, View) or not isinstance(y, View):  # max(x, 0) would read 0 as a leg: where(x > 0, x, 0)
            x, y = (x, y) if isinstance(x, View) else (y, x)
            return self.where_(self.binop(">" if fn == "max" else "<", x, y, dtype="bool"), x, y)
        exprs, legs, axes, batched = self.broadcast([x, y])
        return View(self.emit(Call(fn, exprs), legs, batched), axes, batched)

    def op_where(self, node):
        a = self.args(node)
        const = self.get(a["condition"])
        if isinstance(const, bool):  # a condition made from constants that holds everywhere (or nowhere)
            return self.view_arg(a["self"] if const else a["other"])
        cond, x, y = self.view_arg(a["condition"], "condition"), self.view_arg(a["self"]), self.view_arg(a["other"])
        return self.where_(cond, x, y)

    def op_full(self, node):
        """torch.full / zeros / ones / scalar_tensor / new_full of a constant shape: the number,
        which every operation it meets broadcasts (`torch.full([], finfo.min)`, GPT-2's mask
        value). A filled tensor whose own axes a result keeps is refused."""
        fill = {"zeros": 0, "new_zeros": 0, "ones": 1, "new_ones": 1}.get(_packet(node))
        if fill is None:
            a = self.args(node)
            fill = a.get("fill_value", a.get("s"))
        if hasattr(fill, "op") or isinstance(fill, torch.SymInt) or not isinstance(fill, int | float):
            self.unsupported(why="the fill value is not a constant number")
        shape = self.out_shape() or []
        if any(not isinstance(s, int) for s in shape):
            self.unsupported(why="a shape known only at run time")
        if math.prod(shape) != 1:
            for u in node.users:  # a number only where the other operands carry every axis it has
                others = [a.meta.get("val") for a in u.args if hasattr(a, "meta") and a is not node]
                shapes = [list(v.shape) for v in others if isinstance(v, torch.Tensor)]
                out = self.out_shape(u)
                if out is None or not shapes or list(torch.broadcast_shapes(*shapes)) != out:
                    self.unsupported(why=f"a filled tensor of shape {tuple(shape)} whose axes the result keeps "
                                         "(a number broadcasts only where the other operands carry every axis)")
        dt = self.out_dtype()
        if dt == torch.bool:
            return bool(fill)
        return float(fill) if dt is None or dt.is_floating_point else int(fill)


    def full_shape(self, v: View) -> list:
        return ([self.batch_size] if v.batched else []) + [1 if c is None else c.size for c in v.axes]

    def tile(self, x: View, dim: int, n: int, interleave: bool) -> View:
        """x copied n times along torch dim `dim`: a new leg of size n merged with the axis, outside
        it (`Tensor.repeat`, tiles) or inside it (`repeat_interleave`, each entry n times)."""
        full = self.full_shape(x)
        at = dim if not interleave else dim + 1
        y = self.unsqueezed(x, at)
        sizes = full[:at] + [n] + full[at:]
        y = self.expand(y, sizes)
        merged = full[:dim] + [full[dim] * n] + full[dim + 1:]
        return self.reshape(y, merged)

    def op_repeat(self, node):
        """Tensor.repeat(sizes): each axis tiled (a copy leg merged outside it); a size-1 axis expanded."""
        x = self.view_arg(node.args[0])
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        sizes = [int(s) for s in node.args[1]]
        while len(x.full) < len(sizes):
            x = self.unsqueezed(x, 0)
        for d in range(len(sizes) - 1, -1, -1):
            n = sizes[d]
            if n == 1:
                continue
            full = self.full_shape(x)
            if full[d] == 1:
                x = self.expand(x, full[:d] + [n] + full[d + 1:])
            else:
                x = self.tile(x, d, n, interleave=False)
        return x

    def op_repeat_interleave(self, node):
        """repeat_interleave(x, n, dim): each entry n times along dim (Mistral's grouped-query heads)."""
        a = self.args(node)
        x, n, dim = self.view_arg(a.get("self", node.args[0])), a.get("repeats"), a.get("dim")
        if not isinstance(x, View) or not isinstance(n, int) or isinstance(n, bool):
            self.unsupported(why="repeats that are not one whole number (a tensor of counts)")
        if dim is None:
            self.unsupported(why="no dim (it flattens the tensor first)")
        d = dim % len(x.full)
        return x if n == 1 else self.tile(x, d, n, interleave=True)

    def op_zeros_like(self, node):
        """zeros_like(x), ones_like(x), full_like(x, v): the number itself, which every operation it
        meets broadcasts (`torch.where(m, y, torch.zeros_like(y))` is `where(m, y, 0.0)`)."""
        x = self.view_arg(node.args[0])
        fill = {"zeros_like": 0, "ones_like": 1}.get(_packet(node))
        if fill is None:
            fill = self.get(node.args[1])
            if isinstance(fill, View) or isinstance(fill, bool) or not isinstance(fill, (int, float)):
                self.unsupported(why="the fill value is not a plain number")
        dtype = x.pval.dtype if isinstance(x, View) else "float"
        return float(fill) if dtype == "float" else int(fill)


    def op_topk(self, node):
        """`v, i = x.topk(k, dim)`: expressible as `zeros_like(x).scatter(dim, i, v)` (the k
        largest along dim kept, zeros elsewhere: a TopK sparsifier), the language's
        `topk(x, leg, k=K)`; op_scatter completes it."""
        a = self.args(node)
        x = self.view_arg(a["self"])
        if a.get("largest", True) is False:
            self.unsupported(why="the smallest k (largest=False)")
        self.leg_of(x, a.get("dim", -1))
        key = (x, self.axis(x, a.get("dim", -1)), int(a["k"]), node)  # the node: a refusal is at its line
        return [("topk_values", *key), ("topk_indices", *key)]

    def op_scatter(self, node):
        a = self.args(node)
        base, index, src = self.get(a["self"]), self.get(a["index"]), self.get(a.get("src"))
        topk = (isinstance(index, tuple) and index and index[0] == "topk_indices" and isinstance(src, tuple) and src
                and src[0] == "topk_values" and index[1:] == src[1:])
        if not topk or base not in (0, 0.0) or isinstance(base, bool):
            self.unsupported(why="only as zeros_like(x).scatter(dim, i, v) with v, i = x.topk(k, dim) (topk in .pen)")
        _, x, axis, k, _node = index
        if self.axis(x, a["dim"]) != axis:
            self.unsupported(why="scattered along another axis than the top-k's")
        p = self.emit(Call("topk", [Ref(x.pval), Leg(x.axes[axis])], [("k", Num(k))]), x.pval.legs, x.batched)
        return View(p, list(x.axes), x.batched)

    def op_bitwise_not(self, node):
        """~mask: only as a condition (where and masked_fill swap their branches)."""
        x = self.view_arg(node.args[0])
        if not isinstance(x, View) or x.pval.dtype != "bool":
            self.unsupported(why="only the negation of a bool mask, used as a condition")
        return ("not", x)


    def op_and(self, node):
        """mask & other (both bool; Hugging Face's causal mask and padding mask): a mask is used only
        in where, so `where(mask, where(other, 1, 0), 0) != 0` (`where(mask, attention_mask, 0) != 0`
        when other is `attention_mask != 0` of a number tensor)."""
        for one, other in (node.args[:2], node.args[1::-1]):  # True everywhere (a mask that keeps every key): the other
            t = self.consts.get(one) if hasattr(one, "op") else None
            if isinstance(t, torch.Tensor) and t.dtype == torch.bool and bool(t.all()):
                return self.view_arg(other, "condition")
        a, b = (self.view_arg(v, "condition") for v in node.args[:2])
        if isinstance(b, bool) or isinstance(a, bool):
            keep, flag = (b, a) if isinstance(a, bool) else (a, b)
            return keep if flag else False
        if not all(isinstance(v, View) and v.pval.dtype == "bool" for v in (a, b)):
            self.unsupported(why="only bool masks are combined with &")
        return self.map_expr(self.where_(a, self.where_(b, 1.0, 0.0), 0.0), lambda r: BinOp("!=", r, Num(0)), dtype="bool")

    def where_(self, cond, x, y):
        if isinstance(cond, tuple) and cond and cond[0] == "not":
            cond, x, y = cond[1], y, x
        if not isinstance(cond, View) or cond.pval.dtype != "bool":
            self.unsupported(why="the condition is not a bool tensor")
        if not isinstance(x, View) and not isinstance(y, View):
            exprs, legs, axes, batched = self.broadcast([cond])
            exprs = exprs + [Num(x), Num(y)]
        else:
            exprs, legs, axes, batched = self.broadcast([cond, x, y])
        p = self.emit(Call("where", exprs), legs, batched)
        return View(p, axes, batched)

    def op_masked_fill(self, node):
        a = self.args(node)
        x, mask, value = self.view_arg(a["self"]), self.view_arg(a["mask"], "condition"), self.get(a["value"])
        if isinstance(value, View):
            self.unsupported(why="a tensor fill value")
        return self.where_(mask, value, x)

    def op_log_sigmoid(self, node):
        """log σ(x) = -softplus(-x)."""
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: Neg(Call("softplus", [Neg(r)])))

    def op_elu(self, node):
        """elu(x, alpha, scale, input_scale) = scale · elu(input_scale · x, alpha): the language's
        elu, scaled where torch scales (selu and celu are written through it too)."""
        a = self.args(node)
        return self.scaled_elu(self.view_arg(a["self"]), float(a.get("alpha", 1.0)), float(a.get("scale", 1.0)),
                               float(a.get("input_scale", 1.0)))

    def op_selu(self, node):  # torch's constants (Klambauer et al. 2017)
        return self.scaled_elu(self.view_arg(node.args[0]), 1.6732632423543772, 1.0507009873554805, 1.0)

    def op_celu(self, node):  # celu(x, alpha) = alpha · elu(x / alpha, 1)
        a = self.args(node)
        alpha = float(a.get("alpha", 1.0))
        return self.scaled_elu(self.view_arg(a["self"]), 1.0, alpha, 1.0 / alpha)

    def scaled_elu(self, x: View, alpha: float, scale: float, input_scale: float):
        def make(r):
            inner = r if input_scale == 1.0 else BinOp("*", r, Num(input_scale))
            e = Call("elu", [inner], [("alpha", Num(alpha))] if alpha != 1.0 else [])
            return e if scale == 1.0 else BinOp("*", Num(scale), e)
        return self.map_expr(x, make)

    def op_hardsigmoid(self, node):  # relu6(x + 3) / 6
        return self.map_expr(self.view_arg(node.args[0]), lambda r: Call(
            "clamp", [BinOp("+", BinOp("/", r, Num(6)), Num(0.5))], [("min", Num(0)), ("max", Num(1))]))

    def op_threshold(self, node):  # x where x > threshold, else value
        a = self.args(node)
        th, value = float(a["threshold"]), float(a["value"])
        return self.map_expr(self.view_arg(a["self"]), lambda r: Call("where", [BinOp(">", r, Num(th)), r, Num(value)]))

    def op_relu6(self, node):
        return self.unary_call("clamp", self.view_arg(node.args[0]), min=0.0, max=6.0)

    def op_hardtanh(self, node):
        a = self.args(node)
        return self.unary_call("clamp", self.view_arg(a["self"]), min=float(a.get("min_val", -1.0)), max=float(a.get("max_val", 1.0)))
