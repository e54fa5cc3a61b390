"""The zoo's and Steerling's public arguments, checked in one place: types, ranges, finiteness
and labels, each refusal a `PenroseArgumentError` (a TypeError and a ValueError) naming the
argument; the same rules as argparse types for the command line; and names escaped for printing.

    >>> whole(3, "epochs", low=0)
    3
    >>> number(float("nan"), "lr", low=0)
    Traceback (most recent call last):
    ...
    penrose.errors.PenroseArgumentError: error: lr must be a finite number of at least 0, got nan
    >>> printable("cats\\x1b]0;owned\\x07")
    'cats\\\\x1b]0;owned\\\\x07'

What each check takes:

  number(v, name, low=, high=, low_open=, high_open=)  a real number (not a bool, not a string),
                                       finite, in the range; returns a float
  whole(v, name, low=, high=)          an int (numpy integers too; not a bool, not 3.0); returns it
  flag(v, name)                        True or False (not "false", not 0)
  choice(v, name, options)             one of the options (strings)
  task_labels(y, name, task, classes)  class ids 0..classes−1 (whole numbers), binary targets in
                                       [0, 1], any finite regression target
  concept_labels(c, name, kinds, ...)  binary and categorical columns in [0, 1], a categorical
                                       concept's columns summing to at most 1 in each row

`cli_whole(low=, high=)` and `cli_number(...)` are argparse `type=` functions with the same rules
on text written in ASCII digits; `COUNT` (at least 1), `NONNEGATIVE`, `SEED` (0 to 2³² − 1), `SEEDS` (a comma-separated list of them),
`WEIGHT` (finite, at least 0), `POSITIVE` (above 0) and `PROBABILITY` are the ones the commands
share. `printable(text)` escapes the control characters (C0, C1, DEL)
and the invisible format characters that reorder or hide text (bidirectional overrides,
zero-width characters) as `\\xNN` / `\\uNNNN`, so a name read from a file cannot move the cursor,
retitle the terminal or disguise itself when printed.
"""

from __future__ import annotations

import math
import numbers
import operator
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

from penrose.errors import PenroseArgumentError

__all__ = ["COUNT", "NONNEGATIVE", "POSITIVE", "PROBABILITY", "SEED", "SEEDS", "WEIGHT", "choice", "cli_device", "cli_number",
           "cli_whole", "concept_labels", "device_here", "flag", "is_invisible", "json_text", "number", "printable",
           "task_labels", "whole"]


def _bounds(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """' of at least 1', ' from 0 to 1', ' above 0', ' in (0, 1]' ... ('' without bounds)."""
    lo, hi = _shown_bound(low), _shown_bound(high)
    if low is not None and high is not None:
        if not low_open and not high_open:
            return f" from {lo} to {hi}"
        return f" in {'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"
    if low is not None:
        return f" above {lo}" if low_open else f" of at least {lo}"
    if high is not None:
        return f" below {hi}" if high_open else f" of at most {hi}"
    return ""


def _shown_bound(v: float | None) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}" if v is not None else ""


def _inside(v: float, low, high, low_open: bool, high_open: bool) -> bool:
    return ((low is None or (v > low if low_open else v >= low))
            and (high is None or (v < high if high_open else v <= high)))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def number(value: Any, name: str, *, low: float | None = None, high: float | None = None, low_open: bool = False,
           high_open: bool = False, error: type[Exception] = PenroseArgumentError) -> float:
    """`value` as a float: a real number (an int, a float, a NumPy scalar, a 0-d tensor), finite,
    inside the bounds; anything else an `error` (PenroseArgumentError, or the caller's own family,
    such as InterventionError) naming `name`."""
    what = f"a finite number{_bounds(low, high, low_open, high_open)}"
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a 0-d tensor or array
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be {what}, got {_shown(value)} ({type(value).__name__})")
    v = float(value)
    if not math.isfinite(v) or not _inside(v, low, high, low_open, high_open):
        raise error(f"{name} must be {what}, got {_shown(value)}")
    return v


def whole(value: Any, name: str, *, low: int | None = None, high: int | None = None,
          error: type[Exception] = PenroseArgumentError) -> int:
    """`value` as an int (Python or NumPy integers; not a bool, not a float such as 3.0), inside
    the bounds; anything else an `error` (as `number`'s) naming `name`."""
    what = f"a whole number{_bounds(low, high)}"
    try:
        v = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        v = None
    if v is None:
        raise error(f"{name} must be {what}, got {_shown(value)} ({type(value).__name__})")
    if not _inside(v, low, high, False, False):
        raise error(f"{name} must be {what}, got {_shown(value)}")
    return v


def flag(value: Any, name: str) -> bool:
    """True or False (a NumPy bool too); a string such as "false" or a number is refused."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise PenroseArgumentError(f"{name} must be True or False, got {_shown(value)} ({type(value).__name__})")


def choice(value: Any, name: str, options: Sequence[str]) -> str:
    """One of `options` (compared as given: no case folding)."""
    if not isinstance(value, str) or value not in options:
        raise PenroseArgumentError(f"{name} must be one of {', '.join(map(repr, options))}, got {_shown(value)}")
    return value


# ---- labels -----------------------------------------------------------------------------------


def _first_bad(bad, tensor) -> tuple[tuple[int, ...], float]:
    """(index, value) of the first True entry of `bad` (row-major)."""
    import torch

    flat = int(bad.reshape(-1).nonzero()[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(tensor.shape)))
    return index, tensor.reshape(-1)[flat].item()


def task_labels(y: Any, name: str, task: str, classes: int | None = None) -> None:
    """Task labels a loss can read: 'multiclass' — whole numbers 0..classes−1; 'binary' — in
    [0, 1] (0/1, or soft targets); 'regression' — anything finite (checked elsewhere). A
    PenroseArgumentError names the tensor, the first bad index and its value."""
    import torch

    if task not in ("multiclass", "binary") or not isinstance(y, torch.Tensor) or y.numel() == 0:
        return
    if y.is_complex():
        raise PenroseArgumentError(f"{name} holds complex numbers; {task} task labels are real")
    if task == "binary":
        bad = (y < 0) | (y > 1)
        if y.is_floating_point():
            bad = bad & torch.isfinite(y)  # (NaN and ±inf: `fit`'s finiteness check names them)
        rule = "a binary task's labels are 0 or 1 (or a probability between)"
    else:
        bad = (y < 0) | (y >= classes) if classes is not None else y < 0
        if y.is_floating_point():
            bad = (bad | (y != y.round())) & torch.isfinite(y)
        rule = (f"a multiclass task's labels are class ids 0..{classes - 1}" if classes is not None
                else "a multiclass task's labels are class ids, whole numbers from 0")
    if bool(bad.any()):
        index, value = _first_bad(bad, y)
        raise PenroseArgumentError(f"{name} holds {value!r} at index {index}; {rule}")


def concept_labels(c: Any, name: str, kinds: Sequence[str], units: Sequence[Sequence[int]] | None = None,
                   columns: Sequence[str] | None = None) -> None:
    """Concept labels the concept losses can read, column by column: 'binary' and 'categorical'
    columns in [0, 1] (soft labels allowed), the columns of a categorical concept (`units`)
    summing to at most 1 in every row (one value, or a distribution; all 0: no label); 'continuous'
    columns any finite number. A PenroseArgumentError
    names the tensor, the index, the value and the concept."""
    import torch

    if not isinstance(c, torch.Tensor) or c.numel() == 0 or c.dim() == 0 or c.shape[-1] != len(kinds):
        return  # (a wrong width is the diagram's own shape error, naming the leg)
    if c.is_complex():
        raise PenroseArgumentError(f"{name} holds complex numbers; concept labels are real")
    bounded = [i for i, kind in enumerate(kinds) if kind != "continuous"]
    if bounded:
        cols = c[..., bounded]
        bad = (cols < 0) | (cols > 1)
        if cols.is_floating_point():
            bad = bad & torch.isfinite(cols)
        if bool(bad.any()):
            index, value = _first_bad(bad, cols)
            col = bounded[index[-1]]
            index = index[:-1] + (col,)
            label = f" ({columns[col]!r})" if columns is not None else ""
            raise PenroseArgumentError(f"{name} holds {value!r} at index {index}: concept column {col}{label} is "
                                       f"{kinds[col]}, its labels are 0 to 1")
    for unit in units or ():
        if len(unit) < 2 or any(kinds[i] != "categorical" for i in unit):
            continue
        total = c[..., list(unit)].double().sum(-1)
        bad = (total > 1 + 1e-3) & torch.isfinite(total)  # (0: no label for that row, its loss 0)
        if bool(bad.any()):
            index, value = _first_bad(bad, total)
            label = f" ({', '.join(repr(columns[i]) for i in unit)})" if columns is not None else ""
            raise PenroseArgumentError(f"{name}: the columns {list(unit)}{label} of a categorical concept sum to "
                                       f"{value:g} in row {index}; a categorical concept takes one value (one-hot, "
                                       "or a distribution: at most 1 in all)")


# ---- the command line --------------------------------------------------------------------------


def _cli(check: Callable[[Any, str], Any], is_whole: bool) -> Callable[[str], Any]:
    def parse(text: str):
        import argparse

        from penrose.cli import ascii_number

        value = ascii_number(text, whole=is_whole)
        if value is None:
            kind = "a whole number" if is_whole else "a finite number"
            raise argparse.ArgumentTypeError(f"expected {kind} in ASCII digits, got {text!r}")
        try:
            return check(value, "")
        except PenroseArgumentError as e:
            raise argparse.ArgumentTypeError("expected " + e.message.removeprefix(" must be ")) from None

    return parse


def cli_whole(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """argparse type: a whole number in ASCII digits inside the bounds (`whole`'s rule).

    >>> cli_whole(low=1)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a whole number of at least 1, got 0
    """
    return _cli(lambda v, name: whole(v, name, low=low, high=high), True)


def cli_number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
               high_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in ASCII digits inside the bounds (`number`'s rule)."""
    return _cli(lambda v, name: number(v, name, low=low, high=high, low_open=low_open, high_open=high_open), False)


def cli_device(text: str) -> str:
    """argparse type: a torch device's name ('cpu', 'cuda', 'cuda:1', ...); whether this machine
    has it is `device_here`'s question, asked when the command runs (so a documented command line
    parses on any machine)."""
    import argparse

    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a device (cpu, cuda, cuda:1, ...), got {text!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def device_here(text: str | None, name: str = "device") -> None:
    """A PenroseArgumentError unless this machine has the device `text` (None: the default)."""
    import torch

    if text is None:
        return
    device = torch.device(text)
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise PenroseArgumentError(f"{name} {text!r}: no such CUDA device on this machine "
                                   f"({torch.cuda.device_count()} visible)")


# ---- printing ---------------------------------------------------------------------------------


def _unsafe(ch: str) -> bool:
    """A character that must not reach a terminal as it is: a control (Cc: C0, DEL, C1), a
    format character (Cf: bidirectional overrides, zero-width spaces and joiners), a line or
    paragraph separator (Zl, Zp), or a lone surrogate (Cs: a file name's undecodable byte)."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def printable(text: Any, keep: str = "") -> str:
    """`text` with each control and invisible format character written as an escape (`\\x1b`,
    `\\u202e`), but those in `keep` (a message's own line breaks: keep="\\n"); everything else,
    non-ASCII letters included, as it is."""
    s = str(text)
    if all(not _unsafe(ch) or ch in keep for ch in s):
        return s
    return "".join(_escape(ch) if _unsafe(ch) and ch not in keep else ch for ch in s)


def _escape(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def json_text(value: Any, **dumps: Any) -> str:
    """`json.dumps(value, ensure_ascii=False, **dumps)` with every control and invisible format
    character written as a JSON escape (`\\u009b`, `\\u202e`): the same JSON, safe to print
    (json.dumps escapes C0 controls only)."""
    import json

    text = json.dumps(value, ensure_ascii=False, **dumps)
    if all(not _unsafe(ch) or ch == "\n" for ch in text):
        return text
    return "".join(json.dumps(ch)[1:-1] if _unsafe(ch) and ch != "\n" else ch for ch in text)


def is_invisible(text: str) -> bool:
    """True when `text` shows nothing: empty, or only spaces, controls and format characters
    (a name of zero-width spaces)."""
    return all(ch.isspace() or _unsafe(ch) for ch in text)


#: argparse types the zoo's commands share
COUNT = cli_whole(low=1)  # steps, tokens, batches, threads, samples: at least one
NONNEGATIVE = cli_whole(low=0)  # a count where 0 means none (or, where the option says so, all)
SEED = cli_whole(low=0, high=2**32 - 1)  # (the training loop derives seeds from it: seed · 1,000,003 + step)
WEIGHT = cli_number(low=0)  # a loss weight, a penalty's strength: finite, not negative
POSITIVE = cli_number(low=0, low_open=True)  # a learning rate, a draw weight
PROBABILITY = cli_number(0, 1)


def SEEDS(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated seeds, each as --seed takes it (0 to 2³² − 1)."""
    seeds = tuple(SEED(t) for t in text.split(",") if t.strip())
    if not seeds:
        import argparse

        raise argparse.ArgumentTypeError(f"expected comma-separated seeds, got {text!r}")
    return seeds
