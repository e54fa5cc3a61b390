"""Tensors forward makes from constants alone (`torch.arange`, masks, rotary and sinusoidal tables,
ALiBi slopes, decay tables, relative-position indices): folded to their values on the example's
shapes, then said in the language where a tensor of the diagram meets them, first as what they
are (a number, positions, `causal(t, s)`, rows of a rotary table), else rebuilt from `~ arange`
buffers with the ordinary lowering of the ops that made them."""

from __future__ import annotations

import linecache
import re
from typing import TYPE_CHECKING, Any

import torch

from penrose import ir
from penrose.tracing.aten import ATEN
from penrose.tracing.common import _base, _overload, _packet
from penrose.tracing.model import BinOp, Call, Leg, Num, PVal, Ref, View
from penrose.tracing.write import line_targets


class Constants:
    """Handlers of `Lowerer` (constants); a part of it, as the op handlers are."""

    if TYPE_CHECKING:  # a part of `Lowerer`: the rest of it (emit, unsupported, the other parts) is there

        def __getattr__(self, name: str) -> Any: ...

    def fold_constants(self, nodes):
        """The values of the nodes forward computes from constants alone (no input, parameter or
        buffer reaches them: `torch.arange(T)`, and what masking code makes of it), evaluated
        here on their example shapes. A node the ordinary lowering refuses is read from these."""
        from penrose.tracing.write import made_init

        self.consts: dict = {}
        self.pure: set = set()  # of those, the ones no placeholder reaches (torch.arange, torch.ones and what is made of them)
        self.bases: list = []  # rotary bases of the inverse frequencies the module made for itself
        self.mutated: set = set()  # constants an in-place op changed through a view after they were made (`pe[:, 0::2] = ...`)
        self.writes: dict = {}  # a constant -> the in-place ops that update it (`buckets += ...`), in order
        for node in nodes:
            kind, target = self.placeholders.get(node.name, (None, None)) if node.op == "placeholder" else (None, None)
            if kind == "BUFFER" and target not in self.persistent:  # a buffer the module made for itself, as an init does
                tensor = self.tensors.get(target)
                init = made_init(tensor) if isinstance(tensor, torch.Tensor) else None
                if isinstance(tensor, torch.Tensor):  # its values are known: what is made of them may be said
                    self.consts[node] = tensor.detach()
                if init is not None:
                    if init.name == "rotary":
                        self.bases.append(float(init.kwargs[0][1].value))
            if kind == "CONSTANT_TENSOR" and isinstance(self.ep.constants.get(target), torch.Tensor):
                self.consts[node] = self.ep.constants[target].detach()  # torch.tensor([]): a fresh key-value cache
            if node.op != "call_function":
                continue
            args = [a for a in node.all_input_nodes]
            if any(a not in self.consts for a in args) or node.target is torch.ops.higher_order.cond:
                continue

            def concrete(a):
                return self.consts[a] if hasattr(a, "op") else a

            try:
                with torch.no_grad():
                    value = node.target(*torch.fx.node.map_aggregate(node.args, concrete),
                                        **torch.fx.node.map_aggregate(node.kwargs, concrete))
            except Exception:  # noqa: BLE001, S112 - not foldable: the ordinary lowering decides
                continue
            self.consts[node] = value
            packet = _packet(node)
            if packet.endswith("_") and not packet.startswith("_") and node.args and hasattr(node.args[0], "op"):
                target = node.args[0]
                if _base(target) is target:  # `buckets += ...`: later reads read this node, earlier ones the tensor before it
                    self.writes.setdefault(target, []).append(node)
                else:  # `pe[:, 0::2] = ...` through a view: only the final values are known
                    self.mutated.add(_base(target))
            if all(a in self.pure for a in args):
                self.pure.add(node)

    def const_view(self, entry):
        """A tensor made from constants, as the diagram can say it: a number (every entry one
        value), positions (integers 0 .. n-1 along the last axis: an embedding's rows), one id
        everywhere, a causal mask (`causal(t, s)`; a float mask as `where(causal(t, s), a, b)`),
        rows of rotary and sinusoidal tables (constant along its leading axes), Bloom's ALiBi bias;
        else rebuilt from the ops that made it (`rebuild`)."""
        _, t, node = entry
        if not isinstance(t, torch.Tensor):
            return t
        key = ("const", node, id(self.cur))
        if key in self.masks:
            return self.masks[key]
        if not t.numel():
            self.unsupported(why=CONST_WHY)
        first = t.reshape(-1)[0]
        integral = not t.is_floating_point() and t.dtype != torch.bool
        if integral and t.dim():
            n = t.shape[-1]
            rows = t.reshape(-1, n)
            if bool((rows == rows[0]).all()) and torch.equal(rows[0] - rows[0, 0], torch.arange(n)) and n > 1:
                return ("arange", int(rows[0, 0]), int(rows[0, 0]) + n, 1, node)
            if bool((t == first).all()):
                return ("ids_fill", int(first), node)
        if bool((t == first).all()):
            user = self.node
            others = [a.meta.get("val") for a in user.args if hasattr(a, "meta") and a is not node] if user is not None else []
            shapes = [list(v.shape) for v in others if isinstance(v, torch.Tensor)]
            out = self.out_shape(user) if user is not None else None
            if t.numel() != 1 and (out is None or not shapes or list(torch.broadcast_shapes(*shapes)) != list(out)):
                self.unsupported(why=f"a filled tensor of shape {tuple(t.shape)} whose axes the result keeps "
                                     "(a number broadcasts only where the other operands carry every axis)")
            return bool(first) if t.dtype == torch.bool else int(first) if integral else float(first)
        made = len(self.cur.items)
        v = self.alibi_view(t)
        if v is None:
            v = self.value_view(t)
        if v is None:
            v = self.rebuild(node)
        self.masks[key] = v
        if isinstance(v, View) and v.pval.kind == "stmt" and v.pval.hint is None and v.pval.stmt in self.cur.items[made:]:
            targets = line_targets(self.naming_src(node, self.cur))  # the constant as its line names it: pe, bias
            if targets and len(targets) == 1:
                v.pval.hint = targets[0]
        return v

    def value_view(self, t, region=None, limit=True):
        """What a constant's values are, when the language has a name for them: a causal mask, or the
        rows of rotary and sinusoidal tables, along its last two axes (constant along the others);
        a tensor affine in its indices (`linspace`, a relative-position index) from `~ arange`
        buffers. None otherwise."""
        lead = t.dim() - 2
        square = t
        while square.dim() > 2 and bool((square == square[:1]).all()):
            square = square[0]
        if square.dim() == 2 and square.is_floating_point():
            found = sincos_layout(square, self.bases)
            if found is not None:
                v = self.sincos_view(found, square.shape[0], region, limit)
                return View(v.pval, [None] * (t.dim() - 2) + list(v.axes), False)
        if square.dim() == 2 and (square.dtype == torch.bool or square.is_floating_point()):
            T, S = square.shape
            tril = torch.ones(T, S, dtype=torch.bool).tril()
            inside, outside = square[tril], square[~tril]
            two = bool((inside == inside[0]).all()) and bool((outside == outside[0]).all()) and bool(inside[0] != outside[0])
            if two and (square.dtype != torch.bool or bool(inside[0])):
                q = self.C.new(T, role="query", origin="the queries of a causal mask forward makes")
                k = self.C.new(S, role="feat", origin="the keys of a causal mask forward makes")
                p = self.emit(Call("causal", [Leg(q), Leg(k)]), [q, k], False, "bool")
                v = View(p, [None] * lead + [q, k], False)
                return v if t.dtype == torch.bool else self.where_(v, float(inside[0]), float(outside[0]))
        if t.dtype != torch.bool and t.dim():
            return self.affine_view(t)
        return None

    def affine_view(self, t):
        """A tensor whose entries are affine in its indices, each axis read whole or as a square
        grid (`linspace(0, 1, n)`, a relative-position index `(y_i - y_j + w - 1) * (2w - 1) + ...`),
        from `~ arange` buffers: `c + a * i + b * j ...`. None for other values."""
        fit = affine_fit(t)
        if fit is None:
            return None
        shape, c0, coefs = fit
        terms, sizes = [], set()
        for axis, (n, a) in enumerate(zip(shape, coefs)):
            if a == 0:
                continue
            pv = self.made_buffer(self.cur, "coords" if len(shape) > t.dim() else "positions", [n], ir.Init("arange"),
                                  "positions (torch.arange)", fresh=n in sizes)  # one buffer an axis
            sizes.add(n)
            self.position_legs.append(pv.legs[0])
            pos = View(pv, list(pv.legs), False)
            pos = View(pos.pval, [None] * axis + pos.axes + [None] * (len(shape) - axis - 1), False)
            terms.append(pos if a == 1 else self.binop("*", pos, _nice(a)))
        if not terms:
            return None
        total = terms[0]
        for term in terms[1:]:
            total = self.binop("+", total, term)
        if c0:
            total = self.binop("+", total, _nice(c0))
        total = self.expand(total, list(shape))
        return self.reshape(total, list(t.shape))

    def arange_view(self, n, name=None):
        """Positions 0 .. n-1 on a leg of their own: an `unsaved` buffer `~ arange` of the current block,
        named as the user's line names it where the line is only the `torch.arange` (`pos = torch.arange(T)`)."""
        pv = self.made_buffer(self.cur, name or "positions", [n], ir.Init("arange"), "positions (torch.arange)")
        self.position_legs.append(pv.legs[0])
        return View(pv, list(pv.legs), False)

    def made_buffer(self, region, local, sizes, init, origin, legs=None, fresh=False) -> PVal:
        """An `unsaved` buffer `local` of `region` made by `init` (one already declared with that
        init and those sizes is reused; another name gets a number)."""
        base, k = local, 1
        while True:
            key = f"{region.fqn}.{local}" if region.fqn else local
            pv = region.params.get(key)
            if pv is None:
                break
            if pv.made == init and [c.size for c in pv.legs] == list(sizes) and not fresh:
                return pv
            k += 1
            local = f"{base}{k}"
        if local in self.state_names(region):  # a name the module uses for something else
            return self.made_buffer(region, f"{base}_made", sizes, init, origin, legs, fresh)
        legs = legs or [self.C.new(s, role="feat", origin=origin) for s in sizes]
        pv = PVal(legs, False, "float", region, "buffer", param=local, hint=local)
        pv.persistent, pv.made = False, init
        self.C.register(pv)
        region.params[key] = pv
        return pv

    def state_names(self, region) -> set:
        """The local names of the params, buffers and submodules of a region's module."""
        mod = region.module
        if mod is None:
            return set()
        return {n for n, _ in mod.named_parameters(recurse=False)} | {n for n, _ in mod.named_buffers(recurse=False)} \
            | {n for n, _ in mod.named_children()}

    def rebuild(self, node):
        """A tensor forward makes from constants, said with the language's own operations: the ops
        that made it lowered as any other (ALiBi slopes `2 ** (-8 * (h + 1) / H)` times key
        positions, a decay table `gamma ** (t - s)`), from `~ arange` buffers for `torch.arange`
        and from what the values say for the rest (rotary and sinusoidal tables for sin and cos,
        masks, numbers). Refused, at the line of the op the language lacks, where it cannot be."""
        key = ("rebuilt", node, id(self.cur))
        if key in self.masks:
            return self.masks[key]
        value = self.consts.get(node)
        entry = self.values.get(node)
        saved_src, self.src = self.src, self.naming_src(node, self.cur) or self.src  # its statements: its own line
        try:
            v = self.rebuilt(node, value, entry)
        finally:
            self.src = saved_src
        self.masks[key] = v
        return v

    def rebuilt(self, node, value, entry):
        """`rebuild` of one node (not memoised)."""
        if isinstance(entry, tuple) and entry and entry[0] == "state":
            v = self.state_view(entry)
        elif not isinstance(value, torch.Tensor):
            v = value
        elif node in self.writes:  # its value before the updates: its own op
            v = self.rebuilt_op(node)
        elif value.numel() and bool((value == value.reshape(-1)[0]).all()) and node not in self.mutated:
            first = value.reshape(-1)[0]
            v = bool(first) if value.dtype == torch.bool else float(first) if value.is_floating_point() else int(first)
        else:
            v = self.value_view(value) if value.numel() else None
            if v is None:
                v = self.rebuilt_op(node)
        return v

    def rebuilt_op(self, node):
        """`rebuild` of one op: its operands rebuilt, then its ordinary lowering."""
        packet = _packet(node) if node.op == "call_function" else None
        if packet == "arange":
            self.src = self.naming_src(node, self.cur) or self.src
            a = self.args(node)
            start, end, step = (0, a.get("end"), 1) if _overload(node) == "default" else (
                a.get("start", 0), a.get("end"), a.get("step", 1) or 1)
            n = len(range(int(start), int(end), int(step))) if all(isinstance(v, int) for v in (start, end, step)) else None
            if n is None:
                self.unsupported("torch.arange", why="positions of a size known only at run time")
            src = self.naming_src(node, self.cur)
            code = linecache.getline(*src) if src else ""
            targets = line_targets(src)
            only = targets and len(targets) == 1 and re.fullmatch(r"\s*[\w.]+\s*=\s*torch\.arange\(.*\)[\w.()]*\s*(#.*)?", code)
            v = self.arange_view(n, targets[0] if only and len(targets[0]) > 1 else None)
            v = self.binop("*", v, step) if step != 1 else v
            return self.binop("+", v, start) if start else v
        saved = self.node, self.src, {}
        if node.op != "call_function" or node in self.mutated or (packet or "").removesuffix("_") not in ATEN:
            self.node = node
            try:
                self.unsupported(why=CONST_WHY)
            finally:
                self.node, self.src = saved[0], saved[1]
        self.node = node
        try:
            for a in node.all_input_nodes:
                saved[2][a] = self.values.get(a)
                before = [w for w in self.writes.get(a, ()) if self.index.get(w, 0) < self.index.get(node, 0)]
                self.values[a] = self.rebuild(before[-1] if before else a)  # the value this op reads
            self.node = node
            self.src = self.naming_src(node, self.cur) or saved[1]
            self.rebuilding += 1
            try:
                return self.lower(node)
            finally:
                self.rebuilding -= 1
        finally:
            for a, v in saved[2].items():
                self.values[a] = v
            self.node, self.src = saved[0], saved[1]

    def alibi_view(self, t):
        """Bloom's ALiBi bias, `(batch * heads, 1, keys)`: slope_h * s, the slopes `base ** (h + 1)`
        (a power-of-2 head count), met by an operand whose first axis merges (batch, heads): the
        slopes from an `unsaved` buffer of head indices `~ arange`, the positions from one of key
        positions, repeated over the batch and merged as that operand's axis. None for other values."""
        user = self.node
        if user is None or t.dim() != 3 or t.shape[1] != 1 or not t.is_floating_point() or t.shape[2] < 2:
            return None
        R, _, S = t.shape
        factors = virtual = None
        for a in list(user.args) + list(user.kwargs.values()):
            v = self.values.get(a) if hasattr(a, "op") else None
            if isinstance(v, View) and not v.batched and v.axes and v.axes[0] is not None:
                merge = self.C.find(v.axes[0]).merge
                if len(merge) == 2 and merge[0].size * merge[1].size == R:
                    factors = merge
                    virtual = v.axes[0] if self.is_virtual(v.axes[0]) else None
        if factors is None:
            return None
        B, H = factors[0].size, factors[1].size
        x = t[:, 0, :].reshape(B, H, S).detach().cpu().double()
        if not bool((x == x[:1]).all()):
            return None
        slopes = x[0, :, 1]
        base = float(slopes[0])
        if not 0 < base < 1 or not torch.allclose(x[0], slopes[:, None] * torch.arange(S).double(), rtol=1e-6, atol=0) \
                or not torch.allclose(slopes, base ** torch.arange(1, H + 1).double(), rtol=1e-6, atol=0):
            return None
        base = float(f"{base:.9g}")
        legs = {}
        for local, cls in (("head_index", factors[1]), ("key_position", self.C.new(S, role="feat", origin="key positions of the ALiBi bias"))):
            key = f"{self.cur.fqn}.{local}" if self.cur.fqn else local
            pv = self.cur.params.get(key)
            if pv is None:
                pv = PVal([cls], False, "float", self.cur, "buffer", param=local, hint=local)
                pv.persistent, pv.made = False, ir.Init("arange")
                self.C.register(pv)
                self.cur.params[key] = pv
            legs[local] = pv
        h, s = legs["head_index"], legs["key_position"]
        slope = self.emit(BinOp("**", Num(base), BinOp("+", Ref(h), Num(1))), list(h.legs), False, hint="slopes")
        bias = self.binop("*", View(slope, [h.legs[0], None], False), View(s, [s.legs[0]], False))
        if virtual is not None:  # the batch kept apart in the scores: the bias, constant along it, broadcasts
            return View(bias.pval, [virtual, None, bias.axes[1]], False)
        v = self.expand(View(bias.pval, [None] + list(bias.axes), False), [B, H, S])
        return self.reshape(v, [B * H, 1, S])

    def sincos_view(self, found, T, region=None, limit=True):
        """Rows 0 .. T-1 of a table of sines and cosines of positions times rotary frequencies, in
        the layout `sincos_layout` found: from `unsaved` buffers `~ rotary_sin`, `~ rotary_cos` of
        `region` (the current block by default), as long as the model's position limit when `limit`.
        Hugging Face's halves twice over is the table itself; its first half is a slice of it;
        sin then cos (GPT-J's, Transformer-XL's) a concat; alternating columns (the sinusoidal
        positions of the original transformer, an interleaved rotary) a concat on a new axis, merged."""
        base, half, (a, b), how = found
        region = region or self.cur
        rows_total = T
        if limit:
            limits = [getattr(getattr(m, "config", None), "max_position_embeddings", None) for m in self.module.modules()]
            rows_total = max([T] + [n for n in limits if isinstance(n, int)])
        number = ir.Number(int(base) if base == int(base) else base)
        tables = {}
        rows = None
        for pv in region.params.values():  # a rotary table the block has: the new one shares its legs (one meaning each)
            if pv.made is not None and pv.made.name.startswith("rotary_") and [c.size for c in pv.legs] == [rows_total, 2 * half]:
                rows = pv.legs
        for name in dict.fromkeys([a] + ([b] if b else [])):
            init = ir.Init(f"rotary_{name}", (("base", number),))
            pv = self.made_buffer(region, f"{name}_table", [rows_total, 2 * half], init, "", legs=rows)
            if rows is None:
                rows = list(pv.legs)
                self.C.find(rows[0]).origin = self.C.find(rows[0]).origin or f"positions of the rotary {name} table"
            self.C.find(pv.legs[1]).origin = self.C.find(pv.legs[1]).origin or f"the columns of the rotary {name} table"
            v = self.lift(View(pv, list(pv.legs), False), self.cur)
            if rows_total > T:
                v = self.narrow(v, 0, 0, T)
                self.fixed_length.append((T, f"the rotary {name} table"))
            tables[name] = v
        if how == "cat" and a == b:
            return tables[a]
        halves = {n: self.narrow(v, 1, 0, half) for n, v in tables.items()}
        if how == "half":
            return halves[a]
        if how == "cat":
            return self.concat([halves[a], halves[b]], 1)
        if a == b:
            return self.tile(halves[a], 1, 2, interleave=True)
        return self.reshape(self.stacked([halves[a], halves[b]], 2), [T, 2 * half])

    def unsaved_values(self, region, target, value):
        """A buffer registered with persistent=False whose values no init makes, said as what they
        are (`value_view`: GPT-J's sin|cos table `embed_positions`, a relative-position index), so
        no saved buffer is needed; None when they cannot be."""
        from penrose.tracing.write import made_init

        if not isinstance(value, torch.Tensor) or not value.numel() or value.dtype == torch.bool or made_init(value) is not None:
            return None
        key = ("unsaved", target, id(self.cur))
        if key not in self.masks:
            self.masks[key] = self.value_view(value, region, limit=False)
        return self.masks[key]

    def made_ids(self, target, kind, node):
        """A non-persistent integer buffer the module made for itself: position ids (0 .. n-1 along
        its last axis, Hugging Face BERT's `position_ids`) as positions, ("arange", ...); one id
        everywhere (BERT's `token_type_ids`, zeros) as ("ids_fill", id, node); None otherwise."""
        tensor = self.tensors.get(target)
        if kind != "BUFFER" or target in self.persistent or not isinstance(tensor, torch.Tensor) or not tensor.numel() \
                or tensor.is_floating_point() or tensor.dtype == torch.bool or tensor.dim() == 0:
            return None
        n = tensor.shape[-1]
        if all(s == 1 for s in tensor.shape[:-1]) and torch.equal(tensor.reshape(n).cpu(), torch.arange(n)):
            return ("arange", 0, n, 1, node)
        first = int(tensor.reshape(-1)[0])
        if bool((tensor == first).all()):
            return ("ids_fill", first, node)
        return None


CONST_WHY = "a tensor forward makes from constants (torch.arange, torch.ones, ...) whose values the diagram cannot say"


def _nice(v: float):
    """A coefficient as the text will show it: a whole number as an int."""
    v = float(v)
    return int(v) if v.is_integer() else v


def sincos_layout(x, bases=()):
    """(base, half, (first, second), how) when the columns of `x` (positions by columns) are sines
    and cosines of position p times rotary frequencies `base ** (-i / half)`, i < half, laid out
    `how`: "half" (one of them, half columns), "cat" (first then second, each over the frequencies:
    Hugging Face's cos is ("cos", "cos"), GPT-J's table ("sin", "cos")) or "interleave" (column 2i
    the first, 2i + 1 the second); None otherwise. The base is the module's own (`bases`), 10000,
    or read back from the second frequency."""
    import math

    from penrose.tracing.common import made_values

    P, J = x.shape
    if P < 2 or J < 1 or not x.is_floating_point():
        return None
    x = x.detach().cpu().double()
    if not bool(((x[0] == 0) | (x[0] == 1)).all()) or not bool((x.abs() <= 1 + 1e-6).all()):
        return None
    for half, hows in ((J, ("half",)), (J // 2 if J % 2 == 0 else 0, ("cat", "interleave"))):
        if half < 1:
            continue
        guesses = []
        for col in (1, 2):  # the second frequency, base ** (-1 / half): column 1 (half, cat) or 2 (interleave)
            if half > 1 and col < J and 0 < float(x[1, col]) < 1:
                for inverse in (math.asin, math.acos):
                    g = inverse(float(x[1, col]))
                    if 0 < g < 1:
                        guess = g ** -half
                        guesses += [round(guess), float(f"{guess:.3g}"), float(f"{guess:.6g}")]
        for base in dict.fromkeys([*bases, 10000.0, *guesses]):
            if base <= 1:
                continue
            parts = {n: made_values(f"rotary_{n}", (P, 2 * half), base)[:, :half].double() for n in ("sin", "cos")}
            for how in hows:
                for a, b in (("sin", None), ("cos", None)) if how == "half" else (
                        ("sin", "sin"), ("cos", "cos"), ("sin", "cos"), ("cos", "sin")):
                    if how == "half":
                        want = parts[a]
                    elif how == "cat":
                        want = torch.cat([parts[a], parts[b]], 1)
                    else:
                        want = torch.stack([parts[a], parts[b]], -1).reshape(P, J)
                    if torch.allclose(want, x, rtol=1e-5, atol=1e-5):
                        return float(base), half, (a, b), how
    return None


def affine_fit(t):
    """(shape, c, coefficients) with `t.reshape(shape)[i, j, ...] == c + a * i + b * j + ...`, each
    axis of `t` whole or split into a square grid (n = w * w: a window's rows and columns), the
    first such shape that fits; None when none does (or no index matters)."""
    import itertools
    import math

    x = t.detach().cpu().double()
    if x.dim() == 0 or x.dim() > 3 or x.numel() < 2:
        return None
    options = []
    for n in x.shape:
        w = math.isqrt(n)
        options.append([[n]] + ([[w, w]] if w > 1 and w * w == n else []))
    for pick in itertools.product(*options):
        shape = [s for part in pick for s in part]
        y = x.reshape(shape)
        c0 = float(y.reshape(-1)[0])
        coefs, total = [], torch.full(shape, c0, dtype=torch.float64)
        for axis, n in enumerate(shape):
            index = [0] * len(shape)
            if n > 1:
                index[axis] = 1
            a = float(y[tuple(index)]) - c0 if n > 1 else 0.0
            coefs.append(a)
            view = [1] * len(shape)
            view[axis] = n
            total = total + a * torch.arange(n, dtype=torch.float64).reshape(view)
        used = sum(1 for a in coefs if a)
        whole = not x.is_floating_point() or bool((x == x.round()).all())
        if len(shape) > x.dim() and not whole:
            continue  # a grid is read only of integers (an index); a float table of four entries fits one by chance
        if used and x.numel() >= used + 3 and torch.allclose(total, y, rtol=1e-6, atol=1e-6 * max(1.0, float(y.abs().max()))):
            return shape, c0, coefs
    return None
