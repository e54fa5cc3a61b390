"""Checked diagram → readable PyTorch source → `nn.Module`.

The source is built only from validated identifiers, numbers, and string literals written with
`repr`; user text (captions, notes) appears only in comments with line breaks removed. The
in-memory module is that same source, compiled; `penrose compile FILE -o model.py` writes it.

>>> import penrose
>>> m = penrose.compile("dim e = 3\\ninput x[e]\\nparam W[e, e] ~ eye\\ny = einsum('i,ij->j', x, W)\\noutput y")
>>> m(torch.ones(3)).tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import ast
import copy
import functools
import keyword
from dataclasses import dataclass, replace
import math
import os
import re
from pathlib import Path

import torch

from penrose.attrs import Aligned, Axis, BlockCall, Clamp, Const, DimSize, Dropout, Einop, Einsum, Flatten, LayerNorm, Mask, Num, RMSNorm, Ref, Rope, Select, Slice, Split, TopK, Unary, Unflatten
from penrose import generated, ir, ops
from penrose import pyast as P
from penrose.tables import BUILTINS, RESERVED, init_call, quoted, unquote
from penrose.checker import Checked, V
from penrose.checked import CStmt, fixed
from penrose.errors import PenroseCompileError, PenroseShapeError, Span, seed_value
from penrose.fmt import format_stmt
from penrose.fuse import find_attention
from penrose.plan import TooManyLegs, letters_for
from penrose.report import einsum_plan
from penrose.stack import deep
from penrose.views import labels_agree, read_counts


def _runtime_text() -> str:
    """The helpers' source as standalone files carry it (penrose/runtime.py from its marker on)."""
    text = Path(__file__).with_name("runtime.py").read_text(encoding="utf-8")
    return text.split(_RUNTIME_MARK, 1)[1].strip("\n")


_RUNTIME_MARK = "# ---- inlined into standalone source from here on ----"


@functools.cache
def _runtime_defs() -> dict[str, tuple[str, frozenset[str]]]:
    """The helpers of penrose/runtime.py from its marker on, in order: name -> (its source as
    written, the comment lines just above it included; the other helpers and `ShapeError` it reads)."""
    text = _runtime_text()
    lines = text.split("\n")
    tree = ast.parse(text)
    defined = {n: node for node in tree.body for n in _defined(node)}
    out = {}
    for node in tree.body:
        first = node.lineno - 1
        while first > 0 and lines[first - 1].startswith("#"):
            first -= 1
        reads = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id != _defined(node)[0]
                          and (n.id in defined or n.id == "ShapeError"))
        out[_defined(node)[0]] = ("\n".join(lines[first:node.end_lineno]), reads)
    return out


def _defined(node: ast.stmt) -> list[str]:
    """The names a top-level statement of runtime.py defines (a function, a class, a constant)."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    assert len(names) == 1, "a helper of runtime.py is a function, a class or one constant"
    return names


def _helpers(code: list[ast.stmt], closure: bool) -> list[str]:
    """The runtime helpers `code` reads, in runtime.py's order; with `closure`, the helpers those
    read too (and `ShapeError` where one raises it), as standalone source must carry them."""
    defs = _runtime_defs()
    todo = [n.id for node in code for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in defs]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            if closure and name in defs:
                todo.extend(defs[name][1])
    return (["ShapeError"] if "ShapeError" in seen else []) + [n for n in defs if n in seen]


_CONSTANT = "penrose_constant"  # marks a name node that reads a module-level constant: ((kind, label, repr), value)


def _constant(kind: str, label: str, value: int | float) -> ast.expr:
    """A name reading a module-level constant: dim or const `label` (kind "dim" or "const") at
    `value`, a dim at the size the module is compiled at. It is named once the module's code is
    complete (`_name_constants`), so that it shadows no other name of the module."""
    node = ast.Name("_", ast.Load())
    setattr(node, _CONSTANT, ((kind, label, repr(value)), value))
    return node


def _name_constants(code: list[ast.stmt], taken: set[str], order: dict[str, int]) -> list[ast.stmt]:
    """Name every constant `code` reads (`D = 32`, `ALPHA = 16`: its label in capitals, unless
    `taken` holds that name) and return their assignments, ordered by `order` (label -> rank),
    after a comment saying what they are."""
    nodes = [n for stmt in code for n in ast.walk(stmt) if isinstance(n, ast.Name) and hasattr(n, _CONSTANT)]
    found = dict(getattr(n, _CONSTANT) for n in nodes)
    names: dict[tuple[str, str, str], str] = {}
    for key in sorted(found, key=lambda k: (order.get(k[1], len(order)), k)):
        kind, label, _ = key
        base = label.upper()
        tries = (base, f"{base}_{kind.upper()}", *(f"{base}_{kind.upper()}{i}" for i in range(2, len(taken) + 3)))
        names[key] = next(c for c in tries if c.isidentifier() and not keyword.iskeyword(c) and c not in taken)
        taken.add(names[key])
    for n in nodes:
        n.id = names[getattr(n, _CONSTANT)[0]]
    kinds = {kind for kind, _, _ in names}
    what = " and ".join(w for k, w in (("dim", "dims (at the sizes compiled)"), ("const", "consts")) if k in kinds)
    assignments = [P.assign(name, P.const(found[key])) for key, name in names.items()]
    return [P.spaced(P.Comment(f"the diagram's {what}"), 1), *assignments] if assignments else []


class _Numbers(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.expr:
        mark = getattr(node, _CONSTANT, None)
        return node if mark is None else P.const(mark[1])


def _numbers(node: ast.stmt) -> ast.stmt:
    """A copy of `node` reading each constant as its number: two declarations compare by value."""
    return _Numbers().visit(copy.deepcopy(node))


def _camel(name: str) -> str:
    parts = re.split(r"[^A-Za-z0-9]+", name)
    text = "".join(p[:1].upper() + p[1:] for p in parts if p)
    if not text or not text[0].isalpha():
        text = "Diagram" + text
    return text


def _statement_comment(st: ir.Assign) -> str:
    """An assignment as the diagram writes it, without its note, for a comment line."""
    return _comment(format_stmt(replace(st, note="")))


def _value(s: CStmt) -> V:
    """The value of an assignment or a return (the checker always gives them one)."""
    assert s.value is not None, "an assignment or return without a checked value"
    return s.value


_comment = P.comment_text  # user text made safe for a comment (and for the docstrings that carry it)


class _Emitter:
    """Builds one member of a module class (the diagram, an entry or one block) as `ast` nodes.

    Every expression is built as a Python `ast` tree (penrose.pyast) by the lowering of its
    operation in LOWER; deep trees are cut into temporaries. Its statements, its method
    (`forward_def`) and its part of the class (`spec_nodes`, `own_nodes`, `instance_nodes`) are
    nodes too, which `_class_def` joins and `generate_source` prints as one module.
    """

    def __init__(self, c: Checked, class_name: str, block_classes: dict, top: bool, fuse_attention: bool = True,
                 method: str = "forward", calls: dict | None = None):
        self.c = c
        self.S = c.sizes
        self.cls_name = class_name
        self.block_classes = block_classes  # instance name -> the class of its module
        self.top = top
        self.method = method  # the method this member's code becomes: forward, an entry's or a block's name
        self.calls = calls or {}  # instance name -> the method of its class that runs this member's block
        # names of the class attributes this entry's code reads (an entry other than forward has its own)
        self.inputs_attr = "_INPUTS" if method == "forward" else f"_INPUTS_{method}"
        self.outputs_attr = "Outputs" if method == "forward" else _camel(method) + "Outputs"
        self.used_free: dict[int, str] = {}
        self.uses_device = False
        self.uses_dtype = False
        self.read = read_counts(c)  # (name, SSA version) -> how often statements and outputs read it
        self.fused = find_attention(c, self.read) if fuse_attention else {}
        self.absorbed = {id(a) for att in self.fused.values() for a in att.absorbed}
        self.hoister = P.Hoister("_")

    # -- sizes
    def size_node(self, cls: int, span: Span, leg: str | None = None):
        """The size of a leg: a dim's module-level constant (`D`, named `leg` where that is a dim
        of this class, else the class's own dim), a number where no dim names it, or the local
        holding a size read at run time."""
        r = self.S.find(cls)
        if not self.S.is_free(cls):
            v = self.fixed_size(cls, span)
            dims = self.c.dims
            name = next((n for n in (leg, self.S.label[r]) if n in dims and self.S.find(dims[n]) == r), None)
            return P.const(v) if name is None else _constant("dim", name, v)
        local = self.used_free.get(r)
        if local is None:
            local = self.size_local(self.S.label[r])
            self.used_free[r] = local
        return P.name(local)

    def fixed_size(self, cls: int, span: Span) -> int:
        v = self.S.size(cls)
        if v is None:
            label = self.S.label[self.S.find(cls)]
            raise PenroseCompileError(f"leg {label!r} has no size; pass {label}=N to compile()", span)
        return v

    def keyword(self, v: V, key: str, value):
        """A keyword's value: as the diagram wrote it where it named consts or dims (`eps=eps`
        reads EPS), else its number; the number too where it reads a size the inputs give (the
        value was fixed when checking, at the declared size)."""
        shown = v.attrs.written(key)
        return P.const(value) if shown is None or fixed(shown.value, self.S) is None else self.expr(shown.value)

    def size_local(self, label: str) -> str:
        """The local holding a size read at run time: `_<dim>`, unless that is a name the
        generated method defines (tables.RESERVED) or another size's local."""
        taken = set(self.used_free.values())
        local, n = "_" + label, 1
        while emitted_name(local, "local", fail=False) is not None or local in taken:
            local, n = f"_{label}_size{'' if n == 1 else n}", n + 1
        return local

    def shape_comment(self, t) -> str:
        parts = ["..."] if t.batched else []
        for leg, c in zip(t.legs, t.cls):
            v = None if self.S.is_free(c) else self.S.size(c)
            parts.append(f"{leg}={v}" if v is not None else leg)
        return "[" + ", ".join(parts) + "]"

    # -- expressions
    def expr(self, v: V):
        """The ast of a checked value."""
        atom = _ATOMS.get(v.op)
        if atom is not None:
            return atom(self, v)
        k = v.key
        lower = LOWER.get(k) if k is not None else None
        if lower is None:  # pragma: no cover - a test keeps LOWER's keys equal to ops.OPS
            raise PenroseCompileError(f"cannot compile operation {k or v.op!r}", v.span)
        return lower(self, v)

    @staticmethod
    def dim_of(v: V, axis: int) -> int:
        """A leg's dimension counted from the end, so batch legs never shift it."""
        return axis - len(v.legs)

    def aligned(self, x: V, align, node: V | None):
        """x's ast, its legs permuted and unsqueezed to line up with node's legs."""
        tree = self.expr(x)
        if align is None or x.type.dtype == "scalar":
            return tree
        n = len(x.legs)
        if None not in align and list(align) == list(range(n)):
            return tree
        present = [i for i in align if i is not None]
        if present != list(range(n)):
            tree = _reorder(tree, present)
        if None in align:
            idx = [None if i is None else ":" for i in align]
            if node is not None and not x.type.batched:  # broadcasting supplies leading axes
                while idx and idx[0] is None:
                    idx.pop(0)
            if idx.count(None) == 1:  # one new axis: unsqueeze, counted from the end
                tree = _unsqueezed(tree, idx.index(None) - len(idx))
            elif None in idx:
                # trailing ':' must stay: after '...', x[..., None] would put the new axis last
                tree = P.subscript(tree, P.index_tuple([Ellipsis] + idx))
        return tree

    def arranged(self, x: V, legs: tuple, target: tuple):
        """x (with `legs`) permuted and unsqueezed so its legs follow `target` (missing ones size 1)."""
        align = tuple(legs.index(l) if l in legs else None for l in target)
        return self.aligned(x, align, None)

    def param_ref(self, name: str | None):
        return _member(P.name("self"), name) if name else P.const(None)

    # -- attention, fused
    def attention_code(self, att):
        """One scaled_dot_product_attention call for a recognised attention pattern; grouped-query
        attention (query head legs g, r; keys and values with g only) through _gqa_attention."""
        heads = att.heads
        grouped = (len(heads) == 2 and heads[1] not in att.k_legs + att.v_legs
                   and heads[0] in att.k_legs and heads[0] in att.v_legs)
        if grouped:
            g, r = heads
            q = P.method(self.arranged(att.q, att.q_legs, heads + (att.t, att.d)), "flatten", -4, -3)
            k = self.arranged(att.k, att.k_legs, (g, att.s, att.d))
            v = self.arranged(att.v, att.v_legs, (g, att.s, att.e))
        else:
            q = self.arranged(att.q, att.q_legs, heads + (att.t, att.d))
            k = self.arranged(att.k, att.k_legs, heads + (att.s, att.d))
            v = self.arranged(att.v, att.v_legs, heads + (att.s, att.e))
        if att.scale_op == "/":
            scale = P.binop("/", P.const(1.0), self.expr(att.scale_value))
        elif att.scale_op == "*":
            scale = self.expr(att.scale_value)
        else:
            scale = P.const(1.0)
        causal = att.mask_kind == "causal"
        mask = P.const(None)
        if att.mask is not None and not causal:  # legs (t, s); batch legs go in front of the head legs
            mask_heads = heads[:1] if grouped else heads  # one (merged) head axis for the grouped call
            mask = (self.arranged(att.mask, (att.t, att.s), mask_heads + (att.t, att.s)) if att.mask.type.batched
                    else self.expr(att.mask))
        if grouped:
            qv = att.q
            at = [att.q_legs.index(l) for l in heads]
            sizes = P.tuple_([self.size_node(qv.type.cls[i], qv.span, qv.legs[i]) for i in at])
            code = P.method(P.call(P.name("_gqa_attention"), q, k, v, mask, scale, P.const(causal)), "unflatten", -3, sizes)
        else:
            code = P.call(P.name("_attention"), q, k, v, mask, scale, P.const(causal))
        current = heads + (att.t, att.e)
        if tuple(att.out) != current:
            code = _reorder(code, [current.index(l) for l in att.out])
        return code

    # -- einsum
    def einsum_code(self, v: V):
        terms, out = v.of(Einsum).terms, v.of(Einsum).out
        ops_ = list(v.args)
        batched = [o.type.batched for o in ops_]
        sum_batch = any(batched) and not v.type.batched
        exact = not sum_batch and labels_agree(self.S, v)
        if len(ops_) == 2 and exact:
            exprs = [self.expr(o) for o in ops_]
            for form in (_matmul_form, _product_sum_form):
                tree = form(terms, out, batched, exprs)
                if tree is not None:
                    return tree
            tree = self.grouped_matmul_form(terms, out, ops_, exprs)
            if tree is not None:
                return tree
        if len(ops_) <= 2:
            try:
                letters = letters_for(terms, out)
            except TooManyLegs as e:
                raise PenroseCompileError(f"einsum: {e}", v.span) from None
            spec = ",".join(("..." if bt else "") + "".join(letters[l] for l in t) for t, bt in zip(terms, batched))
            spec += "->" + ("..." if v.type.batched else "") + "".join(letters[l] for l in out)
            return P.call(P.path("torch.einsum"), P.const(spec), *[self.expr(o) for o in ops_])
        plan = einsum_plan(self.c, v)  # the plan `penrose plan` prints
        work = [(self.expr(o), b) for o, b in zip(ops_, batched)]
        for i, step in enumerate(plan.steps):
            picked = [work.pop(j) for j in step.operands]
            lhs, rhs = step.spec.split("->")
            parts = lhs.split(",")
            last = i == len(plan.steps) - 1
            any_batch = any(b for _, b in picked)
            keep = v.type.batched if last else any_batch
            spec = ",".join(("..." if b else "") + p for p, (_, b) in zip(parts, picked))
            spec += "->" + ("..." if keep and any_batch else "") + rhs
            work.append((P.call(P.path("torch.einsum"), P.const(spec), *[t for t, _ in picked]), any_batch))
        return work[0][0]

    def grouped_matmul_form(self, terms, out, ops_, exprs):
        """A product over several legs at once: X[..., a, b, c, d] Y[c, d, e, f] -> [..., a, b, e, f]
        becomes one matrix product of X with its contracted legs flattened and Y flattened to a
        matrix, the result unflattened. Y must be unbatched and both leg groups contiguous."""
        for (xi, yi) in ((0, 1), (1, 0)):
            xt, yt = terms[xi], terms[yi]
            if ops_[yi].type.batched or len(set(xt)) != len(xt) or len(set(yt)) != len(yt):
                continue
            shared = [l for l in yt if l in xt]
            if any(l in out for l in shared) or not shared:
                continue
            n = len(shared)
            if tuple(yt[:n]) != tuple(shared) or tuple(xt[-n:]) != tuple(shared):
                continue
            x_free, y_free = tuple(xt[:-n]), tuple(yt[n:])
            if x_free + y_free != tuple(out):
                continue
            x_tree, y_tree = exprs[xi], exprs[yi]
            if n > 1:
                x_tree = P.method(x_tree, "flatten", -n)
            if len(y_free) == 0 and n > 1:
                y_tree = P.method(y_tree, "flatten")
            else:
                if n > 1:
                    y_tree = P.method(y_tree, "flatten", 0, n - 1)
                if len(y_free) > 1:
                    y_tree = P.method(y_tree, "flatten", 1)
            tree = P.binop("@", x_tree, y_tree)
            if len(y_free) > 1:
                y = ops_[yi]
                sizes = P.tuple_([self.size_node(c, y.span, leg) for c, leg in zip(y.type.cls[n:], y.legs[n:])])
                return P.method(tree, "unflatten", -1, sizes)
            return tree
        return None

    def topk_keep_code(self, v: V):
        """where(topk_mask(x, l, k=K), f(x), 0), f element-wise (or x itself): only the K kept
        entries are mapped and scattered into zeros; the same values and gradients as the where."""
        cond, a, b = v.args
        if cond.op != "topk_mask" or b.op != "num" or b.of(Num).value != 0:
            return None
        x = cond.args[0]
        if x.op != "ref" or x.type.dtype == "bool" or cond.legs != v.legs or a.legs != v.legs:
            return None
        if any(al is not None and list(al) != list(range(len(v.legs))) for al in v.of(Aligned).alignment[:2]):
            return None

        def same(y):
            return y.op == "ref" and y.attrs == x.attrs

        dim = self.dim_of(x, cond.of(Axis).axis)
        if same(a):
            return P.call(P.name("_topk_filter"), self.expr(x), self.keyword(cond, "k", cond.of(TopK).k), dim)
        row = ops.OPS[a.of(Unary).name] if a.op == "unary" else None
        if row is not None and row.torch is not None and same(a.args[0]) and not row.keywords:
            return P.call(P.name("_topk_keep"), self.expr(x), self.keyword(cond, "k", cond.of(TopK).k), dim, P.path(row.torch))
        return None

    # -- statements
    def statement(self, targets: list[str], tree, comment: str) -> list[ast.stmt]:
        """`targets = tree  # comment` (one target a name, more a tuple), after the temporaries
        a deep tree needs."""
        temps, tree = self.hoister.flatten(tree)
        nodes = [P.assign(t, e) for t, e in temps]
        nodes.append(P.commented(P.assign(targets[0] if len(targets) == 1 else targets, tree), comment))
        return nodes

    def forward_def(self) -> ast.stmt:
        """The method this member's code becomes (forward, an entry's or a block's), each
        statement made from a diagram statement tagged with its span (the source map)."""
        c = self.c
        inputs = [d.tensor.name for d in c.inputs]
        for d in c.inputs:  # the checker refuses these; a name that slipped through is not emitted
            emitted_name(d.tensor.name, "local", d.tensor.span)
        for s in c.stmts:
            for t in getattr(s.stmt, "targets", ()):
                emitted_name(t, "local", s.stmt.span)
        body: list[ast.stmt] = []
        for s in c.stmts:
            st = s.stmt
            made: list[ast.stmt] = []
            if isinstance(st, ir.Comment):
                text = _comment(st.text)
                if text:
                    body.append(P.Comment(text))
                continue
            if isinstance(st, ir.Assign) and id(s) in self.absorbed:
                made.append(P.Comment(f"{_statement_comment(st)}  (fused below)"))
            elif isinstance(st, ir.Assign) and _value(s).op == "split" and id(s) not in self.fused and any(
                (t, ver) not in self.read for t, ver in zip(st.targets, s.versions)
            ):  # pieces nobody reads are not made: narrow the others
                kept = [i for i, (t, ver) in enumerate(zip(st.targets, s.versions)) if (t, ver) in self.read]
                made.append(P.Comment(_statement_comment(st)))
                made.extend(self.narrow_nodes(s, kept))
            elif isinstance(st, ir.Assign):
                tree = self.attention_code(self.fused[id(s)]) if id(s) in self.fused else self.expr(_value(s))
                comment = ", ".join(self.shape_comment(t) for t in s.types)
                note = f"  {_comment(st.note)}" if st.note else ""
                made.append(P.Comment(_statement_comment(st)))  # the diagram's statement, above its code
                made.extend(self.statement(list(st.targets), tree, comment + note))
            elif isinstance(st, ir.Return):
                trees = [self.expr(v) for v in _value(s).args]
                tree = trees[0] if len(trees) == 1 else P.tuple_(trees)
                temps, tree = self.hoister.flatten(tree)
                made.extend(P.assign(t, e) for t, e in temps)
                made.append(P.return_(tree))
            body.extend(P.tagged(node, st.span) for node in made)
        if self.top:
            names = [n for n, _ in c.outputs]
            if len(names) == 1:
                body.append(P.return_(P.name(names[0])))
            else:
                body.append(P.return_(P.method(P.name("self"), self.outputs_attr, *map(P.name, names))))
        head: list[ast.stmt] = []
        ref = self.reference_tensor()  # inputs match its dtype and device; masks may be made where it lives
        if self.top:
            # the catch-alls and every generated local start with '_', never a user's name; inputs
            # given by position are bound by _positional, so that an input given twice, missing
            # or unknown is a ShapeError, as in the interpreter (not Python's TypeError)
            args = P.arguments(["self"], vararg="_args", keyword_only=[(n, None) for n in inputs], kwarg="_unexpected")
            spec = P.attr(P.name("self"), self.inputs_attr)
            given = P.call(P.name("_positional"), spec, P.name("_args"), P.tuple_(map(P.name, inputs)))
            head.append(P.if_(P.name("_args"), [P.assign(inputs, given) if inputs else P.expr_stmt(given)]))
            checks = [P.attr(P.name("self"), self.inputs_attr), P.tuple_(map(P.name, inputs)), P.name("_unexpected")]
            if ref is not None:
                checks += [P.tuple_([]), ref]
            checked = P.call(P.name("_check_inputs"), *checks)  # the sizes of the free legs, where one is read
            head.append(P.assign("_sizes", checked) if self.used_free else P.expr_stmt(checked))
            for r, name in sorted(self.used_free.items(), key=lambda kv: kv[1]):
                head.append(P.assign(name, P.subscript(P.name("_sizes"), P.const(self.S.label[r]))))
        else:
            args = P.arguments(["self", *inputs])
            for r, name in sorted(self.used_free.items(), key=lambda kv: kv[1]):
                head.append(P.assign(name, self.find_binder(r)))
        if self.uses_device:  # masks are made where the inputs (or the parameters) live
            if inputs:
                head.append(P.assign("_device", P.attr(P.name(inputs[0]), "device")))
            elif ref is not None:
                head.append(P.assign("_device", P.attr(ref, "device")))
            else:
                head.append(P.commented(P.assign("_device", P.const(None)), "the default device"))
        if self.uses_dtype:  # a where() of two plain numbers takes the model's floating dtype
            floats = [d.tensor.name for d in c.inputs if d.tensor.dtype == "float"]
            source = P.name(floats[0]) if floats else ref
            head.append(P.assign("_dtype", P.attr(source, "dtype") if source is not None else P.call(P.path("torch.get_default_dtype"))))
        return P.function(self.method, args, head + body)

    def reference_tensor(self):
        """The tree of the first parameter or buffer (inputs must match its dtype and device), or None."""

        def find(c: Checked, node):
            own = c.params + c.buffers
            if own:
                return _member(node, own[0].tensor.name)
            for inst in c.instances.values():
                sub = _instance_node(inst.name, node)
                found = find(self.c.blocks[inst.block], P.subscript(sub, P.const(0)) if inst.stacked is not None else sub)
                if found is not None:
                    return found
            return None

        return find(self.c, P.name("self"))

    def narrow_nodes(self, s, kept: list[int]) -> list[ast.stmt]:
        """The read pieces of a split, each as a narrow (a view) of the split tensor."""
        v = s.value
        x = v.args[0]
        split = v.of(Split)
        sizes = split.sizes
        dim = self.dim_of(x, split.axis)
        # each piece's size by its dim's name, its start the sum of those before it
        named = [self.size_node(t.cls[split.axis], v.span, t.legs[split.axis]) if not self.S.is_free(t.cls[split.axis])
                 else P.const(n) for t, n in zip(s.types, sizes)]
        nodes: list[ast.stmt] = []
        base = self.expr(x)
        if len(kept) > 1 and not P.is_simple(base):  # computed once, however many pieces are read
            nodes.extend(self.statement(["_split"], base, ""))
            base = P.name("_split")
        for i in kept:
            start = _sum(named[:i])
            if not x.type.batched and dim == -len(x.legs):  # the first axis: a plain slice
                end = None if i == len(sizes) - 1 else _sum(named[: i + 1])  # the last piece: to the end
                piece = P.subscript(base, P.slice_(start if i else None, end))
            else:
                piece = P.method(base, "narrow", dim, start, named[i])
            nodes.extend(self.statement([s.stmt.targets[i]], piece, self.shape_comment(s.types[i])))
        return nodes

    def find_binder(self, root: int) -> ast.expr:
        """The size of a run-time leg of a block, read from an argument: `x.shape[-1]`."""
        for d in self.c.inputs:
            for j, cl in enumerate(d.type.cls):
                if self.S.find(cl) == root:
                    return P.subscript(P.attr(P.name(d.tensor.name), "shape"), P.const(j - len(d.type.cls)))
        raise PenroseCompileError(
            f"block {self.c.name!r} uses leg {self.S.label[root]!r}, whose size is known only at run time, "
            "but none of its arguments carries it",
            Span(self.c.diagram.file),
        )

    # -- the class (see _class_def, which joins the members of one class)
    def spec_nodes(self) -> list[ast.stmt]:
        """The class attributes this member's method reads: its outputs' named tuple, its inputs."""
        c, nodes = self.c, []
        if self.top and len(c.outputs) > 1:
            names = tuple(n for n, _ in c.outputs)
            type_name = self.cls_name + ("" if self.method == "forward" else _camel(self.method)) + "Outputs"
            nodes.append(P.assign(self.outputs_attr, P.call(P.path("collections.namedtuple"), P.const(type_name), P.literal(names))))
        if self.top:
            spec = []
            for d in c.inputs:
                # a free leg is named (read from the inputs at run time), a fixed one is its size (its dim's constant)
                sizes = [P.const(self.S.label[self.S.find(cl)]) if self.S.is_free(cl) else self.size_node(cl, d.tensor.span, leg)
                         for cl, leg in zip(d.type.cls, d.type.legs)]
                legs = P.literal(tuple(d.tensor.legs))
                spec.append(P.tuple_([P.const(d.tensor.name), legs, P.tuple_(sizes), P.const(d.tensor.dtype)]))
            nodes.append(P.assign(self.inputs_attr, P.tuple_(spec)))
        return nodes

    def own_nodes(self) -> dict:
        """name -> (its statement in __init__, its statement in reset_parameters, where it is
        declared) for params and buffers."""
        out = {}
        me = P.name("self")
        for d in self.c.params + self.c.buffers:
            if not quoted(d.tensor.name):  # a quoted name is registered by its text, never written as an attribute
                emitted_name(d.tensor.name, "attribute", d.tensor.span)
            shape = [self.size_node(cl, d.tensor.span, leg) for cl, leg in zip(d.type.cls, d.type.legs)]
            empty = P.call(P.path("torch.empty"), *(shape or [P.tuple_([])]))  # a scalar: torch.empty(())
            if d.tensor.kind == "param" and not quoted(d.tensor.name):
                made = P.assign(P.attr(me, d.tensor.name), P.call(P.path("torch.nn.Parameter"), empty))
            elif d.tensor.kind == "param":
                made = P.expr_stmt(P.method(me, "register_parameter", unquote(d.tensor.name), P.call(P.path("torch.nn.Parameter"), empty)))
            else:
                unsaved = {} if d.tensor.saved else {"persistent": False}  # `unsaved`: made from its init, not in the state dict
                made = P.expr_stmt(P.method(me, "register_buffer", unquote(d.tensor.name), empty, **unsaved))
            out[d.tensor.name] = (P.commented(made, self.shape_comment(d.type)), self.init_node(d), d.tensor.span)
        return out

    def instance_nodes(self) -> dict:
        """instance name -> (the module made for it in __init__, where it is made)."""
        out = {}
        for inst in self.c.instances.values():
            head = inst.name.split(".")[0]
            if not head.isdigit() and not quoted(head):  # a number or a quoted name is a key (add_module), not an attribute
                emitted_name(head, "attribute", inst.span)
            made = P.call(P.name(self.block_classes[inst.name]))
            if inst.stacked is not None:  # `repeat N`: N copies; `repeat N shared` is the block itself, run N times
                made = P.call(P.path("torch.nn.ModuleList"), P.list_comp(made, "_", P.call(P.name("range"), inst.stacked)))
            out[inst.name] = (made, inst.span)
        return out

    def init_node(self, d) -> ast.stmt:
        """`torch.nn.init.<function>(self.W, ...)`: the init's row of penrose.tables.INITIALISERS
        (the interpreter calls the same function with the same numbers)."""
        row, args, kwargs = init_call(d.tensor.init, [self.S.size(cl) for cl in d.type.cls])
        target = _member(P.name("self"), d.tensor.name)
        if row.made:  # values the module computes for itself: `self.M.copy_(<values>)` (a param's under no_grad)
            copy = P.expr_stmt(P.method(target, "copy_", _made_node(d.tensor.init.name, target, kwargs)))
            return copy if d.tensor.kind == "buffer" else P.with_(P.call(P.path("torch.no_grad")), [copy])
        extra = {"generator": P.name("generator")} if row.random else {}
        return P.expr_stmt(P.call(P.path("torch.nn.init." + row.function), _member(P.name("self"), d.tensor.name), *args, **kwargs, **extra))


def _made_node(name: str, t: ast.expr, values: dict[str, float]) -> ast.expr:
    """The torch expression of an init a module computes for itself (docs/language.md), as a tree:
    `causal` (torch.tril of ones), `arange`, `rotary` (1 / base ** (i / n)), `rotary_cos`,
    `rotary_sin` (cos, sin of position times those frequencies, twice over), in float32,
    expanded to the tensor `t`'s shape; `values` the row's keywords (the rotary ones' `base`)."""
    shape = P.attr(t, "shape")
    last, rows = P.subscript(shape, -1), P.subscript(shape, -2)
    if name == "causal":
        made = P.method(P.call(P.path("torch.ones"), P.subscript(shape, P.slice_(-2))), "tril")
    elif name == "arange":
        made = P.method(P.call(P.path("torch.arange"), last), "float")
    else:
        n = last if name == "rotary" else P.binop("//", last, P.const(2))
        inverse = P.binop("/", P.const(1.0), P.binop("**", P.const(values["base"]), P.binop("/", P.method(P.call(P.path("torch.arange"), n), "float"), n)))
        if name == "rotary":
            made = inverse
        else:
            positions = P.subscript(P.method(P.call(P.path("torch.arange"), rows), "float"), P.index_tuple([P.slice_(), None]))
            freqs = P.binop("*", positions, P.subscript(inverse, P.index_tuple([None, P.slice_()])))
            made = P.method(P.call(P.path("torch.cat"), P.binop("*", P.list_([freqs]), P.const(2)), dim=P.const(-1)), name[len("rotary_"):])
    return P.method(made, "expand", shape)


def emitted_name(name: str, place: str, span: Span | None = None, fail: bool = True) -> str | None:
    """Check a name the compiler is about to emit against the one table of what Python and the
    generated module reserve (penrose.tables.RESERVED): raises PenroseCompileError (or, with
    fail=False, returns the reason) when it may not stand at `place`."""
    from penrose.tables import reserved

    why = reserved(name, place) if name.isidentifier() else "not a Python identifier"
    if why is not None and fail:
        raise PenroseCompileError(f"{name!r} cannot be a {place} name of the generated module: it is {why}; rename it", span)
    return why


def _reorder(tree, order: list[int]):
    """The method call that puts axis order[j] of the last len(order) axes at position j: one
    transpose for a swap, a one-axis movedim for a single move, else a movedim of all of them."""
    n = len(order)
    moved = [j for j in range(n) if order[j] != j]
    if len(moved) == 2 and order[moved[0]] == moved[1]:
        return P.method(tree, "transpose", moved[0] - n, moved[1] - n)
    for i in range(n):  # axis i moved to position j, the others keeping their order
        rest = [a for a in range(n) if a != i]
        for j in range(n):
            if rest[:j] + [i] + rest[j:] == order:
                return P.method(tree, "movedim", i - n, j - n)
    return P.method(tree, "movedim", tuple(i - n for i in order), tuple(j - n for j in range(n)))


def _matmul_form(terms, out, batched, exprs):
    """`X @ Y` (with .mT where needed) when a two-operand einsum is exactly a matrix product;
    `linear(X, W)` when Y is a weight matrix W (n, c) contracted on its last leg.

    torch.matmul skips einsum's bookkeeping, which is measurable on CPU; anything that is not a
    plain product over one leg (traces, explicit batch legs, reordered outputs) stays an einsum.
    """
    (ta, tb) = terms
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb):
        return None
    shared = set(ta) & set(tb)
    contracted = shared - set(out)
    if len(contracted) != 1 or shared & set(out):
        return None
    (c,) = contracted
    for (xt, xb, xe), (yt, yb, ye) in (
        ((ta, batched[0], exprs[0]), (tb, batched[1], exprs[1])),
        ((tb, batched[1], exprs[1]), (ta, batched[0], exprs[0])),
    ):
        # Y: (c,) or (c, n) / (n, c); X: (..., c) or (c, m) when X has two legs
        if len(yt) == 1:
            if yb:
                continue
            y_tree, y_free = ye, ()
        elif len(yt) == 2:
            if yb and len(xt) != 2:
                continue
            y_free = tuple(l for l in yt if l != c)
            y_tree = ye if yt[0] == c else P.attr(ye, "mT")
        else:
            continue
        if xt[-1] == c:
            x_tree, x_free = xe, xt[:-1]
        elif len(xt) == 2 and xt[0] == c:
            x_tree, x_free = P.attr(xe, "mT"), xt[1:]
        else:
            continue
        if len(xt) == 1 and xb and (yb or len(yt) == 1):
            continue
        if not xb and yb and len(xt) > 2:
            continue
        if tuple(x_free) + tuple(y_free) != tuple(out):
            continue
        if len(yt) == 2 and not yb and yt[1] == c and xt[-1] == c:  # X Wᵀ with a weight matrix W (n, c)
            return P.call(P.path("torch.nn.functional.linear"), xe, ye)
        return P.binop("@", x_tree, y_tree)
    return None


def _product_sum_form(terms, out, batched, exprs):
    """`(a * b).sum(dims)` when both operands carry the same legs in the same order and the
    output keeps some of them in that order (einsum('fpk,fpk->pk', A, B)): torch.einsum would
    route this through a batched matmul with copies."""
    (ta, tb) = terms
    if ta != tb or len(set(ta)) != len(ta) or not ta:
        return None
    kept = [l for l in ta if l in out]
    if tuple(kept) != tuple(out):
        return None
    prod = P.binop("*", exprs[0], exprs[1])
    summed = tuple(i - len(ta) for i, l in enumerate(ta) if l not in out)
    if not summed:
        return prod
    return P.method(prod, "sum", summed[0] if len(summed) == 1 else summed)


# ---- the lowering of each operation: one entry per row of penrose.ops.OPS -------------------

def _lower_unary(em: _Emitter, v: V):
    """An element-wise function: the torch callable its row names, its keywords by position."""
    if v.op == "sfunc":
        return _lower_scalar_func(em, v)
    row = ops.OPS[v.of(Unary).name]
    assert row.torch is not None  # LOWER has this rule for the element-wise rows only
    return P.call(P.path(row.torch), em.expr(v.args[0]), *[em.keyword(v, k.name, v.attrs.keyword(k.name)) for k in row.keywords])


def _lower_scalar_func(em: _Emitter, v: V):
    """A function of a plain number, as written (`math.sqrt(D)`): Python's math computes it, as
    the checker did when it folded the number (the row's form on plain numbers)."""
    row = ops.OPS[v.of(Unary).name]
    if fixed(v, em.S) is None and not row.sized:
        raise PenroseCompileError(f"{row.name} of a size known only at run time; use a tensor", v.span)
    fn = P.path(f"math.{row.name}") if hasattr(math, row.name) else P.name(row.name)  # abs: the builtin
    return P.call(fn, em.expr(v.args[0]))


def _lower_binop(op: str):
    def lower(em: _Emitter, v: V):
        a, b = v.args
        if v.op == "sbin":  # plain numbers, as written (`ALPHA / R`): Python computes what the checker folded
            ta, tb = em.expr(a), em.expr(b)
        else:
            align = v.of(Aligned).alignment
            ta, tb = em.aligned(a, align[0], v), em.aligned(b, align[1], v)
            if op == "//":  # zero gradient wherever it exists; torch has no derivative for floor_divide
                ta, tb = (t if x.type.dtype == "scalar" else P.method(t, "detach") for t, x in ((ta, a), (tb, b)))
            if op == "+":
                fused = _linear_with_bias(v, (ta, tb))
                if fused is not None:
                    return fused
        if op in P.CMPOPS:
            return P.compare(op, ta, tb)
        if v.op != "sbin" and v.type.dtype == "float":  # `ids * 1` is a float tensor, as the checker says: torch's would be int64
            ta, tb = (_as_float(em, t) if x.type.dtype == "int" else t for t, x in ((ta, a), (tb, b)))
        return P.binop(op, ta, tb)

    return lower


def _as_float(em: _Emitter, tree: ast.expr) -> ast.expr:
    """An integer tensor in the model's floating dtype (what arithmetic on it gives in .pen)."""
    em.uses_dtype = True
    return P.method(tree, "to", P.name("_dtype"))


def _linear_with_bias(v: V, trees: tuple) -> ast.expr | None:
    """`F.linear(x, W) + b` as `F.linear(x, W, b)`, where b is a one-leg param or buffer along the
    product's last leg (nn.Linear's bias); None where that does not fit exactly."""
    for i, j in ((0, 1), (1, 0)):
        lin, bias, align = trees[i], v.args[j], v.of(Aligned).alignment[j]
        if (isinstance(lin, ast.Call) and _is_path(lin.func, "torch.nn.functional.linear") and len(lin.args) == 2
                and bias.op == "ref" and bias.of(Ref).kind in ("param", "buffer") and len(bias.legs) == 1
                and bias.type.dtype == "float" and align == (None,) * (len(v.legs) - 1) + (0,)):
            return P.call(lin.func, *lin.args, trees[j])
    return None


def _lower_neg(em: _Emitter, v: V):
    return P.neg(em.expr(v.args[0]))


def _lower_softmax(fn: str):
    def lower(em: _Emitter, v: V):
        return P.call(P.path(fn), em.expr(v.args[0]), dim=em.dim_of(v.args[0], v.of(Axis).axis))

    return lower


def _lower_layernorm(em: _Emitter, v: V):
    x = v.args[0]
    ln = v.of(LayerNorm)
    d = em.dim_of(x, ln.axis)
    n = em.size_node(x.type.cls[ln.axis], v.span, x.legs[ln.axis])
    w, b = em.param_ref(ln.weight), em.param_ref(ln.bias)
    fn = P.path("torch.nn.functional.layer_norm")
    if d == -1:
        return P.call(fn, em.expr(x), P.tuple_([n]), w, b, em.keyword(v, "eps", ln.eps))
    moved = P.method(em.expr(x), "movedim", d, -1)
    return P.method(P.call(fn, moved, P.tuple_([n]), w, b, em.keyword(v, "eps", ln.eps)), "movedim", -1, d)


def _lower_rmsnorm(em: _Emitter, v: V):
    x = v.args[0]
    eps = em.keyword(v, "eps", v.of(RMSNorm).eps)
    return P.call(P.name("_rms_norm"), em.expr(x), em.param_ref(v.of(RMSNorm).weight), eps, em.dim_of(x, v.of(Axis).axis))


def _lower_topk(helper: str):
    def lower(em: _Emitter, v: V):
        x = v.args[0]
        return P.call(P.name(helper), em.expr(x), em.keyword(v, "k", v.of(TopK).k), em.dim_of(x, v.of(Axis).axis))

    return lower


def _lower_reduce(meth: str):
    def lower(em: _Emitter, v: V):
        x = v.args[0]
        return P.method(em.expr(x), meth, em.dim_of(x, v.of(Axis).axis))

    return lower


def _lower_minmax(meth: str, pair: str, bound: str):
    """max / min over a leg (amax / amin), or of two operands entry by entry: torch.maximum
    (minimum) of two tensors, a clamp by a number."""
    reduce = _lower_reduce(meth)

    def lower(em: _Emitter, v: V):
        if v.op == "reduce":
            return reduce(em, v)
        a, b = v.args
        align = v.of(Aligned).alignment
        ta, tb = em.aligned(a, align[0], v), em.aligned(b, align[1], v)
        if a.type.dtype == "scalar":
            ta, tb, a, b = tb, ta, b, a
        if b.type.dtype == "scalar":
            return P.method(ta, "clamp", **{bound: tb})
        return P.call(P.path(pair), ta, tb)

    return lower


def _lower_dropout(em: _Emitter, v: V):
    return P.call(P.path("torch.nn.functional.dropout"), em.expr(v.args[0]), em.keyword(v, "p", v.of(Dropout).p), P.path("self.training"))


def _lower_detach(em: _Emitter, v: V):
    return P.method(em.expr(v.args[0]), "detach")


def _lower_clamp(em: _Emitter, v: V):
    kw = {k: em.keyword(v, k, x) for k, x in (("min", v.of(Clamp).min), ("max", v.of(Clamp).max)) if x is not None}
    return P.method(em.expr(v.args[0]), "clamp", **kw)


def _lower_where(em: _Emitter, v: V):
    kept = em.topk_keep_code(v)
    if kept is not None:
        return kept
    # a float result: where(m, 1, 0) of two whole numbers would otherwise be an int64 tensor
    parts = [P.const(float(x.of(Num).value)) if x.op == "num" or (x.op == "const" and isinstance(x.of(Num).value, int))
             else em.aligned(x, al, v) for x, al in zip(v.args, v.of(Aligned).alignment)]
    tree = P.call(P.path("torch.where"), *parts)
    if v.args[1].type.dtype == v.args[2].type.dtype == "scalar":  # no tensor to take the dtype from
        em.uses_dtype = True
        tree = P.method(tree, "to", P.name("_dtype"))
    return tree


def _lower_mask(em: _Emitter, v: V):
    em.uses_device = True
    if v.of(Mask).kind == "arange":  # a leg's positions, in the model's floating dtype
        em.uses_dtype = True
        n = em.size_node(v.type.cls[0], v.span, v.legs[0])
        return P.call(P.path("torch.arange"), n, device=P.name("_device"), dtype=P.name("_dtype"))
    t, p = (em.size_node(c, v.span, leg) for c, leg in zip(v.type.cls, v.legs))
    if v.of(Mask).kind == "causal":
        return P.call(P.name("_causal_mask"), t, p, P.name("_device"))
    return P.call(P.name("_block_causal_mask"), t, p, em.keyword(v, "block", v.of(Mask).block), P.name("_device"))


def _lower_gather(em: _Emitter, v: V):
    table, ids = v.args
    rows = em.size_node(table.type.cls[0], v.span, table.legs[0])
    checked = P.call(P.name("_ids"), em.expr(ids), rows, P.const(gather_label(table, ids)))  # one meaning: no id wraps
    if len(table.legs) == 2 and not table.type.batched:  # rows of a matrix: an embedding
        return P.call(P.path("torch.nn.functional.embedding"), checked, em.expr(table))
    return P.subscript(em.expr(table), checked)


def gather_label(table: V, ids: V) -> str:
    """How an error about gather's ids names them: the input (or expression) and the table's leg."""
    what = f"input {ids.of(Ref).name!r}" if ids.op == "ref" else "the ids"
    tab = repr(table.of(Ref).name) if table.op == "ref" else "the table"
    return f"gather: {what} indexes leg {table.legs[0]!r} of {tab}"


def _lower_split(em: _Emitter, v: V):
    x = v.args[0]
    axis = v.of(Axis).axis
    sizes = [em.size_node(t.cls[axis], v.span, t.legs[axis]) if not em.S.is_free(t.cls[axis]) else P.const(n)
             for t, n in zip(v.outs, v.of(Split).sizes)]
    return P.call(P.path("torch.split"), em.expr(x), P.list_(sizes), dim=em.dim_of(x, axis))


def _lower_concat(em: _Emitter, v: V):
    parts = P.list_([em.expr(x) for x in v.args])
    if any(x.type.batched for x in v.args):  # batch legs broadcast first: torch.cat does not
        return P.call(P.name("_concat"), parts, em.dim_of(v, v.of(Axis).axis), len(v.legs))
    return P.call(P.path("torch.cat"), parts, dim=em.dim_of(v, v.of(Axis).axis))


def _lower_flatten(em: _Emitter, v: V):
    x = v.args[0]
    n = len(x.legs)
    return P.method(em.expr(x), "flatten", v.of(Flatten).start - n, v.of(Flatten).end - n)


def _lower_unflatten(em: _Emitter, v: V):
    x = v.args[0]
    axis = v.of(Axis).axis
    legs = zip(v.type.cls[axis:], v.legs[axis:], v.of(Unflatten).sizes)
    sizes = [em.size_node(c, v.span, leg) if not em.S.is_free(c) else P.const(n) for c, leg, n in legs]
    return P.method(em.expr(x), "unflatten", em.dim_of(x, axis), P.tuple_(sizes))


def _lower_rope(em: _Emitter, v: V):
    x = v.args[0]
    base = em.keyword(v, "base", v.of(Rope).base)
    return P.call(P.name("_rope"), em.expr(x), em.dim_of(x, v.of(Rope).pos), em.dim_of(x, v.of(Axis).axis), base)


def _lower_einop(em: _Emitter, v: V):
    """rearrange / reduce / repeat: split legs (unflatten), reduce, reorder (movedim), add legs
    (unsqueeze, expand), merge legs (flatten); every leg counted from the end, so batch legs
    ride along in front."""
    x, a = v.args[0], v.of(Einop)
    cls = {aid: c for aid, c, _ in a.axes}
    leg = {aid: name for aid, _, name in a.axes}
    tree = em.expr(x)
    m = len(x.legs)
    for i, grp in enumerate(a.left):  # first leg to last: the later legs keep their indices
        if not grp:
            tree = P.method(tree, "squeeze", i - m)
        elif len(grp) > 1:
            tree = P.method(tree, "unflatten", i - m, P.tuple_([em.size_node(cls[g], v.span, leg[g]) for g in grp]))
    elem = [g for grp in a.left for g in grp]
    k = len(elem)
    dims = [j - k for j, g in enumerate(elem) if g in a.reduced]
    if a.reduction in ("max", "min"):  # a maximum of nothing: legs whose size 0 only the run time can show
        what = P.const(f"reduce {a.reduction!r} of {a.pattern!r}")
        free = [d for d in dims if em.S.is_free(cls[elem[d + k]])]
        if free:
            tree = P.call(P.name("_nonempty"), tree, P.tuple_(free), what)
        if a.sum_batch:
            tree = P.call(P.name("_nonempty"), tree, k, what)
    if a.sum_batch:  # an ellipsis reduced: the batch legs too, as one leading leg
        tree = P.call(P.name("_batch_first"), tree, k)
        dims = [-k - 1] + dims
    if dims:
        tree = _reduction(tree, a.reduction or "sum", dims)
        elem = [g for g in elem if g not in a.reduced]
        k = len(elem)
    final = [g for grp in a.right for g in grp]
    order = [elem.index(g) for g in final if g not in a.new]
    if order != list(range(k)):
        tree = _reorder(tree, order)
    if a.new:
        for j, g in enumerate(final):
            if g in a.new:  # unsqueeze where the new leg stands, counted from the end
                after = sum(1 for h in final[j + 1 :] if h not in a.new)
                tree = _unsqueezed(tree, -after - 1)
        sizes = [em.size_node(cls[g], v.span, leg[g]) if g in a.new else P.const(-1) for g in final]
        if x.type.batched:
            tree = P.call(P.name("_expand_legs"), tree, P.tuple_(sizes))
        else:
            tree = P.method(tree, "expand", *sizes)
    for gi, grp in enumerate(a.right):  # first group to last: the later ones keep their indices
        if len(grp) > 1:
            tail = sum(len(g) for g in a.right[gi:])
            tree = P.method(tree, "flatten", -tail, -tail + len(grp) - 1)
    for gi, grp in enumerate(a.right):  # legs of size 1 ('1', '()'), counted from the end
        if not grp:
            tree = _unsqueezed(tree, -sum(1 for g in a.right[gi + 1 :] if g) - 1)
    return tree


def _sum(terms: list) -> ast.expr:
    """The sum of size trees (0 for none), numbers added up where every term is one."""
    if all(isinstance(t, ast.Constant) for t in terms):
        return P.const(sum(t.value for t in terms))
    tree = terms[0]
    for t in terms[1:]:
        tree = P.binop("+", tree, t)
    return tree


def _unsqueezed(tree, d: int):
    """`tree.unsqueeze(d)`, d counted from the end; of a reduction over that same leg,
    `x.sum(d, keepdim=True)` instead (the same kernel, written as a person would), also under
    element-wise functions and arithmetic with plain numbers, which keep the shape:
    `torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)`."""
    kept = _keepdim(tree, d)
    return P.method(tree, "unsqueeze", d) if kept is None else kept


def _keepdim(tree, d: int):
    """`tree` with its reduction over leg d keeping that leg, or None where it has none there."""
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and tree.func.attr in _REDUCTIONS \
            and len(tree.args) == 1 and not tree.keywords and _int_of(tree.args[0]) == d:
        return P.method(tree.func.value, tree.func.attr, tree.args[0], keepdim=P.const(True))
    if isinstance(tree, ast.Call) and P.unparse(tree.func) in _ELEMENTWISE_CALLS and tree.args \
            and all(_plain_number(a) for a in tree.args[1:]) and not tree.keywords:
        inner = _keepdim(tree.args[0], d)
        return None if inner is None else P.call(tree.func, inner, *tree.args[1:])
    if isinstance(tree, ast.BinOp) and (_plain_number(tree.left) or _plain_number(tree.right)):
        left = tree.left if _plain_number(tree.left) else _keepdim(tree.left, d)
        right = tree.right if _plain_number(tree.right) else _keepdim(tree.right, d)
        return None if left is None or right is None else ast.BinOp(left, tree.op, right)
    return None


_ELEMENTWISE_CALLS = frozenset(op.torch for op in ops.OPS.values() if op.torch is not None)


def _plain_number(tree) -> bool:
    """Whether a tree is a plain number: a literal, a dim's or const's constant, math of those."""
    if isinstance(tree, ast.Constant) or hasattr(tree, _CONSTANT):
        return True
    if isinstance(tree, ast.UnaryOp):
        return _plain_number(tree.operand)
    if isinstance(tree, ast.BinOp):
        return _plain_number(tree.left) and _plain_number(tree.right)
    if isinstance(tree, ast.Call) and _is_path(tree.func.value if isinstance(tree.func, ast.Attribute) else tree.func, "math"):
        return all(_plain_number(a) for a in tree.args)
    return False


_REDUCTIONS = ("sum", "mean", "amax", "amin", "prod")


def _int_of(node) -> int | None:
    """The whole number a constant tree holds (`-2` is unary minus of 2), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_of(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _reduction(tree, reduction: str, dims: list):
    """`reduction` over the given legs (counted from the end)."""
    if reduction == "prod":  # one leg at a time, the outermost first: the inner ones keep their indices
        for d in sorted(dims):
            tree = P.method(tree, "prod", d)
        return tree
    meth = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}[reduction]
    return P.method(tree, meth, dims[0] if len(dims) == 1 else P.tuple_(dims))


def _lower_select(em: _Emitter, v: V):
    x = v.args[0]
    axis, i = v.of(Axis).axis, v.of(Select).index
    return P.method(_within(em, x, axis, i, 1, "select"), "select", em.dim_of(x, axis), i)


def _lower_slice(em: _Emitter, v: V):
    x = v.args[0]
    axis, start, length = v.of(Axis).axis, v.of(Slice).start, v.of(Slice).length
    return P.method(_within(em, x, axis, start, length, "slice"), "narrow", em.dim_of(x, axis), start, length)


def _within(em: _Emitter, x: V, axis: int, start: int, length: int, what: str):
    """x's ast, checked at run time to hold the indices when its leg's size is known only then."""
    tree = em.expr(x)
    if not em.S.is_free(x.type.cls[axis]):
        return tree  # the checker saw the size
    label = P.const(f"{what} of leg {x.legs[axis]!r}")
    return P.call(P.name("_within"), tree, em.dim_of(x, axis), start, length, label)


def _lower_einsum(em: _Emitter, v: V):
    return em.einsum_code(v)


LOWER = {
    **{name: _lower_unary for name in ops.ELEMENTWISE},
    **{op: _lower_binop(op) for op in ("+", "-", "*", "/", "//", "**", "<", "<=", ">", ">=", "==", "!=")},
    "neg": _lower_neg,
    "einsum": _lower_einsum,
    "softmax": _lower_softmax("torch.softmax"),
    "log_softmax": _lower_softmax("torch.log_softmax"),
    "layernorm": _lower_layernorm,
    "rmsnorm": _lower_rmsnorm,
    "topk": _lower_topk("_topk_filter"),
    "topk_mask": _lower_topk("_topk_mask"),
    "sum": _lower_reduce("sum"),
    "mean": _lower_reduce("mean"),
    "max": _lower_minmax("amax", "torch.maximum", "min"),
    "min": _lower_minmax("amin", "torch.minimum", "max"),
    "dropout": _lower_dropout,
    "detach": _lower_detach,
    "clamp": _lower_clamp,
    "where": _lower_where,
    "causal": _lower_mask,
    "arange": _lower_mask,
    "block_causal": _lower_mask,
    "gather": _lower_gather,
    "split": _lower_split,
    "concat": _lower_concat,
    "flatten": _lower_flatten,
    "unflatten": _lower_unflatten,
    "rope": _lower_rope,
    "rearrange": _lower_einop,
    "reduce": _lower_einop,
    "repeat": _lower_einop,
    "select": _lower_select,
    "slice": _lower_slice,
}


def _atom_num(em: _Emitter, v: V):
    return P.const(v.of(Num).value)


def _atom_const(em: _Emitter, v: V):
    return _constant("const", v.of(Const).name, v.of(Const).value)


def _atom_dimsize(em: _Emitter, v: V):
    return em.size_node(v.of(DimSize).cls, v.span, v.of(DimSize).name)


def _atom_ref(em: _Emitter, v: V):
    name = v.of(Ref).name
    return _member(P.name("self"), name) if v.of(Ref).kind in ("param", "buffer") else P.name(name)


def _atom_block(em: _Emitter, v: V):
    inst = v.of(BlockCall).instance
    args = [em.expr(x) for x in v.args]
    method = em.calls.get(inst)  # None: the block is its class's forward; else one of its other methods
    module = _instance_node(inst)
    call = v.of(BlockCall)
    if call.repeat is not None:
        if call.shared:  # one block, applied `repeat` times: `_chain([self.slots] * 3, x)`
            module = P.binop("*", P.list_([module]), P.const(call.repeat))
        return P.call(P.name("_chain"), module, *args, **({"method": P.const(method)} if method else {}))
    return P.call(P.attr(module, method) if method else module, *args)


# values that are not operations of the table: atoms, and calls of the diagram's own blocks
_ATOMS = {"num": _atom_num, "const": _atom_const, "dimsize": _atom_dimsize, "ref": _atom_ref, "block": _atom_block}


@deep
def generate_source(checked: Checked, standalone: bool = True, fuse_attention: bool = True, with_map: bool = False,
                    entries: dict | None = None):
    """The Python source of the module for a checked diagram (imports only torch).

    `fuse_attention` lowers recognised attention (scores, mask, softmax, convex combination) to
    one scaled_dot_product_attention call; the function computed is the same.

    `entries` maps method names to more checked diagrams: one module then holds the parameters
    of them all (shared by name: the same name must have the same shape and init) and runs
    each as its method, `checked` as forward (`_classes` says how blocks are shared).

    With `with_map`, returns `(source, source_map)`: for each diagram statement that produced
    code, in source order, `(class_name, statement_span, first_line, last_line)`, its lines of
    the source (1-based, both included; the class is the diagram's or its block's). A statement
    fused into a later one keeps its comment line; a split cut into narrowed pieces spans them
    all. The map is read from the module's tree (`module_tree`): the printer writes each
    statement's line numbers into it, and every statement made from a diagram statement is
    tagged with that statement's span.

    >>> c = load("dim e = 2\\ninput x[e]\\ny = x * 2\\noutput y")
    >>> source, lines = generate_source(c, with_map=True)
    >>> [(cls, span.line, source.splitlines()[a - 1:b]) for cls, span, a, b in lines]
    [('Diagram', 3, ['        # y = x * 2', '        y = x * 2  # [..., e]'])]
    """
    tree = module_tree(checked, standalone, fuse_attention, entries)
    source = P.print_module(tree)  # the printer writes each statement's lines into the tree
    return (source, _source_map(tree)) if with_map else source


def module_tree(checked: Checked, standalone: bool = True, fuse_attention: bool = True, entries: dict | None = None) -> ast.Module:
    """The generated module as one `ast.Module` (generate_source prints it): its imports, the
    dims and consts its code reads by name as constants, the runtime helpers it calls (standalone
    source carries their text, from penrose/runtime.py; an in-memory module imports them), its
    classes and `Model`. Only what the code reads is there, so the file is lint-clean."""
    entries = dict(entries or {})
    classes = _classes(checked, entries, fuse_attention)
    code = [_class_def(name, members) for name, members in classes]
    code.append(P.spaced(P.assign("Model", P.name(classes[-1][0])), 2))
    helpers = _helpers(code, closure=standalone)
    taken = {n.id for node in code for n in ast.walk(node) if isinstance(n, ast.Name) and not hasattr(n, _CONSTANT)}
    taken |= {n.arg for node in code for n in ast.walk(node) if isinstance(n, ast.arg)}
    taken |= {n.name for node in code for n in ast.walk(node) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    taken |= set(_runtime_defs()) | RESERVED["module"] | BUILTINS | {"math"}
    functional = "F" not in taken  # torch.nn.functional as F, unless a name of the diagram is F
    if functional:
        code = [_Functional().visit(node) for node in code]
        functional = any(isinstance(n, ast.Name) and n.id == "F" for node in code for n in ast.walk(node))
    if functional:
        taken.add("F")
    order = {n: i for i, n in enumerate([*checked.dims, *checked.constants])}
    constants = _name_constants(code, taken, order)
    loaded = {n.id for node in code for n in ast.walk(node) if isinstance(n, ast.Name)}
    # the file name goes inside a docstring: no backslash escapes, no closing quotes
    shown = _comment(os.path.basename(checked.diagram.file)).replace("\\", "/").replace('"', "'")
    body: list[ast.stmt] = [P.docstring(f"Generated by penrose from {shown}: edit the diagram, not this file.")]
    stdlib = [P.import_(m) for m in ("collections", "math") if m in loaded]
    if stdlib:
        body.append(P.spaced(stdlib[0], 1))
        body.extend(stdlib[1:])
    body.append(P.spaced(P.import_("torch"), 1))
    if functional:
        body.append(P.import_("torch.nn.functional", "F"))
    if not standalone and helpers:  # an in-memory module imports the helpers (one copy of their constants' cache)
        body.append(P.import_from("penrose.runtime", helpers))
    body.extend(constants)
    if standalone:
        for name in helpers:
            if name == "ShapeError":
                body.append(P.spaced(P.class_("ShapeError", [P.name("ValueError")], [P.docstring("A runtime input has the wrong name, rank or size.")]), 2))
            else:
                body.append(P.spaced(P.Verbatim(_runtime_defs()[name][0]), 2))
    body.extend(code)
    return P.module(body)


class _Functional(ast.NodeTransformer):
    """`torch.nn.functional.linear` written `F.linear` (the module imports it as F)."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        if _is_path(node.value, "torch.nn.functional"):
            return P.attr(P.name("F"), node.attr)
        self.generic_visit(node)
        return node


def _is_path(node: ast.AST, dotted: str) -> bool:
    """Whether `node` is the dotted name `dotted` (`torch.nn.functional`)."""
    *head, last = dotted.split(".")
    if not head:
        return isinstance(node, ast.Name) and node.id == last
    return isinstance(node, ast.Attribute) and node.attr == last and _is_path(node.value, ".".join(head))


def _classes(checked: Checked, entries: dict, fuse_attention: bool) -> list:
    """[(class name, [its members' emitters])], callees first, the top class last.

    A class is the set of blocks one instance runs: one block, or, when several entries run
    different blocks under one instance name (`known_head_plain(h) as known_head` here,
    `known_head(h, ...)` there), all of them — their parameters and sub-instances joined, the
    first block its forward, each other a method named after the block."""
    tops = [("forward", checked)] + list(entries.items())
    for method, _ in entries.items():
        _method_name_ok(method, "entry", checked)
    blocks: dict[str, tuple] = {}  # block name -> (Checked, the entry's file) of its first appearance
    for _method, c in tops:
        for name, blk in c.blocks.items():
            if not _block_used(c, name):
                continue
            if name not in blocks:
                blocks[name] = (blk, c.diagram.file)
            elif _block_signature(blocks[name][0]) != _block_signature(blk):
                raise PenroseCompileError(
                    f"block {name!r} of {c.diagram.file} is not the block {name!r} of {blocks[name][1]}; "
                    "entries that share a module share its blocks (rename one)",
                    next((st.stmt.span for st in blk.stmts if not isinstance(st.stmt, ir.Comment)), Span(c.diagram.file)))

    def children(members) -> dict:
        """instance name -> (its blocks in order of first use, repeat, span), over the members."""
        out: dict = {}
        for _, c in members:
            for inst in c.instances.values():
                found = out.setdefault(inst.name, ([], inst.stacked, inst.span))
                if found[1] != inst.stacked:
                    raise PenroseCompileError(
                        f"instance {inst.name!r} is repeated {inst.stacked or 1} time(s) here and {found[1] or 1} in another entry; "
                        "entries that share a module share its instances", inst.span)
                if inst.block not in found[0]:
                    found[0].append(inst.block)
        return out

    names: dict[tuple, str] = {}  # the blocks of a class -> its name
    taken = {"Model"}
    order: list = []  # (name, members) callees first

    def name_for(key: tuple) -> str:
        base = "".join(_camel(b) for b in key) + "Block"
        name, n = base, 2
        while name in taken or emitted_name(name, "class", fail=False):
            name, n = f"{base}{n}", n + 1
        taken.add(name)
        return name

    def plan(key: tuple | None, members: list) -> str:
        """The class of `members` [(method, Checked)], its callees planned first."""
        kids = children(members)
        inst_classes, calls = {}, []
        for inst, (blks, _, _) in kids.items():
            sub = tuple(blks)
            if sub not in names:  # (blocks never call themselves: the checker refuses cycles)
                names[sub] = plan(sub, [(b if i else "forward", blocks[b][0]) for i, b in enumerate(sub)])
            inst_classes[inst] = names[sub]
        for _method, c in members:
            calls.append({i.name: (None if i.block == kids[i.name][0][0] else i.block) for i in c.instances.values()})
        if key is None:
            top = _camel(checked.name)
            # taken holds every block class's name; a file saved as none.pen or shape_error.pen
            # gets a class NoneModel, ShapeErrorModel (a keyword, builtin or the module's own name)
            name = top + "Model" if top in taken or emitted_name(top, "class", fail=False) else top
            taken.add(name)
        else:
            name = name_for(key)
        ems = [_Emitter(c, name, inst_classes, top=key is None, fuse_attention=fuse_attention, method=method, calls=cl)
               for (method, c), cl in zip(members, calls)]
        for em in ems[1:]:
            if key is not None:
                _method_name_ok(em.method, "block", em.c)
        order.append((name, ems))
        return name

    plan(None, tops)
    return order


def _block_signature(c: Checked) -> tuple:
    """What makes two checked blocks of one name the same block: statements and leg sizes."""
    S = c.sizes
    legs = tuple((d.tensor.name, d.tensor.kind, tuple(S.size(cl) for cl in d.type.cls))
                 for d in c.inputs + c.params + c.buffers)
    return tuple(format_stmt(s.stmt) for s in c.stmts if not isinstance(s.stmt, ir.Comment)), legs


def _method_name_ok(name: str, what: str, c: Checked):
    """An entry's or a second block's method name: an identifier torch.nn.Module does not use
    (penrose.tables.MODULE_ATTRS, the list the checker holds parameter names to)."""
    if not (isinstance(name, str) and name.isidentifier()) or name.startswith("_") or name == "Model" \
            or emitted_name(name, "method", fail=False):
        raise PenroseCompileError(
            f"{what} name {name!r} cannot be a method of the module (an identifier, not starting with '_', "
            "that torch.nn.Module does not use)", Span(c.diagram.file))


def _member(node, name: str):
    """The ast of param or buffer `name` of `node`: `self.weight`; a quoted name's text where Python
    can write it (`self.self`, `self._bias`), else getattr(self, 'class')."""
    name = unquote(name)
    if name.isidentifier() and not keyword.iskeyword(name):
        return P.attr(node, name)
    return P.call(P.name("getattr"), node, P.const(name))


def _instance_node(name: str, node=None):
    """The ast of instance `name` under `node` (default `self`): attributes for names,
    `_modules['0']` for the numbers of a dotted path (`net.0` is `self.net._modules['0']`)."""
    node = P.name("self") if node is None else node
    for part in name.split(".") if name else ():
        if part.isdigit() or quoted(part):  # `self` of a quoted path: self.attention._modules['self']
            node = P.subscript(P.attr(node, "_modules"), P.const(unquote(part)))
        else:
            node = P.attr(node, part)
    return node


def _instance_init(insts: dict) -> list[ast.stmt]:
    """__init__'s statements for the instances {name: (module tree, span)}: `self.name = ...`,
    or for a dotted path the containers above it (_Container), each made once, then
    `container.add_module('last', ...)`."""
    nodes: list[ast.stmt] = []
    made = set()
    for name, (module, _) in insts.items():
        parts = name.split(".")
        if len(parts) == 1 and not parts[0].isdigit() and not quoted(parts[0]):
            nodes.append(P.assign(P.attr(P.name("self"), name), module))
            continue
        for k in range(1, len(parts) + 1):
            path = ".".join(parts[:k])
            if path in made:
                continue
            made.add(path)
            holder = _instance_node(".".join(parts[:k - 1]))
            made_here = module if k == len(parts) else P.call(P.name("_Container"))
            nodes.append(P.expr_stmt(P.method(holder, "add_module", unquote(parts[k - 1]), made_here)))
    return nodes


def _class_def(name: str, members: list) -> ast.stmt:
    """One module class: the members' parameters, buffers and instances joined by name (each
    declared once, the same everywhere), then each member's method."""
    first = members[0]
    c = first.c
    me = P.name("self")
    doc = f"Generated by penrose from diagram {c.name!r}" if not c.is_block else f"Block {c.name!r}"
    others = [em.method for em in members[1:]]
    if others:
        doc += f"; also {', '.join(others)}"
    eqs = tuple(_comment(format_stmt(s.stmt)) for s in c.stmts if isinstance(s.stmt, (ir.Assign, ir.Return)))
    # the docstring carries the diagram's name: a plain string, printed with repr
    body = [P.expr_stmt(P.const(_comment(doc) + ".")), P.assign("_EQUATIONS", P.literal(eqs))]
    attrs = {unquote(d.tensor.name) for em in members for d in em.c.params + em.c.buffers}
    attrs |= {unquote(inst.name.split(".")[0]) for em in members for inst in em.c.instances.values()}
    for em in members:  # a param named Outputs keeps its state-dict name: the named tuple's attribute moves
        if em.outputs_attr in attrs:
            em.outputs_attr = "_" + em.outputs_attr
        body.extend(em.spec_nodes())
    own: dict = {}
    insts: dict = {}
    for em in members:
        for key, found in em.own_nodes().items():
            prev = own.setdefault(key, found)
            if prev is found:
                continue
            texts = [tuple(P.statement_text(n) for n in f[:2]) for f in (prev, found)]  # declaration, init
            if texts[0] != texts[1]:
                raise PenroseCompileError(
                    f"{key!r} is declared differently in two entries of one module ({texts[0][0]} / {texts[1][0]}); "
                    "entries share parameters by name", found[2], notes=(("the other declaration", prev[2]),))
        for key, found in em.instance_nodes().items():
            insts.setdefault(key, found)
    heads = {k.split(".")[0] for k in insts}  # an instance's attribute: its path's first part
    clash = [n for em in members[1:] for n in (em.method,) if n in own or n in heads]
    if clash:
        raise PenroseCompileError(f"method {clash[0]!r} of {name} is also a parameter or instance name; rename one", Span(c.diagram.file))
    init = [P.expr_stmt(P.method(P.call(P.name("super")), "__init__"))]
    init += [made for made, _, _ in own.values()]
    init += _instance_init(insts)
    init.append(P.commented(P.expr_stmt(P.method(me, "reset_parameters", recurse=False)), "the blocks initialised themselves"))
    body.append(P.function("__init__", P.arguments(["self"]), init))
    reset = [P.docstring("Initialise every parameter and buffer as the diagram says (deterministic under a generator).")]
    if own:
        reset.append(P.if_(P.not_(P.call(P.name("_on_meta"), me)), [fill for _, fill, _ in own.values()]))
    if insts:
        module = P.name("module")
        copies = P.if_exp(P.call(P.name("isinstance"), module, P.path("torch.nn.ModuleList")), module, P.list_([module]))
        each = P.for_("sub", copies, [P.expr_stmt(P.method(P.name("sub"), "reset_parameters", P.name("generator")))])
        reset.append(P.if_(P.name("recurse"), [P.for_("module", P.method(me, "children"), [each])]))
    if not own and not insts:
        reset.append(P.pass_())
    body.append(P.function("reset_parameters", P.arguments(["self", "generator", "recurse"], defaults=[None, True]), reset))
    body.append(P.function("extra_repr", P.arguments(["self"]), [P.return_(P.method(P.const("\n"), "join", P.attr(me, "_EQUATIONS")))]))
    body.extend(em.forward_def() for em in members)
    return P.class_(name, [P.path("torch.nn.Module")], body)


def _source_map(tree: ast.Module) -> list:
    """[(class name, statement span, first line, last line)] read from a printed module: the
    lines of the statements tagged with each span, in order (a statement's nodes are adjacent)."""
    out: list = []

    def walk(body, cls: str):
        for node in body:
            span = P.origin(node)
            if span is not None:
                if out and out[-1][0] == cls and out[-1][1] == span:
                    out[-1][3] = node.end_lineno
                else:
                    out.append([cls, span, node.lineno, node.end_lineno])
            walk(getattr(node, "body", ()), cls)

    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            walk(node.body, node.name)
    return [tuple(entry) for entry in out]


def _block_used(checked: Checked, name: str) -> bool:
    seen = set()

    def visit(c: Checked):
        for inst in c.instances.values():
            if inst.block not in seen:
                seen.add(inst.block)
                visit(checked.blocks[inst.block])

    visit(checked)
    return name in seen


@dataclass(frozen=True, eq=False)
class Recipe:
    """What a generated module is made from: a checked diagram, its entries ((method, Checked)
    pairs) and whether attention is fused. A pickled model carries its recipe (penrose.generated),
    so the process that loads it regenerates the module from the diagram."""

    checked: Checked
    fuse_attention: bool = True
    entries: tuple = ()

    def source(self) -> str:
        return generate_source(self.checked, standalone=False, fuse_attention=self.fuse_attention, entries=dict(self.entries))

    def module(self, source: str | None = None):
        """The generated module, registered under its content's name (made once per process)."""
        cached = self.__dict__.get("_module")
        if cached is None:
            def to_code(text: str, filename: str):
                return _python(text, filename, self.checked)

            source = self.source() if source is None else source
            label = os.path.splitext(os.path.basename(self.checked.diagram.file))[0] or self.checked.name
            cached = generated.module_for(source, label, to_code, {"ShapeError": PenroseShapeError})
            for value in vars(cached).values():  # every class of the diagram pickles as itself
                if isinstance(value, type) and value.__module__ == cached.__name__ and issubclass(value, torch.nn.Module):
                    generated.carries(value, self)
            object.__setattr__(self, "_module", cached)
        return cached

    def __reduce__(self):
        return (Recipe, (self.checked, self.fuse_attention, self.entries))

    def __deepcopy__(self, memo):  # immutable: a copied model shares its recipe
        return self


def build(checked: Checked, seed: int | None = None, fuse_attention: bool = True, entries: dict | None = None) -> torch.nn.Module:
    """Instantiate the module of a checked diagram (and its checked `entries`, {method:
    Checked}); `seed` makes initialisation deterministic."""
    if seed is not None:
        seed = seed_value(seed)  # before any work: 'abc' or 2**70 is a PenroseArgumentError, not torch's
    recipe = Recipe(checked, fuse_attention, tuple((entries or {}).items()))
    source = recipe.source()
    module = recipe.module(source).Model()
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        if not any(p.is_meta for p in module.parameters()):
            module.reset_parameters(g)
    module.penrose_source = source
    module.penrose_checked = checked
    module.penrose_entries = dict(entries or {})  # method name -> its checked diagram
    module._repr_svg_ = functools.partial(_repr_svg, checked)  # the figure, in notebooks
    return module


def _python(source: str, filename: str, checked: Checked):
    """The code object of generated source; a SyntaxError (a name the table of reserved names
    missed) is a PenroseCompileError at the diagram, not Python's error about generated text."""
    try:
        return compile(source, filename, "exec")
    except SyntaxError as e:
        raise PenroseCompileError(f"the generated module does not compile ({e.msg}, line {e.lineno}); "
                                  "this is a bug of penrose: please report it", Span(checked.diagram.file)) from None


def _repr_svg(checked):
    from penrose import display  # a hook the package binds to the renderer

    return display.svg(checked)


def compile_diagram(
    path_or_text=None, /, *, seed: int | None = None, fuse_attention: bool = True, text=None, include_paths=(), entries=None,
    sizes=None, **more_sizes
) -> torch.nn.Module:
    """`.pen` file or text → `nn.Module`; sizes override dim defaults (paths, text, sizes: penrose.load).

    `entries` ({method: diagram}) adds methods to the module, each another diagram run on the
    same parameters (shared by name): `compile("full.pen", entries={"hidden": "hidden.pen"})`
    gives one module whose `forward` is full.pen and whose `hidden(...)` is hidden.pen.

    >>> m = compile_diagram("dim e = 2\\ninput x[e]\\ny = sigmoid(x)\\noutput y")
    >>> m(torch.zeros(2)).tolist()
    [0.5, 0.5]
    """
    from penrose.loader import warned_entries

    checked, more = warned_entries(path_or_text, entries=entries, text=text, include_paths=include_paths, sizes=sizes, **more_sizes)
    return build(checked, seed=seed, fuse_attention=fuse_attention, entries=more)


def write_source(path_or_text, out_path, /, *, text=None, include_paths=(), entries=None, sizes=None, **more_sizes) -> str:
    """Write the standalone module source to `out_path` atomically (penrose.io); returns it."""
    from penrose.io import atomic_write_text, writable_target
    from penrose.loader import load_entries

    writable_target(out_path)  # a bad target is refused before the work
    checked, more = load_entries(path_or_text, entries=entries, text=text, include_paths=include_paths, sizes=sizes, **more_sizes)
    source = generate_source(checked, standalone=True, entries=more)
    _python(source, str(out_path), checked)  # nothing is written that Python would not import
    atomic_write_text(out_path, source)
    return source
