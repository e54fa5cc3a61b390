"""Helpers the tests share for generated source: what it imports, and running it standalone."""

from __future__ import annotations

import ast
import importlib.util
import sys
import warnings
from pathlib import Path

import penrose

# the paper's self-attention figure (section 3), written inline so the tests do not depend on the zoo
ATTENTION = """\
# index legend: t query token, p key token, d embedding, e attention dim
dim t = 6, d = 8, e = 4
input Z[t, d]
param W_q[d, e]
param W_k[d, e]
param W_v[d, e]
label Z "token embeddings Z"
# 1) Affinity of each token embedding Z with slices of W matrices. Yields: q, k, v.
q = einsum('td,de->te', Z, W_q)
k = einsum('pd,de->pe', Z, W_k)
v = einsum('pd,de->pe', Z, W_v)
# 2) For pair of tokens (t, tp), affinity query embedding q and key k.
l = einsum('te,pe->tp', q, k) / sqrt(e)
# 3) Turn affinity into probabilities.
probs = softmax(l, dim=-1)
# 4) Convex combination of token embeddings v and token probabilities.
h = einsum('tp,pe->te', probs, v)
output h
"""


def quiet(fn, *args, **kw):
    """fn(*args, **kw) with warnings (unused inputs, legend entries) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def imported_modules(source: str) -> set:
    """Top-level names of every module the source imports (read with ast, not by running it)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add((node.module or "").split(".")[0])
    return out


def standalone(text, **sizes):
    """A module of the standalone source, executed in a fresh namespace, after checking that it
    imports torch and the standard library only (never penrose, never einops)."""
    src = quiet(penrose.source, text, **sizes)
    third_party = {m for m in imported_modules(src) if m not in sys.stdlib_module_names}
    assert third_party == {"torch"}, f"the standalone source imports {sorted(third_party)}"
    ns = {"__name__": "penrose_standalone"}
    exec(compile(src, "<standalone>", "exec"), ns)
    return ns["Model"]()


def reference(name: str):
    """tests/references/<name>.py (an independent hand-written reference), loaded once and
    registered as the module `name`, so every test file shares one copy."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "references" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def package_folders() -> dict[str, Path]:
    """Top-level import names and their folders, as setup.py maps them (its ROOTS: penrose_zoo ->
    zoo/), read without running setup.py."""
    root = Path(__file__).resolve().parents[1]
    tree = ast.parse((root / "setup.py").read_text(encoding="utf-8"))
    roots = next(ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["ROOTS"])
    return {name: root / folder for name, folder in roots.items()}
