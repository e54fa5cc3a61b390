"""A generated backward: the gradient of a diagram's parameters, planned once from its operations.

    plan = GradientPlan(module)                    # a compiled diagram (penrose.compile, or a zoo model's .diagram)
    tape = plan.forward(x=x, c_true=c, do=do)      # the outputs, and every value the backward reads
    tape.outputs                                   # one tensor per output, in the diagram's order
    grads = tape.backward({"y": dy, "c_logit": dc})   # {param name: d loss / d param}
    step = plan.training_step({"y": seed_y})       # forward, seeds, backward, grads added: one function
    GradientPlan(module, constants={"do": mask})   # inputs fixed when planning (a where folded with them)

Eager autograd records a node for every operation and walks them in its engine; for the small
models of the zoo that bookkeeping, not arithmetic, is most of a training step. Here the diagram
is read once: each operation becomes one forward step and, for each operand that leads to a
trainable parameter, one vector-Jacobian product, each a few torch calls chosen when planning
(a two-operand contraction a matrix product, a sigmoid's derivative y(1 − y) from its output).
The steps are then written out once as two straight-line Python functions, the forward and (per
set of outputs given a gradient) the backward, built as a tree from slot numbers alone (no name
of the diagram, `penrose.pyast`); running the plan is calling them under `torch.no_grad()`: no
graph is recorded, no loop over steps runs, and nothing reads text at run time. A training step
(`training_step`) is one such function from the inputs to the gradients added to the params'
tensors. The commonest rules (a contraction that is one matrix product of views, a linear layer
among them, and its vjps; a bias's gradient; an operator on operands that line up) are written
out there as torch calls with their general function as the fallback (`_inlined`).

Covered: the element-wise functions whose row of `penrose.ops` has a derivative (`vjp`), the
operators + − * / ** (a tensor exponent too) and neg, comparisons and // (no gradient), einsum
(diagonals of repeated labels included), where, clamp, sum, mean, max and min (over a leg, of
two operands, or clamping by a number; ties share the gradient as autograd's), softmax,
log_softmax, layernorm, rmsnorm, rope, topk, topk_mask, gather, select, slice, split (one slot
per piece), concat, flatten, unflatten, rearrange / reduce / repeat (the compiled module's steps,
each with its vjp), causal and block_causal masks and arange (constants), detach, dropout in eval mode (the mode read
when planning, `training=`; or p = 0), blocks (inlined, several returns included) and plain
numbers the checker folded. A diagram with anything else raises `NoGeneratedBackward` naming
the operation and its line: dropout in training (its random mask is drawn when the module
runs), a size only the inputs give where a block needs it (a mask in a block) or a number folded
from one; callers fall back to autograd (`penrose_zoo` does, and says so). The plan is only as
good as its rules: the tests compare its outputs with the compiled module's and its gradients
with autograd's, on every zoo diagram it covers and on generated diagrams.
"""

from __future__ import annotations

import contextlib
import linecache
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from penrose import ops
from penrose import pyast as P
from penrose import runtime as _runtime
from penrose.attrs import (Aligned, Axis, BinOp, BlockCall, Clamp, Dropout, Einop, Einsum, Flatten, LayerNorm, Mask, Ref, RMSNorm,
                           Rope, Select, Slice, Split, TopK, Unary, Unflatten)
from penrose.checked import Checked, V, fixed
from penrose.compiler import gather_label
from penrose.errors import PenroseError
from penrose.interpreter import _unread_splits
from penrose.interpreter import aligner as _aligner
from penrose.tables import unquote

__all__ = ["KERNELS", "GradientPlan", "NoGeneratedBackward", "Tape", "TrainingStep"]


class NoGeneratedBackward(PenroseError):
    """The diagram holds an operation the generated backward has no rule for (autograd has)."""


_A = torch.ops.aten  # the backward kernels autograd itself calls: its numbers, one operation each


class KERNELS:
    """The primitives of the element-wise rows' derivatives (`penrose.ops.Op.vjp`) on tensors:
    torch's own backward kernels by their ATen name, the ones autograd itself calls (its numbers,
    one operation each), and where.

    >>> x = torch.tensor([0.0, 1.0])
    >>> torch.allclose(ops.OPS["tanh"].vjp(torch.ones(2), x, torch.tanh(x), KERNELS), 1 - torch.tanh(x) ** 2)
    True
    """

    where = staticmethod(torch.where)

    @staticmethod
    def kernel(name: str, *args: Any) -> torch.Tensor:
        return getattr(_A, name).default(*args)


def _arithmetic(op: str, swapped: bool = False) -> Callable[[_Tree, Any], _Tree]:
    """The method of _Tree for operator `op` (`swapped`: the reflected one, other op self)."""

    def method(self: _Tree, other: Any) -> _Tree:
        a, b = (_node(other), self.node) if swapped else (self.node, _node(other))
        return _Tree(P.compare(op, a, b) if op in P.CMPOPS else P.binop(op, a, b))

    return method


class _Tree:
    """An expression tree (penrose.pyast) with Python's arithmetic: a row's derivative computed
    on these (with `_WRITTEN`) is the expression the written-out backward holds."""

    __slots__ = ("node",)

    def __init__(self, node: Any):
        self.node = node

    __add__, __radd__ = _arithmetic("+"), _arithmetic("+", True)
    __sub__, __rsub__ = _arithmetic("-"), _arithmetic("-", True)
    __mul__, __rmul__ = _arithmetic("*"), _arithmetic("*", True)
    __truediv__, __rtruediv__ = _arithmetic("/"), _arithmetic("/", True)
    __gt__, __ge__, __lt__, __le__ = _arithmetic(">"), _arithmetic(">="), _arithmetic("<"), _arithmetic("<=")

    def __neg__(self) -> _Tree:
        return _Tree(P.neg(self.node))


def _node(x: Any) -> Any:
    return x.node if isinstance(x, _Tree) else P.const(x)


class _WRITTEN:
    """KERNELS as trees: what the written-out functions call (`torch` is the module there)."""

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> _Tree:
        return _Tree(P.call(P.path("torch.where"), _node(cond), _node(a), _node(b)))

    @staticmethod
    def kernel(name: str, *args: Any) -> _Tree:
        return _Tree(P.call(P.path(f"torch.ops.aten.{name}.default"), *map(_node, args)))


def _callable(dotted: str) -> Callable[..., torch.Tensor]:
    """The torch function a row names (its dotted name, `Op.torch`), by attribute lookup."""
    parts = dotted.split(".")
    if parts[0] != "torch":  # pragma: no cover - every row names a torch function
        raise ValueError(dotted)
    fn: Any = torch
    for p in parts[1:]:
        fn = getattr(fn, p)
    return fn


# ---- legs: every value is a tensor [batch..., legs...] (batch dims only where `batched`) ----


def _unaligner(x: V, align: tuple[int | None, ...] | None) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """The inverse for gradients: a result-shaped gradient summed over the legs (and batch dims)
    `x` lacks, put back in x's leg order, at x's shape."""
    n_out = len(align) if align is not None else 0
    absent = [j - n_out for j, i in enumerate(align or ()) if i is None]
    present = [i for i in (align or ()) if i is not None]
    inverse = [present.index(i) for i in range(len(present))] if present != sorted(present) else None

    if not absent and inverse is None:
        return _fitted

    def unaligned(g: torch.Tensor, value: Any) -> torch.Tensor:
        if absent:
            g = g.sum(absent)
        if inverse is not None:
            lead = g.dim() - len(present)
            g = g.permute(*range(lead), *(lead + i for i in inverse))
        return _fitted(g, value)

    return unaligned


def _inlined(fn: Callable[..., Any], template: Callable[..., Any]) -> Callable[..., Any]:
    """fn, carrying the expression the written-out functions put in place of calling it:
    template(call, *args) -> a tree (penrose.pyast), `args` the trees of fn's arguments and
    `call` the call of fn itself, which the expression keeps for the cases its fast path does
    not cover (a batch of another rank); `torch` is the module there."""
    fn.inline = template  # type: ignore[attr-defined]
    return fn


def _fitted(g: torch.Tensor, value: Any) -> torch.Tensor:
    """g at the shape of `value` (summed over the batch dims it broadcast along)."""
    shape = value.shape
    if g.shape == shape:
        return g
    lead = g.dim() - len(shape)
    if lead > 0 and g.shape[lead:] == shape:  # a bias's gradient: a plain sum over the leading dims (sum_to_size's, cheaper)
        return g.sum(0) if lead == 1 else g.sum(tuple(range(lead)))
    return g.sum_to_size(shape)


# ---- contractions as matrix products -----------------------------------------------------------


def _contraction(terms: tuple[tuple[str, ...], ...], out: tuple[str, ...], batched: tuple[bool, ...],
                 keep_batch: bool, matmul: bool = True) -> Callable[..., torch.Tensor]:
    """A function of the operands computing the einsum `terms -> out` ('...' leading on the
    batched operands, and in the result when `keep_batch`): two operands without repeated labels
    as one (broadcasting) matrix product, anything else (or where not `matmul`) through torch.einsum."""
    if matmul and len(terms) == 2 and all(len(set(t)) == len(t) for t in terms) and len(set(out)) == len(out):
        fn = _as_matmul(terms[0], terms[1], out, batched[0], batched[1], keep_batch)
        if fn is not None:
            return fn
    labels = list(dict.fromkeys([lab for t in terms for lab in t] + list(out)))
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    if len(labels) > len(letters):
        raise NoGeneratedBackward(f"an einsum of {len(labels)} distinct labels")
    letter = dict(zip(labels, letters))
    spec = ",".join(("..." if b else "") + "".join(letter[lab] for lab in t) for t, b in zip(terms, batched))
    spec += "->" + ("..." if keep_batch else "") + "".join(letter[lab] for lab in out)
    return lambda *xs: torch.einsum(spec, *xs)


def _as_matmul(a: tuple[str, ...], b: tuple[str, ...], out: tuple[str, ...], ba: bool, bb: bool,
               keep: bool) -> Callable[..., torch.Tensor] | None:
    """a ⋅ b -> out as torch.matmul: [..., L, P, C] @ [..., L, C, Q] -> [..., L, P, Q], with L
    the labels of both operands and the result, C those summed between them, P and Q the
    result's from one side; labels only one operand has and the result lacks are summed first.
    A batch summed over two batched operands joins C. The operands swap where that spares the
    result a permutation. None where that does not fit."""
    sa, sb, so = set(a), set(b), set(out)
    if not so <= sa | sb:
        return None
    L = [lab for lab in out if lab in sa and lab in sb]
    P = [lab for lab in out if lab in sa and lab not in sb]
    Q = [lab for lab in out if lab in sb and lab not in sa]
    if L + Q + P == list(out) and L + P + Q != list(out):
        swapped = _as_matmul(b, a, out, bb, ba, keep)
        return None if swapped is None else (lambda x, y: swapped(y, x))
    C = [lab for lab in a if lab in sb and lab not in so]
    a_only = [lab for lab in a if lab not in sb and lab not in so]
    b_only = [lab for lab in b if lab not in sa and lab not in so]
    batch_summed = (ba or bb) and not keep
    join_batch = batch_summed and ba and bb  # the batch contracts between the operands
    if join_batch and L:
        return None  # (a batched L under a summed batch: torch.einsum)
    shape_a = _side(a, L + P + C, a_only, ba, batch_summed and ba and not bb)
    shape_b = _side(b, L + C + Q, b_only, bb, batch_summed and bb and not ba)
    nL, nP, nC, nQ = len(L), len(P), len(C), len(Q)
    result = L + P + Q
    perm_out = [result.index(lab) for lab in out]
    identity_out = perm_out == list(range(len(out)))

    if join_batch:
        def contract_batch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            """[batch..., P, C] ⋅ [batch..., C, Q]: the batch flattened into the sum."""
            x, la = shape_a(x)
            y, lb = shape_b(y)
            if x.shape[:la] != y.shape[:lb]:
                bx = torch.broadcast_shapes(x.shape[:la], y.shape[:lb])
                x, y = x.expand(*bx, *x.shape[la:]), y.expand(*bx, *y.shape[lb:])
                la = lb = len(bx)
            sp, sq = x.shape[la:la + nP], y.shape[lb + nC:]
            if nC == 0:  # x^T y over the flattened batch
                xm = x if x.dim() == 2 and nP == 1 else x.reshape(-1, math.prod(sp))
                ym = y if y.dim() == 2 and nQ == 1 else y.reshape(-1, math.prod(sq))
                r = torch.mm(xm.t(), ym)
            else:
                sc = x.shape[la + nP:]
                xm = x.reshape(-1, math.prod(sp), math.prod(sc)).transpose(0, 1).reshape(math.prod(sp), -1)
                r = xm @ y.reshape(-1, math.prod(sq))
            if nP != 1 or nQ != 1:
                r = r.reshape((*sp, *sq))
            return r if identity_out else r.permute(*perm_out)

        return contract_batch

    def contract(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, la = shape_a(x)
        y, lb = shape_b(y)
        if nP == 0 and nL == 0 and lb == 0 and nC >= 1:
            # [..., C] @ [C, Q]: a vector-matrix product, broadcast over the batch
            sq = y.shape[nC:]
            if nC != 1:
                x = x.reshape(*x.shape[:la], -1)
            if nC != 1 or nQ != 1:
                y = y.reshape(x.shape[-1], -1) if nQ else y.reshape(-1)
            r = torch.mm(x, y) if x.dim() == 2 and y.dim() == 2 else x @ y
            if nQ > 1:
                r = r.reshape(*r.shape[:-1], *sq)
        elif nQ == 0 and nC == 1 and nL == 0 and nP == 1 and lb == 0:
            r = x @ y  # [..., P, C] @ [..., C]
        else:
            sl = x.shape[la:la + nL]
            sp = x.shape[la + nL:la + nL + nP]
            sc = x.shape[la + nL + nP:]
            sq = y.shape[lb + nL + nC:]
            if nP != 1 or nC != 1:
                x = x.reshape(*x.shape[:la], *sl, math.prod(sp), math.prod(sc))
            if nC != 1 or nQ != 1:
                y = y.reshape(*y.shape[:lb], *sl, math.prod(sc), math.prod(sq))
            r = x @ y
            if nP != 1 or nQ != 1:
                r = r.reshape((*r.shape[: r.dim() - 2], *sp, *sq))
        if identity_out:
            return r
        lead = r.dim() - len(out)
        return r.permute(*range(lead), *(lead + i for i in perm_out))

    return contract


def _side(term: tuple[str, ...], order_labels: list[str], only: list[str], batched: bool,
          sum_batch: bool) -> Callable[[torch.Tensor], tuple[torch.Tensor, int]]:
    """How to bring one operand to [batch..., *order_labels] (labels in `only` summed away, the
    batch summed where `sum_batch`): a function returning it and its number of batch dims."""
    n = len(term)
    if not only:
        order = [term.index(lab) for lab in order_labels]
        same = order == list(range(n))
        if same and not batched:
            return lambda x: (x, 0)
        if same and not sum_batch:
            return lambda x: (x, x.dim() - n)

        def permuted(x: torch.Tensor) -> tuple[torch.Tensor, int]:
            lead = x.dim() - n if batched else 0
            if sum_batch and lead:
                x, lead = x.sum(list(range(lead))), 0
            if not same:
                x = x.permute(*range(lead), *(lead + i for i in order))
            return x, lead

        return permuted
    kept = [lab for lab in term if lab not in only]
    summed = [term.index(lab) - n for lab in only]
    inner = _side(tuple(kept), order_labels, [], batched, sum_batch)

    def reduced(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return inner(x.sum(summed))

    return inner if not summed else reduced


class _No:
    """A rule's word that it has no gradient for an operand (planning refuses only where one is needed)."""

    def __init__(self, what: str) -> None:
        self.what = what


# ---- the plan ----------------------------------------------------------------------------------


class _Step:
    """One operation: its slot, its operands' slots, the forward function and one
    vector-Jacobian product per operand (None: no gradient flows there)."""

    __slots__ = ("out", "args", "fn", "pairs")

    def __init__(self, out: int, args: tuple[int, ...], fn: Callable[..., Any], vjps: tuple[Callable[..., Any] | None, ...]):
        self.out, self.args, self.fn = out, args, fn
        self.pairs = tuple((a, g) for a, g in zip(args, vjps) if g is not None)  # the operands a gradient flows to


class GradientPlan:
    """The forward steps and vector-Jacobian products of a compiled diagram, planned once for
    the parameters that require a gradient now (plan again after freezing or unfreezing)."""

    def __init__(self, module: torch.nn.Module, checked: Checked | None = None, *, training: bool | None = None,
                 constants: Mapping[str, torch.Tensor] | None = None) -> None:
        checked = checked if checked is not None else getattr(module, "penrose_checked", None)
        if not isinstance(checked, Checked):
            raise TypeError("GradientPlan needs a module compiled by penrose (it carries `penrose_checked`)")
        self.module = module
        self.checked = checked
        self.training = module.training if training is None else training  # dropout's mode, read now
        self._n = 0
        self._constants: dict[int, Any] = {}
        self._steps: list[_Step] = []
        self._fused: dict[int, tuple[int, tuple[int, ...], Callable[..., Any]]] = {}  # product slot -> (sum slot, operands, fn)
        self._inputs: list[tuple[str, int]] = []
        self._tensors: dict[str, int] = {}  # param and buffer state-dict name -> slot
        self._reads: list[tuple[int, Any, str]] = []  # (slot, the owner's dict of params or buffers, key) of each
        self._grad: set[int] = set()  # slots whose gradient the backward computes
        self.params: dict[str, int] = {}  # trainable param name -> slot
        env: dict[tuple[str, int], int] = {}
        fixed_inputs = _fixed_inputs(checked, constants or {})
        self.constant_inputs = tuple(fixed_inputs)  # inputs fixed when planning (not given to forward)
        self._fixed: dict[str, int] = {}  # their slots
        for d in checked.inputs:
            name = d.tensor.name
            if name in fixed_inputs:
                env[(name, 0)] = self._fixed[name] = self._constant(fixed_inputs[name])
                continue
            slot = self._slot()
            self._inputs.append((name, slot))
            env[(name, 0)] = slot
        self.outputs: list[tuple[str, int]] = self._statements(checked, "", env)[0]
        for name, p in module.named_parameters():  # a param nothing reads: a slot no gradient reaches (None)
            if p.requires_grad and name not in self.params:
                self.params[name] = self._slot()
        self.output_names = tuple(n for n, _ in self.outputs)
        self._output_slots = dict(self.outputs)
        # the forward: (slot, second slot or -1, fn, operand slots); a fused x W + b writes its
        # value to both the sum's slot and the product's (whose backward reads only its shape)
        sums = {out: (product, operands, fn) for product, (out, operands, fn) in self._fused.items()}
        self._forward: list[tuple[int, int, Callable[..., Any], tuple[int, ...]]] = []
        for step in self._steps:
            if step.out in self._fused:
                continue
            if step.out in sums:
                product, operands, fn = sums[step.out]
                self._forward.append((step.out, product, fn, operands))
            else:
                self._forward.append((step.out, -1, step.fn, step.args))
        self._backward_steps = [s for s in reversed(self._steps) if s.out in self._grad]
        self._run_forward = _emit_forward(self)
        self._run_backward: dict[tuple[int, ...], Callable[..., tuple]] = {}  # per seeded slots, made on first use

    def _slot(self) -> int:
        self._n += 1
        return self._n - 1

    def _constant(self, value: Any) -> int:
        slot = self._slot()
        self._constants[slot] = value
        return slot

    def _tensor(self, name: str, kind: str, prefix: str) -> int:
        key = ".".join(unquote(part) for part in (prefix + name).split("."))  # the state-dict name
        if key in self._tensors:
            return self._tensors[key]
        slot = self._tensors[key] = self._slot()
        owner, _, attr = key.rpartition(".")
        holder = self.module.get_submodule(owner) if owner else self.module
        # read from the module's own dict of params (or buffers) at each run: what it holds then
        store = next((d for d in (holder._parameters, holder._buffers) if attr in d), None)
        if store is None:  # pragma: no cover - the compiled module registers every param and buffer
            raise NoGeneratedBackward(f"{key} is neither a parameter nor a buffer of the module")
        self._reads.append((slot, store, attr))
        if kind == "param":
            p = self.module.get_parameter(key)
            if p.requires_grad:
                self.params[key] = slot
                self._grad.add(slot)
        return slot

    def _value(self, v: V, env: dict, body: Checked, prefix: str) -> int:
        """The slot holding v, its steps planned (operands first); `body` is the diagram or the
        block being read, `prefix` the state-dict path of its instance."""
        if v.const is not None:
            known = fixed(v, body.sizes)
            if known is None:
                raise NoGeneratedBackward(f"a number read from the inputs' sizes ({v.key or v.op})", v.span)
            return self._constant(known)
        if v.op == "ref":
            ref = v.of(Ref)
            if ref.kind in ("param", "buffer"):
                return self._tensor(ref.name, ref.kind, prefix)
            return env[(ref.name, ref.version)]
        if v.op == "block":
            return self._block(v, env, body, prefix)
        rule = _RULES.get(v.key or v.op)
        if rule is None:
            raise NoGeneratedBackward(f"{v.key or v.op} has no generated backward (autograd differentiates it)", v.span)
        args = tuple(self._value(a, env, body, prefix) for a in v.args)
        if v.key == "where":
            chosen = self._folded_where(v, args)
            if chosen is not None:
                return chosen
        args += self._extras(v, body, prefix)
        fn, rules = rule.plan(v, _Reads(v, body, self.training, self.checked)) if isinstance(rule, _Reading) else rule(v)
        out = self._add(v, args, fn, rules, v.type.dtype == "float")
        blocks = _bias_added(v)
        if blocks is not None:  # x W + b as one step (mm, then add_): the product's step computes nothing on its own
            product = next(s for s in self._steps if s.out == args[0])
            self._fused[product.out] = (out, product.args + args[1:], _with_bias(blocks, product.fn))
        return out

    def _folded_where(self, v: V, args: tuple[int, ...]) -> int | None:
        """where(m, a, b) whose mask and unchosen branch are constants (inputs fixed when
        planning): the chosen branch's slot itself (no step, and a gradient passed through), where
        the result is exactly it: a mask all True (or all False), the chosen branch lined up with
        the result and floating, the constants without batch dims and of its dtype."""
        m, a, b = args
        mask, align = self._constants.get(m), v.of(Aligned).alignment
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.numel() == 0:
            return None
        first = bool(mask.reshape(-1)[0])
        if not bool((mask == first).all()):
            return None
        i = 1 if first else 2
        chosen, other = (a, b) if first else (b, a)
        unchosen = self._constants.get(other)
        legs = len(v.type.legs)
        reference = next((t for t in [*self.module.parameters(), *self.module.buffers()] if t.is_floating_point()), None)
        if (v.type.dtype != "float" or v.args[i].type.dtype != "float" or _aligner(v.args[i], align[i]) is not None
                or not isinstance(unchosen, torch.Tensor) or reference is None or unchosen.dtype != reference.dtype
                or unchosen.dim() > legs or mask.dim() > legs):
            return None
        return chosen

    def _extras(self, v: V, body: Checked, prefix: str) -> tuple[int, ...]:
        """The slots a step reads beyond its value's operands: the params a norm names, and the
        tensor whose device (a mask's) or dtype (a where of two numbers) the compiled module takes."""
        if v.key in ("layernorm", "rmsnorm"):
            return tuple(self._tensor(name, body.decls[name].tensor.kind, prefix) for name in _weights(v))
        if v.key == "arange":  # the inputs (the sizes they carry), then the tensor whose float dtype the module takes
            return (*(slot for _, slot in self._inputs), self._reference(floating=True))
        if v.key in ("causal", "block_causal"):  # the inputs: the first's device, sizes they carry
            return tuple(slot for _, slot in self._inputs) or (self._reference(floating=False),)
        if v.key == "where" and all(x.type.dtype == "scalar" for x in v.args[1:]):
            return (self._reference(floating=True),)
        return ()

    def _reference(self, floating: bool) -> int:
        """The slot of the tensor the compiled module reads the device (or the float dtype) from:
        its first (float) input, else its first param or buffer, else None (torch's defaults)."""
        for (_, slot), d in zip(self._inputs, self.checked.inputs):
            if not floating or d.tensor.dtype == "float":
                return slot
        own = self.checked.params + self.checked.buffers
        if own:
            return self._tensor(own[0].tensor.name, own[0].tensor.kind, "")
        return self._constant(None)

    def _add(self, v: V, args: tuple[int, ...], fn: Callable[..., Any], rules: tuple, differentiable: bool) -> int:
        """The slot of a new step computing fn(*args), with the rules' vjps where a gradient is needed."""
        vjps = tuple(g if differentiable and a in self._grad else None for g, a in zip(rules, args))
        for g in vjps:
            if isinstance(g, _No):  # a gradient is needed where the rule has none
                raise NoGeneratedBackward(f"{g.what} has no generated backward (autograd differentiates it)", v.span)
        out = self._slot()
        if any(g is not None for g in vjps):
            self._grad.add(out)
        self._steps.append(_Step(out, args, fn, vjps))
        return out

    def _split(self, v: V, env: dict, body: Checked, prefix: str) -> list[int]:
        """A split's pieces, one slot each: every piece a narrow of the operand, whose vjp puts
        its gradient in the piece's place (torch.split makes the same views)."""
        x = self._value(v.args[0], env, body, prefix)
        d, start, slots = _dim(v), 0, []
        for n in v.of(Split).sizes:
            fn, vjp = _narrowed(d, start, n)
            slots.append(self._add(v, (x,), fn, (vjp,), v.args[0].type.dtype == "float"))
            start += n
        return slots

    def _block(self, v: V, env: dict, body: Checked, prefix: str) -> int:
        """A block call, inlined: its body planned once per instance (per copy, repeated)."""
        returned = self._block_returns(v, env, body, prefix)
        if len(returned) != 1:
            raise NoGeneratedBackward(f"block {v.of(BlockCall).block} yields several tensors", v.span)
        return returned[0]

    def _block_returns(self, v: V, env: dict, body: Checked, prefix: str) -> list[int]:
        """The slots of what a block call returns (`h, c = blk(x)`: one per target)."""
        call = v.of(BlockCall)
        blk = body.blocks.get(call.block) or self.checked.blocks[call.block]
        args = [self._value(a, env, body, prefix) for a in v.args]
        if call.repeat is None:
            return self._body(blk, f"{prefix}{call.instance}.", args, v)
        x, *rest = args  # the first argument is carried, the others reach every copy unchanged
        for i in range(call.repeat):
            returned = self._body(blk, f"{prefix}{call.prefix(i)}", [x, *rest], v)
            if len(returned) != 1:
                raise NoGeneratedBackward(f"block {blk.name} yields several tensors", v.span)
            x = returned[0]
        return [x]

    def _body(self, blk: Checked, prefix: str, args: list[int], call: V) -> list[int]:
        returned = self._statements(blk, prefix, {(d.tensor.name, 0): a for d, a in zip(blk.inputs, args)})[1]
        if returned is None:
            raise NoGeneratedBackward(f"block {blk.name} returns nothing", call.span)
        return returned

    def _statements(self, body: Checked, prefix: str, env: dict) -> tuple[list[tuple[str, int]], list[int] | None]:
        """Plan a body's statements: the (name, slot) of each `output` and the slots a `return`
        gives (None where there is none)."""
        from penrose import ir

        current = {name: slot for (name, _), slot in env.items()}
        outputs: list[tuple[str, int]] = []
        unread = _unread_splits(body)
        for s in body.stmts:
            st = s.stmt
            if isinstance(st, ir.Assign) and id(s) in unread:
                continue  # a split whose pieces nobody reads is not made (nor its operand), as compiled
            if isinstance(st, ir.Assign):
                if len(s.targets) != 1 and s.value is not None and s.value.op in ("split", "block"):
                    pieces = (self._split if s.value.op == "split" else self._block_returns)(s.value, env, body, prefix)
                    for t, version, slot in zip(s.targets, s.versions, pieces):
                        env[(t, version)] = current[t] = slot
                    continue
                if len(s.targets) != 1:
                    raise NoGeneratedBackward(f"{s.value.key if s.value else 'a statement'} yields several tensors", st.span)
                assert s.value is not None
                env[(s.targets[0], s.versions[0])] = current[s.targets[0]] = self._value(s.value, env, body, prefix)
            elif isinstance(st, ir.Output):
                outputs.extend((n, current[n]) for n in st.names)
            elif isinstance(st, ir.Return):
                assert s.value is not None
                return outputs, [self._value(a, env, body, prefix) for a in s.value.args]
        return outputs, None

    def _output_slot(self, name: str) -> int:
        """The slot of the output `name` (a KeyError naming the outputs where there is none)."""
        slot = self._output_slots.get(name)
        if slot is None:
            raise KeyError(f"{name!r} is not an output of the diagram; its outputs are {', '.join(self.output_names)}")
        return slot

    def reads_constant(self, name: str) -> bool:
        """Whether anything still reads the input `name` fixed when planning (a where folded
        with it does not), an output that is it included."""
        slot = self._fixed[name]
        return any(slot in step.args for step in self._steps) or slot in self._output_slots.values()

    # -- running
    def training_step(self, seeds: Mapping[str, Callable[..., torch.Tensor]]) -> TrainingStep:
        """The forward, loss gradients and backward as one generated function: `seeds` maps an
        output name to fn(value, target) -> d loss / d output (a closed-form loss gradient);
        the step adds each param's gradient to a tensor the caller gives (`TrainingStep`)."""
        return TrainingStep(self, seeds)

    def forward(self, *args: torch.Tensor, **inputs: torch.Tensor) -> Tape:
        """Run the diagram on its inputs (by keyword, or positionally in the diagram's order),
        keeping what the backward reads. Nothing is recorded for autograd."""
        if args:
            names = [n for n, _ in self._inputs]
            if len(args) > len(names):
                raise TypeError(f"{len(args)} positional inputs but the diagram takes {len(names)}")
            inputs = {**dict(zip(names, args)), **inputs}
        fixed = [name for name in inputs if name in self.constant_inputs]
        if fixed:
            raise TypeError(f"input {fixed[0]!r} was fixed when planning (constants=)")
        try:
            given = [inputs[name] for name, _ in self._inputs]
        except KeyError as e:
            raise TypeError(f"missing input {e.args[0]!r}") from None
        tensors = [store[key] for _, store, key in self._reads]
        with _no_grad():
            return Tape(self, self._run_forward(*given, *tensors))


# ---- the plan written out: straight-line functions of slot numbers --------------------------------
# The loops over the plan's steps, unrolled once into Python functions: `v<slot>` holds a value,
# `g<slot>` its gradient, `f<k>` / `b<k>_<j>` are the planned forward functions and
# vector-Jacobian products, `c<slot>` a folded number. The source is built as a tree
# (penrose.pyast) from slot numbers alone, no name of the diagram: it reads nothing a user wrote.


def _emit(fname: str, params: list[str], body: list, namespace: dict[str, Any]) -> Callable[..., Any]:
    tree = P.module([P.function(fname, P.arguments(params), body)])
    source = P.print_module(tree)
    _EMITTED[0] += 1
    filename = f"<penrose gradients #{_EMITTED[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show the line
    exec(compile(source, filename, "exec"), namespace)  # built from slot numbers only
    return namespace[fname]


_EMITTED = [0]


def _emit_forward(plan: GradientPlan) -> Callable[..., list]:
    """forward(*inputs, *params and buffers) -> every slot's value (None where none is made)."""
    namespace: dict[str, Any] = {}
    body, made = _forward_body(plan, namespace)
    body.append(P.return_(P.list_([P.name(f"v{i}") if i in made else P.const(None) for i in range(plan._n)])))
    params = [f"v{slot}" for _, slot in plan._inputs] + [f"v{slot}" for slot, _, _ in plan._reads]
    return _emit("forward", params, body, namespace)


def _forward_body(plan: GradientPlan, namespace: dict[str, Any]) -> tuple[list, set[int]]:
    """The forward's lines (`v<slot> = f<k>(...)`, constants bound first) and the slots made."""
    made = {slot for _, slot in plan._inputs} | {slot for slot, _, _ in plan._reads}
    body: list = []
    for slot, value in plan._constants.items():
        namespace[f"c{slot}"] = value
        body.append(P.assign(P.name(f"v{slot}"), P.name(f"c{slot}")))
        made.add(slot)
    namespace["torch"] = torch
    for k, (out, also, fn, operands) in enumerate(plan._forward):
        namespace[f"f{k}"] = fn
        body.append(P.assign(P.name(f"v{out}"), _called(f"f{k}", fn, [P.name(f"v{a}") for a in operands])))
        made.add(out)
        if also >= 0:
            body.append(P.assign(P.name(f"v{also}"), P.name(f"v{out}")))
            made.add(also)
    return body, made


def _called(name: str, fn: Callable[..., Any], args: list) -> Any:
    """The tree of calling `fn` (bound to `name`) on `args`, or the expression it carries
    (`_inlined`): torch calls written out, with the call kept as its fallback."""
    call = P.call(P.name(name), *args)
    template = getattr(fn, "inline", None)
    return call if template is None else template(call, *args)


def _emit_backward(plan: GradientPlan, seeded: tuple[int, ...]) -> Callable[..., tuple]:
    """backward(values, *seeds) -> each trainable param's gradient (None where none reaches it),
    for gradients given at the slots `seeded`: which slots receive one is known now, so the
    function holds no test of it."""
    namespace: dict[str, Any] = {"torch": torch}
    body: list = [P.assign(P.name(f"g{s}"), P.name(f"s{s}")) for s in seeded]
    loaded: set[int] = set()

    def value(slot: int) -> Any:
        if slot not in loaded:
            body.append(P.assign(P.name(f"v{slot}"), P.subscript(P.name("values"), P.const(slot))))
            loaded.add(slot)
        return P.name(f"v{slot}")

    has = _backward_body(plan, set(seeded), body, namespace, value)
    body.append(P.return_(P.tuple_([P.name(f"g{s}") if s in has else P.const(None) for s in plan.params.values()])))
    return _emit("backward", ["values", *[f"s{s}" for s in seeded]], body, namespace)


def _backward_body(plan: GradientPlan, has: set[int], body: list, namespace: dict[str, Any],
                   value: Callable[[int], Any]) -> set[int]:
    """The backward's lines appended to `body` (`g<slot> = b<k>_<j>(g<out>, v<out>, ...)`,
    summed where several reach a slot), from the slots `has` that hold a gradient already;
    `value(slot)` is the expression of a forward value. Returns the slots given a gradient."""
    for k, step in enumerate(plan._backward_steps):
        if step.out not in has:
            continue
        for j, (a, vjp) in enumerate(step.pairs):
            namespace[f"b{k}_{j}"] = vjp
            call = _called(f"b{k}_{j}", vjp, [P.name(f"g{step.out}"), value(step.out), *[value(x) for x in step.args]])
            body.append(P.assign(P.name(f"g{a}"), P.binop("+", P.name(f"g{a}"), call) if a in has else call))
            has.add(a)
    return has


def _emit_step(plan: GradientPlan, seeds: list[tuple[int, Callable[..., Any]]]) -> tuple[Callable[..., tuple], tuple[str, ...]]:
    """step(*inputs, *targets, grads) for `TrainingStep`: the forward, seed j's gradient
    `q<j>(v<slot>, t<j>)`, the backward from them, `torch._foreach_add_(grads, [...])` over the
    params a gradient reaches (their names returned, in that order); returns the seeded values."""
    namespace: dict[str, Any] = {"foreach_add": torch._foreach_add_, "torch": torch}
    body: list = []
    for slot, store, key in plan._reads:  # the params and buffers, read from their modules' dicts at each call
        namespace[f"d{slot}"], namespace[f"k{slot}"] = store, key
        body.append(P.assign(P.name(f"v{slot}"), P.subscript(P.name(f"d{slot}"), P.name(f"k{slot}"))))
    body += _forward_body(plan, namespace)[0]
    seeded: set[int] = set()
    for j, (slot, fn) in enumerate(seeds):
        namespace[f"q{j}"] = fn
        grad = P.call(P.name(f"q{j}"), P.name(f"v{slot}"), P.name(f"t{j}"))
        body.append(P.assign(P.name(f"g{slot}"), P.binop("+", P.name(f"g{slot}"), grad) if slot in seeded else grad))
        seeded.add(slot)
    has = _backward_body(plan, seeded, body, namespace, lambda slot: P.name(f"v{slot}"))
    reached = [(name, slot) for name, slot in plan.params.items() if slot in has]
    if reached:
        body.append(P.expr_stmt(P.call(P.name("foreach_add"), P.name("grads"),
                                       P.list_([P.name(f"g{slot}") for _, slot in reached]))))
    body.append(P.return_(P.tuple_([P.name(f"v{slot}") for slot, _ in seeds])))
    params = [f"v{slot}" for _, slot in plan._inputs] + [f"t{j}" for j in range(len(seeds))] + ["grads"]
    return _emit("step", params, body, namespace), tuple(name for name, _ in reached)


class TrainingStep:
    """A whole training step of a plan written out as one function (`GradientPlan.training_step`):
    the forward, each seeded output's gradient from its seed function, the backward, and each
    param's gradient added to the tensor given for it, with no Tape, dict or `values` list
    between them. `params` names the params a gradient reaches, in the order of the `grads`
    list a call takes."""

    def __init__(self, plan: GradientPlan, seeds: Mapping[str, Callable[..., torch.Tensor]]) -> None:
        self.plan, self.seeded = plan, tuple(seeds)
        # run(*inputs, *targets, grads): the function itself, to call under torch.no_grad()
        self.run, self.params = _emit_step(plan, [(plan._output_slot(n), fn) for n, fn in seeds.items()])

    def __call__(self, inputs: tuple, targets: tuple, grads: list[torch.Tensor]) -> tuple:
        """The seeded outputs' values, for `inputs` (the plan's non-constant inputs in order),
        one target per seed (its function's second argument) and `grads` (one tensor per name
        of `params`, each gradient added to it in place)."""
        with _no_grad():
            return self.run(*inputs, *targets, grads)


def _no_grad() -> Any:
    """torch.no_grad() where gradients are on; nothing to enter where a caller turned them off
    (a training step runs its forward and backward under one)."""
    return torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()


class Tape:
    """One forward run of a plan: `outputs` in the diagram's order, and `backward`."""

    def __init__(self, plan: GradientPlan, vals: list) -> None:
        self.plan, self.vals = plan, vals
        self.outputs = tuple(vals[slot] for _, slot in plan.outputs)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.vals[self.plan._output_slots[name]]

    def backward(self, grads: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        """{trainable param name: its gradient} given {output name: d loss / d output} (an output
        left out, or None, contributes nothing); a param no gradient reaches gets None."""
        plan = self.plan
        seeds: dict[int, torch.Tensor] = {}
        for name, g in grads.items():
            s = plan._output_slot(name)
            if g is not None:
                seeds[s] = g if s not in seeds else seeds[s] + g
        key = tuple(sorted(seeds))
        run = plan._run_backward.get(key)
        if run is None:
            run = plan._run_backward[key] = _emit_backward(plan, key)
        with _no_grad():
            got = run(self.vals, *[seeds[s] for s in key])
        return dict(zip(plan.params, got))


def _fixed_inputs(checked: Checked, constants: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs fixed when planning, checked: each an input's name, a tensor of the input's
    legs (no batch dims: the plan folds with them) at their sizes and of its kind of dtype."""
    decls = {d.tensor.name: d for d in checked.inputs}
    for name, value in constants.items():
        d = decls.get(name)
        if d is None:
            raise TypeError(f"constants: {name!r} is not an input of the diagram (its inputs: {', '.join(decls)})")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"constants: input {name!r} must be a tensor, got {type(value).__name__}")
        sizes = [checked.sizes.size(c) for c in d.type.cls]
        if value.dim() != len(sizes) or any(s is not None and s != n for s, n in zip(sizes, value.shape)):
            raise TypeError(f"constants: input {name!r} must have shape [{', '.join(map(str, sizes))}] "
                            f"({', '.join(d.type.legs)}), got {list(value.shape)}")
        kind = "bool" if value.dtype == torch.bool else "float" if value.is_floating_point() else "int"
        if kind != d.tensor.dtype:
            raise TypeError(f"constants: input {name!r} is declared {d.tensor.dtype}, got a {value.dtype} tensor")
    return dict(constants)


# ---- the rules: per operation, (forward, (vjp per operand)) -----------------------------------
# A vjp is vjp(g, out, *operands) -> the gradient of that operand, at its shape.


def _rule_unary(v: V):
    """An element-wise function: its row's torch callable, and its row's derivative (`ops.Op.vjp`),
    computed with torch's kernels (KERNELS) and written out as the same expression."""
    row = ops.OPS[v.of(Unary).name]
    assert row.torch is not None
    f = _callable(row.torch)
    kw = {k.name: v.of(Unary).keyword(k.name) for k in row.keywords}
    forward = f if not kw else (lambda x: f(x, *kw.values()))
    d = row.vjp
    if d is None:
        return forward, (_No(f"{row.name} (its row in penrose.ops has no derivative)"),)
    vjp = lambda g, y, x: d(g, x, y, KERNELS, **kw)  # noqa: E731
    return forward, (_inlined(vjp, lambda call, g, y, x: d(_Tree(g), _Tree(x), _Tree(y), _WRITTEN, **kw).node),)


def _rule_operator(v: V):
    op = v.of(BinOp).op
    align = v.of(Aligned).alignment
    al = [_aligner(x, a) for x, a in zip(v.args, align)]
    un = [_unaligner(x, a) for x, a in zip(v.args, align)]
    fa, fb = al[0] or _same, al[1] or _same
    ua, ub = un
    fn = _OPERATORS.get(op)
    if fn is None:
        raise NoGeneratedBackward(f"the operator {op} has no generated backward", v.span)
    if al[0] is None and al[1] is None:  # written out as the operator itself
        written = (lambda call, a, b: P.compare(op, a, b)) if op in P.CMPOPS else (lambda call, a, b: P.binop(op, a, b))
        forward = _inlined(lambda a, b: fn(a, b), written)
    else:
        forward = lambda a, b: fn(fa(a), fb(b))  # noqa: E731
    if op in ("<", "<=", ">", ">=", "==", "!=", "//"):
        return forward, (None, None)
    if op == "+":
        return forward, (_passed(v.args[0], ua, 2), _passed(v.args[1], ub, 3))
    if op == "-":
        return forward, (lambda g, y, a, b: ua(g, a), lambda g, y, a, b: ub(-g, b))
    if op == "*":
        return forward, (lambda g, y, a, b: ua(g * fb(b), a), lambda g, y, a, b: ub(g * fa(a), b))
    if op == "/":
        return forward, (lambda g, y, a, b: ua(g / fb(b), a), lambda g, y, a, b: ub(-g * y / fb(b), b))
    if op == "**":
        if v.args[1].type.dtype != "scalar":
            return forward, _power_vjps(fa, fb, ua, ub)
        return forward, (lambda g, y, a, b: ua(g * b * fa(a) ** (b - 1), a), None)
    raise NoGeneratedBackward(f"the operator {op} has no generated backward", v.span)  # pragma: no cover


def _passed(x: V, unalign: Callable[[torch.Tensor, Any], torch.Tensor], i: int) -> Callable[..., torch.Tensor]:
    """The vjp of a sum's operand x (argument i of vjp(g, y, a, b)): the gradient itself, at x's
    shape. Written out where x lines up with the result: g where the shapes agree, and for an
    operand without batch dims (a bias) g summed over its one leading batch dim."""

    def vjp(g, y, a, b):
        return unalign(g, (a, b)[i - 2])

    if unalign is not _fitted:
        return vjp
    legs = len(x.legs)

    def inline(call, g, y, a, b):
        value = (a, b)[i - 2]
        same = P.compare("==", P.attr(g, "shape"), P.attr(value, "shape"))
        if x.type.batched:
            return P.if_exp(same, g, call)
        one_batch = P.compare("==", P.method(g, "dim"), P.const(legs + 1))
        return P.if_exp(one_batch, P.method(g, "sum", P.const(0)), P.if_exp(same, g, call))

    return _inlined(vjp, inline)


def _power_vjps(fa: Callable, fb: Callable, ua: Callable, ub: Callable) -> tuple[Callable, Callable]:
    """The vjps of a ** b with a tensor exponent, as autograd's pow backward: b a^(b-1) (0 where
    b = 0) and a^b log a (0 where a = 0 and b >= 0)."""

    def ga(g, y, a, b):
        x, e = fa(a), fb(b)
        return ua(torch.where(e == 0, 0.0, g * (e * x ** (e - 1))), a)

    def gb(g, y, a, b):
        x, e = fa(a), fb(b)
        base = x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=y.dtype, device=y.device)
        return ub(g * torch.where((base == 0) & (e >= 0), 0.0, y * base.log()), b)

    return ga, gb


_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
    "**": lambda a, b: a ** b, "//": lambda a, b: a // b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _bias_added(v: V) -> _Blocks | None:
    """For `x ⋅ W + b` (a contraction `_Blocks` writes as one matrix product, b unbatched with
    the product's legs): the product's `_Blocks`; None for any other value."""
    if v.key != "+" or len(v.args) != 2:
        return None
    e, b = v.args
    blocks = _Blocks.of(e) if e.op == "einsum" else None
    if blocks is None or b.type.dtype != "float" or b.type.batched:
        return None
    legs = tuple(range(len(e.legs)))
    if b.legs != e.legs or v.legs != e.legs or v.of(Aligned).alignment != (legs, legs):
        return None
    return blocks


def _with_bias(blocks: _Blocks, contract: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """(operands..., b) -> the product's step `contract` plus b, written out as
    `torch.mm(...).add_(b)` for a batch of one dimension (cheaper than addmm, which copies the
    broadcast bias first)."""

    def fused(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Any other rank of the batch (the written-out expression covers one dimension)."""
        return contract(x, w) + bias

    i = blocks.i
    return _inlined(fused, lambda call, a, b, bias: blocks.product(call, (a, b)[i], (a, b)[1 - i], bias))


def _rule_neg(v: V):
    return (lambda x: -x), ((lambda g, y, x: -g),)


def _rule_einsum(v: V):
    ein = v.of(Einsum)
    terms, out = ein.terms, tuple(ein.out)
    batched = tuple(x.type.batched for x in v.args)
    keep = any(batched) and not ein.sum_batch
    matmul = not _broadcasts(v)
    forward = _contraction(terms, out, batched, keep, matmul)
    vjps: list[Callable | _No | None] = []
    for i, term in enumerate(terms):
        if len(set(term)) != len(term):
            vjps.append(_diagonal_vjp(i, terms, out, batched, keep))
            continue
        vjps.append(_operand_vjp(i, terms, out, batched, keep, matmul))
    blocks = _Blocks.of(v)
    if blocks is not None:  # one matrix product of views: the product and its vjps written out, the general functions the fallback
        i = blocks.i
        general_a, general_b = vjps  # (`_operand_vjp`'s: the terms repeat no label)
        assert callable(general_a) and callable(general_b)
        forward = _inlined(forward, lambda call, a, b: blocks.product(call, (a, b)[i], (a, b)[1 - i]))
        inline_x = lambda call, g, y, a, b: blocks.grad_x(call, g, (a, b)[i], (a, b)[1 - i])  # noqa: E731
        inline_w = lambda call, g, y, a, b: blocks.grad_w(call, g, (a, b)[i], (a, b)[1 - i])  # noqa: E731
        vjps = [_inlined(general_a, inline_x if i == 0 else inline_w), _inlined(general_b, inline_w if i == 0 else inline_x)]
    return forward, tuple(vjps)


def _operand_vjp(i: int, terms: tuple[tuple[str, ...], ...], out: tuple[str, ...], batched: tuple[bool, ...],
                 keep: bool, matmul: bool = True) -> Callable:
    """The vjp of operand i (a term without repeated labels) of the einsum `terms -> out`."""
    term = terms[i]
    others = [t for j, t in enumerate(terms) if j != i]
    other_batched = tuple(b for j, b in enumerate(batched) if j != i)
    known = set(out).union(*others) if others else set(out)
    kept = tuple(lab for lab in term if lab in known)  # labels the contraction gives back
    grad_batched = batched[i] and (keep or any(other_batched))
    contract = _contraction((out, *others), kept, (keep, *other_batched), grad_batched, matmul)
    expand = [term.index(lab) for lab in term if lab not in known]
    return _einsum_vjp(i, contract, kept, term, expand)


def _diagonal_vjp(i: int, terms: tuple[tuple[str, ...], ...], out: tuple[str, ...], batched: tuple[bool, ...],
                  keep: bool) -> Callable:
    """The vjp of operand i whose term repeats a label: the vjp of its diagonal (the term with
    each label once, as `torch.diagonal` leaves it: the joined label last) put on the diagonal
    of zeros, as autograd's diagonal_backward does."""
    term, steps = list(terms[i]), []
    while len(set(term)) != len(term):
        k = next(k for k, lab in enumerate(term) if term.index(lab) != k)
        j, n = term.index(term[k]), len(term)
        steps.append((j - n, k - n))
        term = [lab for m, lab in enumerate(term) if m not in (k, j)] + [term[j]]

    def diagonal(x: torch.Tensor) -> torch.Tensor:
        for d1, d2 in steps:
            x = x.diagonal(dim1=d1, dim2=d2)
        return x

    inner = _operand_vjp(i, (*terms[:i], tuple(term), *terms[i + 1:]), out, batched, keep, False)

    def vjp(g, y, *operands):
        x = operands[i]
        r = inner(g, y, *operands[:i], diagonal(x), *operands[i + 1:])
        grad = torch.zeros_like(x)
        diagonal(grad).copy_(r)
        return grad

    return vjp


def _broadcasts(e: V) -> bool:
    """Whether a label of the einsum stands on legs of different size classes (a size-1 leg
    broadcast against a longer one, as torch.einsum does): no matrix product then."""
    seen: dict[str, int] = {}
    for t, x in zip(e.of(Einsum).terms, e.args):
        for lab, c in zip(t, x.type.cls):
            if seen.setdefault(lab, c) != c:
                return True
    return False


class _Blocks:
    """A contraction of a batched operand x and an unbatched w that is one matrix product of
    views at a batch of one dimension: x's term Px ++ C, w's C ++ Q (or Q ++ C, `transpose`),
    the result Px ++ Q (the batch kept). x [N, Px, C] is the matrix [N·Px, C], w [C, Q] (or
    [Q, C]), the result [N·Px, Q]; C is never empty, Px and Q may be (Q empty: a matrix-vector
    product). `i` is x's operand position. A linear layer `einsum('c,cq->q', x, W)` is the
    case of one label each. The trees (`penrose.pyast`) are the torch calls the generated
    functions write out, guarded by the batch's rank."""

    __slots__ = ("i", "np", "nc", "nq", "transpose")

    def __init__(self, i: int, np: int, nc: int, nq: int, transpose: bool) -> None:
        self.i, self.np, self.nc, self.nq, self.transpose = i, np, nc, nq, transpose

    @staticmethod
    def of(e: V) -> _Blocks | None:
        if e.key != "einsum" or len(e.args) != 2 or _broadcasts(e):
            return None
        ein = e.of(Einsum)
        if ein.sum_batch or any(x.type.dtype != "float" for x in e.args):
            return None
        batched = [x.type.batched for x in e.args]
        if batched.count(True) != 1:
            return None
        i = batched.index(True)
        a, w, out = tuple(ein.terms[i]), tuple(ein.terms[1 - i]), tuple(ein.out)
        if any(len(set(t)) != len(t) for t in (a, w, out)):
            return None
        c = tuple(lab for lab in a if lab in w)
        p = tuple(lab for lab in a if lab not in w)
        q = tuple(lab for lab in w if lab not in a)
        if not c or a != p + c or out != p + q or any(lab in out for lab in c):
            return None
        if w == c + q:
            return _Blocks(i, len(p), len(c), len(q), False)
        if q and w == q + c:
            return _Blocks(i, len(p), len(c), len(q), True)
        return None

    # the operands as matrices (trees)
    def _x2(self, x: Any) -> Any:
        """x [N, Px, C] as [N·Px, C]."""
        if self.np:
            x = P.method(x, "flatten", P.const(0), P.const(self.np))
        return P.method(x, "flatten", P.const(1)) if self.nc > 1 else x

    def _w2(self, w: Any) -> Any:
        """w as the matrix [C, Q] ([Q, C] where transposed), or the vector [C] where Q is empty."""
        if not self.nq:
            return P.method(w, "flatten") if self.nc > 1 else w
        first, second = (self.nq, self.nc) if self.transpose else (self.nc, self.nq)
        if first > 1:
            w = P.method(w, "flatten", P.const(0), P.const(first - 1))
        return P.method(w, "flatten", P.const(1)) if second > 1 else w

    def _g2(self, g: Any) -> Any:
        """The result's gradient [N, Px, Q] as [N·Px, Q] (the vector [N·Px] where Q is empty)."""
        if not self.nq:
            return P.method(g, "flatten") if self.np else g
        if self.np:
            g = P.method(g, "flatten", P.const(0), P.const(self.np))
        return P.method(g, "flatten", P.const(1)) if self.nq > 1 else g

    def _rank(self, t: Any, legs: int) -> Any:
        """The tree of `t.dim() == 1 + legs` (a batch of one dimension)."""
        return P.compare("==", P.method(t, "dim"), P.const(1 + legs))

    @staticmethod
    def _viewed(r: Any, shape: Any, needed: bool) -> Any:
        return P.method(r, "view", shape) if needed else r

    def product(self, call: Any, x: Any, w: Any, bias: Any = None) -> Any:
        """x ⋅ w (plus `bias`, added in place) for a batch of one dimension, else `call`."""
        x2, w2 = self._x2(x), self._w2(w)
        if not self.nq:
            r = P.call(P.path("torch.mv"), x2, w2)
            shape = P.subscript(P.attr(x, "shape"), P.slice_(None, 1 + self.np))
            r = self._viewed(r, shape, self.np > 0)
        else:
            r = P.call(P.path("torch.mm"), x2, P.method(w2, "t") if self.transpose else w2)
            q = (P.subscript(P.attr(w, "shape"), P.slice_(None, self.nq)) if self.transpose
                 else P.subscript(P.attr(w, "shape"), P.slice_(self.nc, None)))
            shape = P.binop("+", P.subscript(P.attr(x, "shape"), P.slice_(None, 1 + self.np)), q)
            r = self._viewed(r, shape, self.np > 0 or self.nq > 1)
        if bias is not None:
            r = P.method(r, "add_", bias)
        return P.if_exp(self._rank(x, self.np + self.nc), r, call)

    def grad_x(self, call: Any, g: Any, x: Any, w: Any) -> Any:
        """d/dx: g [N·Px, Q] ⋅ wᵀ at x's shape, for a batch of one dimension, else `call`."""
        g2, w2 = self._g2(g), self._w2(w)
        if not self.nq:
            r = P.call(P.path("torch.outer"), g2, w2)
        else:
            r = P.call(P.path("torch.mm"), g2, w2 if self.transpose else P.method(w2, "t"))
        r = self._viewed(r, P.attr(x, "shape"), self.np > 0 or self.nc > 1)
        return P.if_exp(self._rank(g, self.np + self.nq), P.if_exp(self._rank(x, self.np + self.nc), r, call), call)

    def grad_w(self, call: Any, g: Any, x: Any, w: Any) -> Any:
        """d/dw: x [N·Px, C]ᵀ ⋅ g summed over the rows, at w's shape, else `call`."""
        x2, g2 = self._x2(x), self._g2(g)
        if not self.nq:
            r = P.call(P.path("torch.mv"), P.method(x2, "t"), g2)
            needed = self.nc > 1
        else:
            r = (P.call(P.path("torch.mm"), P.method(g2, "t"), x2) if self.transpose
                 else P.call(P.path("torch.mm"), P.method(x2, "t"), g2))
            needed = self.nc > 1 or self.nq > 1
        r = self._viewed(r, P.attr(w, "shape"), needed)
        return P.if_exp(self._rank(g, self.np + self.nq), P.if_exp(self._rank(x, self.np + self.nc), r, call), call)


def _einsum_vjp(i: int, contract: Callable, kept: tuple[str, ...], term: tuple[str, ...], expand: list[int]) -> Callable:
    """The gradient of operand i: the result's gradient contracted with the other operands,
    spread along the labels only operand i had (summed there, so each entry's derivative is the
    same) and over batch dims it broadcast along."""
    n = len(term)

    def vjp(g, y, *operands):
        x = operands[i]
        r = contract(g, *[t for j, t in enumerate(operands) if j != i])
        if expand:
            lead = r.dim() - len(kept)
            sizes = iter(r.shape[lead:])
            r = r.reshape(*r.shape[:lead], *(1 if k in expand else next(sizes) for k in range(n)))
        if r.shape != x.shape:
            r = r.expand(torch.broadcast_shapes(r.shape, x.shape)).sum_to_size(x.shape)
        return r

    return vjp


def _same(t: Any) -> Any:
    return t


def _rule_where(v: V):
    align = v.of(Aligned).alignment
    if all(x.type.dtype == "scalar" for x in v.args[1:]):
        return _numbers_where(v)
    aligners = [_aligner(x, a) for x, a in zip(v.args, align)]
    fm, fa, fb = (f or _same for f in aligners)
    _, ua, ub = (_unaligner(x, a) for x, a in zip(v.args, align))

    def forward(m, a, b):
        return torch.where(fm(m), fa(a), fb(b))

    if not any(aligners):
        forward = torch.where  # noqa: F811 (the operands line up as they are)

    def ga(g, y, m, a, b):
        return ua(torch.where(fm(m), g, 0.0), a)

    def gb(g, y, m, a, b):  # (g has the result's shape: masked_fill is where(m, 0, g), one kernel)
        return ub(g.masked_fill(fm(m), 0.0), b)

    if aligners[0] is None and ub is _fitted:  # written out where b has the result's shape
        def inline_b(call, g, y, m, a, b):
            same = P.compare("==", P.attr(g, "shape"), P.attr(b, "shape"))
            return P.if_exp(same, P.method(g, "masked_fill", m, P.const(0.0)), call)

        gb = _inlined(gb, inline_b)  # type: ignore[assignment]
    return forward, (None, ga, gb)


def _numbers_where(v: V):
    """where(m, 1, 0) of two plain numbers: a float tensor in the model's dtype (read from the
    reference operand the planner adds), as compiled."""
    fm = _aligner(v.args[0], v.of(Aligned).alignment[0]) or _same

    def forward(m, a, b, reference):
        dtype = torch.get_default_dtype() if reference is None else reference.dtype
        return torch.where(fm(m), float(a), float(b)).to(dtype)

    return forward, (None, None, None, None)


def _rule_clamp(v: V):
    lo, hi = v.of(Clamp).min, v.of(Clamp).max

    def inside(x):
        if lo is not None and hi is not None:
            return (x >= lo) & (x <= hi)
        return x >= lo if lo is not None else x <= hi

    return (lambda x: torch.clamp(x, min=lo, max=hi)), ((lambda g, y, x: g * inside(x).to(g.dtype)),)


def _dim(v: V) -> int:
    """The operand's axis of an operation along one leg, counted from the end."""
    return v.of(Axis).axis - len(v.args[0].legs)


def _rule_reduce(v: V):
    """sum, mean, max or min over one leg: the einops reductions' step (`_reduction_steps`)."""
    ((forward, vjp),) = _reduction_steps(v.key or "", [_dim(v)])
    return forward, (vjp,)


def _rule_softmax(v: V):
    d = _dim(v)

    def vjp(g, y, x):
        return _A._softmax_backward_data.default(g, y, d % y.dim(), y.dtype)

    return (lambda x: torch.softmax(x, d)), (vjp,)


def _rule_log_softmax(v: V):
    d = _dim(v)
    return (lambda x: torch.log_softmax(x, d)), ((lambda g, y, x: _A._log_softmax_backward_data.default(g, y, d % y.dim(), y.dtype)),)


def _rule_detach(v: V):
    return (lambda x: x), (None,)


# ---- rules of the shape operations, norms, masks, lookups (those below read sizes or the mode) --


class _Reads:
    """What a rule reads beyond its value: the size of a size class (refused where only the
    inputs give it) and whether the module is training (dropout)."""

    def __init__(self, v: V, body: Checked, training: bool, top: Checked) -> None:
        self.v, self.sizes, self.training = v, body.sizes, training
        self.inputs = top.inputs if body is top else None  # the diagram's inputs, where the step reads them

    def free(self, cls: int) -> bool:
        """Whether only the inputs give the class's size (the compiled module checks indices into it at run time)."""
        return self.sizes.is_free(cls)

    def carried(self, cls: int) -> Callable[[tuple], int]:
        """The class's size as a function of the diagram's inputs: its number where known when
        planning, else the size of an input's leg of that class (at the top level)."""
        if self.sizes.is_free(cls) and self.inputs is not None:
            root = self.sizes.find(cls)
            for i, d in enumerate(self.inputs):
                for k, c in enumerate(d.type.cls):
                    if self.sizes.find(c) == root:
                        return _leg_size(i, k - len(d.tensor.legs))
        n = self.size(cls)  # known when planning (else refused here)
        return lambda inputs: n

    def size(self, cls: int) -> int:
        n = None if self.sizes.is_free(cls) else self.sizes.size(cls)
        if n is None:
            raise NoGeneratedBackward(f"a number read from the inputs' sizes ({self.v.key or self.v.op})", self.v.span)
        return n


def _leg_size(i: int, dim: int) -> Callable[[tuple], int]:
    """The size of dim `dim` (counted from the end) of input i."""
    return lambda inputs: inputs[i].shape[dim]


class _Reading:
    """A rule that is given a `_Reads` too: rule(v, reads) -> (forward, (vjp per operand))."""

    def __init__(self, rule: Callable[[V, _Reads], tuple[Callable[..., Any], tuple]]) -> None:
        self.plan = rule


def _weights(v: V) -> tuple[str, ...]:
    """The params an operation names in its record (layernorm's weight and bias, rmsnorm's
    weight): extra operands of its step, after the value's own."""
    if v.key == "layernorm":
        ln = v.of(LayerNorm)
        return tuple(n for n in (ln.weight, ln.bias) if n)
    if v.key == "rmsnorm":
        w = v.of(RMSNorm).weight
        return (w,) if w else ()
    return ()


def _reshaped(g, y, x):
    """The vjp of a view that keeps the entries in order (flatten, unflatten, squeeze, unsqueeze)."""
    return g.reshape(x.shape)


def _rule_flatten(v: V):
    n = len(v.args[0].legs)
    a, b = v.of(Flatten).start - n, v.of(Flatten).end - n
    return (lambda x: x.flatten(a, b)), (_reshaped,)


def _rule_unflatten(v: V):
    d, sizes = _dim(v), tuple(v.of(Unflatten).sizes)
    return (lambda x: x.unflatten(d, sizes)), (_reshaped,)


def _within(v: V, reads: _Reads, start: int, length: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """x, checked to hold the indices where its leg's size is known only at run time (the
    compiled module's check and error), else x itself."""
    x, axis = v.args[0], v.of(Axis).axis
    if not reads.free(x.type.cls[axis]):
        return _same
    d, what = _dim(v), f"{v.key} of leg {x.legs[axis]!r}"
    return lambda t: _runtime._within(t, d, start, length, what)


def _rule_select(v: V, reads: _Reads):
    d, i = _dim(v), v.of(Select).index
    checked = _within(v, reads, i, 1)
    return (lambda x: checked(x).select(d, i)), ((lambda g, y, x: _A.select_backward.default(g, x.shape, d % x.dim(), i)),)


def _narrowed(d: int, start: int, length: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """x.narrow(d, start, length) (a negative start counts from the end) and its vjp: the
    gradient in the narrowed place, zeros elsewhere (torch's slice_backward)."""

    def vjp(g, y, x):
        first = start + x.shape[d] if start < 0 else start
        return _A.slice_backward.default(g, x.shape, d % x.dim(), first, first + length, 1)

    return (lambda x: x.narrow(d, start, length)), vjp


def _rule_slice(v: V, reads: _Reads):
    start, length = v.of(Slice).start, v.of(Slice).length
    fn, vjp = _narrowed(_dim(v), start, length)
    checked = _within(v, reads, start, length)
    return (fn if checked is _same else (lambda x: fn(checked(x)))), (vjp,)


def _rule_concat(v: V):
    n = len(v.legs)
    d = v.of(Axis).axis - n  # counted from the end, in every part

    def broadcast(*parts):  # batch legs broadcast first: torch.cat does not
        return _runtime._concat(list(parts), d, n)

    def joined(*parts):
        return torch.cat(parts, dim=d)

    forward = broadcast if any(x.type.batched for x in v.args) else joined

    def part(i: int) -> Callable[..., torch.Tensor]:
        def vjp(g, y, *parts):
            start = sum(x.shape[d] for x in parts[:i])
            return _fitted(g.narrow(d, start, parts[i].shape[d]), parts[i])

        return vjp

    return forward, tuple(part(i) for i in range(len(v.args)))


def _count_split(g: torch.Tensor, mask: torch.Tensor, dims: Any) -> torch.Tensor:
    """g (kept dims) shared evenly among the entries equal to the extreme, as autograd's amax does."""
    return g / mask.sum(dims, keepdim=True) * mask


def _rule_minmax(v: V):
    """max / min over a leg (autograd's amax / amin: ties share the gradient evenly), or of two
    operands (torch.maximum / minimum: a tie halves it), a plain-number operand a clamp."""
    big = v.key == "max"
    if v.op == "reduce":
        return _rule_reduce(v)
    align = v.of(Aligned).align
    if align is None:
        raise NoGeneratedBackward(f"{v.key} of two plain numbers", v.span)
    fa, fb = (_aligner(x, al) or _same for x, al in zip(v.args, align))
    ua, ub = (_unaligner(x, al) for x, al in zip(v.args, align))
    numbers = [x.type.dtype == "scalar" for x in v.args]
    if any(numbers):  # a clamp of the tensor operand by the number: ties keep the whole gradient
        t = numbers.index(False)
        f, u = (fa, ua) if t == 0 else (fb, ub)
        bound = "min" if big else "max"

        def clamped(a, b):
            x, c = (a, b) if t == 0 else (b, a)
            return f(x).clamp(**{bound: c})

        def through(g, y, a, b):
            x, c = (a, b) if t == 0 else (b, a)
            fx = f(x)
            return u(torch.where(fx >= c if big else fx <= c, g, 0.0), x)

        return clamped, tuple(through if i == t else None for i in range(2))
    pair = torch.maximum if big else torch.minimum

    def forward(a, b):
        return pair(fa(a), fb(b))

    def ga(g, y, a, b):
        x, z = fa(a), fb(b)
        return ua(torch.where(x == z, g / 2, g).masked_fill(x < z if big else x > z, 0), a)

    def gb(g, y, a, b):
        x, z = fa(a), fb(b)
        return ub(torch.where(x == z, g / 2, g).masked_fill(x > z if big else x < z, 0), b)

    return forward, (ga, gb)


def _rule_gather(v: V):
    """Rows of a table by ids, as the compiled module reads them (an embedding for a matrix);
    the gradient is each row's gradients summed (torch's embedding and index backward)."""
    table, ids = v.args
    legs, label = len(table.legs), gather_label(table, ids)
    embedding = legs == 2 and not table.type.batched

    def forward(t, i):
        i = _runtime._ids(i, t.shape[t.dim() - legs], label)
        return torch.nn.functional.embedding(i, t) if embedding else t[i]

    def vjp(g, y, t, i):
        if embedding:
            return _A.embedding_dense_backward.default(g, i, t.shape[0], -1, False)
        return torch.zeros_like(t).index_put_((i,), g, accumulate=True)

    return forward, (vjp, None)


def _rule_dropout(v: V, reads: _Reads):
    """The identity in eval mode (the mode read when planning: `GradientPlan(..., training=)`,
    else the module's) or for p = 0. In training it is refused: its random mask is drawn when
    the module runs, and the plan could not compute what the module computes."""
    if v.of(Dropout).p != 0 and reads.training:
        raise NoGeneratedBackward("dropout in training (a random mask: plan in eval mode, or with training=False)", v.span)
    return _same, ((lambda g, y, x: g),)


def _rule_mask(v: V, reads: _Reads):
    """arange: a leg's positions; causal and block_causal: bool constants of their sizes (read from the inputs where only
    they give them), on the first input's device; the planner gives the inputs as operands."""
    m = v.of(Mask)
    if m.kind == "arange":  # a leg's positions: a constant in the module's float dtype (its first float input's, else
        n = reads.carried(v.type.cls[0])  # its first param's: the last operand; with neither, torch's default)

        def positions(*inputs):
            first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
            floats = [x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
            return torch.arange(n(inputs[:-1]), device=getattr(first, "device", None),
                                dtype=floats[0] if floats else torch.get_default_dtype())

        return positions, ()
    t, p = (reads.carried(c) for c in v.type.cls)

    def forward(*inputs):
        device = getattr(inputs[0], "device", None)
        if m.kind == "causal":
            return _runtime._causal_mask(t(inputs), p(inputs), device)
        return _runtime._block_causal_mask(t(inputs), p(inputs), m.block, device)

    return forward, ()


def _rule_topk_mask(v: V):
    d, k = _dim(v), v.of(TopK).k
    return (lambda x: _runtime._topk_mask(x, k, d)), (None,)


def _rule_topk(v: V):
    """The k largest entries kept, zeros elsewhere: the gradient reaches the kept entries."""
    d, k = _dim(v), v.of(TopK).k
    return (lambda x: _runtime._topk_filter(x, k, d)), ((lambda g, y, x: torch.where(_runtime._topk_mask(x, k, d), g, 0.0)),)


def _rule_layernorm(v: V):
    """torch's layer_norm along the leg (moved last where it is not), as compiled; the vjps
    from torch's native_layer_norm_backward, computed once per backward step for all operands."""
    ln = v.of(LayerNorm)
    d, eps, has_w, has_b = _dim(v), ln.eps, ln.weight is not None, ln.bias is not None
    last: list = [None, None, None]  # the (g, x) of the last backward, and its gradients

    def affine(wb: tuple) -> tuple[Any, Any]:
        return (wb[0] if has_w else None), (wb[-1] if has_b else None)

    def forward(x, *wb):
        w, b = affine(wb)
        if d == -1:
            return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)
        return torch.nn.functional.layer_norm(x.movedim(d, -1), (x.shape[d],), w, b, eps).movedim(-1, d)

    def grads(g, x, wb) -> tuple:
        if last[0] is g and last[1] is x:
            return last[2]
        w, b = affine(wb)
        xm, gm = (x, g) if d == -1 else (x.movedim(d, -1), g.movedim(d, -1))
        shape = [xm.shape[-1]]
        _, mean, rstd = _A.native_layer_norm.default(xm, shape, w, b, eps)
        gx, gw, gb = _A.native_layer_norm_backward.default(gm, xm, shape, mean, rstd, w, b, [True, has_w, has_b])
        last[:] = [g, x, (gx if d == -1 else gx.movedim(-1, d), gw, gb)]
        return last[2]

    def operand(i: int) -> Callable[..., torch.Tensor]:
        return lambda g, y, x, *wb: grads(g, x, wb)[i]

    return forward, (operand(0), *(operand(1) for _ in range(has_w)), *(operand(2) for _ in range(has_b)))


def _rule_rmsnorm(v: V):
    """The runtime's RMSNorm (in float32, float64 in a float64 model); its vjp written out:
    dx = r (g w) - x r³ mean(g w x), dw = Σ g x r over every dim but the leg's."""
    rms = v.of(RMSNorm)
    d, eps, has_w = _dim(v), rms.eps, rms.weight is not None

    def forward(x, *w):
        return _runtime._rms_norm(x, w[0] if has_w else None, eps, d)

    def parts(g, x, w):
        wide = _runtime._wide(x.dtype)
        xf, gf = x.to(wide), g.to(wide)
        r = torch.rsqrt(xf.pow(2).mean(d, keepdim=True) + eps)
        along = [-1] + [1] * (-d - 1)
        gy = gf * w[0].to(wide).reshape(along) if has_w else gf
        return xf, gf, r, gy

    def vjp_x(g, y, x, *w):
        xf, _, r, gy = parts(g, x, w)
        return (r * gy - xf * r.pow(3) * (gy * xf).mean(d, keepdim=True)).to(x.dtype)

    def vjp_w(g, y, x, w):
        xf, gf, r, _ = parts(g, x, (w,))
        dims = [i for i in range(xf.dim()) if i != xf.dim() + d]
        dw = gf * xf * r
        return (dw.sum(dims) if dims else dw).to(w.dtype)  # (sum over [] would sum every dim)

    return forward, ((vjp_x, vjp_w) if has_w else (vjp_x,))


def _halves_swapped(t: torch.Tensor, d: int) -> torch.Tensor:
    h = t.shape[d] // 2
    return torch.cat([t.narrow(d, h, t.shape[d] - h), t.narrow(d, 0, h)], dim=d)


def _rule_rope(v: V):
    """The runtime's rotate-half RoPE: a rotation R per position, so its vjp is Rᵀ g, and Rᵀ
    = S R S with S the swap of the leg's halves (the angles repeat in both halves)."""
    n = len(v.args[0].legs)
    pos, d, base = v.of(Rope).pos - n, _dim(v), v.of(Rope).base

    def forward(x):
        return _runtime._rope(x, pos, d, base)

    return forward, ((lambda g, y, x: _halves_swapped(_runtime._rope(_halves_swapped(g, d), pos, d, base), d)),)


# einops: the compiled module's steps, each with its vjp; the forward runs them, a vjp runs them
# again keeping each step's value, then walks back


def _sum_back(g: torch.Tensor, dims: list[int], x: torch.Tensor) -> torch.Tensor:
    """g, reduced over dims (counted from the end) of x, with those dims back as size 1."""
    for p in sorted(dim % x.dim() for dim in dims):
        g = g.unsqueeze(p)
    return g


def _prod_back(g: torch.Tensor, y: torch.Tensor, x: torch.Tensor, d: int) -> torch.Tensor:
    """The vjp of x.prod(d): g times the product of the other entries (cumulative products
    from both sides, so zeros are exact: autograd's prod_safe_zeros_backward)."""
    n = x.shape[d]
    ones = torch.ones_like(x.narrow(d, 0, 1))
    before = torch.cat([ones, x.narrow(d, 0, n - 1)], dim=d).cumprod(d)
    after = torch.cat([ones, x.narrow(d, 1, n - 1).flip(d)], dim=d).cumprod(d).flip(d)
    return g.unsqueeze(d) * (before * after)


def _reduction_steps(reduction: str, dims: list[int]) -> list[tuple[Callable, Callable]]:
    if reduction == "prod":  # one leg at a time, the outermost first, as compiled
        return [((lambda t, d=d: t.prod(d)), (lambda g, y, x, d=d: _prod_back(g, y, x, d))) for d in sorted(dims)]
    arg: Any = dims[0] if len(dims) == 1 else tuple(dims)
    if reduction == "sum":
        return [((lambda t: t.sum(arg)), (lambda g, y, x: _sum_back(g, dims, x).expand(x.shape)))]
    if reduction == "mean":
        return [((lambda t: t.mean(arg)),
                 (lambda g, y, x: (_sum_back(g, dims, x) / math.prod(x.shape[dim] for dim in dims)).expand(x.shape)))]
    f: Callable[..., torch.Tensor] = torch.amax if reduction == "max" else torch.amin
    return [((lambda t: f(t, arg)), (lambda g, y, x: _count_split(_sum_back(g, dims, x), x == _sum_back(y, dims, x), arg)))]


def _method(name: str, *args: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """t -> t.name(*args), the method looked up once (squeeze, unflatten, unsqueeze, flatten)."""
    fn = getattr(torch.Tensor, name)
    return lambda t: fn(t, *args)


def _rule_einop(v: V, reads: _Reads):
    """rearrange / reduce / repeat as `penrose.compiler` lowers them (squeeze and unflatten the
    left groups, reduce, reorder, unsqueeze and expand new legs, flatten the right groups), each
    step's vjp its inverse: a reshape back, the inverse permutation, a sum over the expanded
    legs, a reduction's vjp."""
    x, a = v.args[0], v.of(Einop)
    cls = {aid: c for aid, c, _ in a.axes}
    m = len(x.legs)
    steps: list[tuple[Callable, Callable]] = []
    for i, grp in enumerate(a.left):
        if not grp:
            steps.append((_method("squeeze", i - m), _reshaped))
        elif len(grp) > 1:
            steps.append((_method("unflatten", i - m, tuple(reads.size(cls[g]) for g in grp)), _reshaped))
    elem = [g for grp in a.left for g in grp]
    k = len(elem)
    dims = [j - k for j, g in enumerate(elem) if g in a.reduced]
    if a.sum_batch:  # the batch legs as one leading leg, reduced with the rest
        steps.append(((lambda t, k=k: _runtime._batch_first(t, k)), _reshaped))
        dims = [-k - 1] + dims
    if dims:
        steps += _reduction_steps(a.reduction or "sum", dims)
        elem = [g for g in elem if g not in a.reduced]
        k = len(elem)
    final = [g for grp in a.right for g in grp]
    order = [elem.index(g) for g in final if g not in a.new]
    if order != list(range(k)):
        inverse = [order.index(j) for j in range(k)]
        steps.append(((lambda t: t.permute(*range(t.dim() - k), *(t.dim() - k + o for o in order))),
                      (lambda g, y, t: g.permute(*range(g.dim() - k), *(g.dim() - k + o for o in inverse)))))
    if a.new:
        for j, g in enumerate(final):
            if g in a.new:
                after = sum(1 for h in final[j + 1:] if h not in a.new)
                steps.append((_method("unsqueeze", -after - 1), _reshaped))
        sizes = tuple(reads.size(cls[g]) if g in a.new else -1 for g in final)
        steps.append(((lambda t: _runtime._expand_legs(t, sizes)), (lambda g, y, t: g.sum_to_size(t.shape))))
    for gi, grp in enumerate(a.right):
        if len(grp) > 1:
            tail = sum(len(g) for g in a.right[gi:])
            steps.append((_method("flatten", -tail, -tail + len(grp) - 1), _reshaped))
    for gi, grp in enumerate(a.right):
        if not grp:
            steps.append((_method("unsqueeze", -sum(1 for g in a.right[gi + 1:] if g) - 1), _reshaped))

    def forward(t):
        for f, _ in steps:
            t = f(t)
        return t

    def vjp(g, y, t):
        values = [t]
        for f, _ in steps[:-1]:
            values.append(f(values[-1]))
        for (_, back), before in zip(reversed(steps), reversed(values)):
            g = back(g, y, before)
            y = before
        return g

    return forward, (vjp if steps else (lambda g, y, t: g),)


_RULES: dict[str, Callable[[V], tuple[Callable[..., Any], tuple[Callable[..., Any] | None, ...]]] | _Reading] = {
    **{name: _rule_unary for name in ops.ELEMENTWISE},
    **{op: _rule_operator for op in _OPERATORS},
    "neg": _rule_neg,
    "einsum": _rule_einsum,
    "where": _rule_where,
    "clamp": _rule_clamp,
    "sum": _rule_reduce,
    "mean": _rule_reduce,
    "softmax": _rule_softmax,
    "log_softmax": _rule_log_softmax,
    "detach": _rule_detach,
    "flatten": _rule_flatten,
    "unflatten": _rule_unflatten,
    "select": _Reading(_rule_select),
    "slice": _Reading(_rule_slice),
    "concat": _rule_concat,
    "max": _rule_minmax,
    "min": _rule_minmax,
    "gather": _rule_gather,
    "dropout": _Reading(_rule_dropout),
    "causal": _Reading(_rule_mask),
    "arange": _Reading(_rule_mask),
    "block_causal": _Reading(_rule_mask),
    "topk": _rule_topk,
    "topk_mask": _rule_topk_mask,
    "layernorm": _rule_layernorm,
    "rmsnorm": _rule_rmsnorm,
    "rope": _rule_rope,
    "rearrange": _Reading(_rule_einop),
    "reduce": _Reading(_rule_einop),
    "repeat": _Reading(_rule_einop),
}
