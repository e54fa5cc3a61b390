"""From lowered regions to `.pen` text: blocks shared by their instances, names, statements.

1. Each region's body is rendered with canonical names; regions with the same text are the same
   block. Calls of one module, and numbered siblings chained `layers.0 → layers.1 → …`, must be
   (the chain becomes `repeat N as layers`); other instances of one class share a block when
   their legs can be one index each.
2. Legs get names: one dim per size where they never meet on one tensor or in one statement,
   readable letters by role (`t` tokens, `e` features, `h d` heads, `s` keys …), `hd = h * d` for
   merged legs; every dim is in the index legend.
3. Tensors get the user's own variable names (from the source line that made them) where the
   line assigns one, SSA-style; intermediate single-use values are written inline.
4. The diagram is built as `penrose.ir` records (expressions, statements, blocks) and printed by
   `penrose.fmt`: the trace package has no printer of its own.
"""

from __future__ import annotations

import keyword
import linecache
import math
import re
import textwrap
from collections import defaultdict
from dataclasses import replace

from penrose import ir
from penrose.errors import Span
from penrose.fmt import format_diagram, format_expr, format_stmt
from penrose.tables import FLOAT32_MAX, FUNCTIONS, GENERATED, IDENT, MODULE_ATTRS, PEN_KEYWORDS
from penrose.tracing.errors import PenroseTraceError, span_at
from penrose.tracing.model import (
    BinOp, Call, CallStmt, Einsum, Leg, LegClash, LegList, Neg, Num, Pattern, Ref, Stmt, Str, TensorList, children,
)

RESERVED = set(FUNCTIONS) | set(GENERATED) | set(PEN_KEYWORDS) | {"inf", "sigma"}

ROLE_LETTERS = {
    "in_last": "eic", "in_only": "ief", "in_other": "tsnp", "out": "fokgj", "in": "ei", "feat": "ef",
    "head": "hg", "headdim": "dc", "key": "sjk", "piece": "efc", "slice": "uvwpq", "joined": "fc", "copy": "rk",
    "query": "tq", "sum": "sjk", "one": ["one"], "part": "uvw", "kernel": "klmn", "stack": "kjw",
}
LETTERS = "tefhdskgijmnopqruvwxyzaclbABCDEFGHIJKLMNOPQRSTUVWXYZ"


def made_init(value) -> ir.Init | None:
    """The init that makes a non-persistent buffer's values exactly (penrose.runtime._made_buffer:
    zeros, ones, `causal` for torch.tril of ones, `arange` for position ids, `rotary(base=B)` for
    rotary inverse frequencies), or None: then the diagram declares it as a saved buffer."""
    import torch

    from penrose.tracing.common import made_values

    if value is None or not value.numel():
        return None
    shape, x = tuple(value.shape), value.detach().cpu().to(torch.float64)
    candidates = [ir.Init("zeros"), ir.Init("ones")] + ([ir.Init("arange")] if shape else [])
    first = float(x.reshape(-1)[0])
    if math.isfinite(first) and bool((x == first).all()):
        candidates.append(ir.Init("constant", (("value", ir.Number(first)),)))
    if len(shape) >= 2 and shape[-1] == shape[-2]:
        candidates.append(ir.Init("causal"))
    n = shape[-1] if shape else 1
    if shape and n >= 2 and 0 < float(x.reshape(-1, n)[0, 1]) < 1:  # entry 1 is base ** (-1 / n)
        base = float(x.reshape(-1, n)[0, 1]) ** -n
        for nice in (round(base), float(f"{base:.6g}")):
            if nice > 0:
                candidates.append(ir.Init("rotary", (("base", ir.Number(nice if nice == int(nice) else float(nice))),)))
    tables = []  # rotary cos and sin caches (lit-gpt's): their base read back from the second frequency
    if len(shape) >= 2 and n >= 4 and n % 2 == 0 and shape[-2] >= 2:
        row = x.reshape(-1, shape[-2], n)[0, 1]
        for name, inverse in (("rotary_cos", math.acos), ("rotary_sin", math.asin)):
            if -1 <= float(row[1]) <= 1 and 0 < inverse(float(row[1])) < 1:
                guess = inverse(float(row[1])) ** -(n // 2)  # near: acos is ill-conditioned near 1
                for base in dict.fromkeys([10000, 500000, 1000000, 100000, round(guess), float(f"{guess:.2g}"), float(f"{guess:.3g}")]):
                    tables.append(ir.Init(name, (("base", ir.Number(int(base) if base == int(base) else base)),)))
    for init in tables:
        want = made_values(init.name, shape, float(init.kwargs[0][1].value)).to(value.dtype).to(torch.float64)
        if torch.equal(want, x):
            return init
    for init in candidates:
        if init.name in ("zeros", "ones", "constant"):
            fill = float(init.kwargs[0][1].value) if init.kwargs else 0.0 if init.name == "zeros" else 1.0
            want = torch.full(shape, fill, dtype=torch.float32).to(value.dtype).to(torch.float64)
        else:
            base = float(init.kwargs[0][1].value) if init.kwargs else 10000.0
            want = made_values(init.name, shape, base).to(value.dtype).to(torch.float64)
        if torch.equal(want, x):
            return init
    return None


def pen_name_ok(name: str, module_attr: bool = True) -> bool:
    """The checker's rule for a param, buffer or instance name (penrose.checker._name_ok)."""
    return (bool(IDENT.match(name)) and not keyword.iskeyword(name) and not keyword.issoftkeyword(name)
            and name not in PEN_KEYWORDS and name != "inf" and name not in GENERATED
            and not (module_attr and name in MODULE_ATTRS))


def pen_name(name: str) -> str | None:
    """A state-dict name as the diagram writes it: itself where .pen allows it, else quoted
    (`self`, `_bias`, `output`); None for a name no quoting holds (a backquote, a line break)."""
    if pen_name_ok(name):
        return name
    if name and not any(ch in name for ch in "`.\n") and name not in MODULE_ATTRS:
        return f"`{name}`"
    return None


def ok_name(name: str) -> bool:
    return bool(IDENT.match(name)) and not keyword.iskeyword(name) and not keyword.issoftkeyword(name) and name not in RESERVED


# ---- what the user's line assigns -------------------------------------------------------------------------
_SINGLE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")
_AUG = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\+|-|\*|/|@|\*\*|//)=")
_TUPLE = re.compile(r"^\s*\(?\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+)\s*,?\s*\)?\s*=(?!=)")


def line_targets(src):
    if src is None:
        return None
    code = linecache.getline(src[0], src[1])
    m = _TUPLE.match(code)
    if m:
        return [n.strip().lstrip("_") for n in m.group(1).split(",")]
    m = _SINGLE.match(code) or _AUG.match(code)
    if m:
        return [m.group(1).lstrip("_")]
    return None


_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def snake(name: str) -> str:
    """A class name in snake case as a person splits it: words, acronyms whole (`SiLU`, `ViT`, `RMS`),
    numbers with the word before them (`GPT2Block` gpt2_block, `Conv1d` conv1d).

    >>> [snake(n) for n in ("SiLUActivation", "GPT2MLP", "LlamaRMSNorm", "ViTSelfAttention", "Conv1D", "MLPBlock")]
    ['silu_activation', 'gpt2_mlp', 'llama_rms_norm', 'vit_self_attention', 'conv1d', 'mlp_block']
    """
    words: list[str] = []
    for part in re.split(r"[^A-Za-z0-9]+", name):
        found = _CAMEL.findall(part)
        for i, w in enumerate(found):
            after_number = bool(words) and words[-1][-1:].isdigit() and len(w) == 1 and (
                i == len(found) - 1 or found[i + 1][:1].isupper())
            if words and (w.isdigit() or after_number) and i > 0:
                words[-1] += w  # a number, and one letter after it (Conv1d), join the word before them
            elif i > 0 and w.isupper() and len(w) <= 2 and len(found[i - 1]) == 2 and found[i - 1][0].isupper() \
                    and words and words[-1] == found[i - 1]:
                words[-1] += w  # SiLU, ViT, DiT: an acronym with one small letter in it
            else:
                words.append(w)
    return "_".join(w.lower() for w in words if w) or "module"


# ---- expressions to penrose.ir, printed by penrose.fmt ------------------------------------------------------
def number(v):
    """A constant of the traced graph as a `penrose.ir` record: bools as 1 and 0, integral floats as
    integers (`2`, not `2.0`), infinity as the name `inf`, beyond float32 the most float32 holds."""
    if isinstance(v, bool):
        return ir.Number(int(v))
    if isinstance(v, int):
        return ir.Number(v)
    v = float(v)
    if math.isinf(v):
        return ir.Name("inf") if v > 0 else ir.Neg(ir.Name("inf"))
    if math.isnan(v):
        raise PenroseTraceError("a NaN constant cannot be written in .pen")
    if abs(v) > FLOAT32_MAX:  # -torch.finfo(torch.float64).max, a float64 model's mask fill: the most float32 holds
        return ir.Number(math.copysign(FLOAT32_MAX, v))
    if v.is_integer() and abs(v) < 1e15:
        return ir.Number(int(v))
    return ir.Number(v)


class Text:
    """Turns the tracer's expressions into `penrose.ir` records once legs and tensors have names
    (a namer for legs, tensors and blocks, and an inliner), and prints them with `penrose.fmt`."""

    def __init__(self, C, leg, val, inline):
        self.C, self.leg, self.val, self.inline = C, leg, val, inline
        self.dims: set = set()  # dim names an einsum's spare letters avoid

    def expr(self, e) -> str:
        return format_expr(self.to_ir(e))

    def to_ir(self, e):
        if isinstance(e, Ref):
            inner = self.inline(e.pval)
            return self.to_ir(inner) if inner is not None else ir.Name(self.val(e.pval))
        if isinstance(e, Num):
            return number(e.value)
        if isinstance(e, Leg):
            return ir.Name(self.leg(e.cls))
        if isinstance(e, Str):
            return ir.String(e.text)
        if isinstance(e, Pattern):
            return ir.String(self.pattern(e))
        if isinstance(e, LegList):
            return ir.ListExpr(tuple(ir.Name(self.leg(c)) for c in e.legs))
        if isinstance(e, TensorList):
            return ir.ListExpr(tuple(self.to_ir(x) for x in e.items))
        if isinstance(e, Call):
            e = self.composed(e)
            return ir.Call(e.fn, tuple(self.to_ir(a) for a in e.args), tuple((k, self.to_ir(v)) for k, v in e.kwargs))
        if isinstance(e, BinOp):
            return ir.BinOp(e.op, self.to_ir(e.a), self.to_ir(e.b))
        if isinstance(e, Neg):
            return ir.Neg(self.to_ir(e.a))
        if isinstance(e, Einsum):
            return ir.Call("einsum", (ir.String(self.spec(e)),) + tuple(self.to_ir(x) for x in e.operands))
        raise TypeError(e)

    def composed(self, e: Call) -> Call:
        """`rearrange(repeat(x, 't g d -> g r t d'), 'g r t d -> (g r) t d')` as the one call a person
        writes, `repeat(x, 't g d -> (g r) t d')`: a rearrange of an inlined rearrange or repeat whose
        result legs it takes one by one."""
        while e.fn == "rearrange" and len(e.args) == 2 and isinstance(e.args[0], Ref) and isinstance(e.args[1], Pattern):
            inner = self.inline(e.args[0].pval)
            outer = e.args[1]
            if not (isinstance(inner, Call) and inner.fn in ("rearrange", "repeat") and len(inner.args) == 2
                    and isinstance(inner.args[1], Pattern) and not inner.kwargs):
                break
            mid = inner.args[1].right
            if any(isinstance(x, (str, tuple)) for x in mid) or any(isinstance(x, (str, tuple)) for x in outer.left) \
                    or len(mid) != len(outer.left) or not all(self.C.same(a, b) for a, b in zip(mid, outer.left)):
                break
            e = Call(inner.fn, [inner.args[0], Pattern(inner.args[1].left, outer.right)])
        return e

    def pattern(self, p: Pattern) -> str:
        def side(entries):
            out = []
            for x in entries:
                if isinstance(x, str):
                    out.append(x)
                elif isinstance(x, tuple):
                    out.append("(" + " ".join(self.leg(c) for c in x) + ")")
                else:
                    out.append(self.leg(x))
            return " ".join(out)

        return f"{side(p.left)} -> {side(p.right)}"

    def spec(self, e: Einsum) -> str:
        """Letters when every leg's name is one letter, else words (`'t hd, e hd -> t e'`)."""
        pref = {}
        for k in e.out:
            pref[k] = self.leg(e.out_cls[k])
        for term in e.terms:
            for k in term:
                if k not in pref:
                    binds = e.binds.get(k, [])
                    pref[k] = self.leg(binds[0]) if binds else None
        words = any(p is not None and len(p) > 1 for p in pref.values())
        label, used = {}, set()
        for k in e.out:
            label[k] = pref[k]
            used.add(pref[k])
        dims = self.dims
        for term in e.terms:
            for k in term:
                if k in label:
                    continue
                cands = [self.leg(c) for c in e.binds.get(k, [])]
                pick = next((p for p in cands if p not in used and (words or len(p) == 1)), None)
                if pick is None:
                    pick = next((ch for ch in LETTERS if ch not in used and ch not in dims), None) or next(ch for ch in LETTERS if ch not in used)
                label[k] = pick
                used.add(pick)
        if words:
            return ", ".join(" ".join(label[k] for k in t) for t in e.terms) + " -> " + " ".join(label[k] for k in e.out)
        return ",".join("".join(label[k] for k in t) for t in e.terms) + "->" + "".join(label[k] for k in e.out)


MAX_DEPTH = 3  # calls nested in one statement (`softmax(einsum(...) / sqrt(d), s)` is three)
MAX_LINE = 100  # characters on a line of the text (a longer statement is cut into named intermediates)


def call_depth(e, inline) -> int:
    """How many calls an expression nests, counting those of the values written inline."""
    if isinstance(e, Ref):
        inner = inline(e.pval)
        return call_depth(inner, inline) if inner is not None else 0
    if isinstance(e, Call) and e.fn == "rearrange" and e.args and isinstance(e.args[0], Ref):
        inner = inline(e.args[0].pval)
        if isinstance(inner, Call) and inner.fn in ("rearrange", "repeat"):  # written as one call (Text.composed)
            return call_depth(inner, inline)
    if isinstance(e, (Call, Einsum)):
        args = list(e.args) + [v for _, v in e.kwargs] if isinstance(e, Call) else list(e.operands)
        return 1 + max((call_depth(a, inline) for a in args), default=0)
    if isinstance(e, BinOp):
        return max(call_depth(e.a, inline), call_depth(e.b, inline))
    if isinstance(e, Neg):
        return call_depth(e.a, inline)
    if isinstance(e, TensorList):
        return max((call_depth(x, inline) for x in e.items), default=0)
    return 0


def refs(e, out):
    """The PVals an expression reads, in order."""
    if isinstance(e, Ref):
        out.append(e.pval)
    for x in children(e):
        refs(x, out)
    return out


def _einsums_only(p, items) -> bool:
    """Whether every statement that reads the param or buffer `p` reads it as an einsum's operand (so
    that two legs of one name are read by two letters, `einsum('ti,ei->te', x, weight)`)."""
    def reads(e, operand):
        if isinstance(e, Ref):
            return e.pval is p and not operand
        return any(reads(x, isinstance(e, Einsum)) for x in children(e))

    return not any(p in it.args if isinstance(it, CallStmt) else reads(it.expr, False) for it in items)


def classes_in(e, out):
    """Leg classes an expression names (for the conflicts of naming)."""
    if isinstance(e, Leg):
        out.append([e.cls])
    elif isinstance(e, Pattern):
        group = []
        for side in (e.left, e.right):
            for x in side:
                if isinstance(x, tuple):
                    group.extend(x)
                elif not isinstance(x, str):
                    group.append(x)
        out.append(group)
    elif isinstance(e, Einsum):
        out.append(("einsum", e))
    elif isinstance(e, LegList):  # a split's pieces: each meets the others' legs, not one another
        for c in e.legs:
            out.append([c])
    for x in children(e):
        classes_in(x, out)
    return out


# ---- regions: liveness, inlining ---------------------------------------------------------------------------
class Body:
    """A region's statements after dead code is dropped, with uses and inlining decided."""

    def __init__(self, region, outputs=None):
        self.region = region
        results = [inner for inner, _ in region.returns] if region.parent is not None else list(outputs or [])
        self.results = results
        live = {p.id for p in results}
        items = []
        for it in reversed(region.items):
            outs = it.outs
            if isinstance(it, CallStmt) and not it.outs:
                continue
            if not any(p.id in live for p in outs) and not (isinstance(it, CallStmt) and it.keep):
                continue
            items.append(it)
            read = refs(it.expr, []) if isinstance(it, Stmt) else list(it.args)
            live |= {p.id for p in read}
        self.items = items[::-1]
        self.uses = defaultdict(int)
        for it in self.items:
            for p in (refs(it.expr, []) if isinstance(it, Stmt) else it.args):
                self.uses[p.id] += 1 + (100 if isinstance(it, CallStmt) else 0)
        for p in results:
            self.uses[p.id] += 100 if region.parent is None else 1  # outputs are read by name; returns may inline
        self.named = {}  # pval id -> name wished by the user's line
        runs, prev = [], None
        for it in self.items:
            src = it.src
            if src is not None and runs and prev == src:
                runs[-1].append(it)
            else:
                runs.append([it])
            prev = src
        later = defaultdict(int)  # pval id -> reads by statements of other lines (and the results)
        for it in self.items:
            for p in (refs(it.expr, []) if isinstance(it, Stmt) else it.args):
                later[(p.id, it.src)] += 1
        for run in runs:
            last = run[-1]
            targets = line_targets(last.src)
            if not targets:
                continue
            made = [p for it in run for p in it.outs]
            # the values the line hands on (read by other lines, or results): the line's names, in order
            escaping = [p for p in made if p in results or any(n for (pid, src), n in later.items() if pid == p.id and src != last.src)]
            chosen = last.outs if len(targets) == len(last.outs) else escaping if len(targets) == len(escaping) else []
            for p, t in zip(chosen, targets):
                if ok_name(t):
                    self.named[p.id] = t
        self.inlined = {}
        for it in self.items:
            if isinstance(it, Stmt):  # no statement nests more than MAX_DEPTH calls: a deeper operand is named
                while call_depth(it.expr, self.inline) > MAX_DEPTH:
                    deepest = max((p for p in refs(it.expr, []) if p.id in self.inlined),
                                  key=lambda p: call_depth(self.inlined[p.id], self.inline))
                    del self.inlined[deepest.id]
            if isinstance(it, Stmt) and len(it.outs) == 1 and it.inline_ok:
                p = it.outs[0]
                if p.id not in self.named and self.uses[p.id] == 1 and p.hint is None:
                    self.inlined[p.id] = it.expr
        # a value inlined into another that is itself inlined: fine; a statement with a single
        # use in a statement from another line keeps its own line only when the line named it
        self.kept = [it for it in self.items if not (isinstance(it, Stmt) and len(it.outs) == 1 and it.outs[0].id in self.inlined)]

    def inline(self, pval):
        return self.inlined.get(pval.id)

    def params(self) -> list:
        """The region's params and buffers to declare: every one the state dict holds, and the
        `unsaved` ones a live statement reads (one made while trying a constant that was then said
        another way is not)."""
        return [p for p in sorted(self.region.params.values(), key=lambda p: p.id)
                if p.persistent or p.kind == "param" or self.uses.get(p.id)]


# ---- the writer -------------------------------------------------------------------------------------------------
class BlockDef:
    def __init__(self, regions):
        self.regions = list(regions)
        self.name = None

    @property
    def rep(self):
        return self.regions[0]



def _instance(it):
    """A call's instance name: its region's, less the `.0` of a chain of numbered copies
    (`repeat L as layers` for layers.0 … layers.{L-1}); a shared repeat keeps its one module's."""
    inst = it.region.rel_name()
    return inst[: -len(".0")] if it.chain and not it.shared else inst


class Writer:
    def __init__(self, lowerer, title: str, notes: bool = False):
        self.L = lowerer
        self.C = lowerer.C
        self.root = lowerer.root
        self.title = title
        self.notes = notes
        self.bodies: dict = {}
        self.blocks: list[BlockDef] = []
        self.first_keys: dict = {}

    def fail(self, message, region=None):
        raise PenroseTraceError(message, self.where(region))

    @staticmethod
    def where(region):
        src = region.call.src if region is not None and region.call is not None else None
        return span_at(*src) if src else None

    # -- bodies and keys
    def body(self, region):
        b = self.bodies.get(id(region))
        if b is None:
            b = Body(region, self.L.outputs if region.parent is None else None)
            self.bodies[id(region)] = b
        return b

    def key(self, region):
        """The region's block text with canonical names, and its classes in order."""
        order, ids, vals = [], {}, {}

        def leg(c):
            r = self.C.find(c)
            if id(r) not in ids:
                ids[id(r)] = f"L{len(ids)}:{r.size}"
                order.append(r)
            return ids[id(r)]

        def val(p):
            if p.kind in ("param", "buffer"):
                return f"{p.kind}:{p.param}"
            if p.id not in vals:
                vals[p.id] = f"v{len(vals)}"
            return vals[p.id]

        lines = self.body_lines(region, leg, val, lambda r: f"B{id(r.block)}", canonical=True)
        return "\n".join(lines), order

    # -- grouping
    def group(self):
        regions = [r for r in _walk(self.root) if r is not self.root]
        by_depth = defaultdict(list)
        for r in regions:
            by_depth[r.depth].append(r)
        for d in sorted(by_depth, reverse=True):
            level = by_depth[d]
            keys = {id(r): self.key(r) for r in level}  # before any union of this level: each on its own
            self.first_keys.update(keys)
            groups = {id(r): [r] for r in level}  # union of regions that must share a block

            def join(a, b):
                ga, gb = groups[id(a)], groups[id(b)]
                if ga is gb:
                    return
                ga.extend(gb)
                for r in gb:
                    groups[id(r)] = ga

            by_fqn = defaultdict(list)
            for r in level:
                by_fqn[(id(r.parent), r.fqn)].append(r)
            for same in by_fqn.values():
                for r in same[1:]:
                    self.must_share(same[0], r, keys, f"module {r.fqn!r} is called twice with different computations")
                    join(same[0], r)
            for parent in {id(r.parent): r.parent for r in level}.values():
                for chain in self.chains(parent, keys):
                    for r in chain[1:]:
                        self.must_share(chain[0], r, keys, f"{r.fqn!r} does not compute what {chain[0].fqn!r} computes, so the chain cannot be a repeat")
                        join(chain[0], r)
            defs = []
            for g in {id(g): g for g in groups.values()}.values():
                bd = BlockDef(g)
                for r in g:
                    r.block = bd
                defs.append(bd)
            merged = self.blocks  # blocks of deeper levels too: a LayerNorm at the top and one in a layer
            for bd in defs:  # other instances of one class with the same text: one block if they can be
                k = self.first_keys[id(bd.rep)][0]
                for other in merged:
                    if type(other.rep.module) is type(bd.rep.module) and self.first_keys[id(other.rep)][0] == k:
                        snap = self.C.snapshot()
                        try:
                            self.unify_regions(other.rep, bd.rep)
                        except LegClash:
                            self.C.restore(snap)
                            continue
                        other.regions.extend(bd.regions)
                        for r in bd.regions:
                            r.block = other
                        break
                else:
                    merged.append(bd)

    def must_share(self, a, b, keys, message):
        if self.first_keys[id(a)][0] != self.first_keys[id(b)][0]:
            self.fail(message, b)
        try:
            self.unify_regions(a, b)
        except LegClash:
            self.fail(message + " (their legs cannot be named alike)", b)

    def unify_regions(self, a, b):
        """Join the classes of two regions of the same text, position by position (as each was
        on its own, before the unions that sharing blocks makes)."""
        (ka, oa), (kb, ob) = self.first_keys[id(a)], self.first_keys[id(b)]
        if ka != kb or len(oa) != len(ob):
            raise LegClash("different texts")
        for x, y in zip(oa, ob):
            if not self.C.can_union(x, y):
                raise LegClash("legs cannot be one index")
        for x, y in zip(oa, ob):
            self.C.union(x, y)

    def chains(self, parent, keys):
        """Runs of calls in `parent` collapsed into the first call: numbered siblings
        `P.0 → P.1 → … → P.{N-1}` (`repeat N as P`, N copies), or one module called N times in a row
        (`for _ in range(n): x = self.block(x)`, ALBERT's shared layers: `repeat N shared`)."""
        found = []
        items = parent.items
        i = 0
        while i < len(items):
            it = items[i]
            if not isinstance(it, CallStmt) or it.chain:
                i += 1
                continue
            m = re.fullmatch(r"(.+)\.0", it.region.rel_name())
            chain = self.run_of(items, i, lambda c, n: c.region.fqn == it.region.fqn)
            shared = len(chain) > 1
            if not shared and m:
                prefix = m.group(1)
                chain = self.run_of(items, i, lambda c, n: c.region.rel_name() == f"{prefix}.{n}")
            if len(chain) > 1 and all(keys[id(c.region)][0] == keys[id(chain[0].region)][0] for c in chain):
                first = chain[0]
                first.chain = [c.region for c in chain]
                first.shared = shared
                first.outs = chain[-1].outs
                for c in chain[1:]:
                    items.remove(c)
                for p in first.outs:
                    p.stmt = first
                found.append([c.region for c in chain])
            i += 1
        return found

    @staticmethod
    def run_of(items, i, follows):
        """The calls from `items[i]` on that `follows(call, position)` accepts, each fed the one result of
        the call before as its first argument, its other arguments (a mask, cos and sin) the first's, and
        that result read by nothing else."""
        it = items[i]
        chain, j = [it], i + 1
        while True:
            nxt = next((k for k in range(j, len(items)) if isinstance(items[k], CallStmt)), None)
            if nxt is None:
                break
            cand, prev = items[nxt], chain[-1]
            if not follows(cand, len(chain)):
                break
            if len(prev.outs) != 1 or not cand.args or cand.args[0] is not prev.outs[0] or len(cand.args) != len(it.args) \
                    or any(a is not b for a, b in zip(cand.args[1:], it.args[1:])):
                break
            if any(isinstance(items[k], Stmt) and prev.outs[0] in refs(items[k].expr, []) for k in range(j, len(items)) if k != nxt):
                break
            chain.append(cand)
            j = nxt + 1
        return chain

    # -- rendering a body
    def body_lines(self, region, leg, val, block_name, canonical=False):
        """A region's statements as text, one a line (the key that tells blocks apart)."""
        stmts = self.body_stmts(region, leg, val, block_name, canonical)
        lines = [format_stmt(st) for st in stmts]
        if canonical:
            lines.insert(0, "(" + ", ".join(f"{val(p)}[{', '.join(leg(c) for c in p.legs)}]:{p.dtype}" for p, _ in region.formals) + ")")
        return lines

    def body_stmts(self, region, leg, val, block_name, canonical=False) -> list:
        """A region's statements as `penrose.ir` records: params and buffers, assignments, block
        calls and (in a block) the return."""
        b = self.body(region)
        T = Text(self.C, leg, val, b.inline)
        T.dims = set() if canonical else set(getattr(self, "dim_sizes", {}))
        stmts: list = []
        for p in b.params():
            if not canonical and pen_name(p.param) is None:
                where = f"{region.fqn}.{p.param}" if region.fqn else p.param
                raise PenroseTraceError(f"the state-dict name {where!r} cannot be kept: {p.param!r} cannot be written in .pen, "
                                        "even quoted", p.span or self.where(region))
            made = p.made or (None if p.persistent else made_init(p.value))  # persistent=False: `unsaved`, made from its init
            init = made
            if made is None and p.value is not None and p.value.numel():
                if bool((p.value == 1).all()):
                    init = ir.Init("ones")
                elif bool((p.value == 0).all()):
                    init = ir.Init("zeros")
            stmts.append(ir.Tensor(p.kind, val(p), tuple(leg(c) for c in p.legs), init=init, saved=made is None))
        noted = None
        for it in b.kept:
            instance = repeat = None
            if isinstance(it, Stmt):
                value = T.to_ir(it.expr)
            else:
                reg = it.region
                inst = _instance(it)
                # a dotted path (`as net.0`, a Sequential's or ModuleList's child) keeps the
                # state-dict names, each quoted where .pen's rules would refuse it (`as attention.`self``)
                parts = [part if part.isdigit() else pen_name(part) for part in inst.split(".")]
                if not canonical and None in parts:
                    bad = inst.split(".")[parts.index(None)]
                    self.fail(f"submodule {reg.fqn!r} cannot keep its name in .pen: {bad!r} cannot be written, even quoted", reg)
                inst = ".".join(p or "" for p in parts)
                bname = block_name(reg)
                value = ir.Call(bname, tuple(ir.Name(val(a)) for a in it.args))
                if it.chain:
                    repeat, instance = ir.Number(len(it.chain)), inst
                elif inst != bname:
                    instance = inst
                if it.shared and inst == bname:
                    instance = None
            note = ""
            if self.notes and not canonical and it.src is not None and it.src != noted:
                noted = it.src
                note = linecache.getline(*it.src).strip()[:70]
            stmts.append(ir.Assign(tuple(val(p) for p in it.outs), value, instance, repeat, note, shared=isinstance(it, CallStmt) and it.shared))
        if region.parent is not None:
            stmts.append(ir.Return(tuple(T.to_ir(Ref(p)) for p in b.results)))
        return stmts

    # -- naming
    def name_legs(self):
        C = self.C
        roots = {}
        for c in C.all:
            r = C.find(c)
            roots.setdefault(id(r), r)
        conflicts = defaultdict(set)
        together = defaultdict(set)  # the classes that are legs of one tensor with each one
        live: set = set()  # the classes the text writes (dead statements' and unused buffers' are not named)

        hard = defaultdict(set)  # the conflicts a name can't tell apart: all but a param's legs and an einsum's letters
        square: dict = {}  # a root -> the other root of a square param or buffer that only einsums read
        bound = defaultdict(set)  # a root -> the roots one einsum letter binds with it (an axis it contracts against)

        def clique(rs, soft=False):
            rs = [C.find(r) for r in rs]
            live.update(id(r) for r in rs)
            for a in rs:
                for b in rs:
                    if a is not b:
                        conflicts[id(a)].add(id(b))
                        together[id(a)].add(id(b))
                        if not soft:
                            hard[id(a)].add(id(b))

        regions = list(_walk(self.root))
        for region in regions:
            b = self.body(region)
            pvals = [p for p, _ in region.formals] + b.params() + [p for it in b.items for p in it.outs]
            if region is self.root:
                pvals += [v.pval for v in self.L.input_views]
            for p in pvals:
                clique(p.legs, soft=p.kind in ("param", "buffer"))
            for p in b.params():
                ends = [C.find(c) for c in p.legs]
                if len(ends) == 2 and ends[0] is not ends[1] and ends[0].size == ends[1].size and _einsums_only(p, b.items):
                    square[id(ends[0])], square[id(ends[1])] = ends[1], ends[0]
            for it in b.items:
                if isinstance(it, Stmt):
                    for group in classes_in(it.expr, []):
                        if isinstance(group, tuple) and group and group[0] == "einsum":
                            e = group[1]
                            keyed = [[C.find(c) for c in e.binds.get(k, [])] for k in e.binds]
                            live.update(id(r) for g in keyed for r in g)
                            for g in keyed:
                                for a in g:
                                    bound[id(a)].update(id(x) for x in g if x is not a)
                            for i, ga in enumerate(keyed):
                                for gb in keyed[i + 1:]:
                                    for a in ga:
                                        for bb in gb:
                                            if a is not bb:
                                                conflicts[id(a)].add(id(bb))
                                                conflicts[id(bb)].add(id(a))
                        else:
                            clique(group)
        taken = set(RESERVED)
        instances: set = set()  # child instance names: a dim may share one (GPT-2's heads `h`, its blocks `as h.0`)
        for region in regions:
            for p in region.params.values():
                taken.add(p.param)
            for child in region.children:
                instances.add(child.rel_name().split(".")[0])
        attr_taken = set(taken)  # what the letters the module's attributes give must avoid
        taken |= instances
        for bd in self.blocks:
            taken.add(bd.name)
            attr_taken.add(bd.name)
        for v in self.L.input_views:
            taken.add(v.pval.hint)
            attr_taken.add(v.pval.hint)
        soft = set()  # the user's variable names: letters tried last, so tensors keep them
        for region in regions:
            b = self.body(region)
            soft |= set(b.named.values())
            soft |= set(_formal_names(region) or [])
        for v in self.L.input_views:
            soft.add(v.pval.hint)
        first_input = {id(C.find(c)) for c in self.L.input_views[0].pval.legs} if self.L.input_views else set()
        names = {}  # root id -> name
        holders = defaultdict(list)  # name -> roots
        size_of, merge_of, exclusive = {}, {}, set()
        for r in roots.values():
            if r.hint:
                if r.hint in size_of and size_of[r.hint] != r.size:
                    raise PenroseTraceError(f"dims=: {r.hint!r} names axes of sizes {size_of[r.hint]} and {r.size}")
                names[id(r)] = r.hint
                holders[r.hint].append(r)
                size_of[r.hint] = r.size
                exclusive.add(r.hint)

        def free_of(name, r):
            return all(id(h) not in conflicts[id(r)] for h in holders[name])

        # size-1 axes the batch broadcasts (a learned token's and a position table's axis 0, copied over
        # the batch): one letter, `one`, where they never meet; a size-1 axis of a learned token that a
        # concat joins to others is named as the source names the token (`cls_token`'s: `cls`)
        param_of: dict = {}  # a root -> the local name of a param or buffer with it as a leg
        for region in regions:
            for p in region.params.values():
                for leg in p.legs:
                    param_of.setdefault(id(C.find(leg)), p.param)
        batch_ones = {id(C.find(c)) for c in self.L.batch_ones} & set(param_of)
        pieces = {id(C.find(c)) for _, parts in self.L.joined for c in parts}

        sizes_of = attribute_sizes(self.L.module)
        self.meaning = {}  # a dim named from the module's attributes -> its meaning in words

        def described(letter, r):
            key = sizes_of[letter].get(r.size)
            return f"{MEANINGS[letter]} ({key} = {r.size})" if key else MEANINGS[letter]
        roles_of = defaultdict(set)  # a root -> the roles of every leg joined into it
        for c in C.all:
            roles_of[id(C.find(c))].add(c.role)

        def beside_heads(r):
            """A leg of a tensor whose other legs include heads (a size the module's heads or key-value
            heads have): a head dim, not a patch's rows split off an image as heads are split."""
            return any("head" in roles_of[i] and (roots[i].size in sizes_of["h"] or roots[i].size in sizes_of["g"])
                       for i in together[id(r)])

        # the model width: the axis the module's width attribute sizes that most tensors carry (the
        # residual stream), an input's last axis first; heads times head dim beside it are `hd`, not a
        # second letter for the width
        widths = [r for r in roots.values() if id(r) in live and r.size in sizes_of["e"] and not r.hint]
        width = max(widths, key=lambda r: (r.role in ("in_last", "in_only"), len(r.vals), -r.id)) if widths else None

        def attr_letter(r):
            """The letter the module's own attributes give an axis: its heads (n_head, num_heads), key-value
            heads (num_key_value_heads), head dim (head_dim), width (hidden_size, n_embd), copies (n_rep)."""
            if r.role == "head" or (r.merge and r.size in sizes_of["h"] and not r.role.startswith("in_")):
                if r.size in sizes_of["g"] and r.size not in sizes_of["h"]:
                    return "g"
                if r.size in sizes_of["h"]:
                    return "h"
            if "headdim" in roles_of[id(r)] and r.size in sizes_of["d"] and beside_heads(r):
                return "d"
            if r.role == "copy" and r.size in sizes_of["r"]:
                return "r"
            if r is width:
                return "e"
            if r.role.startswith("in_") and (r.merge or r.size in sizes_of["e"]) and r.role != "in_other":
                return "e"  # the model width: one name through the diagram, even where a view splits it
            if width is None and r.merge and len(r.merge) == 2 and r.size in sizes_of["e"] \
                    and C.find(r.merge[0]).size in sizes_of["h"] and C.find(r.merge[1]).size in sizes_of["d"]:
                return "e"  # heads times head dim, the width (a whole model's, whose input is token ids)
            return None

        def name(r):
            if id(r) in names:
                return names[id(r)]
            if r.merge:
                fac = [name(C.find(f)) for f in r.merge]
                want = tuple(fac)
                for n in list(holders):
                    if size_of[n] == r.size and merge_of.get(n) == want and n not in exclusive and free_of(n, r):
                        return assign(r, n, want)
                letter = attr_letter(r)
                if letter and letter not in attr_taken and letter not in holders and letter not in fac:
                    self.meaning[letter] = described(letter, r)
                    return assign(r, letter, want)
                joined = "".join(fac)
                if ok_name(joined) and joined not in taken and joined not in holders:
                    return assign(r, joined, want)
                pool = [f"{joined}{k}" for k in range(2, 100)]
                return assign(r, next(n for n in pool if ok_name(n) and n not in taken and n not in holders), want)
            # a square weight's axis that its einsum contracts against an axis named as the weight's other
            # axis (LLaMA's q_proj and o_proj, one block: the width both): `weight[e, e]`
            twin = square.get(id(r))
            n = names.get(id(twin)) if twin is not None else None
            if n in self.meaning and n not in exclusive and any(id(h) in bound[id(r)] for h in holders[n]) \
                    and all(id(h) not in hard[id(r)] for h in holders[n]):
                return assign(r, n, None)
            if id(r) in batch_ones and r.size == 1 and "one" not in taken \
                    and all(id(h) in batch_ones for h in holders.get("one", [])) and free_of("one", r):
                return assign(r, "one", None)
            token = re.fullmatch(r"(\w+?)_?tokens?", param_of.get(id(r), "")) if r.size == 1 and id(r) in pieces else None
            if token and ok_name(token.group(1)) and token.group(1) not in taken and token.group(1) not in holders:
                return assign(r, token.group(1), None)
            if r.pref and r.pref not in taken and r.pref not in exclusive and r.pref not in merge_of:
                if r.pref not in holders or (size_of[r.pref] == r.size and free_of(r.pref, r)):
                    return assign(r, r.pref, None)  # the user's own letter (an einsum's, a pattern's): one meaning
            # the module's attribute names an axis: axes of one attribute (the head dim of q and k, and
            # of v) share its letter where they never meet; otherwise one letter, one axis
            letter = attr_letter(r)
            if letter and letter not in attr_taken and (letter not in holders or (
                    letter in self.meaning and size_of[letter] == r.size and letter not in merge_of and free_of(letter, r))):
                self.meaning[letter] = described(letter, r)
                return assign(r, letter, None)
            # an input's axis that an expand's copies meet is the input's (BERT's tokens: t), and so is an
            # axis of the first input that a mask's keys meet (OPT's tokens, the keys of the mask its
            # positions are counted from: tokens `t` and keys `s`, as in the other models)
            roles = roles_of[id(r)]
            role = next((x for x in ("headdim", "head", "key", "copy") if x in roles
                         and not (x == "copy" and r.role.startswith("in_"))
                         and not (x == "key" and id(r) in first_input)), r.role)
            pref = ROLE_LETTERS.get(role, "") if not (batch_ones and role == "one") else ""
            letters = list(dict.fromkeys(list(pref) + list(LETTERS)))
            for ch in [c for c in letters if c not in soft and c not in meant] + [c for c in letters if c in soft] \
                    + [c for c in letters if c in meant]:
                if ch not in taken and ch not in holders:
                    return assign(r, ch, None)
            k = 2
            while f"d{k}" in taken or f"d{k}" in holders:
                k += 1
            return assign(r, f"d{k}", None)

        def assign(r, n, merge):
            names[id(r)] = n
            holders[n].append(r)
            size_of[n] = r.size
            if merge:
                merge_of[n] = merge
            return n

        # the width first (so that a view of it keeps its name), then heads and head dims, then the rest
        def first(r):
            if r is width or (r.role in ("in_last", "in_only") and attr_letter(r)):
                return 0
            return 1 if roles_of[id(r)] & {"head", "headdim", "key", "copy"} else 2

        named = [r for r in sorted(roots.values(), key=lambda r: (first(r), r.id))
                 if id(r) in live and (r.vals or r.merge or id(r) in conflicts)]
        # the letters the module's attributes give some axis (its heads `h`): no other axis takes them by
        # its role alone (a 2 x 4 patch grid split like heads, in a ViT whose heads are 4)
        meant = {attr_letter(r) for r in named} - {None}
        for r in named:
            name(r)
        ones = [param_of[id(h)] for h in holders.get("one", []) if id(h) in batch_ones]
        if ones:
            copied = " and ".join(dict.fromkeys(ones))
            self.meaning["one"] = f"size 1 where the batch is: {copied} {'are' if len(set(ones)) > 1 else 'is'} the same for every item"
        self.leg_names = names
        self.dim_sizes = size_of
        self.dim_merge = merge_of
        self.dim_holders = holders
        return names

    def leg(self, c):
        r = self.C.find(c)
        n = self.leg_names.get(id(r))
        if n is None:
            self.leg_names[id(r)] = n = self._late_name(r)
        return n

    def _late_name(self, r):
        n = next(ch for ch in LETTERS if ch not in self.dim_sizes and ch not in RESERVED)  # one letter, one axis
        self.dim_sizes[n] = r.size
        self.dim_holders[n].append(r)
        return n

    def name_blocks(self):
        """Blocks by their module's class in snake case (`llama_rms_norm`); where one class makes several
        blocks (other shapes), the one with the most instances keeps that name and each other is named
        by its instances (`linear_k_proj_v_proj`), as a person names a variant by what uses it."""
        used: set = set()
        by_class: dict = defaultdict(list)
        for bd in self.blocks:
            base = snake(type(bd.rep.module).__name__)
            if isinstance(bd.rep.key, tuple) and bd.rep.key and bd.rep.key[0] == "container":
                base = snake(bd.rep.fqn.split(".")[-1]) + "_part"  # a ModuleDict's calls, gathered
            if not ok_name(base) or base in MODULE_ATTRS:
                base = base + "_module" if base[:1].isalpha() else "module_" + base
            by_class[base].append(bd)
        for base, bds in by_class.items():
            plain = max(bds, key=lambda bd: (len(bd.regions), -bds.index(bd))) if len(bds) > 1 else bds[0]
            for bd in [plain] + [x for x in bds if x is not plain]:
                n = base
                if bd is not plain or n in used:
                    parts = list(dict.fromkeys(self.instance_part(r) for r in bd.regions))
                    n = base + "_" + "_".join(parts[:2]) if parts else base
                    if n in used or any(n == base + "_" + self.instance_part(r) for x in bds if x is not bd for r in x.regions):
                        path = "_".join([p for p in bd.rep.fqn.split(".") if not p.isdigit()][-2:])
                        n = base + "_" + re.sub(r"\W", "_", path or bd.rep.fqn)
                k = 2
                while n in used or not ok_name(n):
                    n = f"{base}_{k}"
                    k += 1
                used.add(n)
                bd.name = n

    @staticmethod
    def instance_part(region) -> str:
        """The last name of an instance's path, numbers left out (`layers.0.mlp.up_proj` up_proj)."""
        parts = [p for p in region.fqn.split(".") if not p.isdigit()]
        return re.sub(r"\W", "_", parts[-1]) if parts else region.fqn

    def name_tensors(self, region, formal_names=None):
        """Names for every tensor of a rendered body: params fixed, the rest by wish, SSA-style."""
        b = self.body(region)
        taken = set(RESERVED) | set(self.dim_sizes) | {bd.name for bd in self.blocks}
        fixed = {}
        for p in region.params.values():
            fixed[p.id] = pen_name(p.param) or p.param
        instances = set()
        for it in b.kept:
            if isinstance(it, CallStmt):
                instances.add(_instance(it))
                instances.add(it.region.block.name)
        taken |= instances | set(fixed.values())
        names = dict(fixed)
        bound = {}  # name -> pval id holding it
        last = {}
        pos = {}
        for i, it in enumerate(b.kept):
            read = self._reads(it, b)
            for p in read:
                last[p.id] = i
        end = len(b.kept)
        for p in b.results:
            last[p.id] = end

        def choose(p, wish, at):
            base = wish if wish and ok_name(wish) else "h"
            cand, k = base, 1
            while True:
                holder = bound.get(cand)
                if cand not in taken and (holder is None or last.get(holder, -1) <= at):
                    break
                k += 1
                cand = f"{base}{k}" if not base[-1].isdigit() else f"{base}_{k}"
            bound[cand] = p.id
            names[p.id] = cand
            pos[p.id] = at
            return cand

        starts = []
        if region.parent is None:
            starts = [v.pval for v in self.L.input_views]
            for p in starts:
                choose(p, p.hint if p.hint and ok_name(p.hint) else "x", -1)
        else:
            wishes = formal_names or []
            for j, (p, outer) in enumerate(region.formals):
                w = wishes[j] if j < len(wishes) else (p.hint or self.wish_of(outer) or "x")
                choose(p, w if ok_name(w) else "x", -1)
        fields = {}  # the outputs' names where the module returns a ModelOutput: its fields
        if region.parent is None and self.L.output_names:
            for p, field in zip(b.results, self.L.output_names):
                fields.setdefault(p.id, field)
        for i, it in enumerate(b.kept):
            for p in it.outs:
                wish = fields.get(p.id) or b.named.get(p.id) or p.hint
                if wish is None and isinstance(it, Stmt) and len(it.outs) == 1:  # a part of a long line: the line's name
                    targets = line_targets(it.src)
                    wish = targets[0] if targets and len(targets) == 1 and ok_name(targets[0]) else None
                if wish is None and isinstance(it, CallStmt) and len(it.outs) == 1:
                    wish = self.tuple_target(it)
                if wish is None and isinstance(it, CallStmt) and len(it.outs) > 1:
                    wish = self.wish_of(p)  # `cos, sin = llama_rotary_embedding() as rotary_emb`: the names it returns
                if wish is None and isinstance(it, CallStmt):
                    wish = _instance(it).split(".")[0] + "_out"
                if wish is None and region.parent is None and p in b.results:
                    wish = "out"
                if wish is None and isinstance(it, Stmt):
                    wish = self.deep_wish(p)
                if wish is None:
                    wish = _fallback(it, names, b.inline)
                choose(p, wish, i)
        return names

    def shorten(self, region, names, indent) -> bool:
        """Name the longest value written inline in the first statement over MAX_LINE characters (it
        becomes a statement of its own, before); False when no statement is too long, or none can be cut."""
        b = self.body(region)
        T = Text(self.C, self.leg, lambda p: names.get(p.id, "x"), b.inline)
        T.dims = set(self.dim_sizes)
        lines: list[tuple] = [(it, ir.Assign(tuple(names.get(p.id, "x") for p in it.outs), T.to_ir(it.expr)))
                              for it in b.kept if isinstance(it, Stmt)]
        if region.parent is not None:
            lines.append((None, ir.Return(tuple(T.to_ir(Ref(p)) for p in b.results))))
        for it, st in lines:
            if indent + len(format_stmt(st)) <= MAX_LINE:
                continue
            inner: list = []
            for p in (refs(it.expr, []) if it is not None else list(b.results)):
                self._inlined_in(p, b, inner, 0, it.expr if it is not None else None)
            if not inner:
                continue
            size = {p.id: len(T.expr(b.inlined[p.id])) for p, _ in inner}
            # the longest call in it (a person names `rotated = concat(...)`, not `... * sin`), else the longest part
            pick = max(inner, key=lambda x: (isinstance(b.inlined[x[0].id], (Call, Einsum)), size[x[0].id]))[0]
            del b.inlined[pick.id]
            b.kept = [x for x in b.items if not (isinstance(x, Stmt) and len(x.outs) == 1 and x.outs[0].id in b.inlined)]
            return True
        return False

    def _inlined_in(self, p, b, out, depth, parent=None):
        """(value, depth) of the values written inline inside value p (p too, when it is); not a
        rearrange or repeat its parent rearrange is written as one call with (`Text.composed`)."""
        e = b.inlined.get(p.id)
        if e is None:
            return
        composed = isinstance(parent, Call) and parent.fn == "rearrange" and isinstance(e, Call) and e.fn in ("rearrange", "repeat")
        if not composed:
            out.append((p, depth))
        for q in refs(e, []):
            self._inlined_in(q, b, out, depth + 1, e)

    def deep_wish(self, p):
        """The name a helper function's line gives a value forward made through it (Hugging Face's
        `eager_attention_forward`: `attn_weights = torch.matmul(query, key_states.transpose(2, 3))`)."""
        lines = self.L.helper_lines()
        line = lines.get(p.node) if p.node else None
        if line is None:
            return None
        if self.L.last_on_line(p.node):  # the value of the helper's line (a part of it is not)
            targets = line_targets(line)
            if targets and len(targets) == 1 and ok_name(targets[0]):
                return targets[0]
        fn = self.L.helper_result(p.node)  # what a helper returns: named after it (`rotate_half`)
        return fn if fn and ok_name(fn) else None

    def tuple_target(self, it):
        """The user's name for a call's one result where its line unpacks a tuple: the one target at a
        place the module's call fills with a tensor (`_, top_k_weights, top_k_index = self.gate(x)`, the
        index None in the dense form of a mixture of experts), or None where that is not one name."""
        targets = line_targets(it.src)
        places = self.L.result_places.get(it.region.fqn)
        if not targets or len(targets) < 2 or places is None or len(places) != len(targets):
            return None
        named = [t for t, tensor in zip(targets, places) if tensor and ok_name(t)]
        return named[0] if len(named) == 1 else None

    def wish_of(self, p, depth=0):
        """The name the user's code gives a value, followed through block boundaries: a block's result
        is named as the block's code names it (`return cos, sin`), an argument as the caller's."""
        if depth > 20:
            return None
        if p.kind == "callout" and isinstance(p.stmt, CallStmt):
            inner = next((i for i, o in p.stmt.region.returns if o is p), None) if not p.stmt.chain else None
            if inner is not None:
                b = self.body(p.stmt.region)
                return b.named.get(inner.id) or inner.hint or self.wish_of(inner, depth + 1)
        if p.kind == "formal" and p.region is not None:
            outer = next((o for f, o in p.region.formals if f is p), None)
            return self.wish_of(outer, depth + 1) if outer is not None else None
        if p.kind in ("stmt", "input"):
            return self.body(p.region).named.get(p.id) or p.hint
        return None

    def _reads(self, it, b):
        out = []
        if isinstance(it, CallStmt):
            return list(it.args)

        def walk(e):
            for p in refs(e, []):
                inner = b.inline(p)
                if inner is not None:
                    walk(inner)
                else:
                    out.append(p)

        walk(it.expr)
        return out

    # -- the whole text
    def write(self, header_lines) -> str:
        try:
            return self._write(header_lines)
        except PenroseTraceError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug of the tracer: say so, without a traceback
            raise PenroseTraceError(f"internal: writing the diagram failed ({type(e).__name__}: {e})") from e

    def _write(self, header_lines) -> str:
        self.group()
        self.C.grant_wishes()
        self.name_blocks()
        self.name_legs()
        blocks = []
        for bd in _bottom_up(self.blocks):
            reg = bd.rep
            fnames = _formal_names(reg)
            tn = self.name_tensors(reg, fnames)
            while self.shorten(reg, tn, indent=2):  # a line too long: its longest inlined part named
                tn = self.name_tensors(reg, fnames)
            val = tn_of(tn)
            formals = tuple(ir.Tensor("formal", tn[p.id], tuple(self.leg(c) for c in p.legs), p.dtype) for p, _ in reg.formals)
            body = tuple(self.body_stmts(reg, self.leg, val, lambda r: r.block.name))
            blocks.append(ir.Block(bd.name, tuple(_as_read(f, body, self.dim_sizes) for f in formals), body))
        root = self.root
        tn = self.name_tensors(root)
        while self.shorten(root, tn, indent=0):
            tn = self.name_tensors(root)
        val = tn_of(tn)
        top: list = []
        for v in self.L.input_views:
            p = v.pval
            top.append(ir.Tensor("input", tn[p.id], tuple(self.leg(c) for c in p.legs), p.dtype))
        top += self.body_stmts(root, self.leg, val, lambda r: r.block.name)
        b = self.body(root)
        outs = []
        for p in b.results:
            if b.inline(p) is not None:
                raise PenroseTraceError("internal: an output was inlined")
            outs.append(tn[p.id])
        top.append(ir.Output(tuple(dict.fromkeys(outs))))
        wrapped = [w for line in header_lines for w in textwrap.wrap(line[2:], MAX_LINE - 2, break_on_hyphens=False)]
        comments = [ir.Comment(line) for line in wrapped] + [ir.Comment(line[2:]) for line in self.legend()]
        return format_diagram(ir.Diagram(_laid_out(comments, self.dims(), blocks, top)))

    def dims(self) -> list:
        """`dim t = 3, e = 4` (one line), then the merged dims, each on its own: `dim hd = h * d`."""
        plain: list[ir.Dim] = []
        prod: list[ir.Dim] = []
        done = set()
        order = sorted(self.dim_sizes, key=lambda n: min(r.id for r in self.dim_holders[n]))

        def emit(n):
            if n in done:
                return
            done.add(n)
            if n in self.dim_merge:
                for f in self.dim_merge[n]:
                    emit(f)
                factors = [ir.Name(f) for f in self.dim_merge[n]]
                size = factors[0]
                for f in factors[1:]:
                    size = ir.BinOp("*", size, f)
                prod.append(ir.Dim(n, size))
            else:
                width[0] += len(f"{n} = {self.dim_sizes[n]}, ")
                if width[0] > MAX_LINE - 6:  # a new `dim` line: none over MAX_LINE characters
                    width[0] = len(f"{n} = {self.dim_sizes[n]}, ")
                    plain.append(ir.Dim(n, ir.Number(self.dim_sizes[n]), grouped=False))
                else:
                    plain.append(ir.Dim(n, ir.Number(self.dim_sizes[n]), grouped=bool(plain)))

        width = [0]
        for n in order:
            emit(n)
        return plain + prod

    def legend(self):
        order = sorted(self.dim_sizes, key=lambda n: min(r.id for r in self.dim_holders[n]))
        out = ["# index legend:"]
        origins = {n: next((o for o in map(self._origin, sorted(self.dim_holders[n], key=lambda r: r.id)) if o), "")
                   for n in order}
        for n in order:
            if n in getattr(self, "meaning", {}):
                meaning = self.meaning[n] + (f": {' times '.join(self.dim_merge[n])}" if n in self.dim_merge else "")
            elif n in self.dim_merge:
                meaning = f"{' and '.join(self.dim_merge[n])} merged (a view)"
            else:
                meaning = self._joined(n) or self._again(n, origins) or origins[n] or f"a leg of size {self.dim_sizes[n]}"
            meaning = meaning.replace(",", ";")
            room = MAX_LINE - len(f"#   {n}  ")
            if len(meaning) > room:  # one line an entry (a wrapped one would read as another entry)
                meaning = meaning[:room - 3].rsplit(" ", 1)[0] + " ..."
            out.append(f"#   {n}  {meaning}")
        return out

    def _joined(self, n):
        """A concat's joined leg by the names of the legs it joins (`cls and gt joined (concat)`)."""
        held = {id(r) for r in self.dim_holders[n]}
        for into, parts in self.L.joined:
            if id(self.C.find(into)) in held:
                names = [self.leg_names.get(id(self.C.find(c))) for c in parts]
                if all(names):
                    return f"{' and '.join(names)} joined (concat)"
        return None

    def _again(self, n, origins):
        """A second leg of one size (attention's keys) by the name of the first (`t again`)."""
        origin = origins[n]
        if not origin.endswith(" (a second leg of that size)"):
            return None
        first = origin.split(" (")[0]
        return next((f"{m} again (a second leg of that size)" for m, o in origins.items()
                     if m != n and o and o.split(" (")[0] == first and not o.endswith("(a second leg of that size)")), None)

    def _origin(self, r):
        for c in self.C.all:
            if self.C.find(c) is r and c.origin:
                return c.origin
        return ""


# module attributes (and a Hugging Face config's) that size an axis, by the letter the axis takes
SIZE_ATTRS = {
    "h": ("n_head", "n_heads", "num_heads", "num_attention_heads", "nhead", "heads", "n_q_heads"),
    "g": ("num_key_value_heads", "n_kv_heads", "n_kv_head", "num_kv_heads", "n_kv"),
    "d": ("head_dim", "head_size", "attention_head_size", "d_head", "dim_head", "d_k", "kv_channels", "hd", "head_dim_"),
    "e": ("hidden_size", "n_embd", "d_model", "embed_dim", "dim", "n_embed", "width", "all_head_size", "in_features"),
    "r": ("num_key_value_groups", "n_rep", "n_groups"),
}


MEANINGS = {"h": "heads", "g": "key-value heads", "d": "head dim", "e": "model width", "r": "copies of each key-value head"}


def attribute_sizes(module) -> dict:
    """letter -> {size: the attribute that gives it} from the module's (and its submodules' and configs') attributes."""
    out: dict[str, dict[int, str]] = {k: {} for k in SIZE_ATTRS}
    for m in module.modules():
        for owner in (m, getattr(m, "config", None)):
            fields = vars(owner) if owner is not None and hasattr(owner, "__dict__") else {}
            for letter, keys in SIZE_ATTRS.items():
                for k in keys:
                    v = fields.get(k)
                    if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                        out[letter].setdefault(v, k)
    return out


def _fallback(it, names=None, inline=None):
    """A name for a value no line names: a view of a tensor (rearrange, repeat, select, slice) keeps
    the tensor's name, as a person reassigns `v = repeat(v, ...)`; else one by what it is."""
    e = it.expr
    if isinstance(e, BinOp) and isinstance(e.a, Einsum):
        e = e.a  # einsum(...) / sqrt(d)
    if isinstance(e, Einsum):  # attention's scores: a result with the keys' leg beside the queries'
        return "scores" if any(c.role == "key" for c in e.out_cls.values()) else "y"
    view = e
    while isinstance(view, Call) and view.fn in ("rearrange", "repeat", "select", "slice", "detach", "dropout") \
            and view.args and isinstance(view.args[0], Ref) and names is not None:
        p = view.args[0].pval
        if p.id in names:
            return re.sub(r"\d+$", "", names[p.id]) or names[p.id]
        view = inline(p) if inline is not None else None
    if isinstance(e, Call):
        return {"rearrange": "y", "softmax": "probs", "split": "part", "concat": "cat", "where": "masked"}.get(e.fn, e.fn + "_out")
    return "y"  # arithmetic no line names (`h` would read as the heads)


def _as_read(formal, body, sizes):
    """A block's formal declared with the letters its einsums read it by, where it is read only by
    einsums that agree (`block linear(x[t, j])` for `einsum('tj,ej->te', x, weight)`, its square weight's
    out leg `e` being the caller's width): a call binds its arguments' legs by position, so the caller
    is unchanged, and the block reads as written."""
    reads: list = []

    def walk(e):
        if isinstance(e, ir.Name) and e.id == formal.name:
            reads.append(None)  # read other than as an einsum's operand
        elif isinstance(e, ir.Call):
            spec = e.args[0].value if e.func == "einsum" and e.args and isinstance(e.args[0], ir.String) else None
            terms = spec.split("->")[0].split(",") if spec else []
            for k, a in enumerate(e.args):
                if spec and k and isinstance(a, ir.Name) and a.id == formal.name and k - 1 < len(terms):
                    term = terms[k - 1].strip()
                    reads.append(tuple(term.split()) if " " in term else tuple(term))
                elif not (spec and k == 0):
                    walk(a)
            for _, v in e.kwargs:
                walk(v)
        elif isinstance(e, ir.BinOp):
            walk(e.left)
            walk(e.right)
        elif isinstance(e, ir.Neg):
            walk(e.operand)
        elif isinstance(e, ir.ListExpr):
            for x in e.items:
                walk(x)

    for st in body:
        for v in [getattr(st, "value", None), *getattr(st, "values", ())]:
            if v is not None:
                walk(v)
    letters = set(reads)
    if len(letters) != 1 or None in letters:
        return formal
    (want,) = letters
    if len(want) != len(formal.legs) or want == formal.legs or any(
            w not in sizes or sizes[w] != sizes.get(l) for w, l in zip(want, formal.legs)) or len(set(want)) != len(want):
        return formal
    return replace(formal, legs=tuple(want))


def _formal_names(region):
    import inspect

    own = region.module.__dict__.get("forward")  # an instance's own forward (a mixture of experts' dense form)
    try:
        sig = inspect.signature(own if own is not None else type(region.module).forward)
    except (TypeError, ValueError):
        return None
    params = [p for p in list(sig.parameters.values())[0 if own is not None else 1:]
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in params]
    if any("tuple" in str(p.annotation).lower() for p in params):
        return None  # a tuple argument is several formals (LLaMA's position_embeddings, cos and sin): no names by position
    if len(names) == len(region.formals):
        return names
    if len(region.formals) == 1 and names:
        return names[:1]
    return None


def _walk(region):
    yield region
    for c in region.children:
        yield from _walk(c)


def _bottom_up(blocks):
    return sorted(blocks, key=lambda bd: -bd.rep.depth)


def tn_of(tn):
    """The namer of a region's tensors: a value's name by its id."""

    def val(p):
        return tn[p.id]

    return val


def _laid_out(comments, dims, blocks, top) -> tuple:
    """The diagram's statements with the lines fmt lays them out by: the comments, the dims (the
    plain ones on one line), a blank line, each block followed by a blank line, then the top level."""
    out, line = [], 1

    def at(st, first, last=None):
        return replace(st, span=Span("<trace>", first, 1, last or first, 1))

    for c in comments:
        out.append(at(c, line))
        line += 1
    for i, d in enumerate(dims):
        if i and not d.grouped:
            line += 1
        out.append(at(d, line))
    line += 2 if dims else 1
    for blk in blocks:
        first = line
        body = []
        for st in blk.body:
            line += 1
            body.append(at(st, line))
        line += 1
        out.append(replace(at(blk, first, line), body=tuple(body)))
        line += 2
    for st in top:
        out.append(at(st, line))
        line += 1
    return tuple(out)
