"""Printable reports about a checked diagram: the contraction plan of every einsum.

FLOPs are penrose.plan's count (opt_einsum's): a step costs the product of the sizes of all the
legs it touches, twice that when it sums a leg away. A block's contractions count once per run
of the block: each call, times its `repeat` count, times the runs of the body that calls it.
"""

from __future__ import annotations

from penrose.attrs import BlockCall, Einsum
from penrose import ir
from penrose.checker import Checked, V
from penrose.fmt import format_stmt
from penrose.errors import PenroseCompileError
from penrose.plan import Plan, TooManyLegs, plan_einsum

CONVENTION = "FLOPs: a step costs the product of its legs' sizes, twice that when it sums a leg (opt_einsum's count)"


def _values(v: V):
    """Every checked value inside v, arguments before the operations that use them."""
    out, stack = [], [(v, False)]
    while stack:  # no recursion: a deep expression must not hit Python's limit
        node, done = stack.pop()
        if done:
            out.append(node)
            continue
        stack.append((node, True))
        stack.extend((a, False) for a in reversed(node.args) if isinstance(a, V))
    return out


def einsums(v: V):
    """Every einsum inside a checked value, innermost first."""
    return [x for x in _values(v) if x.op == "einsum"]


def einsum_plan(c: Checked, v: V) -> Plan:
    """The plan of one checked einsum for the diagram's bound sizes (free legs at 64), the
    compiler's plan; a step with more than 52 legs is a PenroseCompileError at the einsum."""
    ein = v.of(Einsum)
    sizes: dict[str, int] = {}
    for t, o in zip(ein.terms, v.args):
        for leg, cl in zip(t, o.type.cls):  # a leg of size 1 broadcasts: the larger size, as compiled
            sizes[leg] = max(sizes.get(leg, 1), c.sizes.size(cl) or 64)
    try:
        return plan_einsum(ein.terms, ein.out, sizes)
    except TooManyLegs as e:
        raise PenroseCompileError(str(e), v.span) from None


def _calls(body: Checked) -> list[tuple[str, int]]:
    """(block, times) for each block call in a body: a `repeat N` call runs N times."""
    calls = []
    for s in body.stmts:
        if s.value is not None:
            calls += [(x.of(BlockCall).block, x.of(BlockCall).repeat or 1) for x in _values(s.value) if x.op == "block"]
    return calls


def block_runs(c: Checked) -> dict:
    """How often each block's body runs per call of the diagram (0 for a block never called).

    >>> from penrose.parser import parse
    >>> from penrose.checker import check
    >>> text = "dim e = 2\\ninput x[e]\\nblock f(h[e]) {\\n  return h * 2\\n}\\ny = f(x) repeat 4\\nz = f(y) as g\\noutput z"
    >>> block_runs(check(parse(text)))
    {'f': 5}
    """
    order, seen = [], set()
    for root in [None] + list(c.blocks):  # callers before callees (blocks cannot recurse)
        stack = [(root, False)]
        while stack:
            name, done = stack.pop()
            if done:
                order.append(name)
                continue
            if name in seen:
                continue
            seen.add(name)
            stack.append((name, True))
            body = c if name is None else c.blocks[name]
            stack.extend((callee, False) for callee, _ in _calls(body) if callee not in seen)
    runs: dict[str | None, int] = {name: 0 for name in c.blocks}
    runs[None] = 1
    for name in reversed(order):
        body = c if name is None else c.blocks[name]
        for callee, times in _calls(body):
            runs[callee] += runs[name] * times
    del runs[None]
    return runs


def statement_plans(c: Checked):
    """(block, line, statement text, [plans]) for each statement holding an einsum, blocks included."""
    rows = []
    bodies = [(None, c)] + [(name, b) for name, b in c.blocks.items()]
    for block, body in bodies:
        for s in body.stmts:
            if isinstance(s.stmt, (ir.Assign, ir.Return)) and s.value is not None:
                plans = [einsum_plan(c, e) for e in einsums(s.value)]
                if plans:
                    rows.append((block, s.stmt.span.line, format_stmt(s.stmt), plans))
    return rows


def _reading(spec: str) -> str:
    """A step's einsum with its operands in list order (a step pops them last first)."""
    lhs, rhs = spec.split("->")
    return ",".join(reversed(lhs.split(","))) + "->" + rhs


def plan_report(c: Checked) -> str:
    """The text `penrose plan FILE` prints."""
    lines = [f"contraction plan for {c.diagram.file} (free legs at their default sizes)", CONVENTION]
    runs = block_runs(c)
    total = 0
    heading = None
    for block, line, text, plans in statement_plans(c):
        times = 1 if block is None else runs[block]
        if block is not None and block != heading:
            heading = block
            how = {0: "never called", 1: "runs once per call"}.get(times, f"runs {times:,} times per call")
            lines.append(f"\nblock {block}: {how}")
        lines.append(f"\nline {line}: {text}")
        flops = 0
        for p in plans:
            for i, s in enumerate(p.steps, 1):
                lines.append(f"  step {i}: {_reading(s.spec):<24} flops {s.flops:>14,}   result size {s.out_size:,}")
            if len(p.steps) > 1:
                lines.append(
                    f"  naive {p.naive_flops:,} flops, planned {p.opt_flops:,} ({p.speedup:.1f}x), largest intermediate {p.largest_intermediate:,}"
                )
            flops += p.opt_flops
        if times != 1:
            lines.append(f"  {flops:,} flops × {times:,} runs = {flops * times:,}")
        total += flops * times
    lines.append(f"\ntotal {total:,} flops per call (one batch element)")
    return "\n".join(lines)
