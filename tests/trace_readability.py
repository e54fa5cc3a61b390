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


def header(text: str) -> str:
    """The diagram's header comments (above the index legend) as one line: they wrap at MAX_LINE."""
    head = text.split("# index legend:")[0]
    return " ".join(line[2:] for line in head.splitlines() if line.startswith("# "))


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


# ---- the measures of what a person would have written (issue 38) ---------------------------------------------
MAX_LINE = 100


def long_lines(text: str) -> list[str]:
    """Lines over MAX_LINE characters (comments too: the header and legend are read as well)."""
    return [line for line in text.splitlines() if len(line) > MAX_LINE]


def _walk(e):
    """An expression and every expression inside it."""
    from penrose import ir

    if e is None:
        return
    yield e
    if isinstance(e, ir.Call):
        for x in list(e.args) + [v for _, v in e.kwargs]:
            yield from _walk(x)
    elif isinstance(e, ir.BinOp):
        yield from _walk(e.left)
        yield from _walk(e.right)
    elif isinstance(e, ir.Neg):
        yield from _walk(e.operand)
    elif isinstance(e, ir.ListExpr):
        for x in e.items:
            yield from _walk(x)


def block_leg_mismatches(text: str) -> list[str]:
    """Einsums in a block whose letters for a formal, param or buffer of the block are not the legs
    the block declares for it (`block f(x[t, e])` contracted as 'tm,...': a reader must rename), but
    for a leg whose name an operand of the einsum declares twice (a square `weight[e, e]`: its two
    copies need two letters, `einsum('ti,ei->te', x, weight)`)."""
    from penrose import ir
    from penrose.parser import parse

    out = []
    for st in parse(text).body:
        if not isinstance(st, ir.Block):
            continue
        legs = {f.name: list(f.legs) for f in st.formals}
        legs.update({t.name: list(t.legs) for t in st.body if isinstance(t, ir.Tensor)})
        for body_st in st.body:
            values = [getattr(body_st, "value", None)] + list(getattr(body_st, "values", ()))
            for e in (x for v in values for x in _walk(v)):
                if not (isinstance(e, ir.Call) and e.func == "einsum" and e.args and isinstance(e.args[0], ir.String)):
                    continue
                spec = e.args[0].value
                terms = spec.split("->")[0].split(",")
                declared = [legs[x.id] for x in e.args[1:] if isinstance(x, ir.Name) and x.id in legs]
                twice = {leg for ls in declared for leg in ls if ls.count(leg) > 1}
                for term, operand in zip(terms, e.args[1:]):
                    if not isinstance(operand, ir.Name) or operand.id not in legs:
                        continue
                    letters = term.split() if " " in term.strip() else list(term.strip())
                    if len(letters) != len(legs[operand.id]) or any(
                            a != b and b not in twice for a, b in zip(letters, legs[operand.id])):
                        out.append(f"{st.name}: {operand.id}{legs[operand.id]} read as '{term.strip()}'")
    return out


def unrolled_layers(text: str) -> list[str]:
    """Calls of one block on numbered instances one after the other (`as h.0`, `as h.1`) that are not
    written `repeat N`."""
    found = re.findall(r"^\s*(\w+) = (\w+)\((\w+)[,)].* as ([\w.`]+)\.(\d+)$", text, re.MULTILINE)
    out = []
    for (o1, b1, _a1, p1, k1), (_o2, b2, a2, p2, k2) in zip(found, found[1:]):
        if b1 == b2 and p1 == p2 and int(k2) == int(k1) + 1 and a2 == o1:
            out.append(f"{p1}.{k1} -> {p2}.{k2}")
    return out


MADE_UP = re.compile(r"^(r|h|y|part|cat|masked)\d*$")


def made_up_names(text: str) -> list[str]:
    """Tensor names the tracer made up rather than read from the source (`r2`, `h2`, `y`, formals `x2`, `x3`)."""
    names = re.findall(r"^\s*([\w, ]+?) = ", text, re.MULTILINE)
    formals = re.findall(r"[(,] ?(\w+)\[", " ".join(re.findall(r"^block \w+(\(.*)\) \{$", text, re.MULTILINE)))
    found = [n.strip() for group in names for n in group.split(",")]
    return sorted({n for n in found if MADE_UP.match(n)} | {n for n in formals if re.fullmatch(r"x\d+", n)})


def legend_repeats(text: str) -> list[str]:
    """Letters for one meaning: dims of size 1 beyond the most that one declared tensor carries (timm's
    `cls_token[one, cls, e]` needs two: the batch's place and the class token), and dims whose legend
    line says the same."""
    rows = re.findall(r"^#\s+(\w+)\s{2}(.*)$", text, re.MULTILINE)
    sizes = dict(re.findall(r"\b(\w+) = (\d+)\b", "\n".join(re.findall(r"^dim (.*)$", text, re.MULTILINE))))
    ones = [n for n, s in sizes.items() if s == "1"]
    decls = re.findall(r"^\s*(?:input|param|buffer) \w+\[([^\]]*)\]", text, re.MULTILINE)
    need = max([1] + [len({leg.strip() for leg in legs.split(",")} & set(ones)) for legs in decls])
    seen: dict = {}
    for name, meaning in rows:
        seen.setdefault(re.sub(r"\.\d+\.", ".#.", meaning.strip()), []).append(name)  # layers.0. and layers.1.
    same = [" ".join(ns) for ns in seen.values() if len(ns) > 1]
    return ([f"size 1: {' '.join(ones)}"] if len(ones) > need else []) + same


MEANT = ("model width", "heads", "key-value heads", "copies of each key-value head", "head dim")


def meaning_letters(text: str) -> list[str]:
    """Meanings with more than one letter, and letters with a second meaning: the legend's meanings from
    the module's attributes (`e  model width (hidden_size = 16)`), the residual stream (the first
    formal of a block called `repeat N`: its last leg is the model width), and the head dim's letter
    split or merged in a pattern with no heads (a patch's rows `(g d)` are not a head dim)."""
    rows = re.findall(r"^#\s+(\w+)\s{2}(.*)$", text, re.MULTILINE)
    letters: dict = {m: set() for m in MEANT}
    for name, line in rows:
        meaning = next((m for m in MEANT if line.startswith(m + " (") or line == m), None)
        if meaning:
            letters[meaning].add(name)
    if letters["model width"]:
        repeated = set(re.findall(r"= (\w+)\([^)]*\) repeat ", text))
        for block, first in re.findall(r"^block (\w+)\(\w+\[([^\]]*)\]", text, re.MULTILINE):
            if block in repeated:
                letters["model width"].add(first.split(",")[-1].strip())
    out = [f"{m}: {' '.join(sorted(ls))}" for m, ls in letters.items() if len(ls) > 1]
    heads = letters["heads"] | letters["key-value heads"] | letters["copies of each key-value head"]
    for pattern in re.findall(r"\b(?:rearrange|repeat|reduce)\([^']*'([^']*)'", text):
        for group in re.findall(r"\(([^()]*)\)", pattern):
            legs = group.split()
            if len(legs) > 1 and set(legs) & letters["head dim"] and not set(legs) & heads:
                out.append(f"head dim without heads: ({group})")
    return out


def snake_block_names(text: str) -> list[str]:
    """Block names split as no person would (`si_lu_activation`, `g_p_t2`): short pieces that are not the
    name of an instance the text calls (`linear_c_fc` for `as c_fc` is the module's own name)."""
    instances = set(re.findall(r" as ([\w`.]+)$", text, re.MULTILINE))
    parts = {p for i in instances for p in i.replace("`", "").split(".")}
    out = []
    for n in re.findall(r"^block (\w+)\(", text, re.MULTILINE):
        bare = n
        for p in sorted(parts, key=len, reverse=True):
            bare = bare.replace("_" + p, "") if p and not p.isdigit() else bare
        if re.search(r"(^|_)[a-z]{1,2}_[a-z]{1,2}(_|$)", bare):
            out.append(n)
    return out


def measures(text: str) -> dict:
    """Each measure's count for one traced text."""
    return {"long lines": len(long_lines(text)), "block legs vs einsum": len(block_leg_mismatches(text)),
            "unrolled layers": len(unrolled_layers(text)), "made-up names": len(made_up_names(text)),
            "legend repeats": len(legend_repeats(text)), "block names": len(snake_block_names(text)),
            "letters per meaning": len(meaning_letters(text))}
