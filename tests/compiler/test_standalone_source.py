"""The standalone source of every zoo diagram is what a person would write, and still the module.

`penrose compile FILE -o model.py` writes a file people read: it holds only the run-time helpers
it calls, the diagram's dims and consts by name, imports only what it reads, and keeps to the
project's line length. Checked on every diagram of the zoo (zoo/*.pen, the paper's listings
zoo/paper/*.pen, Steerling's zoo/steerling/*.pen): one `ruff check` over them all, with the
project's rules plus its line length (E501; pyflakes' F401 unused import, F811 redefinition and
F841 unused variable among them); every top-level definition read somewhere; and, imported, the
same numbers as the compiled module on random inputs (Steerling at a tiny configuration).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

import penrose
from penrose import pyast as P
from penrose.compiler import generate_source
from test_differential import make_inputs

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
ZOO = sorted(p for pattern in ("zoo/*.pen", "zoo/paper/*.pen", "zoo/steerling/*.pen") for p in ROOT.glob(pattern)
             if re.search(r"^output ", p.read_text(encoding="utf-8"), re.M))  # the rest are libraries others include
IDS = [str(p.relative_to(ROOT / "zoo").with_suffix("")) for p in ZOO]
RUFF = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]


@functools.cache
def _tiny_steerling() -> dict[str, int]:
    from penrose_zoo.steerling.cli import TINY_CONCEPTS, TINY_MODEL
    from penrose_zoo.steerling.model import compile_sizes, diagram_sizes

    return compile_sizes(diagram_sizes(TINY_MODEL, TINY_CONCEPTS, 260), False)


def _sizes(path: Path) -> dict[str, int]:
    """The sizes a diagram is compiled at here: its own, or Steerling's tiny configuration."""
    if "steerling" not in path.parts:
        return {}
    sizes = dict(_tiny_steerling())
    if re.search(r"\bLpre\b", path.read_text(encoding="utf-8")):
        sizes["Lpre"] = 1  # the injected variant: one layer before the injection, one after
    return sizes


@functools.cache
def _load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return penrose.load(path, sizes=_sizes(path))


@functools.cache
def _source(path: Path, standalone: bool = True) -> str:
    return generate_source(_load(path), standalone=standalone)


def test_the_zoo_is_all_there():
    assert len(ZOO) >= 35 and {"paper", "steerling"} <= {p.parent.name for p in ZOO}


def test_the_printer_wraps_at_the_projects_line_length():
    assert P.LINE_LENGTH == RUFF["line-length"]


def test_zoo_sources_pass_ruff(tmp_path):
    """One ruff run over every zoo diagram's standalone source: the project's rules and ignores,
    and its line length, which the project's own config does not select (E501)."""
    for path, name in zip(ZOO, IDS):
        (tmp_path / (name.replace("/", "__") + ".py")).write_text(_source(path), encoding="utf-8")
    lint = RUFF["lint"]
    rules = [*lint["select"], "E501", "F401", "F811", "F841"]
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--output-format", "concise",
                          "--select", ",".join(rules), "--ignore", ",".join(lint["ignore"]),
                          "--line-length", str(RUFF["line-length"]), "--target-version", RUFF["target-version"], str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(list(tmp_path.glob("*.py"))) == len(ZOO)


def _unused(source: str) -> list[str]:
    """The top-level definitions of a module (functions, classes, constants) that nothing reads,
    but `Model`, what the file is for."""
    tree = ast.parse(source)
    unused = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        for name in names:
            read = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                       for other in tree.body if other is not node for n in ast.walk(other))
            if not read and name != "Model":
                unused.append(name)
    return unused


def test_the_unused_check_can_fail():
    assert _unused("import torch\n\nA = 1\nB = A\n\n\ndef _f():\n    return B\n\n\nModel = 2\n") == ["_f"]


@pytest.mark.parametrize("path", ZOO, ids=IDS)
def test_zoo_sources_define_nothing_unused(path):
    assert _unused(_source(path)) == []


@pytest.mark.parametrize("path", ZOO, ids=IDS)
def test_zoo_sources_compute_what_the_module_computes(path):
    """The standalone file, run, gives the compiled module's outputs exactly; and the in-memory
    module is the same code from its first class on (it imports the helpers rather than
    carrying them)."""
    source = _source(path)
    memory = _source(path, standalone=False)
    classes = re.compile(r"^class (?!ShapeError\b|_)", re.M)
    assert source[classes.search(source).start():] == memory[classes.search(memory).start():]
    checked = _load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = penrose.compile(path, seed=0, sizes=_sizes(path)).double().eval()
    namespace = {"__name__": "penrose_standalone"}
    exec(compile(source, str(path), "exec"), namespace)
    standalone = namespace["Model"]().double().eval()
    standalone.load_state_dict(module.state_dict())
    unsized = {checked.sizes.find(c): 5 for d in checked.inputs for c in d.type.cls if checked.size(c) is None}  # `dim t`
    inputs = make_inputs(checked, (2,), resize=unsized)
    with torch.no_grad():
        want, got = module(**inputs), standalone(**inputs)
    want, got = (tuple(x) if isinstance(x, tuple) else (x,) for x in (want, got))
    assert len(want) == len(got)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_constants_and_the_functional_alias_shadow_no_name_of_the_diagram():
    """A dim's or const's constant takes its name in capitals unless the module holds that name
    already (an input `E`, a local `ALPHA`): then `E_DIM`, `ALPHA_CONST`; `F` is
    torch.nn.functional unless the diagram names a tensor `F`."""
    text = ("dim e = 3, f = 2\nconst alpha = 2.5\ninput E[e]\nparam W[e, f]\nF = einsum('e,ef->f', E, W) * alpha\n"
            "ALPHA = gelu(F) + sqrt(e)\noutput ALPHA")
    source = penrose.source(text)
    assert "\nE_DIM = 3\nF_DIM = 2\nALPHA_CONST = 2.5\n" in source and "import torch.nn.functional" not in source
    assert "F = E @ self.W * ALPHA_CONST" in source
    assert "ALPHA = torch.nn.functional.gelu(F) + math.sqrt(E_DIM)" in source
    namespace: dict = {}
    exec(compile(source, "<standalone>", "exec"), namespace)
    module = namespace["Model"]().double()
    x = torch.randn(3, dtype=torch.float64)
    want = torch.nn.functional.gelu(x @ module.W * 2.5) + 3 ** 0.5
    torch.testing.assert_close(module(x), want)
