"""The checked IR: what `penrose.check` returns and every back end reads.

A few small records, torch-free. Their invariants, all established by the checker:

- **One body per `Checked`.** The diagram's top level and each block body is a `Checked`; they
  share one `Sizes` (size classes), one `dims` table (dim name -> class) and one `blocks` dict
  (block name -> its `Checked`, callees before their callers). `is_block` tells them apart.
- **Statements in source order.** `stmts` holds one `CStmt` per statement of the body, comments
  included (captions need them); the top level's dims, blocks and includes are collected by the
  checker and are not among them (a block's own dims are). `CStmt.value` is the checked `V` of an assignment or a return
  and None for every other statement; `types` are the types of its results (one per target of
  an assignment, one per returned value); `step` is the `# N) caption` step it belongs to.
- **SSA versions.** `CStmt.versions[i]` numbers the definitions of `targets[i]` in the body: 0
  for a name's first definition, one more for each reassignment (`Z = Z + h` over an input `Z`
  makes version 1). A `ref` value records the version it reads, so (name, version) identifies a
  tensor; an output reads the last version of its name.
- **Values are trees compared by identity.** `V` is frozen with `eq=False`: `id(v)` is a key,
  and a value read twice is two `ref`s. `V.op` is one of the checker's op codes — atoms `num`,
  `const`, `dimsize`, `ref`; plain-number arithmetic `neg`, `sbin`, `sfunc`; the operations of
  `penrose.ops` (`unary`, `binop`, `einsum`, `softmax`, ...); `block` (a call of a block
  instance) and `return`. `V.key` is the table's name for it (`ops.key_of`, set once: `relu`
  for a `unary`, `+` for a `binop`, `rearrange` for an `einop`; None for atoms and statements).
- **Attributes are typed records.** `V.attrs` is one frozen record of `penrose.attrs`, the one
  the row names (`ops.OPS[v.key].attrs`): leg positions already resolved to axes, keyword
  values already validated and defaulted. Read them as attributes, `v.of(Softmax).axis` (a
  TypeError names the op where the record is another), never by a string key.
- **Plain numbers are folded once.** A plain-number value the checker can compute at the
  declared sizes carries it in `V.const` (a `Folded`: the value, the dims and consts it reads,
  their size classes); `fixed(v, sizes)` is that value where no size it reads is free (read
  from the inputs at run time). The compiler, the interpreter and the language server read it
  instead of evaluating again; `Checked.constants` holds each const's value.
- **Types.** `TType.legs` and `TType.cls` are parallel: each leg's name and size class. `dtype`
  is float, int, bool, or `scalar` for a plain number (then legs are empty: `SCALAR`). `batched`
  means the tensor may carry leading batch dims at run time (an input's `...`). A value that
  yields several tensors (`split`, a block returning several) lists them in `outs`.
- **Declarations.** `decls` maps each input, param, buffer and block formal to its `Decl`
  (the IR tensor and its type); `outputs` is [(name, type)] (a block's are out0, out1, ...);
  `instances` maps each block instance to its block and `repeat` count.

>>> from penrose.checker import check
>>> from penrose.parser import parse
>>> c = check(parse("dim e = 3\\ninput x[e]\\ny = x * 2\\ny = y + x\\noutput y"))
>>> [(s.targets, s.versions, s.value.op, s.value.key) for s in c.stmts if s.value is not None]
[(('y',), (0,), 'binop', '*'), (('y',), (1,), 'binop', '+')]
>>> y0 = next(s.value for s in c.stmts if s.value is not None)
>>> y0.args[1].attrs, y0.args[1].const
(Num(shown=(), value=2), Folded(value=2, reads=(), classes=()))
"""

from __future__ import annotations

import builtins
import functools
import math
from dataclasses import dataclass, field
from typing import TypeVar

from penrose import ir, ops
from penrose.attrs import NONE, Attrs, Folded
from penrose.errors import Span
from penrose.sizes import Sizes

A = TypeVar("A", bound=Attrs)


@dataclass(frozen=True)
class TType:
    legs: tuple[str, ...]
    cls: tuple[int, ...]
    dtype: str = "float"  # float | int | bool | scalar
    batched: bool = False


SCALAR = TType((), (), "scalar", False)


@dataclass(frozen=True, eq=False)
class V:
    """One checked operation: its operator, arguments, attributes and result type."""

    op: str
    args: tuple[V, ...] = ()
    attrs: Attrs = NONE
    type: TType = SCALAR
    outs: tuple[TType, ...] = ()  # result types when the op yields several (split, block calls)
    span: Span = field(default_factory=Span)
    const: Folded | None = None  # a plain number known when checking: its value, computed once

    @functools.cached_property
    def key(self) -> str | None:
        """The table's name for this value (`ops.key_of`): computed once, when first read."""
        return ops.key_of(self.op, self.attrs)

    @property
    def legs(self) -> tuple[str, ...]:
        return self.type.legs

    def of(self, kind: builtins.type[A]) -> A:
        """Its attributes as the record `kind` (a base such as `Axis` too); a TypeError if not."""
        a = self.attrs
        if not isinstance(a, kind):
            raise TypeError(f"{self.key or self.op} carries {type(a).__name__}, not {kind.__name__}")
        return a


def fixed(v: V, sizes: Sizes) -> int | float | None:
    """The plain number `v` comes to as the checker folded it (`V.const`), where no size it reads
    comes from the inputs at run time; else None (the generated code computes it then)."""
    f = v.const
    if f is None or any(sizes.is_free(c) for c in f.classes):
        return None
    return f.value


@dataclass
class CStmt:
    stmt: ir.Stmt
    targets: tuple[str, ...] = ()
    value: V | None = None
    types: tuple[TType, ...] = ()
    step: int | None = None
    versions: tuple[int, ...] = ()  # SSA version of each target (0 for its first definition)


@dataclass
class Decl:
    tensor: ir.Tensor
    type: TType


@dataclass
class Instance:
    name: str
    block: str
    repeat: int | None
    span: Span
    shared: bool = False  # `repeat N shared`: one copy of the block's parameters, applied N times

    @property
    def stacked(self) -> int | None:
        """How many copies of the block the instance holds in a list (a ModuleList; its state-dict
        paths `inst.0.`, `inst.1.`, ...), or None where it is the block itself (one call, or shared)."""
        return None if self.shared else self.repeat

    @property
    def copies(self) -> int:
        """How many copies of the block's parameters the instance holds."""
        return self.stacked or 1


@dataclass
class Checked:
    """A checked diagram (or block body): values typed, sizes resolved."""

    diagram: ir.Diagram
    name: str
    sizes: Sizes
    dims: dict[str, int]  # name -> class
    decls: dict[str, Decl]  # inputs, params, buffers, formals
    stmts: list[CStmt]  # in order (comments included, for captions)
    outputs: list[tuple[str, TType]]
    blocks: dict[str, Checked]
    instances: dict[str, Instance]
    labels: dict[str, str]
    warnings: list[tuple[str, Span]]
    is_block: bool = False
    captions: dict[int, str] = field(default_factory=dict)  # step -> text
    constants: dict[str, int | float] = field(default_factory=dict)  # const name -> its value, folded once

    @property
    def inputs(self) -> list[Decl]:
        return [d for d in self.decls.values() if d.tensor.kind in ("input", "formal")]

    @property
    def params(self) -> list[Decl]:
        return [d for d in self.decls.values() if d.tensor.kind == "param"]

    @property
    def buffers(self) -> list[Decl]:
        return [d for d in self.decls.values() if d.tensor.kind == "buffer"]

    def size(self, cls: int) -> int | None:
        return self.sizes.size(cls)

    def dim_sizes(self) -> dict[str, int | None]:
        return {n: self.sizes.size(c) for n, c in self.dims.items()}

    def param_count(self) -> int:
        """Learnable parameters, blocks and repeats included."""
        total = sum(math.prod(self.size(c) or 0 for c in d.type.cls) for d in self.params)
        for inst in self.instances.values():
            total += self.blocks[inst.block].param_count() * inst.copies
        return total


    def _repr_svg_(self) -> str | None:
        """The figure, for notebooks."""
        from penrose import display  # a hook the package binds to the renderer

        return display.svg(self)
