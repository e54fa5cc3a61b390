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

import functools
import linecache
from dataclasses import replace
import math
import os
import re
from pathlib import Path

import torch

from penrose import ir
from penrose.check import UNARY, Checked, V, check
from penrose.errors import PenroseCompileError, PenroseShapeError, Span
from penrose.fmt import format_stmt
from penrose.fuse import find_attention, read_counts
from penrose.parse import parse, parse_file
from penrose.plan import letters_for, plan_einsum

_PREC_ATOM, _PREC_POW, _PREC_UNARY, _PREC_MUL, _PREC_ADD, _PREC_CMP = 100, 90, 80, 70, 60, 50
_BINPREC = {"**": _PREC_POW, "*": _PREC_MUL, "/": _PREC_MUL, "//": _PREC_MUL, "+": _PREC_ADD, "-": _PREC_ADD}
_UNARY_CODE = UNARY  # the checker's table of element-wise functions names their torch calls

HELPERS = '''
def _check_inputs(spec, values, unexpected, extra=()):
    """Check inputs against (name, legs, sizes, dtype) and return the sizes of free legs."""
    if unexpected:
        names = ", ".join(sorted(unexpected))
        raise ShapeError(f"unexpected input(s): {names}; the diagram takes " + ", ".join(s[0] for s in spec))
    if extra:
        raise ShapeError(
            f"{len(spec) + len(extra)} positional inputs given but the diagram takes {len(spec)}: " + ", ".join(s[0] for s in spec)
        )
    free = {}
    batch, batch_of = (), None  # the batch dims seen so far (broadcast together) and who gave them
    for (name, legs, sizes, kind), x in zip(spec, values):
        if x is None:
            raise ShapeError(f"missing input {name!r} with legs [{', '.join(legs)}]")
        if not isinstance(x, torch.Tensor):
            raise ShapeError(f"input {name!r} must be a tensor, got {type(x).__name__}")
        if x.dim() < len(legs):
            raise ShapeError(
                f"input {name!r} has {x.dim()} dimension(s) but needs at least {len(legs)} for legs [{', '.join(legs)}]"
            )
        floating = x.is_floating_point() or x.is_complex()
        if kind == "int" and (floating or x.dtype == torch.bool):
            raise ShapeError(f"input {name!r} must hold integer ids, got {x.dtype}")
        if kind == "bool" and x.dtype != torch.bool:
            raise ShapeError(f"input {name!r} must be a bool mask, got {x.dtype}")
        if kind == "float" and not floating:
            raise ShapeError(f"input {name!r} must be a floating-point tensor, got {x.dtype}")
        lead = tuple(x.shape[: x.dim() - len(legs)])
        if lead:
            n = max(len(lead), len(batch))
            a, b = (1,) * (n - len(lead)) + lead, (1,) * (n - len(batch)) + batch
            if any(u != v and u != 1 and v != 1 for u, v in zip(a, b)):
                raise ShapeError(
                    f"input {name!r} has batch dims {list(lead)} but input {batch_of!r} has {list(batch)}; they must broadcast"
                )
            batch, batch_of = tuple(v if u == 1 else u for u, v in zip(a, b)), batch_of or name
        shape = x.shape[x.dim() - len(legs):]
        for leg, want, got in zip(legs, sizes, shape):
            if isinstance(want, str):
                if want in free and free[want][0] != got:
                    first, size = free[want][1], free[want][0]
                    raise ShapeError(
                        f"input {name!r} leg {leg!r} has size {got} but input {first!r} gave it size {size}"
                    )
                free.setdefault(want, (got, name))
            elif want != got:
                raise ShapeError(f"input {name!r} leg {leg!r} must have size {want}, got {got}")
    return {k: v[0] for k, v in free.items()}


def _topk_filter(x, k, dim):
    """Keep the k largest entries along dim and zero the rest."""
    values, indices = x.topk(k, dim=dim)
    return torch.zeros_like(x).scatter(dim, indices, values)


def _topk_keep(x, k, dim, fn):
    """fn of the k largest entries of x along dim, zero elsewhere (fn element-wise)."""
    values, indices = x.topk(k, dim=dim)
    return torch.zeros_like(x).scatter(dim, indices, fn(values))


def _topk_mask(x, k, dim):
    """True at the k largest entries along dim."""
    indices = x.topk(k, dim=dim).indices
    return torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter(dim, indices, True)


def _rms_norm(x, weight, eps, dim):
    """RMSNorm over one leg, computed in float32 and cast back."""
    xf = x if x.dtype == torch.float32 else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim, keepdim=True) + eps)
    if weight is not None:
        w = weight if weight.dtype == torch.float32 else weight.float()
        y = y * (w if dim == -1 else w.reshape([1] * (x.dim() + dim) + [-1] + [1] * (-dim - 1)))
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _causal_mask(n_t, n_p, device):
    """True where query t may see key p (p <= t)."""
    key = ("causal", n_t, n_p, device)
    mask = _CONSTANTS.get(key)
    if mask is None:
        t = torch.arange(n_t, device=device)
        p = torch.arange(n_p, device=device)
        mask = _remember(key, p[None, :] <= t[:, None])
    return mask


def _block_causal_mask(n_t, n_p, block, device):
    """True where key p's block is not after query t's block (bidirectional inside a block)."""
    key = ("block_causal", n_t, n_p, block, device)
    mask = _CONSTANTS.get(key)
    if mask is None:
        t = torch.arange(n_t, device=device) // block
        p = torch.arange(n_p, device=device) // block
        mask = _remember(key, p[None, :] <= t[:, None])
    return mask


def _rope(x, pos_dim, dim, base):
    """Rotate-half RoPE in float32: entry i pairs with i + n/2; position p turns it by p * base**(-2i/n)."""
    n, length = x.shape[dim], x.shape[pos_dim]
    transposed = (pos_dim % x.dim()) > (dim % x.dim())
    shape = [1] * x.dim()
    shape[pos_dim], shape[dim] = length, n
    key = ("rope", length, n, base, transposed, tuple(shape), x.device)
    tables = _CONSTANTS.get(key)
    if tables is None:  # cos and sin of every angle, computed once per (length, n, base, layout, device)
        inv_freq = 1.0 / (base ** (torch.arange(0, n, 2, device=x.device, dtype=torch.float32) / n))
        angle = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angle = torch.cat([angle, angle], dim=-1)  # (positions, n)
        angle = (angle.T if transposed else angle).reshape(shape)
        tables = _remember(key, (angle.cos(), angle.sin()))
    cos, sin = tables
    xf = x if x.dtype == torch.float32 else x.float()
    first, second = xf.chunk(2, dim=dim)
    y = xf * cos + torch.cat([-second, first], dim=dim) * sin
    return y if y.dtype == x.dtype else y.to(x.dtype)


_CONSTANTS = {}  # masks and RoPE tables: constants of their sizes, shared by every call


def _remember(key, value):
    # traced values (export's fake tensors) must not outlive the trace, nor inference tensors reach autograd
    if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
        return value
    if len(_CONSTANTS) >= 64:
        _CONSTANTS.clear()
    _CONSTANTS[key] = value
    return value


def _broadcast_lead(parts, n):
    """The broadcast shape of the parts' leading legs, all but their last n (torch.broadcast_shapes is slow)."""
    lead = [1] * (max(x.dim() for x in parts) - n)
    for x in parts:
        for i, m in enumerate(x.shape[: max(x.dim() - n, 0)], len(lead) + n - x.dim()):
            lead[i] = m if m != 1 else lead[i]
    return lead


def _attention(q, k, v, mask, scale, causal):
    """softmax(q kᵀ · scale + mask) v over the last two legs, via scaled_dot_product_attention.
    q, k, v (and a mask with batch legs) carry the same leading legs, or size-1 ones."""
    batch = _broadcast_lead((q, k, v) if mask is None else (q, k, v, mask), 2)
    q = q.expand(*batch, *q.shape[-2:])
    k = k.expand(*batch, *k.shape[-2:])
    v = v.expand(*batch, *v.shape[-2:])
    if len(batch) != 2:  # the fused (flash) kernels take (batch, heads, t, d): fold the rest in
        q, k, v = (x.reshape(1, -1, *x.shape[-2:]) for x in (q, k, v))
        if mask is not None and mask.dim() > 2:
            mask = mask.expand(*batch, *mask.shape[-2:]).reshape(1, -1, *mask.shape[-2:])
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
        return y.reshape(*batch, *y.shape[-2:])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def _gqa_attention(q, k, v, mask, scale, causal):
    """Grouped-query attention: q (..., g·r, t, d), k (..., g, s, d), v (..., g, s, e); query
    head g·r + i reads key/value head g (scaled_dot_product_attention's enable_gqa: no copies of
    k and v). A mask is (t, s) or (..., 1, t, s)."""
    if q.dim() == k.dim() == v.dim() == 4 and q.shape[0] == k.shape[0] == v.shape[0]:  # the kernels' layout
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                                enable_gqa=True)
    lead = _broadcast_lead((q, k, v) if mask is None else (q, k, v, mask), 3)
    q, k, v = (x.expand(*lead, *x.shape[-3:]).reshape(-1, *x.shape[-3:]) for x in (q, k, v))
    if mask is not None and mask.dim() > 3:
        mask = mask.expand(*lead, *mask.shape[-3:]).reshape(-1, *mask.shape[-3:])
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                         enable_gqa=True)
    return y.reshape(*lead, *y.shape[-3:])


def _chain(blocks, x):
    """Feed x through each block in turn (a repeated block)."""
    for block in blocks:
        x = block(x)
    return x
'''


_STANDALONE_ERROR = '''
class ShapeError(ValueError):
    """A runtime input has the wrong name, rank or size."""
'''


def _camel(name: str) -> str:
    parts = re.split(r"[^A-Za-z0-9]+", name)
    text = "".join(p[:1].upper() + p[1:] for p in parts if p)
    if not text or not text[0].isalpha():
        text = "Diagram" + text
    return text


def _statement_comment(st: ir.Assign) -> str:
    """An assignment as the diagram writes it, without its note, for a comment line."""
    return _comment(format_stmt(replace(st, note="")))


def _comment(text: str) -> str:
    """User text made safe for a comment: no line breaks can escape it, no NUL or lone surrogate breaks compile()."""
    text = re.sub(r"[\x00\ud800-\udfff]", "\ufffd", text)
    return re.sub(r"[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]+", " ", text).strip()


class _Emitter:
    """Generates the source of one module class (the diagram or one block)."""

    def __init__(self, c: Checked, class_name: str, block_classes: dict, top: bool, fuse_attention: bool = True):
        self.c = c
        self.S = c.sizes
        self.cls_name = class_name
        self.block_classes = block_classes
        self.top = top
        self.used_free: dict[int, str] = {}
        self.uses_device = False
        self.read = read_counts(c)  # (name, SSA version) -> how often statements and outputs read it
        self.fused = find_attention(c, self.read) if fuse_attention else {}
        self.absorbed = {id(a) for att in self.fused.values() for a in att.absorbed}

    # -- sizes
    def size_code(self, cls: int, span: Span) -> str:
        r = self.S.find(cls)
        if not self.S.is_free(cls):
            v = self.S.size(cls)
            if v is None:
                raise PenroseCompileError(
                    f"leg {self.S.label[r]!r} has no size; pass {self.S.label[r]}=N to compile()", span
                )
            return str(v)
        name = "_" + self.S.label[r]
        self.used_free[r] = name
        return name

    def shape_comment(self, t) -> str:
        parts = ["..."] if t.batched else []
        for leg, c in zip(t.legs, t.cls):
            v = None if self.S.is_free(c) else self.S.size(c)
            parts.append(f"{leg}={v}" if v is not None else leg)
        return "[" + ", ".join(parts) + "]"

    # -- expressions: (code, precedence)
    def expr(self, v: V):
        op = v.op
        if op == "num":
            val = v.attrs["value"]
            if val == math.inf:
                return "torch.inf", _PREC_ATOM
            if val == -math.inf:
                return "-torch.inf", _PREC_UNARY
            code = repr(val)
            return code, (_PREC_UNARY if code.startswith("-") else _PREC_ATOM)
        if op == "dimsize":
            return self.size_code(v.attrs["cls"], v.span), _PREC_ATOM
        if op == "sbin":
            return self.binop_code(v.attrs["op"], v.args[0], v.args[1], None)
        if op == "sfunc":
            a, p = self.expr(v.args[0])
            name = v.attrs["name"]
            if name == "sqrt":
                return f"{self.wrap(a, p, _PREC_POW + 1)} ** 0.5", _PREC_POW
            if name == "abs":
                return f"abs({a})", _PREC_ATOM
            try:
                val = float(a)
            except ValueError:
                raise PenroseCompileError(f"{name} of a size known only at run time; use a tensor", v.span) from None
            return repr(math.exp(val) if name == "exp" else math.log(val)), _PREC_ATOM
        if op == "ref":
            name = v.attrs["name"]
            kind = v.attrs["kind"]
            return (f"self.{name}" if kind in ("param", "buffer") else name), _PREC_ATOM
        if op == "neg":
            a, p = self.expr(v.args[0])
            return "-" + self.wrap(a, p, _PREC_UNARY), _PREC_UNARY
        if op == "binop":
            return self.binop_code(v.attrs["op"], v.args[0], v.args[1], v)
        if op == "unary":
            a, _ = self.expr(v.args[0])
            if v.attrs["name"] == "leaky_relu":
                return f"{_UNARY_CODE['leaky_relu']}({a}, {v.attrs['slope']!r})", _PREC_ATOM
            return f"{_UNARY_CODE[v.attrs['name']]}({a})", _PREC_ATOM
        if op == "einsum":
            return self.einsum_code(v)
        if op in ("softmax", "log_softmax"):
            a, _ = self.expr(v.args[0])
            return f"torch.{op}({a}, dim={self.dim_of(v.args[0], v.attrs['axis'])})", _PREC_ATOM
        if op == "layernorm":
            x = v.args[0]
            a, p = self.expr(x)
            d = self.dim_of(x, v.attrs["axis"])
            n = self.size_code(x.type.cls[v.attrs["axis"]], v.span)
            w = f"self.{v.attrs['weight']}" if v.attrs["weight"] else "None"
            b = f"self.{v.attrs['bias']}" if v.attrs["bias"] else "None"
            if d == -1:
                return f"torch.nn.functional.layer_norm({a}, ({n},), {w}, {b}, {v.attrs['eps']!r})", _PREC_ATOM
            a_moved = f"{self.wrap(a, p, _PREC_ATOM)}.movedim({d}, -1)"
            return f"torch.nn.functional.layer_norm({a_moved}, ({n},), {w}, {b}, {v.attrs['eps']!r}).movedim(-1, {d})", _PREC_ATOM
        if op == "rmsnorm":
            a, _ = self.expr(v.args[0])
            w = f"self.{v.attrs['weight']}" if v.attrs["weight"] else "None"
            return f"_rms_norm({a}, {w}, {v.attrs['eps']!r}, {self.dim_of(v.args[0], v.attrs['axis'])})", _PREC_ATOM
        if op == "topk":
            a, _ = self.expr(v.args[0])
            return f"_topk_filter({a}, {v.attrs['k']}, {self.dim_of(v.args[0], v.attrs['axis'])})", _PREC_ATOM
        if op == "topk_mask":
            a, _ = self.expr(v.args[0])
            return f"_topk_mask({a}, {v.attrs['k']}, {self.dim_of(v.args[0], v.attrs['axis'])})", _PREC_ATOM
        if op == "reduce":
            a, p = self.expr(v.args[0])
            fn = {"sum": "sum", "mean": "mean", "max": "amax"}[v.attrs["name"]]
            return f"{self.wrap(a, p, _PREC_ATOM)}.{fn}({self.dim_of(v.args[0], v.attrs['axis'])})", _PREC_ATOM
        if op == "dropout":
            a, _ = self.expr(v.args[0])
            return f"torch.nn.functional.dropout({a}, {v.attrs['p']!r}, self.training)", _PREC_ATOM
        if op == "detach":
            a, p = self.expr(v.args[0])
            return f"{self.wrap(a, p, _PREC_ATOM)}.detach()", _PREC_ATOM
        if op == "clamp":
            a, p = self.expr(v.args[0])
            args = []
            if v.attrs["min"] is not None:
                args.append(f"min={self.num(v.attrs['min'])}")
            if v.attrs["max"] is not None:
                args.append(f"max={self.num(v.attrs['max'])}")
            return f"{self.wrap(a, p, _PREC_ATOM)}.clamp({', '.join(args)})", _PREC_ATOM
        if op == "where":
            kept = self.topk_keep_code(v)
            if kept is not None:
                return kept, _PREC_ATOM
            parts = [self.aligned(x, al, v) for x, al in zip(v.args, v.attrs["align"])]
            return f"torch.where({', '.join(parts)})", _PREC_ATOM
        if op == "mask":
            self.uses_device = True
            t, p = (self.size_code(c, v.span) for c in v.type.cls)
            if v.attrs["kind"] == "causal":
                return f"_causal_mask({t}, {p}, _device)", _PREC_ATOM
            return f"_block_causal_mask({t}, {p}, {v.attrs['block']}, _device)", _PREC_ATOM
        if op == "gather":
            table, p = self.expr(v.args[0])
            ids, _ = self.expr(v.args[1])
            if len(v.args[0].legs) == 2 and not v.args[0].type.batched:  # rows of a matrix: an embedding
                return f"torch.nn.functional.embedding({ids}, {table})", _PREC_ATOM
            return f"{self.wrap(table, p, _PREC_ATOM)}[{ids}]", _PREC_ATOM
        if op == "split":
            a, _ = self.expr(v.args[0])
            sizes = ", ".join(str(s) for s in v.attrs["sizes"])
            return f"torch.split({a}, [{sizes}], dim={self.dim_of(v.args[0], v.attrs['axis'])})", _PREC_ATOM
        if op == "concat":
            parts = ", ".join(self.expr(x)[0] for x in v.args)
            return f"torch.cat([{parts}], dim={self.dim_of(v, v.attrs['axis'])})", _PREC_ATOM
        if op == "unflatten":
            a, p = self.expr(v.args[0])
            sizes = ", ".join(str(x) for x in v.attrs["sizes"])
            return f"{self.wrap(a, p, _PREC_ATOM)}.unflatten({self.dim_of(v.args[0], v.attrs['axis'])}, ({sizes}))", _PREC_ATOM
        if op == "flatten":
            a, p = self.expr(v.args[0])
            n = len(v.args[0].legs)
            return f"{self.wrap(a, p, _PREC_ATOM)}.flatten({v.attrs['start'] - n}, {v.attrs['end'] - n})", _PREC_ATOM
        if op == "rope":
            a, _ = self.expr(v.args[0])
            x = v.args[0]
            return f"_rope({a}, {self.dim_of(x, v.attrs['pos'])}, {self.dim_of(x, v.attrs['axis'])}, {v.attrs['base']!r})", _PREC_ATOM
        if op == "block":
            args = ", ".join(self.expr(x)[0] for x in v.args)
            inst = v.attrs["instance"]
            if v.attrs["repeat"] is not None:
                return f"_chain(self.{inst}, {args})", _PREC_ATOM
            return f"self.{inst}({args})", _PREC_ATOM
        raise PenroseCompileError(f"cannot compile operation {op!r}", v.span)  # pragma: no cover

    @staticmethod
    def num(x) -> str:
        if x == math.inf:
            return "torch.inf"
        if x == -math.inf:
            return "-torch.inf"
        return repr(x)

    @staticmethod
    def wrap(code: str, prec: int, need: int) -> str:
        return code if prec >= need else f"({code})"

    @staticmethod
    def dim_of(v: V, axis: int) -> int:
        """A leg's dimension counted from the end, so batch legs never shift it."""
        return axis - len(v.legs)

    def binop_code(self, op: str, a: V, b: V, node: V | None):
        if op in ("<", "<=", ">", ">=", "==", "!="):
            prec = _PREC_CMP
        else:
            prec = _BINPREC[op]
        align = node.attrs["align"] if node is not None else (None, None)
        ca, pa = self.expr(a) if align[0] is None else (self.aligned(a, align[0], node), _PREC_ATOM)
        cb, pb = self.expr(b) if align[1] is None else (self.aligned(b, align[1], node), _PREC_ATOM)
        if op == "**":
            left, right = self.wrap(ca, pa, prec + 1), self.wrap(cb, pb, _PREC_UNARY)
        else:
            left, right = self.wrap(ca, pa, prec), self.wrap(cb, pb, prec + 1)
        return f"{left} {op} {right}", prec

    def aligned(self, x: V, align, node: V) -> str:
        """x's code, its legs permuted and unsqueezed to line up with node's legs."""
        code, prec = self.expr(x)
        if align is None or x.type.dtype == "scalar":
            return self.wrap(code, prec, _PREC_ATOM)  # callers treat the result as an atom
        if None not in align and list(align) == list(range(len(x.legs))):
            return self.wrap(code, prec, _PREC_ATOM)
        n = len(x.legs)
        present = [i for i in align if i is not None]
        if present != list(range(n)):
            code, prec = self.wrap(code, prec, _PREC_ATOM) + _reorder(present), _PREC_ATOM
        if None in align:
            idx = ["None" if i is None else ":" for i in align]
            if node is not None and not x.type.batched:  # broadcasting supplies leading axes
                while idx and idx[0] == "None":
                    idx.pop(0)
            if idx.count("None") == 1:  # one new axis: unsqueeze, counted from the end
                code = f"{self.wrap(code, prec, _PREC_ATOM)}.unsqueeze({idx.index('None') - len(idx)})"
            elif "None" in idx:
                # trailing ':' must stay: after '...', x[..., None] would put the new axis last
                code = f"{self.wrap(code, prec, _PREC_ATOM)}[..., {', '.join(idx)}]"
            else:
                code = self.wrap(code, prec, _PREC_ATOM)
        return code

    def arranged(self, x: V, legs: tuple, target: tuple) -> str:
        """x (with `legs`) permuted and unsqueezed so its legs follow `target` (missing ones size 1)."""
        align = tuple(legs.index(l) if l in legs else None for l in target)
        return self.aligned(x, align, None)

    def attention_code(self, att) -> str:
        """One scaled_dot_product_attention call for a recognised attention pattern; grouped-query
        attention (query head legs g, r; keys and values with g only) through _gqa_attention."""
        heads = att.heads
        grouped = (len(heads) == 2 and heads[1] not in att.k_legs + att.v_legs
                   and heads[0] in att.k_legs and heads[0] in att.v_legs)
        if grouped:
            g, r = heads
            q = self.arranged(att.q, att.q_legs, heads + (att.t, att.d)) + ".flatten(-4, -3)"
            k = self.arranged(att.k, att.k_legs, (g, att.s, att.d))
            v = self.arranged(att.v, att.v_legs, (g, att.s, att.e))
        else:
            q = self.arranged(att.q, att.q_legs, heads + (att.t, att.d))
            k = self.arranged(att.k, att.k_legs, heads + (att.s, att.d))
            v = self.arranged(att.v, att.v_legs, heads + (att.s, att.e))
        if att.scale_op == "/":
            sc, p = self.expr(att.scale_value)
            scale = f"1.0 / {self.wrap(sc, p, _PREC_MUL + 1)}"
        elif att.scale_op == "*":
            scale = self.expr(att.scale_value)[0]
        else:
            scale = "1.0"
        causal = "False"
        mask = "None"
        if att.mask_kind == "causal":
            causal = "True"
        elif att.mask is not None:  # legs (t, s); batch legs go in front of the head legs
            mask_heads = heads[:1] if grouped else heads  # one (merged) head axis for the grouped call
            mask = (self.arranged(att.mask, (att.t, att.s), mask_heads + (att.t, att.s)) if att.mask.type.batched
                    else self.expr(att.mask)[0])
        if grouped:
            qv = att.q
            sizes = ", ".join(self.size_code(qv.type.cls[att.q_legs.index(l)], qv.span) for l in heads)
            code = f"_gqa_attention({q}, {k}, {v}, {mask}, {scale}, {causal}).unflatten(-3, ({sizes}))"
        else:
            code = f"_attention({q}, {k}, {v}, {mask}, {scale}, {causal})"
        current = heads + (att.t, att.e)
        if tuple(att.out) != current:
            code += _reorder([current.index(l) for l in att.out])
        return code

    def grouped_matmul_form(self, terms, out, ops, exprs):
        """A product over several legs at once: X[..., a, b, c, d] Y[c, d, e, f] -> [..., a, b, e, f]
        becomes one matrix product of X with its contracted legs flattened and Y flattened to a
        matrix, the result unflattened. Y must be unbatched and both leg groups contiguous."""
        for (xi, yi) in ((0, 1), (1, 0)):
            xt, yt = terms[xi], terms[yi]
            if ops[yi].type.batched or len(set(xt)) != len(xt) or len(set(yt)) != len(yt):
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
            (xc, xp), (yc, yp) = exprs[xi], exprs[yi]
            x_code = _wrap(xc, xp, _PREC_ATOM) + (f".flatten({-n})" if n > 1 else "")
            y_code = _wrap(yc, yp, _PREC_ATOM)
            if n > 1:
                y_code += f".flatten(0, {n - 1})"
            if len(y_free) > 1:
                y_code += ".flatten(1)"
            if len(y_free) == 0 and n > 1:
                y_code = _wrap(yc, yp, _PREC_ATOM) + ".flatten()"
            code = f"{_wrap(x_code, _PREC_ATOM, _PREC_MUL)} @ {_wrap(y_code, _PREC_ATOM, _PREC_MUL + 1)}"
            if len(y_free) > 1:
                cls = ops[yi].type.cls[n:]
                sizes = ", ".join(self.size_code(c, ops[yi].span) for c in cls)
                return f"({code}).unflatten(-1, ({sizes}))", _PREC_ATOM
            return code, _PREC_MUL
        return None

    def einsum_code(self, v: V):
        terms, out = v.attrs["terms"], v.attrs["out"]
        ops = list(v.args)
        exprs = [self.expr(o) for o in ops]
        codes = [c for c, _ in exprs]
        batched = [o.type.batched for o in ops]
        m = letters_for(terms, out)
        if len(ops) == 2:
            mm = _matmul_form(terms, out, batched, exprs)
            if mm is not None:
                return mm, (_PREC_ATOM if mm.startswith("torch.") else _PREC_MUL)
            ps = _product_sum_form(terms, out, exprs)
            if ps is not None:
                return ps, _PREC_ATOM
            gm = self.grouped_matmul_form(terms, out, ops, exprs)
            if gm is not None:
                return gm
        if len(ops) <= 2:
            spec = ",".join(("..." if bt else "") + "".join(m[l] for l in t) for t, bt in zip(terms, batched))
            spec += "->" + ("..." if v.type.batched else "") + "".join(m[l] for l in out)
            return f"torch.einsum({spec!r}, {', '.join(codes)})", _PREC_ATOM
        sizes = {}
        for t, o in zip(terms, ops):
            for l, c in zip(t, o.type.cls):
                sizes[l] = self.S.size(c) or 64
        plan = plan_einsum(terms, out, sizes)
        work = list(zip(codes, batched))
        for step in plan.steps:
            picked = [work.pop(i) for i in step.operands]
            lhs, rhs = step.spec.split("->")
            parts = lhs.split(",")
            any_batch = any(b for _, b in picked)
            spec = ",".join(("..." if b else "") + p for p, (_, b) in zip(parts, picked))
            spec += "->" + ("..." if any_batch else "") + rhs
            work.append((f"torch.einsum({spec!r}, {', '.join(c for c, _ in picked)})", any_batch))
        return work[0][0], _PREC_ATOM

    # -- the class
    def generate(self) -> str:
        c = self.c
        L = []
        L.append(f"class {self.cls_name}(torch.nn.Module):")
        doc = f"Generated by penrose from diagram {c.name!r}" if not c.is_block else f"Block {c.name!r}"
        L.append(f"    {repr(_comment(doc) + '.')}")
        eqs = tuple(_comment(format_stmt(s.stmt)) for s in c.stmts if isinstance(s.stmt, (ir.Assign, ir.Return)))
        L.append(f"    _EQUATIONS = {eqs!r}")
        if self.top and len(c.outputs) > 1:
            names = tuple(n for n, _ in c.outputs)
            L.append(f"    Outputs = collections.namedtuple({self.cls_name + 'Outputs'!r}, {names!r})")
        if self.top:
            spec = []
            for d in c.inputs:
                # a free leg is named (read from the inputs at run time); a fixed one is its size
                sizes = tuple(
                    self.S.label[self.S.find(cl)] if self.S.is_free(cl) else int(self.size_code(cl, d.tensor.span))
                    for cl in d.type.cls
                )
                spec.append((d.tensor.name, tuple(d.tensor.legs), sizes, d.tensor.dtype))
            L.append(f"    _INPUTS = {tuple(spec)!r}")
        L.append("")
        # __init__
        L.append("    def __init__(self):")
        L.append("        super().__init__()")
        for d in c.params + c.buffers:
            shape = ", ".join(self.size_code(cl, d.tensor.span) for cl in d.type.cls)
            empty = f"torch.empty({shape})" if shape else "torch.empty(())"
            comment = f"  # {self.shape_comment(d.type)}"
            if d.tensor.kind == "param":
                L.append(f"        self.{d.tensor.name} = torch.nn.Parameter({empty}){comment}")
            else:
                L.append(f"        self.register_buffer({d.tensor.name!r}, {empty}){comment}")
        for inst in c.instances.values():
            cls_name = self.block_classes[inst.block]
            if inst.repeat is not None:
                L.append(f"        self.{inst.name} = torch.nn.ModuleList([{cls_name}() for _ in range({inst.repeat})])")
            else:
                L.append(f"        self.{inst.name} = {cls_name}()")
        L.append("        self.reset_parameters(recurse=False)  # the blocks initialised themselves")
        L.append("")
        # reset_parameters
        L.append("    def reset_parameters(self, generator=None, recurse=True):")
        L.append('        """Initialise every parameter and buffer as the diagram says (deterministic under a generator)."""')
        body = []
        own = c.params + c.buffers
        if own:
            body.append("        if not any(t.is_meta for t in self.parameters(recurse=False)) and not any(t.is_meta for t in self.buffers(recurse=False)):")
            for d in own:
                body.append("    " + self.init_line(d))
        if c.instances:
            body.append("        if recurse:")
            body.append("            for module in self.children():")
            body.append("                for sub in (module if isinstance(module, torch.nn.ModuleList) else [module]):")
            body.append("                    sub.reset_parameters(generator)")
        if not body:
            body.append("        pass")
        L.extend(body)
        L.append("")
        L.append("    def extra_repr(self):")
        L.append("        return '\\n'.join(self._EQUATIONS)")
        L.append("")
        # forward
        fwd = self.forward_lines()
        L.extend(fwd)
        return "\n".join(L) + "\n"

    def init_line(self, d) -> str:
        t = d.tensor
        target = f"self.{t.name}"
        init = t.init or ir.Init("normal", (("std", ir.Number(0.02)),))
        kw = {k: v.value for k, v in init.kwargs}
        name = init.name
        if name == "normal":
            return f"        torch.nn.init.normal_({target}, mean={float(kw.get('mean', 0.0))!r}, std={float(kw.get('std', 0.02))!r}, generator=generator)"
        if name == "zeros":
            return f"        torch.nn.init.zeros_({target})"
        if name == "ones":
            return f"        torch.nn.init.ones_({target})"
        if name == "constant":
            return f"        torch.nn.init.constant_({target}, {float(kw.get('value', 0.0))!r})"
        if name == "uniform":
            return f"        torch.nn.init.uniform_({target}, {float(kw.get('a', 0.0))!r}, {float(kw.get('b', 1.0))!r}, generator=generator)"
        if name == "eye":
            return f"        torch.nn.init.eye_({target})"
        if name == "xavier":
            sizes = [self.S.size(cl) or 1 for cl in d.type.cls]
            fan_in, fan_out = (sizes[0], sizes[-1]) if sizes else (1, 1)
            bound = float(kw.get("gain", 1.0)) * math.sqrt(6.0 / (fan_in + fan_out))
            return f"        torch.nn.init.uniform_({target}, {-bound!r}, {bound!r}, generator=generator)"
        raise PenroseCompileError(f"unknown init {name!r}", init.span)  # pragma: no cover

    def forward_lines(self) -> list[str]:
        c = self.c
        inputs = [d.tensor.name for d in c.inputs]
        body: list[str] = []
        for s in c.stmts:
            st = s.stmt
            if isinstance(st, ir.Comment):
                text = _comment(st.text)
                if text:
                    body.append(f"        # {text}")
                continue
            if isinstance(st, ir.Assign) and id(s) in self.absorbed:
                body.append(f"        # {_statement_comment(st)}  (fused below)")
                continue
            if isinstance(st, ir.Assign) and s.value.op == "split" and id(s) not in self.fused:
                kept = [i for i, (t, ver) in enumerate(zip(st.targets, s.versions)) if (t, ver) in self.read]
                if len(kept) < len(st.targets):  # pieces nobody reads are not made: narrow the others
                    body.append(f"        # {_statement_comment(st)}")
                    body.extend(self.narrow_lines(s, kept))
                    continue
            if isinstance(st, ir.Assign):
                code = self.attention_code(self.fused[id(s)]) if id(s) in self.fused else self.expr(s.value)[0]
                if len(s.types) == 1:
                    comment = self.shape_comment(s.types[0])
                else:
                    comment = ", ".join(self.shape_comment(t) for t in s.types)
                note = f"  {_comment(st.note)}" if st.note else ""
                body.append(f"        # {_statement_comment(st)}")  # the diagram's statement, above its code
                body.append(f"        {', '.join(st.targets)} = {code}  # {comment}{note}")
            elif isinstance(st, ir.Return):
                codes = [self.expr(v)[0] for v in s.value.args]
                body.append(f"        return {', '.join(codes)}")
            elif isinstance(st, ir.Output):
                pass
        if self.top:
            names = [n for n, _ in c.outputs]
            if len(names) == 1:
                body.append(f"        return {names[0]}")
            else:
                body.append(f"        return self.Outputs({', '.join(names)})")
        head = []
        if self.top:
            sig = ", ".join(f"{n}=None" for n in inputs)
            head.append(f"    def forward(self, {sig}{', ' if sig else ''}*extra, **unexpected):")
            head.append(f"        _sizes = _check_inputs(self._INPUTS, ({''.join(n + ', ' for n in inputs)}), unexpected, extra)")
            for r, name in sorted(self.used_free.items(), key=lambda kv: kv[1]):
                head.append(f"        {name} = _sizes[{self.S.label[r]!r}]")
        else:
            head.append(f"    def forward(self, {', '.join(inputs)}):")
            for r, name in sorted(self.used_free.items(), key=lambda kv: kv[1]):
                src = self.find_binder(r)
                head.append(f"        {name} = {src}")
        if self.uses_device:
            if inputs:
                head.append(f"        _device = {inputs[0]}.device")
            else:
                first = (c.params + c.buffers)
                if not first:
                    raise PenroseCompileError("a mask needs an input or a param to take its device from", Span(c.diagram.file))
                head.append(f"        _device = self.{first[0].tensor.name}.device")
        return head + body

    def topk_keep_code(self, v: V) -> str | None:
        """where(topk_mask(x, l, k=K), f(x), 0), f element-wise (or x itself): only the K kept
        entries are mapped and scattered into zeros; the same values and gradients as the where."""
        cond, a, b = v.args
        if cond.op != "topk_mask" or b.op != "num" or b.attrs["value"] != 0:
            return None
        x = cond.args[0]
        if x.op != "ref" or x.type.dtype == "bool" or cond.legs != v.legs or a.legs != v.legs:
            return None
        if any(al is not None and list(al) != list(range(len(v.legs))) for al in v.attrs["align"][:2]):
            return None

        def same(y):
            return y.op == "ref" and all(y.attrs.get(k) == x.attrs.get(k) for k in ("name", "kind", "version"))

        if same(a):
            fn = None
        elif a.op == "unary" and same(a.args[0]) and a.attrs["name"] != "leaky_relu":
            fn = _UNARY_CODE[a.attrs["name"]]
        else:
            return None
        code, _ = self.expr(x)
        dim = self.dim_of(x, cond.attrs["axis"])
        if fn is None:
            return f"_topk_filter({code}, {cond.attrs['k']}, {dim})"
        return f"_topk_keep({code}, {cond.attrs['k']}, {dim}, {fn})"

    def narrow_lines(self, s, kept: list[int]) -> list[str]:
        """The read pieces of a split, each as a narrow (a view) of the split tensor."""
        v = s.value
        a, p = self.expr(v.args[0])
        dim = self.dim_of(v.args[0], v.attrs["axis"])
        starts = [sum(v.attrs["sizes"][:i]) for i in range(len(v.attrs["sizes"]))]
        x = v.args[0]
        lines = []
        if len(kept) > 1 and x.op != "ref":  # computed once, however many pieces are read
            lines.append(f"        _split = {a}")
            a, p = "_split", _PREC_ATOM
        for i in kept:
            start, size = starts[i], v.attrs["sizes"][i]
            if not x.type.batched and dim == -len(x.legs):  # the first axis: a plain slice
                piece = f"{self.wrap(a, p, _PREC_ATOM)}[{start or ''}:{start + size}]"
            else:
                piece = f"{self.wrap(a, p, _PREC_ATOM)}.narrow({dim}, {start}, {size})"
            lines.append(f"        {s.stmt.targets[i]} = {piece}  # {self.shape_comment(s.types[i])}")
        return lines

    def find_binder(self, root: int) -> str:
        for d in self.c.inputs:
            for j, cl in enumerate(d.type.cls):
                if self.S.find(cl) == root:
                    return f"{d.tensor.name}.shape[{j - len(d.type.cls)}]"
        raise PenroseCompileError(
            f"block {self.c.name!r} uses leg {self.S.label[root]!r}, whose size is known only at run time, "
            "but none of its arguments carries it",
            Span(self.c.diagram.file),
        )


def _reorder(order: list[int]) -> str:
    """The method call that puts axis order[j] of the last len(order) axes at position j: one
    transpose for a swap, a one-axis movedim for a single move, else a movedim of all of them."""
    n = len(order)
    moved = [j for j in range(n) if order[j] != j]
    if len(moved) == 2 and order[moved[0]] == moved[1]:
        return f".transpose({moved[0] - n}, {moved[1] - n})"
    for i in range(n):  # axis i moved to position j, the others keeping their order
        rest = [a for a in range(n) if a != i]
        for j in range(n):
            if rest[:j] + [i] + rest[j:] == order:
                return f".movedim({i - n}, {j - n})"
    return f".movedim({tuple(i - n for i in order)}, {tuple(j - n for j in range(n))})"


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
    for (xt, xb, (xc, xp)), (yt, yb, (yc, yp)) in (
        ((ta, batched[0], exprs[0]), (tb, batched[1], exprs[1])),
        ((tb, batched[1], exprs[1]), (ta, batched[0], exprs[0])),
    ):
        # Y: (c,) or (c, n) / (n, c); X: (..., c) or (c, m) when X has two legs
        if len(yt) == 1:
            if yb:
                continue
            y_code, y_free = _wrap(yc, yp, _PREC_MUL + 1), ()
        elif len(yt) == 2:
            if yb and len(xt) != 2:
                continue
            y_free = tuple(l for l in yt if l != c)
            y_code = _wrap(yc, yp, _PREC_MUL + 1) if yt[0] == c else _wrap(yc, yp, _PREC_ATOM) + ".mT"
        else:
            continue
        if xt[-1] == c:
            x_code, x_free = _wrap(xc, xp, _PREC_MUL), xt[:-1]
        elif len(xt) == 2 and xt[0] == c:
            x_code, x_free = _wrap(xc, xp, _PREC_ATOM) + ".mT", xt[1:]
        else:
            continue
        if len(xt) == 1 and xb and (yb or len(yt) == 1):
            continue
        if not xb and yb and len(xt) > 2:
            continue
        if tuple(x_free) + tuple(y_free) != tuple(out):
            continue
        if len(yt) == 2 and not yb and yt[1] == c and xt[-1] == c:  # X Wᵀ with a weight matrix W (n, c)
            return f"torch.nn.functional.linear({xc}, {yc})"
        return f"{x_code} @ {y_code}"
    return None


def _product_sum_form(terms, out, exprs):
    """`(a * b).sum(dims)` when both operands carry the same legs in the same order and the
    output keeps some of them in that order (einsum('fpk,fpk->pk', A, B)): torch.einsum would
    route this through a batched matmul with copies."""
    (ta, tb) = terms
    if ta != tb or len(set(ta)) != len(ta) or not ta:
        return None
    kept = [l for l in ta if l in out]
    if tuple(kept) != tuple(out):
        return None
    (ca, pa), (cb, pb) = exprs
    prod = f"{_wrap(ca, pa, _PREC_MUL)} * {_wrap(cb, pb, _PREC_MUL + 1)}"
    summed = tuple(i - len(ta) for i, l in enumerate(ta) if l not in out)
    if not summed:
        return f"({prod})"
    dims = summed[0] if len(summed) == 1 else summed
    return f"({prod}).sum({dims})"


def _wrap(code: str, prec: int, need: int) -> str:
    return code if prec >= need else f"({code})"


def generate_source(checked: Checked, standalone: bool = True, fuse_attention: bool = True) -> str:
    """The Python source of the module for a checked diagram (imports only torch).

    `fuse_attention` lowers recognised attention (scores, mask, softmax, convex combination) to
    one scaled_dot_product_attention call; the function computed is the same.
    """
    classes = {}
    for name in checked.blocks:
        classes[name] = _camel(name) + "Block"
    top_name = _camel(checked.name)
    if top_name in classes.values():
        top_name += "Model"
    parts = []
    for name, blk in checked.blocks.items():
        if _block_used(checked, name):
            parts.append(_Emitter(blk, classes[name], classes, top=False, fuse_attention=fuse_attention).generate())
    parts.append(_Emitter(checked, top_name, classes, top=True, fuse_attention=fuse_attention).generate())
    # the file name goes inside a docstring: no backslash escapes, no closing quotes
    shown = _comment(os.path.basename(checked.diagram.file)).replace("\\", "/").replace('"', "'")
    header = [
        f'"""Generated by penrose from {shown}: edit the diagram, not this file."""',
        "",
        "import collections",
        "",
        "import torch",
        "",
    ]
    if standalone:
        header.append(_STANDALONE_ERROR.strip("\n"))
        header.append("")
    source = "\n".join(header) + HELPERS + "\n\n" + "\n\n".join(parts)
    source += f"\n\nModel = {top_name}\n"
    return source


def _block_used(checked: Checked, name: str) -> bool:
    seen = set()

    def visit(c: Checked):
        for inst in c.instances.values():
            if inst.block not in seen:
                seen.add(inst.block)
                visit(checked.blocks[inst.block])

    visit(checked)
    return name in seen


_COUNTER = [0]


def build(checked: Checked, seed: int | None = None, fuse_attention: bool = True) -> torch.nn.Module:
    """Instantiate the module of a checked diagram; `seed` makes initialisation deterministic."""
    source = generate_source(checked, standalone=False, fuse_attention=fuse_attention)
    _COUNTER[0] += 1
    filename = f"<penrose:{_comment(checked.diagram.file)}#{_COUNTER[0]}>"
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": f"penrose_generated_{_COUNTER[0]}", "ShapeError": PenroseShapeError}
    exec(code, namespace)  # the source is generated from validated identifiers only
    module = namespace["Model"]()
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        if not any(p.is_meta for p in module.parameters()):
            module.reset_parameters(g)
    module.penrose_source = source
    module.penrose_checked = checked
    module._repr_svg_ = functools.partial(_repr_svg, checked)  # the figure, in notebooks
    return module


def _repr_svg(checked):
    from penrose.render import repr_svg

    return repr_svg(checked)


def load(path_or_text, **sizes) -> Checked:
    """Parse and check a file path or `.pen` text."""
    if isinstance(path_or_text, ir.Diagram):
        return check(path_or_text, **sizes)
    if isinstance(path_or_text, os.PathLike) or (
        isinstance(path_or_text, str) and "\n" not in path_or_text and path_or_text.endswith(".pen")
    ):
        return check(parse_file(path_or_text), **sizes)
    return check(parse(path_or_text), **sizes)


def compile_diagram(path_or_text, *, seed: int | None = None, fuse_attention: bool = True, **sizes) -> torch.nn.Module:
    """`.pen` file or text → `nn.Module`; `sizes` override dim defaults.

    >>> m = compile_diagram("dim e = 2\\ninput x[e]\\ny = sigmoid(x)\\noutput y")
    >>> m(torch.zeros(2)).tolist()
    [0.5, 0.5]
    """
    return build(load(path_or_text, **sizes), seed=seed, fuse_attention=fuse_attention)


def write_source(path_or_text, out_path, **sizes) -> str:
    """Write the standalone module source to `out_path` atomically; returns the source."""
    source = generate_source(load(path_or_text, **sizes), standalone=True)
    from penrose.io import atomic_write_text

    atomic_write_text(out_path, source)
    return source
