"""The table name of a checked value: the key every render backend (FIGURE, EQUATION, READING)
and `penrose.fmt.FORMAT` is indexed by.

The checker's op codes are coarser than the language's operation names ("unary" with its name,
"binop" with its operator ...); `op_key` refines them. `penrose.ops` owns the names; this module
only re-exports its rule, so the backends have one import to re-point when it moves.

>>> from penrose.check import V
>>> op_key(V("unary", attrs={"name": "gelu"})), op_key(V("mask", attrs={"kind": "block_causal"})), op_key(V("ref"))
('gelu', 'block_causal', None)
"""

from __future__ import annotations

from penrose.ops import OPS
from penrose.ops import key as op_key

NAMES = frozenset(OPS)  # every operation of the language: the key set of each backend's table

__all__ = ["NAMES", "op_key"]
