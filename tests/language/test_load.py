"""One way in (penrose/loader.py) and one workspace (penrose/workspace.py).

Every entry point — penrose.load, compile, source, render, interpret, the CLI, the notebook
magic, serve, the language server and the zoo's load_diagram — checks through the one loader,
so the same path, text and sizes give the same checked diagram; sizes can always be given as a
mapping, so a dim of any name can be sized; the workspace parses a file again only when its
stamp changes, and checks again when a file the diagram includes changes.
"""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import penrose
from penrose.checked import Checked
from penrose.compiler import generate_source
from penrose.errors import PenroseCheckError, PenroseError
from penrose.loader import load, load_entries
from penrose.reading import Includes, merge_sizes, walk_includes
from penrose.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]

LIB = "# index legend: text token, e embedding\ndim text = 4, e = 3\nblock f(x[text, e]) {\n  return relu(x)\n}\n"
MAIN = 'include "lib.pen"\ninput Z[text, e]\nparam W[e, e]\ny = f(einsum(\'te,ef->tf\', Z, W))\noutput y\n'


def _write(path: Path, text: str):
    """Write and make sure the stamp moves (a coarse clock may not tick between saves)."""
    before = path.stat().st_mtime_ns if path.exists() else None
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


@pytest.fixture
def project(tmp_path):
    (tmp_path / "lib.pen").write_text(LIB)
    (tmp_path / "main.pen").write_text(MAIN)
    return tmp_path


def summary(c: Checked) -> tuple:
    """What a checked diagram says: sizes, outputs, parameters, blocks, warnings and its PyTorch."""
    return (
        c.dim_sizes(), [(n, t.legs) for n, t in c.outputs], c.param_count(), sorted(c.blocks),
        [m for m, _ in c.warnings], generate_source(c),
    )


# ---- the nine ways in give one answer ----------------------------------------------------------


def _entry_points(path: Path, sizes: dict) -> dict:
    """The checked diagram of `path` at `sizes` through every entry point."""
    from penrose_zoo.core import load_diagram

    from penrose.interpreter import Interpreter
    from penrose.lsp import Analyzer
    from penrose.magic import run_cell
    from penrose.rendering import _checked as render_checked
    from penrose.serve import Live

    out = {
        "penrose.loader": penrose.load(path, sizes=sizes),
        "penrose.compile": penrose.compile(path, sizes=sizes, seed=0).penrose_checked,
        "load_entries (source, compile -o)": load_entries(path, sizes=sizes)[0],
        "render": render_checked(path, sizes),
        "interpret": Interpreter(path, sizes=sizes).checked,
        "serve": Live(path, path.name, sizes=sizes)._check()[0],
        "zoo load_diagram": load_diagram(path, sizes),
    }
    size_opts = " ".join(f"--size {k}={v}" for k, v in sizes.items())
    out["magic"] = run_cell(f"--no-figure {size_opts}", path.read_text())
    if not sizes:  # the language server checks at the diagrams' own sizes
        out["lsp"] = Analyzer().analyse(str(path)).checked
    return out


@pytest.mark.parametrize("sizes", [{}, {"text": 6, "e": 5}], ids=["defaults", "sized"])
def test_every_entry_point_gives_the_same_checked_diagram(project, sizes, monkeypatch):
    monkeypatch.chdir(project)
    found = _entry_points(project / "main.pen", sizes)
    assert len(found) == (9 if not sizes else 8)
    want = summary(load(project / "main.pen", sizes=sizes))
    assert want[0] == {"text": sizes.get("text", 4), "e": sizes.get("e", 3)}
    for name, c in found.items():
        assert isinstance(c, Checked), name
        if name == "magic":  # checked from the cell's text (includes relative to the working folder)
            text = summary(load(text=MAIN, sizes=sizes))
            assert summary(c)[-1] == text[-1].replace("<string>", "<pen cell>"), name  # only the file's name differs
            assert summary(c)[:-1] == text[:-1] == want[:-1], name
        else:
            assert summary(c) == want, name


def test_the_cli_sizes_a_dim_named_text(project):
    """Regression: `--size text=7` reached penrose.load as the keyword text=7 (the diagram's text)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".shim") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "compile", str(project / "main.pen"), "--size", "text=7"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == penrose.source(project / "main.pen", sizes={"text": 7})


def test_text_and_paths_follow_one_rule(project, monkeypatch):
    monkeypatch.chdir(project)
    by_path = summary(penrose.load(project / "main.pen"))
    assert summary(penrose.load(text=MAIN))[:-1] == by_path[:-1]
    assert summary(penrose.load(MAIN))[:-1] == by_path[:-1]  # a str with a line break is text
    with pytest.raises(PenroseError, match="cannot read main: No such file"):
        penrose.rendering.render("main")  # one line: a path, for render as for load
    with pytest.raises(PenroseError, match="cannot read nope.pen"):
        penrose.interpret("nope.pen", torch.ones(4, 3))


# ---- sizes as a mapping ------------------------------------------------------------------------

AWKWARD = "dim text = 2, seed = 3, entries = 4, include_paths = 5\ninput x[text, seed]\nparam W[seed, entries]\n" \
          "param V[entries, include_paths]\ny = einsum('ts,se,ei->ti', x, W, V)\noutput y\n"


def test_dims_named_like_options_are_sized_by_a_mapping(tmp_path):
    path = tmp_path / "awkward.pen"
    path.write_text(AWKWARD)
    sizes = {"text": 8, "seed": 2, "entries": 6, "include_paths": 7}
    assert penrose.load(path, sizes=sizes).dim_sizes() == sizes
    model = penrose.compile(path, sizes=sizes, seed=0)  # seed= the option, sizes["seed"] the dim
    assert model(torch.ones(8, 2)).shape == (8, 7)
    assert model.W.shape == (2, 6) and model.V.shape == (6, 7)
    again = penrose.compile(path, sizes=sizes, seed=0)
    assert torch.equal(model.W, again.W)  # seed=0 still seeds the initialisation
    assert penrose.source(path, sizes=sizes) == generate_source(penrose.load(path, sizes=sizes))
    assert penrose.source(path, sizes=sizes) != penrose.source(path)
    out = penrose.interpret(path, torch.ones(8, 2), params=model.state_dict(), sizes=sizes)
    assert torch.allclose(out, model(torch.ones(8, 2)))


def test_keyword_sizes_still_work_and_agree_with_the_mapping(project):
    model = penrose.compile(project / "main.pen", seed=0, e=5)  # the documented call
    assert model.W.shape == (5, 5)
    assert penrose.load(project / "main.pen", e=5, sizes={"e": 5, "text": 2}).dim_sizes() == {"text": 2, "e": 5}
    with pytest.raises(PenroseError, match=r"size of 'e' given twice: 5 in sizes= and e=6"):
        penrose.load(project / "main.pen", sizes={"e": 5}, e=6)
    with pytest.raises(PenroseError, match="given twice"):
        penrose.compile(project / "main.pen", sizes={"e": 5}, e=6)
    with pytest.raises(TypeError, match="sizes= maps dim"):
        penrose.load(project / "main.pen", sizes=[("e", 5)])
    with pytest.raises(PenroseCheckError, match="unknown dim 'seeed'"):
        penrose.load(project / "main.pen", sizes={"seeed": 2})


def test_merge_sizes():
    assert merge_sizes(None, None) == {}
    assert merge_sizes({"a": 1}, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(PenroseError):
        merge_sizes({"a": 1}, {"a": 1.0})  # a size and a const value are not the same thing


# ---- checking reads no file --------------------------------------------------------------------


def test_checking_reads_no_file(project, monkeypatch):
    diagram = penrose.parse_file(project / "main.pen")
    includes = walk_includes(diagram)
    assert isinstance(includes, Includes) and [Path(f).name for f in includes.files] == ["lib.pen"]

    def no_reading(*args, **kwargs):
        raise AssertionError("the checker opened a file")

    monkeypatch.setattr(builtins, "open", no_reading)
    monkeypatch.setattr("penrose.reading.read_text", no_reading)
    monkeypatch.setattr("penrose.io.read_text", no_reading)
    c = penrose.check(diagram, {"text": 2}, includes=includes)
    assert c.dim_sizes() == {"text": 2, "e": 3}


def test_an_include_not_read_before_checking_is_an_error_at_the_include(project):
    diagram = penrose.parse_file(project / "main.pen")
    with pytest.raises(PenroseCheckError, match="not read before checking") as e:
        penrose.check(diagram, includes=Includes())
    assert e.value.line == 1


# ---- the workspace -----------------------------------------------------------------------------


def test_the_workspace_checks_again_when_an_included_file_changes(project):
    ws = Workspace()
    main = project / "main.pen"
    first = ws.load(main)
    assert first.dim_sizes() == {"text": 4, "e": 3}
    assert ws.load(main) is first  # nothing changed: the same checked diagram
    assert ws.fresh(main)
    _write(project / "lib.pen", LIB.replace("e = 3", "e = 9"))
    assert not ws.fresh(main)
    assert ws.load(main).dim_sizes() == {"text": 4, "e": 9}
    _write(project / "lib.pen", LIB.replace("relu(x)", "relu(xx)"))
    with pytest.raises(PenroseCheckError, match="unknown tensor 'xx'") as e:
        ws.load(main)
    assert e.value.file.endswith("lib.pen") and e.value.line == 4
    with pytest.raises(PenroseCheckError, match="unknown tensor 'xx'"):  # the same error, from the cache
        ws.load(main)
    assert ws.fresh(main)
    _write(project / "lib.pen", LIB)
    assert ws.load(main).dim_sizes() == {"text": 4, "e": 3}
    assert sorted(Path(f).name for f in ws.files(main)) == ["lib.pen", "main.pen"]


def test_an_unchanged_file_is_not_parsed_again(project):
    ws = Workspace()
    main = project / "main.pen"
    ws.load(main)
    assert ws.parses == 2  # main.pen and lib.pen
    ws.load(main)
    ws.load(main, sizes={"text": 2})  # another check at other sizes; the parses are reused
    ws.load(text=MAIN, file=str(project / "cell.pen"))  # a text including lib.pen
    assert ws.parses == 2
    _write(project / "lib.pen", LIB.replace("e = 3", "e = 2"))
    assert ws.load(main).dim_sizes()["e"] == 2
    assert ws.parses == 3  # lib.pen again, not main.pen


def test_an_editors_text_is_read_instead_of_the_disk(project):
    ws = Workspace()
    main = project / "main.pen"
    ws.set_text(str(project / "lib.pen"), LIB.replace("e = 3", "e = 11"))
    assert ws.load(main).dim_sizes()["e"] == 11
    ws.close(str(project / "lib.pen"))
    assert ws.load(main).dim_sizes()["e"] == 3


def test_an_editors_unsaved_file_is_included_though_no_file_is_on_disk(project):
    """Regression (issue 37): including a document open in the editor but never saved said "no
    such file"; the workspace resolves includes to its open texts too."""
    ws = Workspace()
    unsaved = project / "unsaved.pen"
    ws.set_text(str(unsaved), "dim e = 5\n")
    text = 'include "unsaved.pen"\ninput x[e]\noutput x\n'
    ws.set_text(str(project / "uses.pen"), text)
    assert not unsaved.exists() and ws.exists(str(unsaved))
    assert ws.load(project / "uses.pen").dim_sizes() == {"e": 5}
    assert ws.load(penrose.parse(text, file=str(project / "uses.pen"))).dim_sizes() == {"e": 5}  # a Diagram, as the LSP loads it
    ws.close(str(unsaved))
    with pytest.raises(PenroseCheckError, match=r"cannot include 'unsaved.pen': no such file") as e:
        ws.load(penrose.parse(text, file=str(project / "uses.pen")))
    assert (e.value.line, e.value.col) == (1, 1)


def test_an_include_naming_a_nul_is_refused_at_the_include(project):
    """No file name holds NUL: refused at the include, not a ValueError from os.path."""
    with pytest.raises(PenroseCheckError) as e:
        load(text='dim e = 2\ninclude "a\x00b.pen"\ninput x[e]\noutput x\n')
    assert e.value.message == "cannot include 'a\\x00b.pen': a file name holds no NUL character"
    assert (e.value.line, e.value.col) == (2, 1)
    ws = Workspace()  # documents named with NUL (an editor may send one), including a file beside them
    named = str(project / "x\x00y.pen")
    ws.set_text(named, 'include "lib.pen"\ninput x[e]\noutput x\n')
    assert ws.load(named).dim_sizes()["e"] == 3
    in_folder = str(project / "x\x00" / "y.pen")
    ws.set_text(in_folder, 'include "lib.pen"\ninput x[e]\noutput x\n')
    with pytest.raises(PenroseCheckError, match=r"a file name holds no NUL character") as e:
        ws.load(in_folder)
    assert (e.value.line, e.value.col) == (1, 1)


def test_the_language_server_parses_an_unchanged_include_once(project):
    from penrose.lsp import Analyzer

    a = Analyzer()
    main = str(project / "main.pen")
    a.set_text(main, MAIN)
    assert a.analyse(main).checked.dim_sizes() == {"text": 4, "e": 3}
    parses = a.workspace.parses
    a.set_text(main, MAIN + "# a comment\n")
    assert a.analyse(main).diagnostics == []
    assert a.workspace.parses == parses + 1  # the edited document, not lib.pen
    _write(project / "lib.pen", LIB.replace("e = 3", "e = 2"))
    assert a.file_changed(str(project / "lib.pen")) == [main]
    assert a.analyse(main).checked.dim_sizes() == {"text": 4, "e": 2}


def test_the_magic_does_not_parse_an_unchanged_include_again(project, monkeypatch):
    from penrose import magic

    monkeypatch.chdir(project)
    monkeypatch.setattr(magic, "WORKSPACE", Workspace())
    magic.run_cell("--no-figure", MAIN)
    magic.run_cell("--no-figure --size e=2", MAIN)
    assert magic.WORKSPACE.parses == 1  # lib.pen, once (the cell's own text is parsed with each new check)
    _write(project / "lib.pen", LIB.replace("e = 3", "e = 5"))
    assert magic.run_cell("--no-figure", MAIN).dim_sizes()["e"] == 5



def test_zoo_load_diagram_sees_a_change_in_an_included_file(project):
    """Regression: the zoo's cache was keyed on the diagram file's own modification time only,
    so an edited include kept the old checked diagram."""
    from penrose_zoo.core import load_diagram

    main = project / "main.pen"
    assert load_diagram(main).dim_sizes() == {"text": 4, "e": 3}
    _write(project / "lib.pen", LIB.replace("e = 3", "e = 7"))
    assert load_diagram(main).dim_sizes() == {"text": 4, "e": 7}
    assert load_diagram(main, {"text": 2}, e=7).dim_sizes() == {"text": 2, "e": 7}
