"""The checker's tables: reserved names, inits, dtypes, number ranges and size limits.

Data the checker (`penrose.check`) checks a diagram against, kept apart from the rules that
use it, the way the table of operations (`penrose.ops`) keeps the functions of the language:

- IDENT: what a name of the language looks like (a letter, then letters, digits, '_');
- MODULE_ATTRS: attributes of `torch.nn.Module` a param, buffer or instance may not shadow
  (tests keep it in sync with `dir(torch.nn.Module)`), GENERATED: names the generated module
  itself uses, PEN_KEYWORDS: the keywords of `.pen`;
- RESERVED and `reserved(name, place)`: the one table of what Python and the generated module
  reserve, which every identifier the compiler emits is checked against (`penrose.compiler`);
- FUNCTIONS: the functions of the language (`ops.FUNCTIONS`); INITIALISERS: each initialiser
  once (`Initialiser`: its keywords with their defaults and rules, `ops.RULES`, and the
  `torch.nn.init` call the compiler emits and the interpreter runs), INITS its keywords alone;
  DTYPES: the tensor dtypes;
- FLOAT32_MAX, INT64_MAX: the largest numbers torch takes as a scalar;
- LIMITS: the sizes the checker refuses as too big (`Limits`), also `penrose.checker.LIMITS`.

Torch-free.
"""

from __future__ import annotations

import builtins
import keyword
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from penrose import ops
from penrose.errors import PenroseCheckError

IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def quoted(name: str) -> bool:
    """A quoted name (`self`, `_bias`, `output`): a state-dict name the language's own rules would refuse."""
    return len(name) > 2 and name[0] == name[-1] == "`"


def unquote(name: str) -> str:
    """The name a quoted name stands for (`self` is self); other names as they are."""
    return name[1:-1] if quoted(name) else name

# Attributes of torch.nn.Module and names the generated source uses (tests keep this list in sync
# with dir(torch.nn.Module)); a param, buffer or instance with one of these names would clash.
MODULE_ATTRS = frozenset(
    """T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda
    double dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter
    get_submodule half ipu load_state_dict modules mtia named_buffers named_children named_modules
    named_parameters parameters register_backward_hook register_buffer register_forward_hook
    register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module
    register_parameter register_state_dict_post_hook register_state_dict_pre_hook requires_grad_
    set_extra_state set_submodule share_memory smart_apply state_dict to to_empty train training
    type xpu zero_grad reset_parameters""".split()
)

# ---- what Python and the generated module reserve: the one table every emitted name meets ----
# A generated module is `import collections`, `import torch`, ShapeError, the run-time helpers
# (penrose/runtime.py: every one's name starts with '_'), one class per diagram and block, then
# `Model = <the top class>`. Its identifiers come from three places:
# - user names: params, buffers and instances become attributes of `self` (state-dict names);
#   inputs, block arguments and assigned tensors become locals of a method (and inputs its keyword
#   arguments); diagram, file and block names become class names (through camel case);
# - generated names: those below, plus temporaries `_1, _2, ...`, the sizes read at run time
#   (`_<dim>`), and `_INPUTS_<entry>` / `<Entry>Outputs` for entries;
# - Python's own: keywords and the builtins the generated code reads.
# User names start with a letter, generated locals with '_', so the two meet only in this table.
# The checker refuses a user name the table reserves where it would stand (`reserved`), the
# compiler renames what it may (class names, the names of its own locals and attributes).
PYTHON_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)
BUILTINS = frozenset(dir(builtins))
RESERVED = {
    # module-level names of the generated source: a class or a local must not shadow them
    "module": frozenset({"torch", "collections", "ShapeError"}),
    # what a method of the module reads besides its arguments and the module's names: `self`,
    # and the builtins it calls (`abs` of a size known at run time)
    "method": frozenset({"self", "abs"}),
    # a method's own generated locals and parameters (user locals never start with '_')
    "locals": frozenset({"_extra", "_unexpected", "_sizes", "_device", "_dtype", "_split"}),
    # class attributes of a generated module, besides torch.nn.Module's (MODULE_ATTRS): the
    # compiler moves `Outputs` (`<Entry>Outputs`) aside to `_Outputs` when a param takes its name
    "class": frozenset({"Outputs", "_EQUATIONS", "_INPUTS"}),
}


def reserved(name: str, place: str) -> str | None:
    """Why `name` cannot stand at `place` in generated source, or None when it can.

    place: "class" (a class of the module), "local" (a method's argument or local), "attribute"
    (a param, buffer or instance: an attribute of the module), "method" (an entry's method).

    >>> reserved("None", "class")
    'a Python keyword'
    >>> reserved("ShapeError", "class")
    'a name the generated module defines'
    >>> reserved("extra", "local") is None
    True
    """
    if name in PYTHON_KEYWORDS:
        return "a Python keyword"
    if place == "class" and name in BUILTINS:
        return "a Python builtin"
    if name in RESERVED["module"] or (place == "class" and (name == "Model" or name.startswith("_"))):
        return "a name the generated module defines"
    if place == "local" and (name in RESERVED["method"] or name in RESERVED["locals"]):
        return "a name the generated method reads or defines"
    if place in ("attribute", "method") and (name in MODULE_ATTRS or name.startswith("_")):
        return "an attribute of the generated module"
    if place == "method" and name in RESERVED["class"]:
        return "an attribute of the generated module"
    return None


# names the checker refuses for a tensor, a const or a block: the table's (its builtins are the
# language's functions, refused as such), and a few more kept free for readers of the code
GENERATED = RESERVED["module"] | frozenset({"self", "super", "math", "None", "True", "False", "inf"})
PEN_KEYWORDS = frozenset({"dim", "const", "input", "param", "buffer", "output", "return", "block", "include", "label", "as", "repeat", "shared", "unsaved"})

# the functions of the language and their arguments: the table of operations (penrose/ops.py)
FUNCTIONS = ops.FUNCTIONS


def _xavier_bounds(values: dict[str, float], shape: Sequence[int | None]) -> dict[str, float]:
    """xavier's range: +-gain * sqrt(6 / (fan_in + fan_out)), the fans the first and last sizes
    (a size 0 counts 1: the tensor is empty, the bound only has to be finite; so does a size
    known only at run time, which the compiler refuses for a parameter before it asks)."""
    fan_in, fan_out = (shape[0] or 1, shape[-1] or 1) if shape else (1, 1)
    bound = values["gain"] * math.sqrt(6.0 / (fan_in + fan_out))
    return {"a": -bound, "b": bound}


def _fan_in_bounds(values: dict[str, float], shape: Sequence[int | None]) -> dict[str, float]:
    """fan_in's range: +-gain / sqrt(fan_in), the fan-in the first size (a weight written
    [in, out], as `x W` reads it): torch's `nn.Linear` and `nn.Conv` weights' default (their
    kaiming_uniform with a = sqrt(5)). A size 0 or one known only at run time counts 1."""
    fan_in = (shape[0] or 1) if shape else 1
    bound = values["gain"] / math.sqrt(fan_in)
    return {"a": -bound, "b": bound}


@dataclass(frozen=True)
class Initialiser:
    """One initialiser of the language (`param W[d, e] ~ uniform(a=-1, b=1)`), described once for
    the checker, the compiler and the interpreter:

    - keywords: keyword -> (default, rule), the rules those of the table of operations (ops.RULES);
    - function: the `torch.nn.init` function that fills the tensor (in place, under no_grad);
    - positional / by_keyword: the function's arguments after the tensor, in order, named as
      the keywords (or as `derive` names them); random: it also takes `generator=`;
    - made: no torch.nn.init function: the values a module computes for itself (`causal`,
      `arange`, `rotary`...); each backend computes them in its own way from `by_keyword`;
    - derive: the function's arguments from the keywords (defaults filled) and the tensor's
      shape, where they are not the keywords themselves (xavier's bound).

    The compiler emits `torch.nn.init.<function>(tensor, *positional, **by_keyword)`; the
    interpreter calls that same function with the same numbers, so both draw the same values
    from a seeded generator.
    """

    keywords: dict[str, tuple[float, str]]
    function: str
    positional: tuple[str, ...] = ()
    by_keyword: tuple[str, ...] = ()
    random: bool = False
    made: bool = False  # values a module computes for itself (causal, arange, rotary...), not a torch.nn.init call
    derive: Callable[[dict[str, float], Sequence[int | None]], dict[str, float]] | None = None

    def arguments(self, given: dict[str, float], shape: Sequence[int | None]) -> tuple[tuple[float, ...], dict[str, float]]:
        """(positional, keyword) arguments of `function` after the tensor, as floats, for the
        keywords a diagram gives (the others take their defaults) and the tensor's shape."""
        values = {k: float(given.get(k, default)) for k, (default, _) in self.keywords.items()}
        if self.derive is not None:
            values = self.derive(values, shape)
        return tuple(values[k] for k in self.positional), {k: values[k] for k in self.by_keyword}


# the initialisers of the language; a param or buffer without `~` takes DEFAULT_INIT's defaults
INITIALISERS = {
    "normal": Initialiser({"mean": (0.0, "finite"), "std": (0.02, "nonneg")}, "normal_", by_keyword=("mean", "std"), random=True),
    "zeros": Initialiser({}, "zeros_"),
    "ones": Initialiser({}, "ones_"),
    "constant": Initialiser({"value": (0.0, "finite")}, "constant_", positional=("value",)),
    "uniform": Initialiser({"a": (0.0, "finite"), "b": (1.0, "finite")}, "uniform_", positional=("a", "b"), random=True),
    "xavier": Initialiser({"gain": (1.0, "nonneg")}, "uniform_", positional=("a", "b"), random=True, derive=_xavier_bounds),
    "fan_in": Initialiser({"gain": (1.0, "nonneg")}, "uniform_", positional=("a", "b"), random=True, derive=_fan_in_bounds),
    "eye": Initialiser({}, "eye_"),
    # what a module computes for itself (an `unsaved` buffer's usual init): no torch.nn.init
    # function; the compiler emits the values' expression (compiler._made_node) and the
    # interpreter computes them its own way (interpreter._made_values)
    "causal": Initialiser({}, "", made=True),
    "arange": Initialiser({}, "", made=True),
    **{name: Initialiser({"base": (10000.0, "positive")}, "", by_keyword=("base",), made=True)
       for name in ("rotary", "rotary_cos", "rotary_sin")},
}
DEFAULT_INIT = "normal"


def init_call(init, shape: Sequence[int | None]) -> tuple[Initialiser, tuple[float, ...], dict[str, float]]:
    """A declared init (an `ir.Init` the checker passed, its arguments numbers; None: the
    default) as (its row, the positional and keyword arguments of the row's function)."""
    row = INITIALISERS[DEFAULT_INIT if init is None else init.name]
    given = {} if init is None else {k: v.value for k, v in init.kwargs}
    args, kwargs = row.arguments(given, shape)
    return row, args, kwargs


# init -> keyword -> (default, rule): what the checker, the LSP and the lexer read
INITS = {name: row.keywords for name, row in INITIALISERS.items()}

DTYPES = ("float", "int", "bool")
FLOAT32_MAX = 3.4028234663852886e38  # a larger literal overflows torch's scalar conversion (write inf)
INT64_MAX = 2**63 - 1


@dataclass
class Limits:
    """What the checker refuses as too big; raise a limit here or with its environment variable.

    A field left at None reads its environment variable, else the built-in default:

    - tensor_bytes: the largest param or buffer, in bytes as float32 (PENROSE_MAX_TENSOR_BYTES;
      default 2**34, 16 GiB). A size override (`penrose.compile(text, d=...)`) meets it too.
    - total_bytes: all params and buffers together, blocks and repeats counted
      (PENROSE_MAX_TOTAL_BYTES; default 2**36, 64 GiB).
    - repeat: the largest `repeat` count (PENROSE_MAX_REPEAT; default 10,000).
    - block_depth: how deep block calls may nest, a block calling a block calling a block...
      (PENROSE_MAX_BLOCK_DEPTH; default 100). Each level is a nested Python call in the compiled
      forward (4 frames), the standalone source (4) and the interpreter (5); 100 levels take
      about 410 and 510 of Python's default 1,000 frames, and leave the rest to the caller.
    - expanded: the statements one call of the diagram runs, each block body counted once per
      run (`repeat` counts and nesting multiplied) (PENROSE_MAX_EXPANDED; default 500,000). The
      compiled module builds a copy of a block per run, so this bounds its size and build time
      too (500,000 statements: at most 250,000 copies, a few seconds and about 1 GiB).

    >>> from penrose.checker import LIMITS
    >>> LIMITS.value("repeat")
    10000
    """

    tensor_bytes: int | None = None
    total_bytes: int | None = None
    repeat: int | None = None
    block_depth: int | None = None
    expanded: int | None = None

    _ENV = {"tensor_bytes": "PENROSE_MAX_TENSOR_BYTES", "total_bytes": "PENROSE_MAX_TOTAL_BYTES", "repeat": "PENROSE_MAX_REPEAT",
            "block_depth": "PENROSE_MAX_BLOCK_DEPTH", "expanded": "PENROSE_MAX_EXPANDED"}
    _DEFAULT = {"tensor_bytes": 2**34, "total_bytes": 2**36, "repeat": 10_000, "block_depth": 100, "expanded": 500_000}

    def value(self, name: str) -> int:
        set_here = getattr(self, name)
        if set_here is not None:
            return int(set_here)
        env = self._ENV[name]
        text = os.environ.get(env, "").strip()
        if not text:
            return self._DEFAULT[name]
        try:
            n = int(text.replace("_", ""))
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f == int(f)):
                raise PenroseCheckError(f"{env} must be a whole number, got {text!r}") from None
            n = int(f)
        if n < 1:
            raise PenroseCheckError(f"{env} must be at least 1, got {text!r}")
        return n

    @staticmethod
    def how_to_raise(name: str) -> str:
        return f"raise it with {Limits._ENV[name]}=N or penrose.checker.LIMITS.{name} = N"


LIMITS = Limits()
