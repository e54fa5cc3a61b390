"""`penrose check / compile / plan / fmt` through penrose.cli.main, output and exit codes."""

from __future__ import annotations

import importlib.util
import os
import stat

import pytest
import torch

from penrose.cli import main

# GOOD checks and compiles but is not in canonical form ('x,W'), for the fmt tests
GOOD = """\
# index legend: t token, e embedding, f feature
dim t = 4, e = 3
input x[t, e]
input unused[t]
param W[e, e] ~ normal(std=0.5)
y = einsum('te,ef->tf', x,W)
output y
"""
BAD = "dim t = 4\ninput x[t]\ny = sigmod(x)\noutput y\n"
CANONICAL = "dim e = 3\ninput x[e]\ny = x * 2   # twice\noutput y\n"


@pytest.fixture
def files(tmp_path):
    for name, text in [("good.pen", GOOD), ("bad.pen", BAD), ("canonical.pen", CANONICAL)]:
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ---- check -----------------------------------------------------------------------------------


def test_check_ok(files, capsys):
    code, out, err = run(capsys, "check", files / "good.pen")
    assert code == 0
    assert out == f"{files / 'good.pen'}: ok — 2 input(s), 9 parameter(s), outputs y[t, f]\n"
    assert err == f"{files / 'good.pen'}:4:1: warning: input 'unused' is never used\n"


def test_check_with_size_override(files, capsys):
    code, out, _ = run(capsys, "check", files / "good.pen", "--size", "e=5")
    assert code == 0 and "25 parameter(s)" in out


def test_check_error_shows_position_and_caret(files, capsys):
    code, out, err = run(capsys, "check", files / "bad.pen")
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"{files / 'bad.pen'}:3:5: error: unknown function 'sigmod'; did you mean 'sigmoid'?",
        "    y = sigmod(x)",
        "        ^~~~~~~~~",
    ]


def test_check_syntax_error(files, capsys):
    (files / "syntax.pen").write_text("dim t = 2\ninput x[t]\ny = x $ 2\noutput y\n", encoding="utf-8")
    code, _, err = run(capsys, "check", files / "syntax.pen")
    assert code == 1
    assert err.splitlines() == [f"{files / 'syntax.pen'}:3:7: error: unexpected character '$'", "    y = x $ 2", "          ^"]


def test_check_several_files_stops_at_the_first_error(files, capsys):
    code, out, err = run(capsys, "check", files / "good.pen", files / "bad.pen", files / "canonical.pen")
    assert code == 1
    assert out.startswith(f"{files / 'good.pen'}: ok")
    assert "canonical.pen" not in out and "sigmod" in err


def test_check_missing_file(files, capsys):
    code, _, err = run(capsys, "check", files / "none.pen")
    assert code == 1
    assert err == f"{files / 'none.pen'}: error: cannot read {files / 'none.pen'}: No such file or directory\n"


def test_bad_size_option(files, capsys):
    code, _, err = run(capsys, "check", files / "good.pen", "--size", "e=x")
    assert code == 1 and err == ("error: --size expects NAME=NUMBER (a dim's size or a const's value; an identifier, then a finite "
                           "number in ASCII digits), got 'e=x'\n")
    code, _, err = run(capsys, "check", files / "good.pen", "--size", "q=3")
    assert code == 1 and "unknown dim 'q' in sizes" in err


def test_no_command_prints_help(capsys):
    code, out, _ = run(capsys)
    assert code == 2 and "usage: penrose" in out


def test_unknown_command_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# ---- compile ---------------------------------------------------------------------------------


def test_compile_prints_source(files, capsys):
    code, out, err = run(capsys, "compile", files / "good.pen")
    assert code == 0
    compile(out, "generated.py", "exec")
    assert "class Good(torch.nn.Module):" in out
    assert "warning: input 'unused' is never used" in err


def test_compile_writes_a_working_module(files, capsys, tmp_path):
    target = files / "model.py"
    code, out, _ = run(capsys, "compile", files / "good.pen", "-o", target, "--size", "e=5")
    assert code == 0 and out == f"wrote {target}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()  # not mkstemp's private 0600
    spec = importlib.util.spec_from_file_location("cli_generated_model", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    y = module.Model()(x=torch.randn(2, 4, 5), unused=torch.randn(2, 4))
    assert y.shape == (2, 4, 5)
    assert leftovers(files) == []


def test_compile_error_leaves_no_file(files, capsys):
    target = files / "model.py"
    code, out, err = run(capsys, "compile", files / "bad.pen", "-o", target)
    assert code == 1 and out == ""
    assert f"{files / 'bad.pen'}:3:5: error:" in err and "^~~~~~~~~" in err
    assert not target.exists()
    assert leftovers(files) == []


def test_compile_error_keeps_the_previous_file(files, capsys):
    target = files / "model.py"
    target.write_text("# previous\n", encoding="utf-8")
    assert run(capsys, "compile", files / "bad.pen", "-o", target)[0] == 1
    assert target.read_text(encoding="utf-8") == "# previous\n"


def test_compile_write_failure_is_atomic(files, capsys, monkeypatch):
    """A failure while replacing the file leaves the old content and no temporary file."""
    target = files / "model.py"
    target.write_text("# previous\n", encoding="utf-8")

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    code, _, err = run(capsys, "compile", files / "good.pen", "-o", target)
    assert code == 1
    assert f"cannot write {target}: No space left on device" in err
    assert target.read_text(encoding="utf-8") == "# previous\n"
    assert leftovers(files) == []


def test_compile_into_a_missing_folder(files, capsys):
    target = files / "nope" / "model.py"
    code, _, err = run(capsys, "compile", files / "good.pen", "-o", target)
    assert code == 1
    assert f"error: cannot write {target}: folder {files / 'nope'} does not exist" in err


# ---- plan ------------------------------------------------------------------------------------


def test_plan(files, capsys):
    (files / "chain.pen").write_text(
        "dim i = 2, j = 50, k = 50, l = 2\ninput A[i, j]\ninput B[j, k]\ninput C[k, l]\ny = einsum('ij,jk,kl->il', A, B, C)\noutput y\n",
        encoding="utf-8",
    )
    code, out, _ = run(capsys, "plan", files / "chain.pen")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"contraction plan for {files / 'chain.pen'} (free legs at their default sizes)"
    assert "line 5: y = einsum('ij,jk,kl->il', A, B, C)" in lines
    assert sum(l.lstrip().startswith("step ") for l in lines) == 2
    assert any("largest intermediate" in l for l in lines)
    assert lines[-1].startswith("total ") and lines[-1].endswith("flops per call (one batch element)")


def test_plan_error(files, capsys):
    code, out, err = run(capsys, "plan", files / "bad.pen")
    assert code == 1 and out == "" and ":3:5: error:" in err


# ---- fmt -------------------------------------------------------------------------------------


def test_fmt_prints(files, capsys):
    code, out, _ = run(capsys, "fmt", files / "good.pen")
    assert code == 0
    assert out.startswith("# index legend: t token, e embedding, f feature\ndim t = 4, e = 3\ninput x[t, e]\n")
    assert (files / "good.pen").read_text(encoding="utf-8") == GOOD  # untouched


def test_fmt_check(files, capsys):
    code, out, _ = run(capsys, "fmt", "--check", files / "canonical.pen")
    assert (code, out) == (0, "")
    code, out, _ = run(capsys, "fmt", "--check", files / "canonical.pen", files / "good.pen")
    assert (code, out) == (1, f"{files / 'good.pen'}: not formatted\n")
    assert (files / "good.pen").read_text(encoding="utf-8") == GOOD


def test_fmt_write(files, capsys):
    good = files / "good.pen"
    os.chmod(good, 0o640)
    code, out, _ = run(capsys, "fmt", "--write", good, files / "canonical.pen")
    assert (code, out) == (0, f"formatted {good}\n")  # the canonical file is left alone
    assert stat.S_IMODE(good.stat().st_mode) == 0o640  # the rewrite keeps the file's mode
    assert run(capsys, "fmt", "--check", good)[0] == 0
    assert leftovers(files) == []


def test_fmt_syntax_error(files, capsys):
    (files / "syntax.pen").write_text("dim t = = 2\n", encoding="utf-8")
    code, out, err = run(capsys, "fmt", "--write", files / "syntax.pen")
    assert code == 1 and out == ""
    assert err.startswith(f"{files / 'syntax.pen'}:1:9: error: unexpected '='")
    assert (files / "syntax.pen").read_text(encoding="utf-8") == "dim t = = 2\n"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
