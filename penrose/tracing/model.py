"""The tracer's working state: leg classes, penrose values, torch views of them, expressions.

A torch value of the traced graph becomes a `View`: a penrose tensor (`PVal`, whose legs are
named and ordered its own way) and, per torch axis, which of its legs that axis is (`Cls`), or
None for an axis of size 1 the penrose tensor does not carry. A transpose or permute changes the
view only, never the tensor: Penrose diagrams have named legs, not axis positions.

Legs that must be one index (an element-wise sum's aligned axes, a block's instances) are
unified (`Classes`); a tensor never holds one class twice, so a union that would make it do so
is refused. Names come last (`penrose.tracing.write`). Torch-free.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

BATCH = "BATCH"  # the implicit leading batch axis of a view (never a leg of any penrose tensor)


class Cls:
    """A leg class: one index of the diagram (a dim once named)."""

    __slots__ = ("id", "size", "parent", "vals", "role", "origin", "merge", "hint", "order", "pref")
    _ids = itertools.count()

    def __init__(self, size: int, role: str = "", origin: str = "", merge: tuple = (), hint: str | None = None):
        self.id = next(Cls._ids)
        self.size = int(size)
        self.parent: Cls | None = None
        self.vals: set = set()  # ids of the penrose tensors with a leg of this class
        self.role = role  # a naming preference ('in_last', 'out', 'head', 'key', ...)
        self.origin = origin  # for the index legend: where the leg first appears
        self.merge = tuple(merge)  # the classes a merged leg is made of, in order
        self.hint = hint  # a name the user gave (dims=)
        self.order = None  # first appearance, set when naming
        self.pref = None  # a letter the user wrote for it (an einsum spec's)

    def __repr__(self) -> str:
        return f"Cls#{self.id}[{self.size}]"


class LegClash(Exception):
    """A union that would give one tensor the same leg twice (or join different sizes)."""


class Classes:
    """Union-find over leg classes, with the tensors each class appears on."""

    def __init__(self):
        self.all: list[Cls] = []
        self.deferred: list[tuple[Cls, Cls]] = []  # wished-for unions, tried once the required ones are done

    def new(self, size, role="", origin="", merge=(), hint=None) -> Cls:
        c = Cls(size, role, origin, merge, hint)
        self.all.append(c)
        return c

    @staticmethod
    def find(c: Cls) -> Cls:
        root = c
        while root.parent is not None:
            root = root.parent
        while c.parent is not None and c.parent is not root:
            c.parent, c = root, c.parent
        return root

    def same(self, a: Cls, b: Cls) -> bool:
        return self.find(a) is self.find(b)

    def register(self, pval) -> None:
        roots = [self.find(c) for c in pval.legs]
        if len({id(r) for r in roots}) != len(roots):
            raise LegClash("a tensor with the same leg twice")
        for r in roots:
            r.vals.add(pval.id)

    def can_union(self, a: Cls, b: Cls, depth: int = 0) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return True
        if ra.size != rb.size or (ra.vals & rb.vals):
            return False
        if ra.hint and rb.hint and ra.hint != rb.hint:
            return False
        if ra.merge and rb.merge:  # one merged index: the same factors
            if len(ra.merge) != len(rb.merge) or depth > 20:
                return False
            return all(self.can_union(x, y, depth + 1) for x, y in zip(ra.merge, rb.merge))
        return True

    def union(self, a: Cls, b: Cls) -> None:
        """Join two classes (and, for merged legs, their factors); LegClash when they cannot be one index."""
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return
        if not self.can_union(ra, rb):
            raise LegClash(f"legs of sizes {ra.size} and {rb.size} cannot be one index")
        factors = list(zip(ra.merge, rb.merge)) if ra.merge and rb.merge else []
        if rb.id < ra.id:
            ra, rb = rb, ra
        rb.parent = ra
        ra.vals |= rb.vals
        ra.role = ra.role or rb.role
        ra.origin = ra.origin or rb.origin
        ra.merge = ra.merge or rb.merge
        ra.hint = ra.hint or rb.hint
        ra.pref = ra.pref or rb.pref
        for x, y in factors:
            self.union(x, y)

    def wish(self, a: Cls, b: Cls) -> None:
        """A union that reads better (an einsum's shared letter) but is not needed."""
        self.deferred.append((a, b))

    def grant_wishes(self) -> None:
        for a, b in self.deferred:
            if self.can_union(a, b):
                self.union(a, b)
        self.deferred.clear()

    def snapshot(self):
        return [(c, c.parent, set(c.vals), c.role, c.origin, c.merge, c.hint, c.pref) for c in self.all]

    def restore(self, snap) -> None:
        for c, parent, vals, role, origin, merge, hint, pref in snap:
            c.parent, c.vals, c.role, c.origin, c.merge, c.hint, c.pref = parent, vals, role, origin, merge, hint, pref


_pval_ids = itertools.count()


class PVal:
    """A penrose tensor: legs in its own order; how it is made (`stmt`) or declared (`kind`)."""

    __slots__ = ("id", "legs", "batched", "dtype", "region", "kind", "param", "stmt", "src", "hint", "node", "value", "span",
                 "persistent", "made")

    def __init__(self, legs, batched, dtype, region, kind, *, param=None, src=None, hint=None, node=None):
        self.id = next(_pval_ids)
        self.legs = list(legs)
        self.batched = batched
        self.dtype = dtype  # float | int | bool
        self.region = region
        self.kind = kind  # input | param | buffer | formal | stmt | callout
        self.param = param  # the local name of a param or buffer
        self.stmt = None  # the statement that makes it (kind stmt / callout)
        self.src = src  # (file, line) of the user's line that made it
        self.hint = hint  # a name wish
        self.node = node  # the export node's name
        self.value = None  # a param's tensor (for `~ ones` / `~ zeros`)
        self.span = None  # where the user's code first reads a param or buffer
        self.persistent = True  # a buffer registered with persistent=False is not in the state dict
        self.made = None  # the init of an `unsaved` buffer the tracer makes (a rotary table forward computes)

    def __repr__(self) -> str:
        return f"PVal#{self.id}({self.kind}, {self.legs})"


@dataclass
class View:
    """A torch value: a penrose tensor and, per torch axis after the batch, its leg (or None)."""

    pval: PVal
    axes: list  # Cls | None, per non-batch torch axis
    batched: bool

    @property
    def full(self) -> list:
        return ([BATCH] if self.batched else []) + list(self.axes)


# ---- expressions ---------------------------------------------------------------------------------------
# They refer to leg classes (`Cls`, joined by union-find while lowering) and penrose values (`PVal`),
# not to names: names and what is written inline are decided after the whole graph is lowered.
# Then `penrose.tracing.write` turns them into `penrose.ir` records, printed by `penrose.fmt`.


@dataclass
class Ref:
    pval: PVal


@dataclass
class Num:
    value: float


@dataclass
class Leg:
    """A leg (or dim) by name: a function's leg argument, a slice's new dim, sqrt(d)."""

    cls: Cls


@dataclass
class Str:
    text: str


@dataclass
class Pattern:
    """An einops pattern: per side, entries that are a leg, '1', or a group of legs."""

    left: list  # entries: Cls | "1" | tuple[Cls, ...]
    right: list


@dataclass
class LegList:
    legs: list


@dataclass
class TensorList:
    items: list


@dataclass
class Call:
    fn: str
    args: list
    kwargs: list = field(default_factory=list)  # (key, expr)


@dataclass
class BinOp:
    op: str
    a: object
    b: object


@dataclass
class Neg:
    a: object


@dataclass
class Einsum:
    """Operands with, per penrose leg, an index; the output's indices; the classes an index binds."""

    operands: list  # expressions
    terms: list  # per operand: list of index keys, in the operand's leg order
    out: list  # index keys of the result, in its leg order
    binds: dict  # index key -> list of classes it binds (output's first)
    out_cls: dict  # index key -> the result's class (for output indices)


def children(e) -> list:
    """The sub-expressions of an expression, in order (a leaf has none): what every walk over
    the trace IR descends into."""
    if isinstance(e, Call):
        return [*e.args, *(v for _, v in e.kwargs)]
    if isinstance(e, BinOp):
        return [e.a, e.b]
    if isinstance(e, Neg):
        return [e.a]
    if isinstance(e, Einsum):
        return list(e.operands)
    if isinstance(e, TensorList):
        return list(e.items)
    return []


# ---- statements and regions -------------------------------------------------------------------------


@dataclass
class Stmt:
    outs: list  # PVals
    expr: object  # an expression, or None for a block call
    src: tuple | None = None
    inline_ok: bool = True


@dataclass
class CallStmt:
    region: object  # the called Region (the first of a chain)
    args: list = field(default_factory=list)  # PVals of the caller
    outs: list = field(default_factory=list)  # PVals of the caller
    src: tuple | None = None
    chain: list = field(default_factory=list)  # the regions of a `repeat` chain
    shared: bool = False  # the chain is one module applied len(chain) times (`repeat N shared`)
    keep: bool = False  # written though nothing reads its value (a tied param handed up for the state dict)


class Region:
    """One call of a module: a block instance (or the top level), its statements and interface."""

    def __init__(self, key, fqn, module, parent, is_block):
        self.key = key
        self.fqn = fqn
        self.module = module
        self.parent = parent
        self.is_block = is_block
        self.items: list = []  # Stmt | CallStmt
        self.formals: list = []  # (inner PVal, outer PVal)
        self.formal_of: dict = {}  # outer pval id -> inner PVal
        self.returns: list = []  # (inner PVal, outer PVal)
        self.return_of: dict = {}  # inner pval id -> outer PVal
        self.params: dict = {}  # state-dict name -> PVal declared here
        self.call: CallStmt | None = None
        self.children: list = []
        self.forward_range = None  # (file, first line, last line) of the module's forward
        self.block = None  # the BlockDef it instantiates
        self.closed = False

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1

    def ancestors(self):
        r = self
        while r is not None:
            yield r
            r = r.parent

    def rel_name(self) -> str:
        """The instance name under the enclosing block ('attn', 'layers.0')."""
        base = self.parent.fqn if self.parent is not None else ""
        if base and self.fqn.startswith(base + "."):
            return self.fqn[len(base) + 1 :]
        return self.fqn

    def __repr__(self) -> str:
        return f"Region({self.fqn or '<top>'})"
