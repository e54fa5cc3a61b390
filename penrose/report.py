"""Printable reports about a checked diagram: the contraction plan of every einsum."""

from __future__ import annotations

from penrose import ir
from penrose.check import Checked, V
from penrose.fmt import format_stmt
from penrose.plan import Plan, plan_einsum


def einsums(v: V):
    """Every einsum inside a checked value, innermost first."""
    for a in v.args:
        if isinstance(a, V):
            yield from einsums(a)
    if v.op == "einsum":
        yield v


def einsum_plan(c: Checked, v: V) -> Plan:
    """The plan of one checked einsum for the diagram's bound sizes (free legs at their defaults)."""
    sizes = {}
    for t, o in zip(v.attrs["terms"], v.args):
        for leg, cl in zip(t, o.type.cls):
            sizes[leg] = c.sizes.size(cl) or 64
    return plan_einsum(v.attrs["terms"], v.attrs["out"], sizes)


def statement_plans(c: Checked):
    """(line, statement text, [plans]) for each statement holding an einsum, blocks included."""
    rows = []
    bodies = [(None, c)] + [(name, b) for name, b in c.blocks.items()]
    for block, body in bodies:
        for s in body.stmts:
            if isinstance(s.stmt, (ir.Assign, ir.Return)) and s.value is not None:
                plans = [einsum_plan(c, e) for e in einsums(s.value)]
                if plans:
                    rows.append((block, s.stmt.span.line, format_stmt(s.stmt), plans))
    return rows


def plan_report(c: Checked) -> str:
    """The text `penrose plan FILE` prints."""
    lines = [f"contraction plan for {c.diagram.file} (free legs at their default sizes)"]
    total = 0
    for block, line, text, plans in statement_plans(c):
        where = f"block {block}, " if block else ""
        lines.append(f"\n{where}line {line}: {text}")
        for p in plans:
            for i, s in enumerate(p.steps, 1):
                lines.append(f"  step {i}: {s.spec:<24} flops {s.flops:>14,}   result size {s.out_size:,}")
                total += s.flops
            if len(p.steps) > 1:
                lines.append(
                    f"  naive {p.naive_flops:,} flops, planned {p.opt_flops:,} ({p.speedup:.1f}x), largest intermediate {p.largest_intermediate:,}"
                )
    lines.append(f"\ntotal {total:,} flops per call (one batch element)")
    return "\n".join(lines)
