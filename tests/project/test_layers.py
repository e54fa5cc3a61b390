"""The import graph points one way (STYLE.md, "Layers").

Every module of the library and the zoo is parsed with `ast`; every import counts, the lazy ones
inside functions included. A module may import its own layer or a lower one, never a higher one,
and no modules may import each other in a ring. Adding a module: name it in LAYERS (a module the
checker imports may stay unnamed: it sits in the checker's layer).
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
from sources import package_folders

ROOT = Path(__file__).resolve().parents[2]

#: Lowest first: (layer, dotted names or fnmatch globs). A name written out beats a glob, and a
#: longer glob a shorter one, so `penrose.rendering.gallery` sits with the apps, the rest of
#: `penrose.rendering.*` with the back ends.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["penrose.errors", "penrose.stack", "penrose.ops", "penrose.attrs", "penrose.pyast", "penrose.io",
              "penrose.display", "penrose.generated"]),  # generated: where compiled diagrams' modules are
    # registered (imports nothing of penrose)
    ("ir", ["penrose.ir"]),
    ("parse", ["penrose.parser", "penrose.fmt"]),
    ("read", ["penrose.reading"]),  # path or text, includes, sizes: what checking needs first
    ("check", ["penrose.checker", "penrose.checker.*", "penrose.check_*", "penrose.einsum_spec",
               "penrose.views"]),  # views: derived views of the checked IR, shared by the back ends
    ("load", ["penrose.loader", "penrose.workspace"]),  # the one way in (read, then check), and its cache
    ("backends", ["penrose.plan", "penrose.fuse", "penrose.compiler", "penrose.runtime", "penrose.report",
                  "penrose.interpreter", "penrose.gradients", "penrose.rendering", "penrose.rendering.*",
                  "penrose.tracing", "penrose.tracing.*",  # trace: PyTorch modules (torch.export) to .pen text
                  "penrose.export"]),  # compiled diagrams to torch.export programs and ONNX files
    ("facade", ["penrose", "penrose.magic"]),  # penrose/__init__.py: the public API; imports the layers below lazily
    # (magic: `%load_ext penrose` reaches it from the package, so it sits beside it)
    ("apps", ["penrose.rendering.gallery", "penrose.cli", "penrose.__main__",
              "penrose.lsp", "penrose.lsp_io", "penrose.serve", "penrose.pygments_lexer"]),  # editors and live pages
    ("zoo", ["penrose_zoo", "penrose_zoo.*"]),  # above the library: the library never imports it
]

#: Unnamed modules that a module of this layer imports take this layer (the checker's helpers).
ADOPTED_BY = "check"

RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.source} imports {self.target}"


def packages() -> dict[str, Path]:
    """Top-level import names and their folders (setup.py's ROOTS)."""
    return package_folders()


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the library and the zoo."""
    out = {}
    for top, folder in packages().items():
        for path in sorted(folder.rglob("*.py")):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            if all(p.isidentifier() for p in parts):
                out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known) -> list[Edge]:
    """The modules of `known` that module `name` (the file `path`) imports, lazy imports too."""
    return edges_in(name, path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), known,
                    is_package=path.name == "__init__.py")


def edges_in(name: str, text: str, file: str, known, is_package=False) -> list[Edge]:
    package = name if is_package else name.rpartition(".")[0]
    targets = []
    for node in _walk(ast.parse(text, filename=file)):  # every node: imports inside functions too
        if isinstance(node, ast.Import):
            targets += [(_known(a.name, known), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..errors import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                targets.append((sub if sub in known else _known(base, known), node.lineno))
    return [Edge(name, t, file, line) for t, line in targets if t is not None and t != name]


def _walk(node):
    """ast.walk, less `if __name__ == "__main__":` blocks: there the file runs as the program
    `__main__`, so what it imports is no import of the module (`python -m ....train` calls the cli)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not (isinstance(child, ast.If) and ast.unparse(child.test) == "__name__ == '__main__'"):
            yield from _walk(child)


def _known(dotted: str, known) -> str | None:
    """The longest prefix of `dotted` that is one of our modules (None: a third-party import)."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or None


def layer_of(name: str) -> str | None:
    """The layer LAYERS names for a module (None when it names none)."""
    best = None
    for layer, patterns in LAYERS:
        for pattern in patterns:
            if fnmatch.fnmatchcase(name, pattern):
                key = (pattern == name, len(pattern))
                if best is None or key > best[0]:
                    best = (key, layer)
    return best and best[1]


def graph():
    """(modules' layers, import edges) for the library and the zoo."""
    mods = modules()
    edges = [e for name, path in mods.items() for e in imports(name, path, mods)]
    layers = {m: layer_of(m) for m in mods}
    changed = True
    while changed:  # the checker's helpers: unnamed modules a check-layer module imports
        changed = False
        for e in edges:
            if layers[e.source] == ADOPTED_BY and layers[e.target] is None:
                layers[e.target] = ADOPTED_BY
                changed = True
    return layers, edges


LAYERS_, EDGES = graph()


def test_the_graph_is_read():
    """A guard for the test itself: the walk sees the library, the zoo and lazy imports."""
    assert {"penrose", "penrose.checker", "penrose.cli", "penrose.rendering.gallery", "penrose_zoo"} <= set(LAYERS_)
    assert any(e.source == "penrose" and e.target == "penrose.compiler" for e in EDGES)  # inside compile()


def test_every_module_has_a_layer():
    missing = sorted(m for m, layer in LAYERS_.items() if layer is None)
    assert not missing, "modules in no layer; add them to LAYERS in tests/project/test_layers.py: " + ", ".join(missing)


def test_imports_point_down():
    up = [e for e in EDGES
          if LAYERS_[e.source] and LAYERS_[e.target] and RANK[LAYERS_[e.target]] > RANK[LAYERS_[e.source]]]
    assert not up, "imports that point up a layer:\n" + "\n".join(
        f"  {e}  ({LAYERS_[e.source]} -> {LAYERS_[e.target]})" for e in up)


def test_no_import_cycles():
    g = nx.DiGraph()
    for e in EDGES:
        g.add_edge(e.source, e.target, where=e)
    rings = []
    for component in nx.strongly_connected_components(g):
        if len(component) > 1:
            cycle = nx.find_cycle(g.subgraph(component))  # one ring; the others, once it is cut
            rings.append(" -> ".join(a for a, _ in cycle) + f" -> {cycle[0][0]}"
                         + (f"  (tangled: {', '.join(sorted(component))})" if len(component) > len(cycle) else "")
                         + "".join(f"\n    {g.edges[a, b]['where']}" for a, b in cycle))
    assert not rings, "import cycles:\n  " + "\n  ".join(rings)


def test_the_layer_map_prefers_the_named_module():
    assert layer_of("penrose.rendering.gallery") == "apps"  # named, beats penrose.rendering.*
    assert layer_of("penrose.rendering.figure") == "backends"
    assert layer_of("penrose") == "facade" and layer_of("penrose_zoo.steerling.cli") == "zoo"
    assert layer_of("penrose.newmodule") is None


def test_lazy_and_relative_imports_are_edges():
    text = ("import os\ndef f():\n    from penrose import ir, LIMITS\n    from . import figure\n    from ..checker import V\n"
            "if __name__ == '__main__':\n    from penrose.cli import main\n")
    known = {"penrose", "penrose.ir", "penrose.checker", "penrose.rendering", "penrose.rendering.figure"}
    got = [(e.target, e.line) for e in edges_in("penrose.rendering.gallery", text, "g.py", known)]
    assert got == [("penrose.ir", 3), ("penrose", 3), ("penrose.rendering.figure", 4), ("penrose.checker", 5)]
    assert str(Edge("penrose.ir", "penrose.rendering", "penrose/ir.py", 7)) == "penrose/ir.py:7: penrose.ir imports penrose.rendering"


def test_the_zoo_imports_as_penrose_zoo_not_zoo():
    """The wheel installs no generic top-level `zoo` package; the folder zoo/ is penrose_zoo."""
    assert "zoo" not in packages() and packages()["penrose_zoo"] == ROOT / "zoo"
    run = subprocess.run([sys.executable, "-c", "import zoo"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode != 0 and "penrose_zoo" in run.stderr
