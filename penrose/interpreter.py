"""Checked diagram → values, directly: a second implementation of the language.

The interpreter walks the checked IR and evaluates every value with `torch.einsum` and plain
torch operations; an element-wise function from its form in the table of operations
(`penrose.ops.Op.form`, in torch's primitives), not the torch callable the compiler emits. It
shares no code with the compiler (no generated source, no `exec`, no lowering to matmuls, no
fused attention), so the two can check each other: the differential
fuzzer (`tests/interpreter/test_differential.py`) asserts compiled module == standalone source ==
interpreter, in values and gradients, on whole random programs. Users can debug with it too:
it runs a diagram statement by statement and names the input a shape error comes from.

    >>> import penrose, torch
    >>> text = "dim e = 2\\ninput x[e]\\nparam W[e, e] ~ eye\\ny = einsum('i,ij->j', x, W) * 2\\noutput y"
    >>> interpret(text, torch.tensor([1.0, 3.0])).tolist()
    [2.0, 6.0]
    >>> model = penrose.compile(text, seed=0)
    >>> x = torch.randn(5, 2)  # any leading batch dims, as the compiled module takes
    >>> torch.allclose(interpret(text, x, params=model.state_dict()), model(x))
    True

Parameters are named as in the compiled module's `state_dict()`: top-level params and buffers
by name, a block instance's as `inst.W`, a repeated instance's as `inst.0.W`. Without `params`
they are initialised from the diagram's init specs under a seeded generator. The diagram runs
in the dtype of its float inputs: float params are cast to it, so a float32 state_dict can be
checked in float64. Dropout is the identity unless `training=True`.

Every operation of the language has one evaluator in `OPERATIONS`, keyed by the names of the
one table of operations (`penrose.ops.OPS`), and the atoms (numbers, sizes, references, block
calls) one in `ATOMS`; each is a function of the frame, the value and its evaluated arguments.
Values are evaluated bottom-up with an explicit stack, so deep nesting needs no recursion.
"""

from __future__ import annotations

import collections
import collections.abc
import math
import re
from typing import Any

import torch

from penrose.attrs import Aligned, Axis, BlockCall, Clamp, DimSize, Dropout, Einop, Einsum, Flatten, LayerNorm, Mask, Num, RMSNorm, Ref, Rope, Select, Slice, Split, TopK, Unflatten
from penrose import ir, ops
from penrose.checked import Checked, fixed
from penrose.errors import PenroseArgumentError, PenroseError, PenroseShapeError, seed_value
from penrose.loader import load, loadable
from penrose.tables import init_call

__all__ = ["ATOMS", "OPERATIONS", "Interpreter", "init_params", "interpret"]


# ---- entry points ------------------------------------------------------------------------------


def interpret(diagram, *args, params=None, training=False, sizes=None, **inputs):
    """Evaluate a diagram (a `Checked`, a path or `.pen` text) on its inputs.

    Returns what the compiled module's forward returns: one tensor, or a named tuple of the
    outputs in order. `params` maps state_dict names to tensors (a compiled module's
    `state_dict()`, or the module itself); `training=True` makes dropout active; `sizes`
    ({dim: size}) sizes the diagram as `penrose.load(..., sizes=...)` does.

    >>> interpret("dim e = 2\\ninput x[e]\\ny = sigmoid(x)\\noutput y", torch.zeros(2)).tolist()
    [0.5, 0.5]
    """
    return Interpreter(diagram, params, training=training, sizes=sizes)(*args, **inputs)


class Interpreter:
    """A diagram bound to its parameters, callable like the compiled module.

    >>> run = Interpreter("dim e = 2\\ninput x[e]\\ny = x + 1\\nz = y * y\\noutput y, z")
    >>> out = run(x=torch.ones(2))
    >>> out.z.tolist()
    [4.0, 4.0]
    """

    def __init__(self, diagram, params=None, *, training=False, seed=0, sizes=None, include_paths=()):
        if not loadable(diagram):  # the one loader (penrose.load): a path, text, Diagram, Checked or compiled module
            raise PenroseError(f"cannot interpret a {type(diagram).__name__}; pass .pen text, a path or a Checked diagram")
        self.checked = load(diagram, sizes=sizes, include_paths=include_paths)
        if not isinstance(training, bool):
            raise PenroseArgumentError(f"training must be True or False, got {training!r} ({type(training).__name__})")
        if params is None:
            params = init_params(self.checked, seed=seed_value(seed))
        elif isinstance(params, torch.nn.Module):  # the live tensors, so gradients reach them
            params = {**dict(params.named_parameters()), **dict(params.named_buffers())}
        elif not isinstance(params, collections.abc.Mapping):
            raise PenroseArgumentError(
                f"params maps state_dict names to tensors (a dict, or a module), got {type(params).__name__}")
        bad = next(((k, v) for k, v in params.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
        if bad is not None:
            raise PenroseArgumentError(f"params maps state_dict names to tensors; {bad[0]!r} maps to a {type(bad[1]).__name__}"
                                       if isinstance(bad[0], str) else f"params' keys are state_dict names, got {bad[0]!r}")
        self.params = dict(params)
        self.training = training
        names = tuple(n for n, _ in self.checked.outputs)
        self.Outputs = collections.namedtuple(_camel(self.checked.name) + "Outputs", names) if len(names) > 1 else None

    def __repr__(self):
        return f"Interpreter({self.checked.name!r}, {len(self.params)} tensor(s))"

    def __call__(self, *args, **inputs):
        c = self.checked
        values = _bind_inputs(c, args, inputs)
        runtime, dtype, device = _check_inputs(c, values)
        if dtype is None:  # no float input: the params' dtype
            dtype = next((p.dtype for p in self.params.values() if p.is_floating_point()), torch.get_default_dtype())
        frame = _Frame(self, c, "", runtime, dtype, device)
        for d in c.inputs:
            frame.env[(d.tensor.name, 0)] = values[d.tensor.name]
        outs = frame.run()
        if self.Outputs is None:
            return outs[0]
        return self.Outputs(*outs)


def init_params(checked: Checked, seed: int = 0, dtype=torch.float32) -> dict:
    """Fresh parameters and buffers for a checked diagram, initialised as its init specs say
    (under a generator seeded with `seed`), named as in the compiled module's state_dict.

    >>> import penrose
    >>> sorted(init_params(penrose.load("dim e = 2\\nparam W[e, e] ~ eye\\ninput x[e]\\ny = einsum('i,ij->j', x, W)\\noutput y")))
    ['W']
    """
    g = torch.Generator().manual_seed(seed)
    out: dict = {}

    def visit(body: Checked, prefix: str):
        for d in body.params + body.buffers:
            shape = []
            for leg, cls in zip(d.tensor.legs, d.type.cls):
                n = body.size(cls)
                if n is None:
                    raise PenroseShapeError(f"{d.tensor.kind} {prefix}{d.tensor.name!r}: leg {leg!r} has no size", d.tensor.span)
                shape.append(n)
            out[prefix + d.tensor.name] = _initialised(d.tensor, shape, g, dtype)
        for inst in body.instances.values():
            blk = body.blocks[inst.block]
            if inst.stacked is None:
                visit(blk, f"{prefix}{inst.name}.")
            else:
                for i in range(inst.stacked):
                    visit(blk, f"{prefix}{inst.name}.{i}.")

    visit(checked, "")
    return out


def _made_values(name: str, shape: tuple, values: dict[str, float]) -> torch.Tensor:
    """The values of the inits a module computes for itself (docs/language.md), written here
    apart from the compiler's runtime: the interpreter shares no code with it."""
    n = shape[-1] if shape else 1
    if name == "causal":
        rows, cols = torch.meshgrid(torch.arange(shape[-2]), torch.arange(n), indexing="ij")
        made = (cols <= rows).to(torch.float32)
    elif name == "arange":
        made = torch.arange(n, dtype=torch.float32)
    else:
        half = n if name == "rotary" else n // 2
        inverse = torch.pow(torch.tensor(values["base"], dtype=torch.float32), torch.arange(half, dtype=torch.float32) / half).reciprocal()
        if name == "rotary":
            made = inverse
        else:
            angles = torch.arange(shape[-2], dtype=torch.float32).unsqueeze(1) * inverse.repeat(2).unsqueeze(0)
            made = torch.cos(angles) if name == "rotary_cos" else torch.sin(angles)
    return made.expand(shape)


def _camel(name: str) -> str:
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name) if w]
    text = "".join(w[:1].upper() + w[1:] for w in words)
    return text if text[:1].isalpha() else "Diagram" + text


def _initialised(t: ir.Tensor, shape, g, dtype) -> torch.Tensor:
    """A fresh tensor filled as its init says: the table's torch.nn.init function
    (penrose.tables.INITIALISERS), called with the numbers the compiled module passes it."""
    row, args, kwargs = init_call(t.init, shape)
    x = torch.empty(shape, dtype=dtype)
    if row.made and t.init is not None:  # a made init is always written (the default is normal)
        x.copy_(_made_values(t.init.name, tuple(shape), kwargs))
    else:
        getattr(torch.nn.init, row.function)(x, *args, **kwargs, **({"generator": g} if row.random else {}))
    return x


# ---- inputs ------------------------------------------------------------------------------------


def _bind_inputs(c: Checked, args, inputs) -> dict:
    names = [d.tensor.name for d in c.inputs]
    if len(args) > len(names):
        raise PenroseShapeError(f"{len(args)} positional inputs given but the diagram takes {len(names)}: " + ", ".join(names))
    values = dict(zip(names, args))
    for k, x in inputs.items():
        if k not in names:
            raise PenroseShapeError(f"unexpected input {k!r}; the diagram takes " + (", ".join(names) or "no inputs"))
        if k in values:
            raise PenroseShapeError(f"input {k!r} given twice (by position and by name)")
        values[k] = x
    for n in names:
        if values.get(n) is None:
            d = c.decls[n]
            raise PenroseShapeError(f"missing input {n!r} with legs [{', '.join(d.tensor.legs)}]", d.tensor.span)
    return values


_ID_DTYPES = (torch.int64, torch.int32)  # what torch.nn.functional.embedding takes


def _check_inputs(c: Checked, values: dict):
    """Validate each input's dtype, rank and sizes; returns (free sizes by class root, the
    float dtype to run in, the device)."""
    S = c.sizes
    runtime: dict = {}
    given_by: dict = {}
    batch, batch_of = None, None
    dtype = device = dtype_of = device_of = None
    for d in c.inputs:
        t = d.tensor
        x = values[t.name]
        if not isinstance(x, torch.Tensor):
            raise PenroseShapeError(f"input {t.name!r} must be a tensor, got {type(x).__name__}", t.span)
        n = len(t.legs)
        if x.dim() < n:
            raise PenroseShapeError(
                f"input {t.name!r} has {x.dim()} dimension(s) but needs at least {n} for legs [{', '.join(t.legs)}]", t.span
            )
        floating = x.is_floating_point() or x.is_complex()
        if t.dtype == "float" and not floating:
            raise PenroseShapeError(f"input {t.name!r} must be a floating-point tensor, got {x.dtype}", t.span)
        if t.dtype == "int" and x.dtype not in _ID_DTYPES:  # uint8 would index as a mask, bool is no id
            raise PenroseShapeError(f"input {t.name!r} must hold integer ids, got {x.dtype} (ids are torch.int64 or torch.int32)", t.span)
        if t.dtype == "bool" and x.dtype != torch.bool:
            raise PenroseShapeError(f"input {t.name!r} must be a bool mask, got {x.dtype}", t.span)
        if floating:  # one float dtype and one device for every input (docs/language.md)
            if dtype is not None and x.dtype != dtype:
                raise PenroseShapeError(f"input {t.name!r} is {x.dtype} but input {dtype_of!r} is {dtype}; floating inputs share one dtype", t.span)
            if dtype is None:
                dtype, dtype_of = x.dtype, t.name
        if device is not None and x.device != device:
            raise PenroseShapeError(f"input {t.name!r} is on {x.device} but input {device_of!r} is on {device}", t.span)
        if device is None:
            device, device_of = x.device, t.name
        lead = tuple(x.shape[: x.dim() - n])
        if lead:
            if batch is not None:
                try:
                    batch = tuple(torch.broadcast_shapes(batch, lead))
                except RuntimeError:
                    raise PenroseShapeError(
                        f"input {t.name!r} has batch dims {list(lead)} but input {batch_of!r} has {list(batch)}; they must broadcast",
                        t.span,
                    ) from None
            else:
                batch, batch_of = lead, t.name
        for leg, cls, got in zip(t.legs, d.type.cls, x.shape[x.dim() - n :]):
            root = S.find(cls)
            if S.is_free(cls):
                if root in runtime and runtime[root] != got:
                    raise PenroseShapeError(
                        f"input {t.name!r} leg {leg!r} has size {got} but input {given_by[root]!r} gave it size {runtime[root]}",
                        t.span,
                    )
                runtime.setdefault(root, got)
                given_by.setdefault(root, t.name)
            else:
                want = S.size(cls)
                if want != got:
                    raise PenroseShapeError(f"input {t.name!r} leg {leg!r} must have size {want}, got {got}", t.span)
    return runtime, dtype, device


# ---- evaluation --------------------------------------------------------------------------------


class _Frame:
    """One body being run: the top level or one block instance (its params under `prefix`)."""

    def __init__(self, interp: Interpreter, body: Checked, prefix: str, runtime: dict, dtype, device):
        self.interp = interp
        self.body = body
        self.prefix = prefix
        self.runtime = runtime  # class root -> size, for legs only inputs carry
        self.dtype = dtype
        self.device = device
        self.env: dict = {}  # (name, SSA version) -> value

    # sizes and tensors
    def size(self, cls: int, span=None) -> int:
        S = self.body.sizes
        if S.is_free(cls):
            root = S.find(cls)
            if root not in self.runtime:
                raise PenroseShapeError(f"leg {S.label[root]!r} gets its size from the inputs, but none carries it", span)
            return self.runtime[root]
        n = S.size(cls)
        if n is None:
            raise PenroseShapeError(f"leg {S.label[S.find(cls)]!r} has no size; pass it to load()", span)
        return n

    def param(self, name: str, span=None) -> torch.Tensor:
        key = self.prefix + name
        params = self.interp.params
        decl = self.body.decls[name]
        want = tuple(self.size(c) for c in decl.type.cls)
        if key not in params and not decl.tensor.saved:  # an `unsaved` buffer: not in a state dict, made from its init
            params[key] = _initialised(decl.tensor, want, torch.Generator().manual_seed(0), torch.float32)
        if key not in params:
            raise PenroseShapeError(f"no tensor {key!r} among the params ({len(params)} given)", span)
        x = params[key]
        if tuple(x.shape) != want:
            raise PenroseShapeError(f"{decl.tensor.kind} {key!r} has shape {list(x.shape)}, the diagram says {list(want)}", span)
        if self.dtype is not None and x.is_floating_point() and x.dtype != self.dtype:
            x = x.to(self.dtype)  # run in the inputs' dtype
        if self.device is not None and x.device != self.device:
            x = x.to(self.device)
        return x

    # statements
    def run(self) -> list:
        """Execute the body; the top level returns its outputs, a block its returned values."""
        outputs: list = []
        current: dict = {}  # name -> latest value, for 'output'
        for d in self.body.inputs:
            current[d.tensor.name] = self.env[(d.tensor.name, 0)]
        unread = _unread_splits(self.body)
        for s in self.body.stmts:
            st = s.stmt
            if isinstance(st, ir.Assign) and id(s) in unread:
                continue  # a split whose pieces nobody reads is not made (nor is its operand), as compiled
            if isinstance(st, ir.Assign):
                value = self.evaluate(s.value)
                parts = (value,) if len(s.targets) == 1 else tuple(value)
                if len(parts) != len(s.targets):  # pragma: no cover - the checker counts targets
                    raise PenroseError(f"{len(s.targets)} targets but {len(parts)} values", st.span)
                for t, ver, x in zip(s.targets, s.versions, parts):
                    self.env[(t, ver)] = x
                    current[t] = x
            elif isinstance(st, ir.Output):
                outputs.extend(current[n] for n in st.names)
            elif isinstance(st, ir.Return):
                assert s.value is not None  # the checker gives every return its value
                return [self.evaluate(v) for v in s.value.args]
        return outputs

    def evaluate(self, root) -> Any:
        """The value of a V, children first, with an explicit stack (no recursion limit)."""
        done: dict = {}
        stack = [(root, False)]
        while stack:
            v, ready = stack.pop()
            if id(v) in done:
                continue
            if v.const is not None and (known := fixed(v, self.body.sizes)) is not None:
                done[id(v)] = known  # a plain number the checker folded: read, not computed again
                continue
            if not ready:
                stack.append((v, True))
                stack.extend((a, False) for a in reversed(v.args) if id(a) not in done)
                continue
            try:
                done[id(v)] = evaluator(v)(self, v, [done[id(a)] for a in v.args])
            except (RuntimeError, IndexError) as e:  # torch refused: say where, in the diagram's terms
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise PenroseShapeError(f"{v.key or v.op}: {first}", v.span) from e
        return done[id(root)]


def _axis(x, axis: int) -> int:
    """A leg's dimension counted from the end, so leading batch dims never shift it."""
    return axis - len(x.legs)


def _aligned(value, x, align):
    """`value` (the value of V `x`) with its legs permuted and size-1 axes inserted so that they
    line up with the result's legs; `align[j]` is the leg of x at result leg j (None: absent)."""
    if not isinstance(value, torch.Tensor):
        return value
    fn = aligner(x, align)
    return value if fn is None else fn(value)


def aligner(x, align):
    """The function `_aligned` applies to the value of `x`, worked out once (None where it is the
    identity: a plain number, or legs already in place); `penrose.gradients` plans with it."""
    if align is None or x.type.dtype == "scalar":
        return None
    n = len(x.legs)
    present = [i for i in align if i is not None]
    permute = present != list(range(n))
    if not permute and len(align) == n:
        return None

    def aligned(value):
        lead = value.dim() - n
        if permute:
            value = value.permute(*range(lead), *(lead + i for i in present))
        shape = list(value.shape[:lead])
        k = lead
        for i in align:
            if i is None:
                shape.append(1)
            else:
                shape.append(value.shape[k])
                k += 1
        return value.reshape(shape)

    return aligned


def _scalar_safe(fn):
    """A Python-number operation whose errors become positioned PenroseShapeErrors."""

    def run(v, *args):
        try:
            return fn(*args)
        except (ZeroDivisionError, ValueError, OverflowError) as e:
            raise PenroseShapeError(f"{v.key} of plain numbers {', '.join(map(repr, args))}: {e}", v.span) from None

    return run


_UNREAD: dict = {}  # id of a checked body -> (the body, ids of its splits whose pieces nobody reads)


def _unread_splits(body: Checked) -> set:
    """The split statements none of whose pieces is read: the compiled module makes none of
    them, so their operands (gather's ids among them) are not evaluated there either."""
    from penrose.views import read_counts

    found = _UNREAD.get(id(body))
    if found is None or found[0] is not body:
        reads = read_counts(body)
        found = (body, {id(s) for s in body.stmts if isinstance(s.stmt, ir.Assign) and s.value is not None
                        and s.value.op == "split" and not any((t, v) in reads for t, v in zip(s.stmt.targets, s.versions))})
        if len(_UNREAD) > 256:
            _UNREAD.clear()
        _UNREAD[id(body)] = found
    return found[1]


def _flat(x):
    """A floor division's operand, detached: its gradient is zero wherever it exists, and torch
    has no derivative for floor_divide (a backward pass through `x // 2` raised)."""
    return x.detach() if isinstance(x, torch.Tensor) else x


def _operator(fn):
    """An operator (+ - * / // ** and comparisons) on tensors (operands aligned by leg) or on
    plain numbers (Python's arithmetic, as the sizes are Python numbers)."""
    scalar = _scalar_safe(fn)

    def evaluate(fr, v, args):
        align = v.of(Aligned).align
        if align is None:  # two plain numbers
            return scalar(v, *args)
        a, b = (_aligned(val, x, al) for val, x, al in zip(args, v.args, align))
        if v.type.dtype == "float":  # `ids * 1` is a float tensor, as the checker types it (torch's would be int64)
            dtype = fr.dtype or torch.get_default_dtype()
            a, b = (t.to(dtype) if isinstance(t, torch.Tensor) and x.type.dtype == "int" else t for t, x in ((a, v.args[0]), (b, v.args[1])))
        return fn(a, b)

    return evaluate


class _Torch:
    """The primitives of the table's element-wise forms (`ops.Op.form`) on tensors: the
    interpreter computes each function from its form, not with the torch callable the compiler
    emits, so a wrong callable in a row shows as a difference."""

    exp, log, log1p, expm1, tanh, erf, sqrt, abs = torch.exp, torch.log, torch.log1p, torch.expm1, torch.tanh, torch.erf, torch.sqrt, torch.abs
    where, clamp = torch.where, torch.clamp


def _elementwise(name: str):
    """An element-wise function of the table, from its form; on a plain number (exp, sqrt ...) too."""
    row = ops.OPS[name]
    scalar = _scalar_safe(lambda a: row.call(a, ops.SCALAR))

    def evaluate(fr, v, args):
        (a,) = args
        if not isinstance(a, torch.Tensor):
            return scalar(v, a)
        return row.call(a, _Torch, v.attrs.values())

    return evaluate


def _minmax(reduce, pair):
    """max / min: over a leg (a reduction), or of two operands entry by entry (a number clamps)."""
    bound = {torch.maximum: "min", torch.minimum: "max"}[pair]

    def evaluate(fr, v, args):
        if v.op == "reduce":
            return reduce(args[0], _axis(v.args[0], v.of(Axis).axis))
        a, b = (_aligned(val, x, al) for val, x, al in zip(args, v.args, v.of(Aligned).align))
        if not isinstance(a, torch.Tensor):
            a, b = b, a
        if not isinstance(b, torch.Tensor):
            return torch.clamp(a, **{bound: b})
        return pair(a, b)

    return evaluate


def _num(fr, v, args):
    return v.of(Num).value


def _dimsize(fr, v, args):
    return fr.size(v.of(DimSize).cls, v.span)


def _ref(fr, v, args):
    ref = v.of(Ref)
    if ref.kind in ("param", "buffer"):
        return fr.param(ref.name, v.span)
    return fr.env[(ref.name, ref.version)]


def _neg(fr, v, args):
    return -args[0]


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _einsum(fr, v, args):
    """torch.einsum with one letter per distinct label (labels are names, possibly synthetic
    '...0' ones); '...' on batched operands, and in the output unless the batch is summed."""
    ein = v.of(Einsum)
    terms, out = ein.terms, tuple(ein.out)
    batched = [x.type.batched for x in v.args]
    keep_batch = any(batched) and not ein.sum_batch
    labels = list(dict.fromkeys([l for t in terms for l in t] + list(out)))
    if len(labels) > len(_LETTERS):
        return _contract_wide(terms, out, batched, keep_batch, args)
    letter = dict(zip(labels, _LETTERS))
    spec = ",".join(("..." if b else "") + "".join(letter[l] for l in t) for t, b in zip(terms, batched))
    spec += "->" + ("..." if keep_batch else "") + "".join(letter[l] for l in out)
    return torch.einsum(spec, *args)


def _contract_wide(terms, out, batched, keep_batch, args) -> torch.Tensor:
    """The same contraction without letters (more distinct labels than einsum has): diagonals,
    then operands multiplied one by one with broadcasting, each label summed once no later
    operand and no output needs it."""
    prepared = []
    for term, x, b in zip(terms, args, batched):
        term = list(term)
        while len(set(term)) != len(term):  # a repeated label: take the diagonal
            i = next(i for i, l in enumerate(term) if term.index(l) != i)
            j = term.index(term[i])
            n = len(term)
            x = x.diagonal(dim1=j - n, dim2=i - n)  # the diagonal goes last
            label = term[j]
            term = [l for k, l in enumerate(term) if k not in (i, j)] + [label]
        if not b:
            x = x.reshape(x.shape[x.dim() - len(term) :])
        prepared.append((term, x, b))
    acc_labels: list = []
    acc = None
    for k, (term, x, _b) in enumerate(prepared):
        later = {l for t, _, _ in prepared[k + 1 :] for l in t} | set(out)
        labels = acc_labels + [l for l in term if l not in acc_labels]
        xa = _spread(x, term, labels)
        acc = xa if acc is None else _spread(acc, acc_labels, labels) * xa
        gone = [i for i, l in enumerate(labels) if l not in later]
        if gone:
            n = len(labels)
            acc = acc.sum(dim=[i - n for i in gone])
            labels = [l for l in labels if l in later]
        acc_labels = labels
    assert acc is not None  # an einsum has at least one operand
    n = len(acc_labels)
    acc = acc.permute(*range(acc.dim() - n), *(acc.dim() - n + acc_labels.index(l) for l in out))
    if not keep_batch and acc.dim() > n:
        acc = acc.sum(dim=list(range(acc.dim() - n)))
    return acc


def _spread(x, term, labels):
    """x (its last len(term) dims labelled `term`) permuted into `labels` order, size 1 where absent."""
    n = len(term)
    lead = x.dim() - n
    order = sorted(range(n), key=lambda i: labels.index(term[i]))
    x = x.permute(*range(lead), *(lead + i for i in order))
    shape = list(x.shape[:lead]) + [1] * len(labels)
    for i in order:
        shape[lead + labels.index(term[i])] = x.shape[lead + order.index(i)]
    return x.reshape(shape)


def _softmax(fr, v, args):
    return torch.softmax(args[0], dim=_axis(v.args[0], v.of(Axis).axis))


def _log_softmax(fr, v, args):
    return torch.log_softmax(args[0], dim=_axis(v.args[0], v.of(Axis).axis))


def _along(w, dim: int):
    """A one-leg weight shaped to broadcast along dimension `dim` (counted from the end)."""
    return w.reshape([-1] + [1] * (-dim - 1))


def _layernorm(fr, v, args):
    (x,) = args
    ln = v.of(LayerNorm)
    dim = _axis(v.args[0], ln.axis)
    mean = x.mean(dim, keepdim=True)
    var = (x - mean).pow(2).mean(dim, keepdim=True)
    y = (x - mean) / torch.sqrt(var + ln.eps)
    if ln.weight:
        y = y * _along(fr.param(ln.weight, v.span), dim)
    if ln.bias:
        y = y + _along(fr.param(ln.bias, v.span), dim)
    return y


def _wide(dtype):
    """float64 stays float64; half, bfloat16 and float32 compute in float32 (rmsnorm, rope)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rmsnorm(fr, v, args):
    """RMSNorm over one leg, in float32 (float64 in a float64 model: the language says so), cast back."""
    (x,) = args
    rms = v.of(RMSNorm)
    dim = _axis(v.args[0], rms.axis)
    wide = _wide(x.dtype)
    xf = x.to(wide)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim, keepdim=True) + rms.eps)
    if rms.weight:
        y = y * _along(fr.param(rms.weight, v.span).to(wide), dim)
    return y.to(x.dtype)


def _kept(x, k, dim):
    """True at the k largest entries of x along dim."""
    idx = x.topk(k, dim=dim).indices
    return torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter(dim, idx, True)


def _topk(fr, v, args):
    (x,) = args
    keep = _kept(x, v.of(TopK).k, _axis(v.args[0], v.of(Axis).axis))
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _topk_mask(fr, v, args):
    return _kept(args[0], v.of(TopK).k, _axis(v.args[0], v.of(Axis).axis))


def _reduce(fn):
    def evaluate(fr, v, args):
        return fn(args[0], _axis(v.args[0], v.of(Axis).axis))

    return evaluate


def _dropout(fr, v, args):
    return torch.nn.functional.dropout(args[0], v.of(Dropout).p, fr.interp.training)


def _detach(fr, v, args):
    return args[0].detach()


def _clamp(fr, v, args):
    return torch.clamp(args[0], min=v.of(Clamp).min, max=v.of(Clamp).max)


def _where(fr, v, args):
    m, a, b = (_aligned(val, x, al) for val, x, al in zip(args, v.args, v.of(Aligned).align))
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):  # two numbers: a float tensor
        a = torch.tensor(a, dtype=fr.dtype, device=m.device)
    return torch.where(m, a, b)


def _mask(fr, v, args):
    """causal(t, p): True where p <= t; block_causal(t, p, block=B): where p // B <= t // B;
    arange(t): the positions 0, 1, ... along t, in the model's floating dtype."""
    if v.of(Mask).kind == "arange":
        return torch.arange(fr.size(v.type.cls[0], v.span), device=fr.device, dtype=fr.dtype or torch.get_default_dtype())
    n_t, n_p = (fr.size(c, v.span) for c in v.type.cls)
    t = torch.arange(n_t, device=fr.device)
    p = torch.arange(n_p, device=fr.device)
    mask = v.of(Mask)
    if mask.kind == "block_causal":
        t, p = t // mask.block, p // mask.block
    return p[None, :] <= t[:, None]


def _gather(fr, v, args):
    table, ids = args
    n = table.shape[table.dim() - len(v.args[0].legs)]
    src, what = v.args[1], "the ids"
    if src.op == "ref":
        what = f"input {src.of(Ref).name!r}"
    tab = repr(v.args[0].of(Ref).name) if v.args[0].op == "ref" else "the table"
    label = f"gather: {what} indexes leg {v.args[0].legs[0]!r} of {tab}"
    if ids.dtype not in _ID_DTYPES:  # a uint8 or bool tensor would index as a mask
        raise PenroseShapeError(f"{label}: ids must be torch.int64 or torch.int32, got {ids.dtype}", v.span)
    if ids.numel() and not ids.is_meta:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n:  # no id is read from the end: the rows are 0 to n - 1
            raise PenroseShapeError(f"{label}: id {lo if lo < 0 else hi} is outside 0 to {n - 1}", v.span)
    return table[ids]


def _split(fr, v, args):
    (x,) = args
    dim = _axis(v.args[0], v.of(Axis).axis)
    parts, start = [], 0
    for n in v.of(Split).sizes:
        parts.append(x.narrow(dim, start, n))
        start += n
    if start != x.shape[dim]:
        raise PenroseShapeError(f"split: the parts add up to {start} but the leg has size {x.shape[dim]}", v.span)
    return tuple(parts)


def _concat(fr, v, args):
    """Parts joined along one leg; their batch dims broadcast (a param joined to an input)."""
    n = len(v.legs)
    lead = torch.broadcast_shapes(*(x.shape[: x.dim() - n] for x in args))
    parts = [x.expand(*lead, *x.shape[x.dim() - n :]) for x in args]
    return torch.cat(parts, dim=_axis(v, v.of(Axis).axis))


def _unflatten(fr, v, args):
    (x,) = args
    dim = x.dim() + _axis(v.args[0], v.of(Axis).axis)
    return x.reshape(*x.shape[:dim], *v.of(Unflatten).sizes, *x.shape[dim + 1 :])


def _flatten(fr, v, args):
    (x,) = args
    n = len(v.args[0].legs)
    a, b = x.dim() - n + v.of(Flatten).start, x.dim() - n + v.of(Flatten).end
    return x.reshape(*x.shape[:a], -1 if x.numel() else math.prod(x.shape[a : b + 1]), *x.shape[b + 1 :])


def _einop(fr, v, args):
    """rearrange / reduce / repeat by full shapes: batch legs flattened into one leading axis,
    one reshape to the elementary axes, one permute (reduced axes last, then flattened into one
    and reduced), new axes broadcast by expand, one reshape to the result, the batch restored."""
    (x,) = args
    a = v.of(Einop)
    n = len(v.args[0].legs)
    batch = list(x.shape[: x.dim() - n])
    nb = math.prod(batch)
    leg_sizes = list(x.shape[x.dim() - n :])
    cls = {aid: c for aid, c, _ in a.axes}
    size = {}
    for grp, s in zip(a.left, leg_sizes):
        if len(grp) == 1:
            size[grp[0]] = s
        for g in grp if len(grp) > 1 else ():
            size[g] = fr.size(cls[g], v.span)
    for g in a.new:
        size[g] = fr.size(cls[g], v.span)
    elem = [g for grp in a.left for g in grp]
    y = x.reshape([nb] + [size[g] for g in elem])
    final = [g for grp in a.right for g in grp]
    kept = [g for g in final if g not in a.new]
    reduced = [g for g in elem if g not in kept]
    y = y.permute([0] + [1 + elem.index(g) for g in kept + reduced])
    r = math.prod(size[g] for g in reduced)
    if a.sum_batch:  # the batch axis is reduced with the rest: move it last too
        y = y.movedim(0, -1).reshape(*[size[g] for g in kept], r * nb)
    elif reduced:
        y = y.reshape(nb, *[size[g] for g in kept], r)
    if reduced or a.sum_batch:
        y = {"sum": lambda t: t.sum(-1), "mean": lambda t: t.mean(-1), "max": lambda t: t.amax(-1),
             "min": lambda t: t.amin(-1), "prod": lambda t: t.prod(-1)}[a.reduction](y)
    lead = [] if a.sum_batch else [nb]
    if a.new:
        y = y.reshape(lead + [1 if g in a.new else size[g] for g in final]).expand(lead + [size[g] for g in final])
    out = [math.prod(size[g] for g in grp) for grp in a.right]
    return y.reshape(([] if a.sum_batch else batch) + out)


def _select(fr, v, args):
    (x,) = args
    dim = x.dim() + _axis(v.args[0], v.of(Axis).axis)
    _inside(x, dim, v.of(Select).index, 1, f"select of leg {v.args[0].legs[v.of(Axis).axis]!r}", v.span)
    return x[(slice(None),) * dim + (v.of(Select).index,)]


def _inside(x, dim, start, length, what, span):
    """Indices start .. start + length - 1 of leg dim exist (a negative start counts from the end)."""
    n = x.shape[dim]
    first = start + n if start < 0 else start
    if first < 0 or first + length > n:
        where = f"index {start}" if length == 1 else f"indices {start} to {start + length - 1}"
        raise PenroseShapeError(f"{what}: {where} outside a leg of size {n}", span)


def _slice(fr, v, args):
    (x,) = args
    dim = x.dim() + _axis(v.args[0], v.of(Axis).axis)
    start, length = v.of(Slice).start, v.of(Slice).length
    _inside(x, dim, start, length, f"slice of leg {v.args[0].legs[v.of(Axis).axis]!r}", v.span)
    start = start + x.shape[dim] if start < 0 else start
    return x[(slice(None),) * dim + (slice(start, start + length),)]


def _rope(fr, v, args):
    """Rotate-half rotary embedding in float32 (float64 in a float64 model): entry i of the rotated leg pairs with i + n/2,
    and position p along the position leg turns the pair by p * base**(-2i/n)."""
    (x,) = args
    src = v.args[0]
    legs = len(src.legs)
    pos, axis = v.of(Rope).pos, v.of(Axis).axis
    n, length = x.shape[_axis(src, axis)], x.shape[_axis(src, pos)]
    wide = _wide(x.dtype)
    inv_freq = 1.0 / (v.of(Rope).base ** (torch.arange(0, n, 2, device=x.device, dtype=wide) / n))
    angle = torch.arange(length, device=x.device, dtype=wide)[:, None] * inv_freq[None, :]
    angle = torch.cat([angle, angle], dim=-1)  # (position, rotated)
    if pos > axis:
        angle = angle.T
    shape = [1] * legs
    shape[pos], shape[axis] = length, n
    angle = angle.reshape(shape)
    xf = x.to(wide)
    dim = _axis(src, axis)
    first, second = xf.narrow(dim, 0, n // 2), xf.narrow(dim, n // 2, n - n // 2)
    y = xf * angle.cos() + torch.cat([-second, first], dim=dim) * angle.sin()
    return y.to(x.dtype)


def _block(fr, v, args):
    call = v.of(BlockCall)
    blk = fr.body.blocks[call.block]
    inst = call.instance
    if call.repeat is None:
        outs = _call_block(fr, blk, f"{fr.prefix}{inst}.", args)
    else:
        x, *fixed = args  # the first argument is carried, the others reach every copy unchanged
        for i in range(call.repeat):
            (x,) = _call_block(fr, blk, f"{fr.prefix}{call.prefix(i)}", [x, *fixed])
        outs = [x]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _call_block(fr, blk: Checked, prefix: str, args) -> list:
    runtime = dict(fr.runtime)
    sub = _Frame(fr.interp, blk, prefix, runtime, fr.dtype, fr.device)
    S = blk.sizes
    for d, x in zip(blk.inputs, args):
        n = len(d.tensor.legs)
        if x.dim() < n:  # pragma: no cover - the checker matched the legs
            raise PenroseShapeError(f"block argument {d.tensor.name!r} has {x.dim()} dimension(s), needs {n}", d.tensor.span)
        for cls, got in zip(d.type.cls, x.shape[x.dim() - n :]):
            if S.is_free(cls):
                runtime.setdefault(S.find(cls), got)
        sub.env[(d.tensor.name, 0)] = x
    return sub.run()


# Every operation of the language (penrose.ops.OPS, the same names), and the atoms.
OPERATIONS = {
    **{name: _elementwise(name) for name in sorted(ops.ELEMENTWISE)},
    "+": _operator(lambda a, b: a + b),
    "-": _operator(lambda a, b: a - b),
    "*": _operator(lambda a, b: a * b),
    "/": _operator(lambda a, b: a / b),
    "//": _operator(lambda a, b: _flat(a) // _flat(b)),
    "**": _operator(lambda a, b: a**b),
    "<": _operator(lambda a, b: a < b),
    "<=": _operator(lambda a, b: a <= b),
    ">": _operator(lambda a, b: a > b),
    ">=": _operator(lambda a, b: a >= b),
    "==": _operator(lambda a, b: a == b),
    "!=": _operator(lambda a, b: a != b),
    "neg": _neg,
    "einsum": _einsum,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "topk": _topk,
    "topk_mask": _topk_mask,
    "sum": _reduce(lambda x, dim: x.sum(dim)),
    "mean": _reduce(lambda x, dim: x.mean(dim)),
    "max": _minmax(lambda x, dim: x.amax(dim), torch.maximum),
    "min": _minmax(lambda x, dim: x.amin(dim), torch.minimum),
    "dropout": _dropout,
    "detach": _detach,
    "clamp": _clamp,
    "where": _where,
    "causal": _mask,
    "arange": _mask,
    "block_causal": _mask,
    "gather": _gather,
    "split": _split,
    "concat": _concat,
    "flatten": _flatten,
    "unflatten": _unflatten,
    "rope": _rope,
    "rearrange": _einop,
    "reduce": _einop,
    "repeat": _einop,
    "select": _select,
    "slice": _slice,
}

ATOMS = {"num": _num, "const": _num, "dimsize": _dimsize, "ref": _ref, "block": _block}


def evaluator(v):
    """The function that evaluates a checked value: its operation's, or its atom's."""
    name = v.key
    fn = OPERATIONS.get(name) if name is not None else ATOMS.get(v.op)
    if fn is None:  # pragma: no cover - a new operation without an evaluator (a test keeps the tables equal)
        raise PenroseError(f"the interpreter cannot evaluate operation {name or v.op!r}", v.span)
    return fn
