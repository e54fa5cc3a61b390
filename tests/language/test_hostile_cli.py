"""Hostile command-line and API arguments (docs/security.md): a dim sized twice, digits of other
scripts, mistyped mapping arguments, read-only files (as root too). Each is a clear error; nothing
is half-written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import penrose
from penrose.cli import _sizes, ascii_float, ascii_int, main
from penrose.errors import PenroseError
from penrose.tracing import PenroseTraceError

ROOT = Path(__file__).resolve().parents[2]
DIAGRAM = "dim e = 4\ninput x[e]\nparam W[e, e]\ny = einsum('e,ef->f', x, W)\noutput y\n"


def test_a_dim_sized_twice_must_agree():
    assert _sizes(["e=4", "e=4", "t=2"]) == {"e": 4, "t": 2}
    with pytest.raises(PenroseError, match="--size e is given twice, as 4 and 5"):
        _sizes(["e=4", "e=5"])
    with pytest.raises(PenroseError, match="given twice"):
        _sizes(["e=4", " e = 4.5"])


@pytest.mark.parametrize("item", ["e=\u0663", "e=\u0969", "e=\uff14", "e=1_000", "e=nan", "e=inf", "e=-inf", "e=0x10",
                                  "e=", "=4", "e4", "\u0435=4", "1e=4", "e=4=4", "e= ", "e=\u00b2"])
def test_only_ascii_numbers_and_names(item):
    with pytest.raises(PenroseError, match="--size expects NAME=NUMBER"):
        _sizes([item])


def test_the_command_line_refuses_them_too(tmp_path, capsys):
    f = tmp_path / "m.pen"
    f.write_text(DIAGRAM)
    assert main(["check", str(f), "--size", "e=\u0663"]) == 1
    assert "ASCII digits" in capsys.readouterr().err
    assert main(["check", str(f), "--size", "e=4", "--size", "e=5"]) == 1
    assert "given twice" in capsys.readouterr().err
    assert main(["check", str(f), "--size", "e=4", "--size", "e=4"]) == 0


@pytest.mark.parametrize("text", ["\u0663", "\uff14", "1_0", "nan", "inf", "", " ", "4.0", "0x4", "\u00b2"])
def test_argparse_number_types(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="ASCII digits"):
        ascii_int(text)
    if text != "4.0":
        with pytest.raises(argparse.ArgumentTypeError, match="ASCII digits"):
            ascii_float(text)
    assert ascii_int(" 12 ") == 12 and ascii_float("-1.5e-3") == -0.0015


def test_serve_port_and_steerling_numbers_take_ascii_digits_only():
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "serve", "x.pen", "--port", "\u0663\u0663"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "ASCII digits" in run.stderr and "Traceback" not in run.stderr
    from penrose_zoo.steerling.cli import main as steerling

    with pytest.raises(SystemExit):
        steerling(["init", "--out", "unused", "--tiny", "--seed", "\u0663"])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return x @ self.w


@pytest.mark.parametrize("dims, message", [
    ("t", r"dims= takes a mapping of dim names to axes.*not a str"), (["t"], "not a list"), (5, "not a int"),
    ({"t": "1"}, r"'t' maps to '1'; expected an axis"), ({"t": 1.0}, "maps to 1.0"), ({"t": True}, "maps to True"),
    ({"t": (0, 1, 2)}, r"maps to \(0, 1, 2\)"), ({"t": None}, "maps to None"), ({1: 0}, "1 is not a usable dim name"),
    ({"t": 1, "u": -1}, "both name axis 1 of input 0"), ({"t": 5}, "names axis 5 of input 0"),
])
def test_trace_mapping_arguments_are_type_checked(dims, message):
    with pytest.raises(PenroseTraceError, match=message):
        penrose.trace(Net(), torch.randn(2, 4), dims=dims)


@pytest.mark.parametrize("kw, message", [({"verify": "yes"}, "verify= takes True or False"), ({"batch": 1}, "batch= takes None"),
                                         ({"notes": None}, "notes= takes"), ({"title": 5}, "title= takes a string")])
def test_trace_flags_are_type_checked(kw, message):
    with pytest.raises(PenroseTraceError, match=message):
        penrose.trace(Net(), torch.randn(2, 4), **kw)


def test_trace_command_shapes_and_dims(tmp_path):
    from penrose.tracing.run import parse_shape, trace_command

    for bad in ("\u0663,4", "4,-1", "4,1e3", "100000x100000x100000"):
        with pytest.raises(PenroseTraceError, match="--input"):
            parse_shape(bad)
    src = tmp_path / "net.py"
    src.write_text("import torch\nclass Net(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n")
    with pytest.raises(PenroseTraceError, match="--dim expects NAME=AXIS"):
        trace_command(f"{src}:Net", ["2,3"], ["t=\u0661"])
    with pytest.raises(PenroseTraceError, match="--dim t is given twice"):
        trace_command(f"{src}:Net", ["2,3"], ["t=1", "t=0"])


@pytest.mark.parametrize("paths", [5, [5], b"/tmp", {"a": 1}])
def test_include_paths_are_type_checked(paths):
    with pytest.raises(TypeError, match="include_paths= takes"):
        penrose.load(DIAGRAM, include_paths=paths)


def test_read_only_files_are_refused_even_for_root(tmp_path, capsys):
    """docs/language.md: a file with no write bit (0444) is refused by fmt --write and -o, root or not."""
    f = tmp_path / "m.pen"
    messy = DIAGRAM.replace("y = einsum", "y   =   einsum")
    f.write_text(messy)
    out = tmp_path / "model.py"
    out.write_text("# keep me\n")
    for p in (f, out):
        os.chmod(p, 0o444)
    try:
        assert main(["fmt", "--write", str(f)]) == 1
        assert "read-only" in capsys.readouterr().err and f.read_text() == messy
        assert main(["compile", str(f), "-o", str(out)]) == 1
        assert "read-only" in capsys.readouterr().err and out.read_text() == "# keep me\n"
        assert stat.S_IMODE(f.stat().st_mode) == 0o444
        os.chmod(f, 0o644)  # writable again: written
        assert main(["fmt", "--write", str(f)]) == 0 and f.read_text() != messy
    finally:
        for p in (f, out):
            os.chmod(p, 0o644)
