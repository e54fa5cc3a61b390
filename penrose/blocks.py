"""The block call graph: which block calls which, that none recurses, and the order to check them.

A block may call other blocks (never itself, directly or through others: a module cannot
contain itself). The graph is a `networkx.DiGraph` over block names, an edge `f -> g` for each
block `g` that `f`'s body calls, holding the span of the first such call. `order` gives the
blocks callees first, so the checker checks a block before any block that calls it; it raises a
positioned `PenroseCheckError` naming the recursion (`recursion between blocks: f -> g -> f`)
at the call that closes it, and one naming the chain where calls nest deeper than
`LIMITS.block_depth` (each level is a nested Python call when the diagram runs).

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
from penrose.tables import LIMITS, Limits


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
        names = list(nx.dfs_postorder_nodes(g))
        _depth_ok(g, names)
        return names
    path = " -> ".join([cycle[0][0]] + [callee for _, callee in cycle])
    caller, callee = cycle[-1]
    raise PenroseCheckError(f"recursion between blocks: {path}", g.edges[caller, callee]["span"])


def _depth_ok(g, names: list[str]) -> None:
    """No chain of block calls is longer than LIMITS.block_depth blocks (`names`: callees first).
    Refused at the call that makes a chain one too long, naming the chain."""
    limit = LIMITS.value("block_depth")
    depth: dict[str, int] = {}
    deepest: dict[str, str] = {}  # block -> its callee on its longest chain
    for name in names:
        callees = list(g.successors(name))
        depth[name] = 1 + max((depth[c] for c in callees), default=0)
        if callees:
            deepest[name] = max(callees, key=lambda c: depth[c])
        if depth[name] > limit:
            chain = [name]
            while chain[-1] in deepest:
                chain.append(deepest[chain[-1]])
            shown = chain if len(chain) <= 6 else [*chain[:3], "...", *chain[-2:]]
            raise PenroseCheckError(
                f"block calls nest {depth[name]} deep through this call ({' -> '.join(shown)}), beyond the limit of "
                f"{limit}: each level is a nested Python call when the diagram runs, and too many exceed Python's "
                f"recursion limit; call the blocks one after another instead, or {Limits.how_to_raise('block_depth')}",
                g.edges[name, deepest[name]]["span"],
            )
