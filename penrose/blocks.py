"""The block call graph: which block calls which, that none recurses, and the order to check them.

A block may call other blocks (never itself, directly or through others: a module cannot
contain itself). The graph is a `networkx.DiGraph` over block names, an edge `f -> g` for each
block `g` that `f`'s body calls, holding the span of the first such call. `order` gives the
blocks callees first, so the checker checks a block before any block that calls it; it raises a
positioned `PenroseCheckError` naming the recursion (`recursion between blocks: f -> g -> f`)
at the call that closes it.

    >>> from penrose.parser import parse
    >>> from penrose import ir
    >>> d = parse("dim t = 2\\nblock f(x[t]) {\\n  return g(x)\\n}\\nblock g(x[t]) {\\n  return x\\n}\\n")
    >>> order({s.name: s for s in d.body if isinstance(s, ir.Block)})
    ['g', 'f']

networkx is imported only when there are blocks (a diagram without any checks without it).
"""

from __future__ import annotations

from penrose import ir
from penrose.errors import PenroseCheckError


def calls(body) -> list[tuple[str, object]]:
    """(callee, span) for every call in the assignments and returns of `body`, in source order."""
    out: list[tuple[str, object]] = []
    for s in body:
        if isinstance(s, ir.Assign):
            exprs = [s.value]
        elif isinstance(s, ir.Return):
            exprs = list(s.values)
        else:
            continue
        for e in exprs:
            out.extend((sub.func, sub.span) for sub in ir.walk(e) if isinstance(sub, ir.Call))
    return out


def call_graph(blocks: dict):
    """`networkx.DiGraph` of block name -> the blocks its body calls (edge attribute `span`: the
    first such call). Nodes and edges are in definition and call order."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(blocks)
    for name, blk in blocks.items():
        for callee, span in calls(blk.body):
            if callee in blocks and not g.has_edge(name, callee):
                g.add_edge(name, callee, span=span)
    return g


def order(blocks: dict) -> list[str]:
    """The names of `blocks` (name -> ir.Block), callees before callers; refuses recursion.

    The order is a depth-first postorder in definition order (a topological order of the
    reversed call graph), so it does not change when an unrelated block is added after."""
    if not blocks:
        return []
    import networkx as nx

    g = call_graph(blocks)
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return list(nx.dfs_postorder_nodes(g))
    path = " -> ".join([cycle[0][0]] + [callee for _, callee in cycle])
    caller, callee = cycle[-1]
    raise PenroseCheckError(f"recursion between blocks: {path}", g.edges[caller, callee]["span"])
