"""The readability checks every traced test model passes (tests/tracing/test_trace*.py): no statement
nests more than three calls, each dim letter is one axis, every dim is in the index legend."""

from __future__ import annotations

import re
from unittest import mock

import penrose
from penrose.tracing import write as trace_write

MAX_DEPTH = 3


def call_depth(code: str) -> int:
    """How many calls a line nests (parentheses after a name; a pattern's groups are in strings)."""
    code = re.sub(r"'[^']*'|\"[^\"]*\"", "''", code.split("#", 1)[0])
    stack, deepest = [], 0
    for i, ch in enumerate(code):
        if ch == "(":
            stack.append(i > 0 and (code[i - 1].isalnum() or code[i - 1] == "_"))
            deepest = max(deepest, sum(stack))
        elif ch == ")" and stack:
            stack.pop()
    return deepest


def check_readable(text: str, writer) -> None:
    deep = [line for line in text.splitlines() if call_depth(line) > MAX_DEPTH]
    assert not deep, f"statements nesting more than {MAX_DEPTH} calls: {deep}"
    # a product (bt = b * t) is one meaning; so is a letter the module's attribute gives (head_dim: the head
    # dim of q and k, and of v) or the user's own pattern writes (`h d` in two rearranges), where the axes
    # are of one size and never meet
    prefs = {n: {getattr(r, "pref", None) for r in rs} for n, rs in writer.dim_holders.items()}
    shared = {n: len({id(r) for r in rs}) for n, rs in writer.dim_holders.items()
              if len({id(r) for r in rs}) > 1 and n not in writer.dim_merge
              and not (len({r.size for r in rs}) == 1 and (n in writer.meaning or prefs[n] == {n}))}
    assert not shared, f"dim letters that stand for more than one axis: {shared}"
    legend = {m.group(1) for m in re.finditer(r"^#\s+(\w+)\s{2}\S", text, re.MULTILINE)}
    dims = set(writer.dim_sizes)
    assert dims <= legend, f"dims the index legend does not explain: {sorted(dims - legend)}"


def traced(module, *inputs, **options) -> str:
    """penrose.tracing's text, checked for readability (with the names its writer gave)."""
    made = []
    original = trace_write.Writer.write

    def write(self, header):
        made.append(self)
        return original(self, header)

    with mock.patch.object(trace_write.Writer, "write", write):
        text = penrose.trace(module, *inputs, **options)
    check_readable(text, made[-1])
    return text
