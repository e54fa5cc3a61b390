"""The checker's warnings in Python: `PenroseWarning`s raised with `warnings.warn` (issue 41).

`penrose.load`, `compile`, `interpret`, `source` and `export_onnx` raise each warning of the
diagrams they check once, at the caller's line; the CLI, the notebook magic, the live page and
the workspace show `Checked.warnings` themselves and raise nothing (no warning twice).
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

import penrose
from penrose.cli import main
from penrose.errors import PenroseWarning
from penrose.magic import run_cell
from penrose.workspace import Workspace

# line 4: 'h' aligns with 'x' by position (sizes 3 and 3); the legend explains every dim
ALIGNED = ("# index legend: e embedding, f feature\ndim e = 3, f = 3\ninput x[e]\ninput h[f]\n"
           "y = x + h\noutput y\n")
UNUSED = "# index legend: e embedding\ndim e = 3\ninput x[e]\nparam W[e]\ny = x * 2\noutput y\n"
NO_LEGEND = "dim e = 3\ninput x[e]\ny = x * 2\noutput y\n"  # one legend reminder: for figures, not Python


def recorded(call):
    """The warnings `call()` raises, each one (no registry, no filter hides a repeat)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        call()
    return got


def test_the_category_is_a_user_warning_exported_by_the_package():
    assert issubclass(penrose.PenroseWarning, UserWarning) and penrose.PenroseWarning is PenroseWarning
    assert "PenroseWarning" in penrose.__all__


def test_compile_raises_the_checker_warning_at_the_callers_line():
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        penrose.compile(ALIGNED)
    (w,) = got
    assert w.category is PenroseWarning
    assert (w.filename, w.lineno) == (__file__, line)  # the user's frame, not penrose's
    assert isinstance(w.message, PenroseWarning)
    assert (w.message.file, w.message.line, w.message.col) == ("<string>", 5, 9)
    assert w.message.message.startswith("'+' aligns leg 'f' of 'h' with leg 'e' of 'x' by position (sizes 3 and 3)")
    assert str(w.message) == f"<string>:5:9: {w.message.message}"


@pytest.mark.parametrize("call", [
    lambda: penrose.load(UNUSED),
    lambda: penrose.compile(UNUSED, seed=0),
    lambda: penrose.source(UNUSED),
    lambda: penrose.interpret(UNUSED, torch.ones(3)),
], ids=["load", "compile", "source", "interpret"])
def test_every_entry_point_raises_each_warning_once(call):
    got = recorded(call)
    assert [(w.category, str(w.message)) for w in got] == [(PenroseWarning, "<string>:4:1: param 'W' is never used")]
    assert got[0].filename == __file__


def test_export_onnx_raises_the_warning_once(tmp_path):
    pytest.importorskip("onnx")  # the `onnx` extra
    got = recorded(lambda: penrose.export_onnx(UNUSED, tmp_path / "m.onnx", verify=False))
    assert [str(w.message) for w in got if w.category is PenroseWarning] == ["<string>:4:1: param 'W' is never used"]
    assert next(w for w in got if w.category is PenroseWarning).filename == __file__


def test_filterwarnings_error_turns_it_into_an_exception():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=PenroseWarning)
        with pytest.raises(PenroseWarning) as info:
            penrose.compile(ALIGNED)
    assert (info.value.line, info.value.col) == (5, 9)
    assert "by position" in info.value.message and info.value.span.file == "<string>"


def test_filterwarnings_ignore_by_message_hides_only_that_warning():
    text = ALIGNED.replace("input h[f]", "input h[f]\nparam W[e]")  # and a param never used, line 5
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=r".*never used", category=PenroseWarning)
        penrose.compile(text)
    assert [(w.message.line, "by position" in w.message.message) for w in got] == [(6, True)]


def test_a_checked_diagram_or_a_module_passed_on_is_not_warned_about_again():
    with pytest.warns(PenroseWarning):
        checked = penrose.load(UNUSED)
    with pytest.warns(PenroseWarning):
        module = penrose.compile(UNUSED)
    assert recorded(lambda: penrose.compile(checked)) == []
    assert recorded(lambda: penrose.interpret(module, torch.ones(3))) == []
    assert recorded(lambda: penrose.source(module)) == []


def test_entries_sharing_a_warning_raise_it_once_each():
    got = recorded(lambda: penrose.compile(UNUSED, entries={"again": UNUSED.replace("y = x * 2", "y = x * 3")}))
    assert [str(w.message) for w in got] == ["<string>:4:1: param 'W' is never used"]


def test_the_legend_reminder_stays_out_of_python():
    assert recorded(lambda: penrose.compile(NO_LEGEND)) == []
    assert [m for m, _ in penrose.load(NO_LEGEND).warnings] == [
        "dim 'e' is not in the index legend (# index legend: e <meaning>)"]


def test_the_workspace_and_render_raise_nothing():
    assert recorded(lambda: Workspace().load(text=UNUSED)) == []
    assert recorded(lambda: penrose.render(UNUSED, "tikz")) == []


def test_the_magic_shows_the_warning_and_raises_none():
    shown: list = []
    got = recorded(lambda: run_cell("--no-figure", UNUSED, {}, shown.append))
    assert got == []
    assert [repr(s) for s in shown] == ["<pen cell>:4:1: warning: param 'W' is never used"]


def test_the_cli_prints_the_warning_once(tmp_path, capsys):
    (tmp_path / "m.pen").write_text(UNUSED, encoding="utf-8")
    for command in (["check"], ["compile"], ["plan"]):
        assert main([*command, str(tmp_path / "m.pen")]) == 0
        err = capsys.readouterr().err
        assert err.count("param 'W' is never used") == (0 if command == ["plan"] else 1), (command, err)
        if command != ["plan"]:
            assert f"{tmp_path / 'm.pen'}:4:1: warning: param 'W' is never used" in err


def test_the_cli_prints_a_raised_penrose_warning_once_at_its_place(tmp_path, capsys, monkeypatch):
    """`penrose export` compiles through penrose.compile, which raises the warning: the CLI prints
    it located (the export itself stood in for by the compile, to keep this fast)."""
    import penrose.export

    (tmp_path / "m.pen").write_text(UNUSED, encoding="utf-8")
    monkeypatch.setattr(penrose.export, "export_onnx", lambda source, out, **options: penrose.compile(source))
    assert main(["export", str(tmp_path / "m.pen"), "-o", str(tmp_path / "m.onnx")]) == 0
    err = capsys.readouterr().err
    assert err.count("param 'W' is never used") == 1
    assert f"{tmp_path / 'm.pen'}:4:1: warning: param 'W' is never used" in err


def test_the_live_page_shows_the_warning_and_raises_none(tmp_path):
    from penrose.serve import Live, _warnings_html

    (tmp_path / "m.pen").write_text(UNUSED, encoding="utf-8")
    live = Live(tmp_path / "m.pen", "key")
    got = recorded(live._check)  # what rebuild shows above the figure (the figure itself: tests/editors/test_serve.py)
    assert [w for w in got if w.category is PenroseWarning] == []
    _, shown = live._check()
    assert f"{tmp_path / 'm.pen'}:4:1: warning: param &#x27;W&#x27; is never used" in _warnings_html(shown)
