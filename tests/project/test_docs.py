"""The documentation tells the truth: its examples parse, compile and run (every snippet of every
doc is run or checked by tests/project/test_docs_run.py; these look closer at a few)."""

import re
from pathlib import Path

import pytest
import torch

import penrose
from test_docs_run import blocks

ROOT = Path(__file__).resolve().parents[2]


def pen_blocks(path: Path) -> list[str]:
    """The diagram blocks of a doc, read as tests/project/test_docs_run.py reads every block."""
    return [b.body for b in blocks(path) if b.lang == "pen"]


@pytest.mark.parametrize("doc", ["docs/language.md", "README.md"])
def test_every_diagram_example_parses(doc):
    blocks = pen_blocks(ROOT / doc)
    assert blocks, f"{doc} has no diagram examples"
    for body in blocks:
        penrose.parse(body, file=doc)  # raises PenroseSyntaxError with the position if not


def test_language_reference_first_example_compiles_and_runs():
    body = pen_blocks(ROOT / "docs/language.md")[0]
    model = penrose.compile(body, seed=0)
    assert model(Z=torch.randn(16, 32), s=torch.tensor(1.0)).shape == (16, 8)


def test_every_function_of_the_checker_is_documented():
    from penrose.checker import FUNCTIONS

    doc = (ROOT / "docs/language.md").read_text()
    missing = [f for f in sorted(FUNCTIONS) if not re.search(rf"`{f}\(", doc)]
    assert not missing, f"undocumented functions: {missing}"
