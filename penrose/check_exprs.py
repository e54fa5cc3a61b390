"""The checker's expressions: assignments, arithmetic and alignment, calls, plain numbers, block calls.

`_Exprs` is a part of `penrose.checker._Checker`; its methods read the checker's state.
"""

from __future__ import annotations

import math
from typing import Any, cast

from dataclasses import replace

from penrose import ir, ops
from penrose.check_base import _a, _describe, _names, _Scope, _State
from penrose.check_hints import broadcast_hint
from penrose.check_ops import TYPE_RULES
from penrose.checked import SCALAR, CStmt, Instance, TType, V
from penrose.attrs import BinOp, BlockCall, Const, DimSize, Folded, Num, Ref, Shown, Unary
from penrose.errors import PenroseCheckError, Span, suggest
from penrose.fmt import format_expr
from penrose.ops import OPS
from penrose.tables import FLOAT32_MAX, FUNCTIONS, INT64_MAX, LIMITS, Limits


class _Exprs(_State):
    """Expressions: assignments, names, arithmetic, alignment, calls, plain-number folding, block calls."""

    # -- assignments
    def _assign(self, sc: _Scope, s: ir.Assign, step) -> CStmt:
        for t in s.targets:
            self._name_ok(t, s.span, "tensor", module_attr=False)
            if t in sc.decls and sc.decls[t].tensor.kind in ("param", "buffer"):
                raise PenroseCheckError(f"cannot assign to {sc.decls[t].tensor.kind} {t!r}; give the new value another name "
                                        f"({t}_2 = ...)", s.span)
            if t in FUNCTIONS or t in self.block_defs:
                raise PenroseCheckError(f"{t!r} is a {'function' if t in FUNCTIONS else 'block'} name", s.span)
            if t in sc.instances:
                raise PenroseCheckError(f"{t!r} is a block instance name", s.span)
            if t in self.constants:
                raise PenroseCheckError(f"{t!r} is a const; give the tensor another name", s.span,
                                        notes=(("the const is declared here", self.constants[t][1]),))
            if any(t == o[0] for o in sc.outputs):  # forward returns one value per output name
                raise PenroseCheckError(
                    f"{t!r} is assigned again after 'output {t}'; output its final value (move 'output' last) "
                    "or give the new value another name",
                    s.span,
                    notes=(("output here", sc.output_at),) if sc.output_at is not None else (),
                )
        if len(set(s.targets)) != len(s.targets):
            raise PenroseCheckError("a name appears twice among the targets", s.span)
        if s.legs is not None:
            self._stated_ok(s)
        sc.block_calls = []
        stmt_ctx = {"instance": s.instance, "repeat": s.repeat, "shared": s.shared, "assign": s, "legs": s.legs}
        self._stmt_ctx: dict[str, Any] | None = stmt_ctx
        try:
            value = self._unambiguous(sc, self._expr(sc, s.value))  # `y = k`: the tensor or the size?
        finally:
            self._stmt_ctx = None
        if s.instance is not None and len(sc.block_calls) != 1:
            raise PenroseCheckError("'as NAME' names the one block call of a statement", s.span)
        if s.repeat is not None and not (isinstance(s.value, ir.Call) and s.value.func in self.block_defs):
            raise PenroseCheckError("'repeat N' applies to a statement that is one block call: Z = layer(Z) repeat N", s.span)
        if s.legs is not None:
            self._stated_match(s, value)
        if value.outs:
            types = value.outs
        else:
            types = (value.type,)
        if len(types) != len(s.targets):
            raise PenroseCheckError(
                f"{len(s.targets)} target(s) but the value yields {len(types)} tensor(s)", s.span
            )
        versions = []
        for t, ty in zip(s.targets, types):
            known = t in sc.vars
            sc.vars[t] = ty
            sc.defined_at[t] = s.span
            sc.versions[t] = sc.versions.get(t, 0) + 1 if known else 0
            versions.append(sc.versions[t])
        return CStmt(s, s.targets, value, types, step, tuple(versions))

    def _stated_ok(self, s: ir.Assign):
        """`s[t, s, a] = ...`: each stated leg a declared dim, once."""
        assert s.legs is not None
        for i, leg in enumerate(s.legs):
            at = s.leg_spans[i] if i < len(s.leg_spans) else s.span
            if leg not in self.dims:
                raise PenroseCheckError(
                    f"stated leg {leg!r} is not a declared dim{suggest(leg, list(self.dims))}; declare it (dim {leg}) "
                    "or state the legs the value has", at)
            if s.legs.index(leg) != i:
                raise PenroseCheckError(f"leg {leg!r} is stated twice; a leg names one axis of the result", at)

    def _stated_match(self, s: ir.Assign, value: V):
        """The value has exactly the stated legs, in the stated order; their sizes are the dims'."""
        assert s.legs is not None
        stated, legs = s.legs, value.type.legs
        shown = f"[{', '.join(stated)}]"
        if value.outs or value.type.dtype == "scalar":
            what = "several tensors" if value.outs else "a plain number"
            raise PenroseCheckError(f"{s.targets[0]}{shown} states legs, but the value is {what}; write {s.targets[0]} = ...", s.span)
        for i, leg in enumerate(stated):
            if leg not in legs:
                at = s.leg_spans[i] if i < len(s.leg_spans) else s.span
                raise PenroseCheckError(
                    f"leg {leg!r} is stated, but the value has legs [{', '.join(legs)}]; state only those, or give an "
                    f"operand leg {leg!r}", at)
        extra = [leg for leg in legs if leg not in stated]
        if extra:
            kept = ", ".join(stated + tuple(extra))
            raise PenroseCheckError(
                f"the value has leg {extra[0]!r}, which {s.targets[0]}{shown} does not state; state it "
                f"({s.targets[0]}[{kept}] = ...) or sum it out (sum(..., {extra[0]}))",
                cast("ir.Expr", s.value).span)
        if legs != stated:
            raise PenroseCheckError(
                f"the value's legs are [{', '.join(legs)}], in that order; state them so ({s.targets[0]}[{', '.join(legs)}] = ...), "
                "or reorder them in the value (an einsum's output, or rearrange)", cast("ir.Expr", s.value).span)
        for i, (leg, c) in enumerate(zip(legs, value.type.cls)):
            at = s.leg_spans[i] if i < len(s.leg_spans) else s.span
            self.S.unify(c, self.dims[leg], (f"stated leg {leg!r}", at))

    # -- expressions
    def _expr(self, sc: _Scope, e) -> V:
        if isinstance(e, ir.Number):
            self._literal_ok(e)
            return V("num", attrs=Num(e.value), span=e.span, const=Folded(e.value))
        if isinstance(e, ir.Name):
            if e.id == "inf":
                return V("num", attrs=Num(math.inf), span=e.span, const=Folded(math.inf))
            if e.id in self.constants:
                value = self.constants[e.id][0]
                return V("const", attrs=Const(value=value, name=e.id), span=e.span, const=Folded(value, ((e.id, value),)))
            if e.id in self.dims and e.id not in sc.vars:
                return self._dimsize(self.dims[e.id], e.id, e.span)
            ty = self._lookup(sc, e.id, e.span)
            decl = sc.decls.get(e.id)
            kind = decl.tensor.kind if decl is not None and sc.vars[e.id] is decl.type else "local"
            v = V("ref", attrs=Ref(e.id, kind, sc.versions.get(e.id, 0)), type=ty, span=e.span)
            if e.id in self.dims:
                self.dim_named_refs[id(v)] = v
            return v
        if isinstance(e, ir.Shape):
            ty = self._lookup(sc, e.tensor, e.span)
            n = len(ty.legs)
            if not -n <= e.index < n:
                raise PenroseCheckError(f"{e.tensor!r} has {n} leg(s); shape index {e.index} is out of range", e.span)
            c = ty.cls[e.index]
            return self._dimsize(c, ty.legs[e.index], e.span)
        if isinstance(e, ir.String):
            raise PenroseCheckError("a string is only allowed as an einsum spec, an einops pattern or a reduction", e.span)
        if isinstance(e, ir.ListExpr):
            raise PenroseCheckError("a list is only allowed as an argument of split or concat", e.span)
        if isinstance(e, ir.Neg):
            a = self._expr(sc, e.operand)
            if a.op == "num":  # -inf, -2: fold into the number
                value = -a.of(Num).value
                return V("num", attrs=Num(value), span=e.span, const=Folded(value))
            self._numeric(self._unambiguous(sc, a), cast("ir.Expr", e.operand).span, "negate")
            return self._evaluated(V("neg", (a,), type=a.type, span=e.span))
        if isinstance(e, ir.BinOp):
            return self._evaluated(self._binop(sc, e))
        if isinstance(e, ir.Call):
            v = self._call(sc, e)
            if v.op == "unary":
                self._unambiguous(sc, v.args[0])
            return self._evaluated(v)
        raise PenroseCheckError(f"unsupported expression {type(e).__name__}", getattr(e, "span", Span(self.file)))

    def _literal_ok(self, e: ir.Number, finite: bool = False):
        """A number torch accepts as a scalar: an int64, a float within float32's range, or inf."""
        v = e.value
        if isinstance(v, int) and abs(v) > INT64_MAX:
            raise PenroseCheckError(f"the integer {v} does not fit in 64 bits; write it as a float ({v:.4g})", e.span)
        if isinstance(v, float) and math.isfinite(v) and abs(v) > FLOAT32_MAX:
            raise PenroseCheckError(f"the number {v:g} is beyond float32's range ({FLOAT32_MAX:.4g}); write inf for infinity", e.span)
        if finite and not math.isfinite(v):
            raise PenroseCheckError(f"the number {v} must be finite here", e.span)

    def _dimsize(self, cls: int, name: str, span: Span) -> V:
        """The size of a dim as a plain number: folded where the size is known when checking."""
        n = self.S.size(cls)
        return V("dimsize", attrs=DimSize(cls, name), span=span, const=None if n is None else Folded(n, ((name, n),), (cls,)))

    def _evaluated(self, v: V) -> V:
        """Evaluate a plain-number value (as the generated Python will) and refuse what torch cannot take."""
        if v.type.dtype != "scalar" or v.op not in ("neg", "sbin", "sfunc"):
            return v
        args = [a.const for a in v.args]
        if any(a is None for a in args):
            return v  # a size known only at run time
        folded = [a for a in args if a is not None]
        vals = [a.value for a in folded]
        reads = tuple(dict.fromkeys(d for a in folded for d in a.reads))
        classes = tuple(dict.fromkeys(c for a in folded for c in a.classes))
        at = f" at {', '.join(f'{n} = {size}' for n, size in reads[:3])}" if reads else ""
        value = _evaluate(v, vals, at)
        if isinstance(value, int) and abs(value) > INT64_MAX:
            raise PenroseCheckError(f"this number is {value:.4g}{at}, which does not fit in 64 bits", v.span)
        if isinstance(value, float):
            if math.isnan(value):
                raise PenroseCheckError(f"this expression is nan (not a number){at}", v.span)
            if math.isfinite(value) and abs(value) > FLOAT32_MAX:
                raise PenroseCheckError(f"this number is {value:.4g}{at}, beyond float32's range ({FLOAT32_MAX:.4g})", v.span)
        return replace(v, const=Folded(value, reads, classes))

    def _numeric(self, v: V, span: Span, what: str):
        if v.type.dtype in ("int", "bool"):
            raise PenroseCheckError(f"cannot {what} {_a(v.type.dtype)} tensor", span)

    def _binop(self, sc, e: ir.BinOp) -> V:
        a, b = self._unambiguous(sc, self._expr(sc, e.left)), self._unambiguous(sc, self._expr(sc, e.right))
        compare = e.op in ("<", "<=", ">", ">=", "==", "!=")
        for v, sub in ((a, e.left), (b, e.right)):
            if v.type.dtype == "bool" and not compare:
                raise PenroseCheckError(f"arithmetic on the bool mask {_describe(sub)}; use where(mask, a, b)", cast("ir.Expr", sub).span)
        if a.type.dtype == "scalar" and b.type.dtype == "scalar":
            if compare:
                raise PenroseCheckError("comparing two plain numbers; compare a tensor", e.span)
            return V("sbin", (a, b), BinOp(op=e.op), SCALAR, span=e.span)
        legs, cls, align = self._align([a, b], [e.left, e.right], e.span, f"'{e.op}'")
        dtype = "bool" if compare else "float"
        batched = a.type.batched or b.type.batched
        return V("binop", (a, b), BinOp(op=e.op, align=align), TType(legs, cls, dtype, batched), span=e.span)

    def _align(self, vals, exprs, span, what):
        """Result legs of an element-wise op and, per operand, how its legs map onto them."""
        tensors = [(i, v) for i, v in enumerate(vals) if v.type.dtype != "scalar"]
        if not tensors:
            return (), (), (None,) * len(vals)
        # the operand with the most legs (leftmost on ties) sets the result's order
        li, lead = max(tensors, key=lambda iv: (len(iv[1].legs), -iv[0]))
        legs, cls = lead.type.legs, lead.type.cls
        unique = len(set(legs)) == len(legs)
        outer = self._outer(vals, tensors, legs, span, what)
        if outer is not None:
            return outer
        align = []
        for v, ex in zip(vals, exprs):
            if v.type.dtype == "scalar":
                align.append(None)
                continue
            vl = v.type.legs
            if unique and len(set(vl)) == len(vl) and set(vl) <= set(legs):
                for leg, c in zip(vl, v.type.cls):
                    j = legs.index(leg)
                    self.S.unify(c, cls[j], (f"{what}: leg {leg!r}", span))
                align.append(tuple(vl.index(l) if l in vl else None for l in legs))
            elif len(vl) == len(legs):
                for j, c in enumerate(v.type.cls):
                    if vl[j] != legs[j]:
                        self._by_position(ex, vl[j], c, exprs[li], legs[j], cls[j], span, what, legs)
                    self.S.unify(c, cls[j], (f"{what}: leg {vl[j]!r} of {_describe(ex)} against leg {legs[j]!r}", span))
                align.append(tuple(range(len(legs))))
            else:
                self._letter_cause(ex, v, legs, cls, span, what)  # an einsum letter upstream renamed a leg
                size = self.S.size
                hint = broadcast_hint(what, ex, vl, [size(c) for c in v.type.cls], exprs, [x.type.legs for x in vals],
                                      legs, [size(c) for c in cls])
                raise PenroseCheckError(
                    f"cannot broadcast {_describe(ex)} with legs [{', '.join(vl)}] against [{', '.join(legs)}] in {what}: "
                    f"legs align by name when one set contains the other, else by position when the counts match; {hint}; "
                    f"or, for every pair (an outer {what} over the legs of both), state the result's legs, as "
                    f"{self._stated_hint(legs + vl)}",
                    getattr(ex, "span", span),
                )
        return legs, cls, tuple(align)

    def _outer(self, vals, tensors, lead_legs, span, what):
        """Under stated legs (`s[t, s, a] = qa + ka`), operands whose legs no one of them holds all
        of align by name: the result has every leg of any operand, in the stated order (legs not
        stated after them, as first met), each operand broadcast over the legs it lacks. None where
        the ordinary rule applies (one operand holds every leg) or no legs are stated."""
        ctx = getattr(self, "_stmt_ctx", None)
        stated = ctx.get("legs") if ctx is not None else None
        if stated is None or any(len(set(v.type.legs)) != len(v.type.legs) for _, v in tensors):
            return None
        met = list(dict.fromkeys(leg for _, v in tensors for leg in v.type.legs))
        if set(met) <= set(lead_legs):
            return None
        legs = tuple([leg for leg in stated if leg in met] + [leg for leg in met if leg not in stated])
        cls: dict[str, int] = {}
        for _, v in tensors:
            for leg, c in zip(v.type.legs, v.type.cls):
                if leg in cls:
                    self.S.unify(c, cls[leg], (f"{what}: leg {leg!r}", span))
                else:
                    cls[leg] = c
        align = tuple(None if v.type.dtype == "scalar" else tuple(v.type.legs.index(l) if l in v.type.legs else None for l in legs)
                      for v in vals)
        return legs, tuple(cls[leg] for leg in legs), align

    def _stated_hint(self, legs) -> str:
        """`decay[h, t, s] = ...`: the statement's target with the legs stated (y where there is none)."""
        ctx = getattr(self, "_stmt_ctx", None)
        target = ctx["assign"].targets[0] if ctx is not None and len(ctx["assign"].targets) == 1 else "y"
        return f"{target}[{', '.join(dict.fromkeys(legs))}] = ..."

    def _by_position(self, ex, leg: str, c: int, lead_ex, other: str, oc: int, span, what, lead_legs=()):
        """Two legs of different names aligned by position (docs/language.md, element-wise
        arithmetic): allowed, with a warning, only when the sizes are already known and equal
        (then nothing is guessed); a leg of unknown size is never bound this way."""
        S = self.S
        a, b = S.size(c), S.size(oc)
        shown = f"leg {leg!r} of {_describe(ex)} with leg {other!r} of {_describe(lead_ex)}"
        outer = "product" if what == "'*'" else "sum" if what in ("'+'", "'-'") else "combination"
        sized = "" if a is not None else f", {leg}=SIZE"
        fix = (f"rename one leg if they are one leg; for every pair (the outer {outer}) state the result's legs, "
               f"as {self._stated_hint((*lead_legs, leg))} (operands then align by name), or give the other operand leg "
               f"{leg!r} too, by name: write repeat({format_expr(lead_ex)}, '... -> ... {leg}'{sized}), or an einsum")
        if S.find(c) != S.find(oc) and (a is None or b is None):
            unknown = leg if a is None else other
            raise PenroseCheckError(
                f"{what} would align {shown} by position and so fix the size of {unknown!r}, which is not known; {fix}",
                getattr(ex, "span", span))
        self.warnings.append((f"{what} aligns {shown} by position (sizes {a} and {b}); {fix}", getattr(ex, "span", span)))

    def _leg_arg(self, v: V, arg, call: ir.Call, what="leg") -> int:
        """Position (among the non-batch legs) of a leg given by name or dim=±i."""
        n = len(v.legs)
        if isinstance(arg, ir.Name):
            if arg.id not in v.legs:
                close = suggest(arg.id, v.legs)
                tensor = format_expr(call.args[0]) if call.args else "x"
                write = "" if close or not v.legs else f"; write one of them, as {call.func}({tensor}, {v.legs[-1]})"
                raise PenroseCheckError(
                    f"{call.func}: the tensor has no leg {arg.id!r}{close}; its legs are [{', '.join(v.legs)}]{write}", arg.span)
            if v.legs.count(arg.id) > 1:
                raise PenroseCheckError(f"{call.func}: leg {arg.id!r} appears twice; use dim=i", arg.span)
            return v.legs.index(arg.id)
        if isinstance(arg, ir.Number) and isinstance(arg.value, int):
            i = arg.value
            if not -n <= i < n:
                raise PenroseCheckError(f"{call.func}: dim={i} is out of range for a tensor with {n} leg(s)", arg.span)
            return i % n
        if isinstance(arg, ir.String) and arg.value in v.legs:
            raise PenroseCheckError(f"{call.func}: the {what} is a leg name, without quotes: write {arg.value}, not "
                                    f"{arg.value!r}", arg.span)
        raise PenroseCheckError(f"{call.func}: the {what} is a leg name or dim=i", getattr(arg, "span", call.span))

    def _call(self, sc, e: ir.Call) -> V:
        f = e.func
        if f in self.block_defs:
            return self._block_call(sc, e)
        if f not in FUNCTIONS:
            pool = list(FUNCTIONS) + list(self.block_defs)
            hint = suggest(f, pool) or (f"; write one of the functions of docs/language.md ('Functions'), or define it as "
                                        f"a block: block {f}(x[...]) {{ ... }}")
            if f in sc.vars:
                args = ", ".join(format_expr(a) for a in e.args)
                hint = (f"; {f!r} is a tensor, not a function: contract it with einsum, as "
                        f"einsum('te,ed->td', {args or 'x'}, {f}) for a matrix on legs [e, d]")
            raise PenroseCheckError(f"unknown function {f!r}{hint}", e.span)
        self._arity(e)  # arity and keywords as the table of operations says
        v = self._builtin(sc, e)
        written = list(e.kwargs)
        if OPS[f].rule == "elementwise":  # keywords given by position (clamp_min(x, alpha))
            written += [(k.name, node) for k, node in zip(OPS[f].keywords, e.args[1:])]
        shown = {k: self._expr(self._static_scope, node) for k, node in written
                 if (kw := OPS[f].keyword(k)) is not None and kw.kind in ops.NUMERIC and _names(node)}
        if shown:  # keyword values written with consts or dims: figures and equations show the names
            texts = {k: format_expr(node) for k, node in written if k in shown}
            v = replace(v, attrs=replace(v.attrs, shown=tuple(Shown(k, x, texts[k]) for k, x in shown.items())))
        return v

    def _builtin(self, sc, e: ir.Call) -> V:
        rule = OPS[e.func].rule  # the row names its type rule (an operator has none, and is no call)
        assert rule is not None
        return TYPE_RULES[rule](self, sc, e)

    def _arity(self, e: ir.Call):
        """Positional count and keyword names against the table of operations (ops.OPS)."""
        op = OPS[e.func]
        lo, hi, kws = op.min_args, op.max_args, op.keyword_names
        n = len(e.args)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            raise PenroseCheckError(f"{e.func} takes {want} positional argument(s), got {n}", e.span)
        seen = set()
        for k, v in e.kwargs:
            if op.axis_lengths and k not in seen:  # einops' NAME=size (and reduce's reduction=): _einop reads them
                seen.add(k)
                continue
            if k not in kws:
                allowed = ", ".join(kws) or "no keyword arguments"
                raise PenroseCheckError(f"{e.func} takes {allowed}, not {k!r}", v.span)
            if k in seen:
                raise PenroseCheckError(f"{e.func}: keyword argument {k!r} is given twice", v.span)
            seen.add(k)

    def _tensor_arg(self, sc, e: ir.Call, i: int, allow=("float",), v: V | None = None) -> V:
        v = self._expr(sc, e.args[i]) if v is None else v
        if v.type.dtype == "scalar":
            raise PenroseCheckError(f"{e.func}: argument {i + 1} must be a tensor", e.args[i].span)
        if v.type.dtype not in allow:
            raise PenroseCheckError(f"{e.func}: argument {i + 1} is {_a(v.type.dtype)} tensor; expected {' or '.join(allow)}", e.args[i].span)
        return v

    def _number_kw(self, e: ir.Call, key, default=None, node=None):
        """A number keyword as its row says: its default when not given (or `default`, a value
        given by position), whole or not, a dim allowed or not, within its rule."""
        spec = OPS[e.func].keyword(key)
        assert spec is not None, f"{e.func} has no keyword {key!r} in the table"
        node = node if node is not None else e.kwarg(key)
        if node is None:
            return default if default is not None else spec.default
        value = self._number_kw_value(e, key, node, spec.integer, spec.allows_dim, spec.infinite_ok)
        if value is not None and not spec.ok(value):
            raise PenroseCheckError(f"{e.func}: {key} must be {spec.rule_text}, got {value:g}", node.span)
        return value

    def _number_kw_value(self, e: ir.Call, key, v, integer, allow_dim, bound):
        if not bound and any(isinstance(n, ir.Name) and n.id == "inf" for n in (v, getattr(v, "operand", None))):
            raise PenroseCheckError(f"{e.func}: {key} must be finite", v.span)
        if isinstance(v, ir.Neg) and isinstance(v.operand, ir.Name) and v.operand.id == "inf":
            return -math.inf
        if isinstance(v, ir.Name) and v.id == "inf":
            return math.inf
        sign, node = (-1, v.operand) if isinstance(v, ir.Neg) else (1, v)
        if allow_dim and isinstance(node, ir.Name) and node.id in self.dims:
            size = self.S.size(self.dims[node.id])
            if size is None:
                raise PenroseCheckError(f"{e.func}: dim {node.id!r} has no size", node.span)
            return sign * size
        names = _names(v)
        if names and all(n in self.constants or (allow_dim and n in self.dims) for n in names):
            return self._static(v, f"{e.func}: {key}", integer=integer)  # consts (and dims where allowed)
        if not isinstance(v, ir.Number) or (integer and not isinstance(v.value, int)):
            kind = "a whole number" if integer else "a number"
            raise PenroseCheckError(f"{e.func}: {key} must be {kind}{' or a dim' if allow_dim else ''}", v.span)
        self._literal_ok(v, finite=not bound)
        return v.value

    # blocks ---------------------------------------------------------------------------------------
    def _block_call(self, sc, e: ir.Call) -> V:
        blk = self.blocks[e.func]
        blk_def = self.block_defs[e.func][0]
        ctx = getattr(self, "_stmt_ctx", None)
        if e.kwargs:
            raise PenroseCheckError("block arguments are positional", e.kwargs[0][1].span)
        formals = blk_def.formals
        if len(e.args) != len(formals):
            raise PenroseCheckError(f"block {e.func!r} takes {len(formals)} argument(s), got {len(e.args)}", e.span)
        args = [self._expr(sc, a) for a in e.args]
        for f, v, a in zip(formals, args, e.args):
            if v.type.dtype == "scalar":
                raise PenroseCheckError(f"block {e.func!r}: argument {f.name!r} must be a tensor", a.span)
            if v.type.dtype != f.dtype:
                raise PenroseCheckError(f"block {e.func!r}: argument {f.name!r} is {f.dtype}, got {_a(v.type.dtype)} tensor", a.span)
            if len(v.legs) != len(f.legs):
                raise PenroseCheckError(
                    f"block {e.func!r}: argument {f.name!r} has legs [{', '.join(f.legs)}] but {_describe(a)} has [{', '.join(v.legs)}]",
                    a.span,
                )
            for leg, c in zip(f.legs, v.type.cls):
                self.S.unify(self.dims[leg], c, (f"block {e.func!r} argument {f.name!r} leg {leg!r}", a.span))
        instance = e.func
        repeat = None
        shared = False
        if ctx is not None and ctx["assign"] is not None and ctx["assign"].value is e:
            instance = ctx["instance"] or e.func
            if ctx["repeat"] is not None:
                repeat, shared = self._repeat_count(ctx["repeat"]), ctx["shared"]
                if not args or len(blk.outputs) != 1:
                    raise PenroseCheckError(
                        "'repeat' chains a block with one result, fed back into its first argument "
                        "(the others reach every copy unchanged)", e.span)
                fin, fout = blk_def.formals[0], blk.outputs[0][1]
                if tuple(fin.legs) != tuple(fout.legs):
                    raise PenroseCheckError(
                        f"'repeat' feeds block {e.func!r}'s result [{', '.join(fout.legs)}] back into its argument [{', '.join(fin.legs)}]; their legs must match",
                        e.span,
                    )
        elif ctx is not None and ctx["instance"] is not None:
            instance = ctx["instance"]
        parts = instance.split(".")  # a dotted path (net.0, encoder.layer.3): the submodule's state-dict path
        for part in parts:
            if not part.isdigit():
                self._name_ok(part, e.span, "instance")
        head = parts[0]
        if head in sc.decls or (head in sc.vars and head not in sc.instances):
            raise PenroseCheckError(f"instance name {head!r} is already a tensor; name it with 'as NAME'", e.span)
        nested = next((o for o in sc.instances if o != instance and (o.startswith(instance + ".") or instance.startswith(o + "."))), None)
        if nested is not None:
            outer, inner = sorted((nested, instance), key=len)
            raise PenroseCheckError(
                f"instance {instance!r}: {outer!r} is a block instance and cannot also hold {inner!r} (a path's parts "
                "above its last are containers)", e.span, notes=(("the other instance", sc.instances[nested].span),))
        prev = sc.instances.get(instance)
        if prev is not None and (prev.block != e.func or prev.stacked != (None if shared else repeat)):
            raise PenroseCheckError(
                f"instance {instance!r} is already a {'repeated ' if prev.stacked else ''}{prev.block!r} block; name this one with 'as NAME'",
                e.span,
                notes=(("first used here", prev.span),),
            )
        if prev is None:
            sc.instances[instance] = Instance(instance, e.func, repeat, e.span, shared)
        sc.block_calls.append(instance)
        # results: a leg whose class is one of the formals' classes maps to the argument's class
        outs = []
        for _, t in blk.outputs:
            # batch legs come only from the arguments (a block body has no inputs of its own)
            outs.append(TType(t.legs, t.cls, t.dtype, t.batched and any(v.type.batched for v in args)))
        ty = outs[0] if len(outs) == 1 else TType((), (), "float", False)
        return V(
            "block",
            tuple(args),
            BlockCall(block=e.func, instance=instance, repeat=repeat, shared=shared),
            ty,
            outs=tuple(outs) if len(outs) > 1 else (),
            span=e.span,
        )

    def _repeat_count(self, node) -> int:
        """1 to LIMITS.repeat: the compiled module builds that many copies of the block."""
        n: int | None
        if isinstance(node, ir.Number) and isinstance(node.value, int):
            n, what = node.value, f"repeat count {node.value:,}"
        elif isinstance(node, ir.Name) and node.id in self.dims:
            n = self.S.size(self.dims[node.id])
            if n is None:
                raise PenroseCheckError(f"repeat count {node.id!r} needs a size of at least 1: declare it with 'dim {node.id} = 4', "
                                        f"or give it when compiling (penrose.compile(..., {node.id}=4), --size {node.id}=4)", node.span)
            what = f"repeat count {node.id!r} (size {n:,})"
        else:
            raise PenroseCheckError("repeat takes a whole number or a dim, as 'repeat 4' or 'repeat L'", node.span)
        if n < 1:
            raise PenroseCheckError(f"{what} must be at least 1", node.span)
        limit = LIMITS.value("repeat")
        if n > limit:
            raise PenroseCheckError(f"{what} is beyond the limit of {limit:,}; {Limits.how_to_raise('repeat')}", node.span)
        return n



def _evaluate(v: V, vals: list, at: str):
    """The value of a plain-number operation, as Python computes it in the generated module.

    `at` (' at d = 4') names the sizes the value was computed at, for the message."""
    span = v.span
    if v.op == "neg":
        return -vals[0]
    if v.op == "sfunc":
        (a,), name = vals, v.of(Unary).name
        if name == "sqrt":
            if a < 0:
                raise PenroseCheckError(f"sqrt of a negative number ({a:g}{at}); the result would not be real", span)
            return OPS[name].call(a, ops.SCALAR)  # the row's form: what the generated code reads
        if name == "log":
            if a == 0:
                raise PenroseCheckError(f"log of zero{at}; the result would be -inf", span)
            if a < 0:
                raise PenroseCheckError(f"log of a negative number ({a:g}{at}); the result would not be real", span)
        try:
            return OPS[name].call(a, ops.SCALAR)  # the row's form on a plain number
        except OverflowError:
            raise PenroseCheckError(f"{name}({a:g}){at} is beyond float32's range ({FLOAT32_MAX:.4g})", span) from None
    a, b = vals
    op = v.of(BinOp).op
    if op in ("/", "//") and b == 0:
        raise PenroseCheckError(f"division by zero{at}", span)
    if op == "**":
        if a == 0 and b < 0:
            raise PenroseCheckError(f"zero to the negative power {b:g}{at} is a division by zero", span)
        if a < 0 and math.isfinite(b) and b != int(b):
            raise PenroseCheckError(f"a negative number ({a:g}) to the fractional power {b:g}{at}; the result would not be real", span)
        if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 and b * math.log2(abs(a)) > 64:
            raise PenroseCheckError(f"{a} ** {b}{at} does not fit in 64 bits", span)  # refused before Python computes it
    try:
        value = _ARITHMETIC[op](a, b)
    except OverflowError:
        raise PenroseCheckError(f"this number{at} is beyond float32's range ({FLOAT32_MAX:.4g})", span) from None
    if isinstance(value, complex):  # pragma: no cover - every complex case is refused above
        raise PenroseCheckError(f"this number{at} would not be real", span)
    return value


_ARITHMETIC = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "**": lambda a, b: a**b,
}
