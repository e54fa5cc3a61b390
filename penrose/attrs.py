"""The attribute records of the checked IR: one small frozen record per kind of operation.

A checked value (`penrose.checked.V`) carries what its operation needs in `V.attrs`, one of the
records below; each row of the table of operations (`penrose.ops.OPS`) names its record
(`Op.attrs`), and a test asserts that what the checker builds is an instance of it. Leg
positions are already resolved to axes (counted among the operand's non-batch legs) and keyword
values already validated and defaulted: a backend reads `v.of(Softmax).axis` (the record, or a
TypeError naming the op), never a string key, so the type checker sees every read. `Axis` and
`Aligned` are the bases of the records of operations along one axis and of element-wise
operations whose operands align by leg.

Keyword values written with the names of consts and dims (`clamp(x, min=-alpha)`) are kept as
written in `shown` (the keyword's checked value and its text), so figures and equations show
the names while the lowering reads the number.

Torch-free; imports nothing of penrose at run time.

>>> Softmax(axis=1).axis
1
>>> Unary("leaky_relu", (("slope", 0.2),)).keyword("slope")
0.2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Number = int | float
# per operand of an element-wise op: for each result leg, the operand's axis holding it (None: the
# operand lacks that leg, it broadcasts); None for a plain-number operand
Align = tuple[tuple[int | None, ...] | None, ...]


@dataclass(frozen=True, slots=True)
class Shown:
    """A keyword value as written with consts and dims: its checked value and its text."""

    key: str
    value: Any  # its checked value, a penrose.checked.V (this layer, below the IR's, names no V)
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Attrs:
    """The base of every record: the keyword values written with names (figures show those)."""

    shown: tuple[Shown, ...] = ()

    def keyword(self, key: str) -> Any:
        """The value of keyword `key` of the operation's row (its validated value, or default)."""
        return getattr(self, key)

    def written(self, key: str) -> Shown | None:
        """Keyword `key` as written with consts and dims, or None (a number literal, or absent)."""
        return next((s for s in self.shown if s.key == key), None)


# atoms --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Num(Attrs):
    """A number literal (inf included)."""

    value: Number


@dataclass(frozen=True, slots=True)
class Const(Num):
    """A read of `const NAME`: its value at the declared sizes (or as given to compile); a Num
    with a name."""

    name: str


@dataclass(frozen=True, slots=True)
class DimSize(Attrs):
    """The size of a dim (`d`, or `T.shape[i]`): its size class and the leg's name."""

    cls: int
    name: str


@dataclass(frozen=True, slots=True)
class Ref(Attrs):
    """A read of a tensor: its name, kind (input, param, buffer, formal, local) and SSA version."""

    name: str
    kind: str
    version: int = 0


# operations ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Axis(Attrs):
    """The base of an operation along one axis of its operand (softmax, layernorm, split, ...)."""

    axis: int


@dataclass(frozen=True, slots=True)
class Aligned(Attrs):
    """The base of an element-wise operation of several operands: per operand, for each result
    leg the operand's axis holding it (None: it broadcasts); None for a plain-number operand,
    and `align` None for an operator on two plain numbers."""

    align: Align | None = None

    @property
    def alignment(self) -> Align:
        """`align` of an operation on tensors (an operator on two plain numbers has none)."""
        if self.align is None:
            raise TypeError("an operator on two plain numbers aligns no legs")
        return self.align


@dataclass(frozen=True, slots=True)
class NoAttrs(Attrs):
    """An operation with nothing beyond its operands (neg, detach, gather, return)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BinOp(Aligned):
    """An operator: `op` (+ - * / // ** and comparisons); `align` for tensors, None for two numbers."""

    op: str


@dataclass(frozen=True, slots=True)
class Unary(Attrs):
    """An element-wise function of the table (on a tensor, or on a plain number), its keyword values."""

    name: str
    keywords: tuple[tuple[str, float], ...] = ()

    def keyword(self, key: str) -> Any:
        return dict(self.keywords)[key]

    def values(self) -> dict[str, float]:
        return dict(self.keywords)


@dataclass(frozen=True, slots=True)
class Einsum(Attrs):
    """A contraction: one term of labels per operand, the output term, the spec as written."""

    terms: tuple[tuple[str, ...], ...]
    out: tuple[str, ...]
    sum_batch: bool
    spec: str


@dataclass(frozen=True, slots=True)
class Softmax(Axis):
    """softmax and log_softmax: the axis normalised."""


@dataclass(frozen=True, slots=True)
class LayerNorm(Axis):
    """layernorm: the axis, its weight and bias params (names, or None), eps."""

    weight: str | None
    bias: str | None
    eps: float


@dataclass(frozen=True, slots=True)
class RMSNorm(Axis):
    """rmsnorm: the axis, its weight param (a name, or None), eps."""

    weight: str | None
    eps: float


@dataclass(frozen=True, slots=True)
class TopK(Axis):
    """topk and topk_mask: the axis and k."""

    k: int


@dataclass(frozen=True, slots=True)
class Reduce(Axis):
    """sum, mean, max, min over one axis."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair(Aligned):
    """max and min of two operands, entry by entry, aligned as an operator's."""

    name: str


@dataclass(frozen=True, slots=True)
class Dropout(Attrs):
    p: Number


@dataclass(frozen=True, slots=True)
class Clamp(Attrs):
    """clamp: its bounds (None: that side is open)."""

    min: Number | None
    max: Number | None


@dataclass(frozen=True, slots=True)
class Where(Aligned):
    """where(mask, a, b)."""


@dataclass(frozen=True, slots=True)
class Mask(Attrs):
    """causal, block_causal and arange (a leg's positions): `kind` is the function; `block` the block size (block_causal)."""

    kind: str
    block: int | None = None


@dataclass(frozen=True, slots=True)
class Split(Axis):
    """split: the axis cut and the parts' sizes."""

    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Concat(Axis):
    """concat: the axis joined."""

@dataclass(frozen=True, slots=True)
class Flatten(Attrs):
    """flatten: the first and last axis merged (inclusive)."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Unflatten(Axis):
    """unflatten: the axis split and the new legs' sizes."""

    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Rope(Axis):
    """rope: the position axis, the rotated axis, the frequency base."""

    pos: int
    base: float


@dataclass(frozen=True, slots=True)
class Einop(Attrs):
    """rearrange, reduce, repeat (`kind`), their pattern read against the operand.

    `left` and `right` are the pattern's groups as axis ids; `axes` maps each id to its size
    class and leg name; `new` are the ids repeat adds, `reduced` those reduce removes."""

    kind: str
    pattern: str
    reduction: str | None
    left: tuple[tuple[str, ...], ...]
    right: tuple[tuple[str, ...], ...]
    axes: tuple[tuple[str, int, str], ...]
    new: tuple[str, ...]
    reduced: tuple[str, ...]
    sum_batch: bool


@dataclass(frozen=True, slots=True)
class Select(Axis):
    index: int


@dataclass(frozen=True, slots=True)
class Slice(Axis):
    start: int
    length: int


@dataclass(frozen=True, slots=True)
class BlockCall(Attrs):
    """A call of a block: the block, the instance holding its params, its repeat count (or None);
    `shared`: a `repeat N shared`, one instance applied N times (its parameters tied)."""

    block: str
    instance: str
    repeat: int | None
    shared: bool = False

    def prefix(self, i: int) -> str:
        """The state-dict path of run `i`'s parameters below the caller: `inst.i.`, or `inst.` once for all (shared)."""
        return f"{self.instance}." if self.repeat is None or self.shared else f"{self.instance}.{i}."


NONE = NoAttrs()


@dataclass(frozen=True, slots=True)
class Folded:
    """A plain-number value known when checking, computed once by the checker.

    `value` at the declared sizes; `reads` the dims and consts it reads, with their values (for
    messages); `classes` the size classes of the dims it reads: where one is free (read from the
    inputs at run time) the generated code computes the number again at run time."""

    value: Number
    reads: tuple[tuple[str, Number], ...] = ()
    classes: tuple[int, ...] = ()
