"""Files: paths versus text, reading, includes and where they may reach, and `-o` writes.

The rules are written in penrose/loader.py (paths, text, includes) and penrose/io.py (reading,
writing); docs/language.md ("Files") says them for users.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import penrose
from penrose import io
from penrose.cli import main
from penrose.errors import PenroseCheckError, PenroseError, PenroseSyntaxError

ROOT = Path(__file__).resolve().parents[2]
GOOD = "dim t = 2, e = 3\ninput x[t, e]\ny = x * 2\noutput y\n"
LIB = "dim e = 3\nblock twice(h[t, e]) {\n  return h * 2\n}\n"
MAIN = 'dim t = 2\ninclude "lib.pen"\ninput x[t, e]\ny = twice(x)\noutput y\n'
NOT_AS_ROOT = pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may read and write anything")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def leftovers(folder: Path):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def torch_free(code: str):
    """Run `code` in a fresh interpreter from the repository root; it must not import torch."""
    script = code + "\nimport sys\nassert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


# ---- layers: loading and checking import no torch -------------------------------------------


def test_load_imports_no_torch():
    torch_free("import penrose, sys; penrose.load('zoo/self_attention.pen')")


def test_check_command_imports_no_torch():
    r = torch_free(
        "from penrose.cli import main\n"
        "assert main(['check', 'zoo/paper/self_attention.pen', 'zoo/steerling/steerling.pen']) == 0\n"
    )
    assert "zoo/paper/self_attention.pen: ok" in r.stdout


def test_fmt_command_imports_no_torch():
    torch_free("from penrose.cli import main\nassert main(['fmt', '--check', 'zoo/paper/mlp.pen']) in (0, 1)\n")


# ---- paths and text -------------------------------------------------------------------------


def test_a_missing_path_is_no_such_file_not_a_syntax_error(tmp_path, capsys):
    with pytest.raises(PenroseError) as info:
        penrose.load("nope")
    e = info.value
    assert type(e) is PenroseError and e.file == "nope" and e.line == 0
    assert e.message == "cannot read nope: No such file or directory"
    # the CLI, from anywhere
    code, _, err = run(capsys, "check", "nope")
    assert code == 1 and err == "nope: error: cannot read nope: No such file or directory\n"
    with pytest.raises(PenroseError, match="No such file"):
        penrose.load(tmp_path / "missing.pen")


def test_a_directory_is_refused_not_parsed(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    for source in (folder, str(folder)):
        with pytest.raises(PenroseError) as info:
            penrose.load(source)
        assert info.value.message == f"cannot read {folder}: Is a directory" and info.value.file == str(folder)
    with pytest.raises(PenroseError, match="Is a directory"):
        penrose.compile(str(folder))  # once parsed the word as a diagram
    assert run(capsys, "check", folder)[0] == 1


def test_path_or_text_rule(tmp_path, monkeypatch):
    f = tmp_path / "model"  # no .pen suffix: still a path, because a str without a line break is one
    f.write_text(GOOD, encoding="utf-8")
    assert penrose.load(str(f)).diagram.file == str(f)
    assert penrose.load(f).diagram.file == str(f)  # a Path is always a path
    assert penrose.load(GOOD).diagram.file == "<string>"  # a line break: text
    assert penrose.load(text=GOOD).diagram.file == "<string>"  # text= is always text
    d = penrose.parse(GOOD)
    assert penrose.load(d).diagram is d  # a Diagram as it is
    # a file whose name looks like text is still read as a file, when passed as a Path
    monkeypatch.chdir(tmp_path)
    odd = Path("y = x\noutput y")
    odd.write_text(GOOD, encoding="utf-8")
    assert penrose.load(odd).outputs[0][0] == "y"
    # the empty string is the empty diagram, not a file name
    with pytest.raises(PenroseCheckError, match="no output"):
        penrose.load("")
    with pytest.raises(TypeError, match="not both"):
        penrose.load(f, text=GOOD)
    with pytest.raises(TypeError, match="got bytes"):
        penrose.load(GOOD.encode())


def test_source_and_compile_take_text_and_paths_alike(tmp_path):
    f = tmp_path / "m.pen"
    f.write_text(GOOD, encoding="utf-8")
    assert "\nModel = " in penrose.source(f) and "\nModel = " in penrose.source(text=GOOD)
    assert penrose.compile(text=GOOD, seed=0).penrose_checked.diagram.file == "<string>"
    assert penrose.compile(str(f), seed=0).penrose_checked.diagram.file == str(f)
    with pytest.raises(PenroseError, match="No such file"):
        penrose.source("missing.pen")


# ---- reading --------------------------------------------------------------------------------


def test_an_empty_file_names_the_file(tmp_path):
    f = tmp_path / "empty.pen"
    f.write_text("", encoding="utf-8")
    with pytest.raises(PenroseError) as info:
        penrose.load(f)
    assert info.value.message == f"{f} is empty; a diagram declares at least an input and an output"
    assert info.value.file == str(f)
    f.write_text("\ufeff \n\n", encoding="utf-8")  # a byte-order mark and blank lines are empty too
    with pytest.raises(PenroseError, match="is empty"):
        penrose.load(f)
    assert penrose.parse_file(f).body == ()  # parsing (fmt) accepts it


def test_not_utf8_is_positioned_and_names_the_file(tmp_path):
    f = tmp_path / "latin1.pen"
    f.write_bytes("dim t = 2\n# caf\xe9\ninput x[t]\noutput x\n".encode("latin-1"))
    with pytest.raises(PenroseSyntaxError) as info:
        penrose.load(f)
    e = info.value
    assert e.message == f"{f} is not UTF-8 text (invalid continuation byte at byte 15)"
    assert (e.file, e.line, e.col) == (str(f), 2, 6)
    assert "caf" not in e.render()  # the undecodable line is not echoed
    f.write_bytes("dim t = 2\n".encode("utf-16"))
    with pytest.raises(PenroseSyntaxError, match="it looks like UTF-16, save it as UTF-8"):
        penrose.load(f)


def test_an_unreadable_file_names_the_file(tmp_path, monkeypatch):
    f = tmp_path / "secret.pen"
    f.write_text(GOOD, encoding="utf-8")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(io, "open", denied, raising=False)
    with pytest.raises(PenroseError) as info:
        penrose.load(f)
    assert info.value.message == f"cannot read {f}: Permission denied" and info.value.file == str(f)


@NOT_AS_ROOT
def test_an_unreadable_file_on_disk(tmp_path):
    f = tmp_path / "secret.pen"
    f.write_text(GOOD, encoding="utf-8")
    f.chmod(0)
    with pytest.raises(PenroseError, match="Permission denied"):
        penrose.load(f)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.pen"
    os.mkfifo(fifo)
    with pytest.raises(PenroseError) as info:
        penrose.load(fifo)  # opening it would wait for a writer forever
    assert info.value.message == f"cannot read {fifo}: not a regular file (a FIFO)"


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
def test_a_device_is_refused():
    with pytest.raises(PenroseError, match=r"cannot read /dev/null: not a regular file \(a character device\)"):
        penrose.load("/dev/null")


# ---- byte-order mark and CRLF ---------------------------------------------------------------


def test_bom_and_crlf_parse_with_positions_an_editor_shows(tmp_path):
    f = tmp_path / "windows.pen"
    f.write_bytes(b"\xef\xbb\xbfdim t = 2\r\ninput x[t]\r\ny = sigmod(x)\r\noutput y\r\n")
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(f)
    e = info.value
    assert (e.line, e.col) == (3, 5)
    assert e.render().split("\n")[1:] == ["    y = sigmod(x)", "        ^~~~~~~~~"]
    f.write_bytes(b"\xef\xbb\xbfdim t = 2\r\ninput x[t]\r\ny = x\r\noutput y\r\n")
    c = penrose.load(f)
    assert c.outputs[0][0] == "y" and "\r" not in c.diagram.source and "\ufeff" not in c.diagram.source
    assert penrose.parse("\ufeffdim t = 2\r\ninput x[t]\r\noutput x") == penrose.parse("dim t = 2\ninput x[t]\noutput x")
    # the first line's columns do not count the byte-order mark
    assert penrose.parse("\ufeffdim t = 2").body[0].span.col == penrose.parse("dim t = 2").body[0].span.col == 5


@pytest.mark.parametrize("text, line, col", [
    ("# a note\rdim f = 2\ndim e = 2\ninput x[e]\noutput x\n", 1, 9),  # an editor shows `dim f = 2` on a line of its own
    ("dim e = 2\ninput x[e]\rinput y[e]\noutput x\n", 2, 11),
    ('dim e = 2\ninput x[e]\nlabel x "a\rb"\noutput x\n', 3, 11),
    ("dim e = 2\r\ninput x[e]\r\noutput x\r", 3, 9),  # CRLF lines, then a lone CR at the end
])
def test_a_lone_carriage_return_is_refused_where_it_stands(text, line, col):
    """Regression: a CR without an LF after it ended no line, so inside a comment it swallowed
    what an editor shows as the next line (a declaration penrose then never saw)."""
    with pytest.raises(PenroseSyntaxError) as info:
        penrose.parse(text)
    e = info.value
    assert e.message.startswith("a carriage return (CR) without a line feed after it: a line of a .pen file ends with LF or CRLF")
    assert (e.line, e.col) == (line, col)
    assert "\r" not in e.render()  # the caret line shows it as a symbol


def test_fmt_keeps_crlf_and_drops_the_bom(tmp_path, capsys):
    crlf = tmp_path / "crlf.pen"
    crlf.write_bytes(b"dim e = 3\r\ninput x[e]\r\ny = x * 2\r\noutput y\r\n")
    assert run(capsys, "fmt", "--check", crlf) == (0, "", "")  # CRLF is this file's style, not a fault
    crlf.write_bytes(b"dim e = 3\r\ninput x[ e ]\r\ny = x*2\r\noutput y\r\n")
    assert run(capsys, "fmt", "--write", crlf)[:2] == (0, f"formatted {crlf}\n")
    assert crlf.read_bytes() == b"dim e = 3\r\ninput x[e]\r\ny = x * 2\r\noutput y\r\n"
    bom = tmp_path / "bom.pen"
    bom.write_bytes(b"\xef\xbb\xbfdim e = 3\ninput x[e]\ny = x * 2\noutput y\n")
    assert run(capsys, "fmt", "--check", bom)[:2] == (1, f"{bom}: not formatted\n")
    run(capsys, "fmt", "--write", bom)
    assert bom.read_bytes() == b"dim e = 3\ninput x[e]\ny = x * 2\noutput y\n"


# ---- -o: atomic, through symlinks, keeping the mode, refusing what is not a file ------------


@pytest.fixture
def good(tmp_path):
    f = tmp_path / "good.pen"
    f.write_text(GOOD, encoding="utf-8")
    return f


def test_output_refuses_a_directory(good, tmp_path, capsys):
    out = tmp_path / "out.svg"
    out.mkdir()
    for argv in (("compile", good, "-o", out), ("render", good, "-o", out)):
        code, stdout, err = run(capsys, *argv)
        assert code == 1 and stdout == ""
        assert err == f"{out}: error: cannot write {out}: it is a directory\n"
    assert list(out.iterdir()) == [] and leftovers(tmp_path) == []


def test_output_refuses_devices_and_fifos(good, tmp_path, capsys):
    if os.path.exists("/dev/null"):
        code, _, err = run(capsys, "compile", good, "-o", "/dev/null")
        assert code == 1
        assert "cannot write /dev/null: it is a character device, not a regular file; leave out -o to print instead" in err
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "model.py"
        os.mkfifo(fifo)
        code, _, err = run(capsys, "compile", good, "-o", fifo)
        assert code == 1 and f"cannot write {fifo}: it is a FIFO, not a regular file" in err
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_output_refuses_the_diagram_itself(good, capsys):
    code, _, err = run(capsys, "compile", good, "-o", good)
    assert code == 1 and f"cannot write {good}: it is the diagram {good} itself" in err
    assert good.read_text(encoding="utf-8") == GOOD


def test_output_keeps_the_mode_of_an_existing_file(good, tmp_path, capsys):
    out = tmp_path / "model.py"
    out.write_text("# old\n", encoding="utf-8")
    out.chmod(0o751)
    assert run(capsys, "compile", good, "-o", out)[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o751 and "\nModel = " in out.read_text(encoding="utf-8")


def test_output_of_a_new_file_follows_the_umask(good, tmp_path, capsys):
    old = os.umask(0o027)
    try:
        out = tmp_path / "new.py"
        assert run(capsys, "compile", good, "-o", out)[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_output_writes_through_a_symlink(good, tmp_path, capsys):
    real = tmp_path / "real" / "model.py"
    real.parent.mkdir()
    real.write_text("# old\n", encoding="utf-8")
    real.chmod(0o600)
    link = tmp_path / "model.py"
    link.symlink_to(Path("real") / "model.py")  # relative, as links usually are
    assert run(capsys, "compile", good, "-o", link)[:2] == (0, f"wrote {link}\n")
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "model.py")
    assert "\nModel = " in real.read_text(encoding="utf-8") and stat.S_IMODE(real.stat().st_mode) == 0o600
    assert leftovers(tmp_path) == [] and leftovers(real.parent) == []
    # fmt --write too: the link stays, its target is formatted
    diagram = tmp_path / "real" / "d.pen"
    diagram.write_text("dim e = 3\ninput x[ e ]\noutput x\n", encoding="utf-8")
    (tmp_path / "d.pen").symlink_to(diagram)
    assert run(capsys, "fmt", "--write", tmp_path / "d.pen")[0] == 0
    assert (tmp_path / "d.pen").is_symlink() and diagram.read_text(encoding="utf-8") == "dim e = 3\ninput x[e]\noutput x\n"
    # a dangling link: the file it names is created
    dangling = tmp_path / "later.py"
    dangling.symlink_to(tmp_path / "real" / "later.py")
    assert run(capsys, "compile", good, "-o", dangling)[0] == 0
    assert dangling.is_symlink() and (tmp_path / "real" / "later.py").is_file()


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_a_failed_write_leaves_the_old_file_whole(good, tmp_path, capsys, monkeypatch, where):
    out = tmp_path / "model.py"
    out.write_text("# previous\n", encoding="utf-8")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if where == "write":
        real_fdopen = os.fdopen

        class Full:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[: len(data) // 2])  # half of it lands, then the disk is full
                disk_full()

        monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    else:
        monkeypatch.setattr(os, where, disk_full)
    code, _, err = run(capsys, "compile", good, "-o", out)
    assert code == 1 and f"cannot write {out}: No space left on device" in err
    assert out.read_text(encoding="utf-8") == "# previous\n"
    assert leftovers(tmp_path) == []


def test_an_interrupted_write_leaves_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "model.py"
    out.write_text("# previous\n", encoding="utf-8")

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        io.atomic_write_text(out, "new\n")
    assert out.read_text(encoding="utf-8") == "# previous\n" and leftovers(tmp_path) == []


def test_a_read_only_file_is_refused(good, tmp_path, capsys, monkeypatch):
    out = tmp_path / "model.py"
    out.write_text("# keep\n", encoding="utf-8")
    out.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if Path(p) == out and m == os.W_OK else real_access(p, m))
    code, _, err = run(capsys, "compile", good, "-o", out)
    assert code == 1 and f"cannot write {out}: permission denied (the file is read-only)" in err
    assert out.read_text(encoding="utf-8") == "# keep\n" and stat.S_IMODE(out.stat().st_mode) == 0o444


def test_render_refuses_a_bad_output_before_drawing(good, tmp_path, capsys):
    code, _, err = run(capsys, "render", good, "-o", tmp_path / "missing" / "fig.svg")
    assert code == 1 and "folder" in err and "does not exist" in err
    code, out, _ = run(capsys, "render", good, "-o", tmp_path / "fig.svg")
    assert code == 0 and (tmp_path / "fig.svg").read_text(encoding="utf-8").startswith("<?xml")


# ---- includes -------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path):
    p = tmp_path / "project"
    (p / "lib").mkdir(parents=True)
    (p / "lib" / "blocks.pen").write_text('include "dims.pen"\n' + LIB.replace("dim e = 3\n", ""), encoding="utf-8")
    (p / "lib" / "dims.pen").write_text("dim e = 3\n", encoding="utf-8")  # beside blocks.pen, not the top file
    (p / "main.pen").write_text(MAIN.replace('"lib.pen"', '"lib/blocks.pen"'), encoding="utf-8")
    return p


def test_includes_resolve_relative_to_the_including_file(project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the working folder does not matter
    c = penrose.load(project / "main.pen")
    assert c.outputs[0][0] == "y" and "twice" in c.blocks


def test_an_include_that_escapes_the_project_is_refused_with_a_position(tmp_path):
    (tmp_path / "outside.pen").write_text("dim q = 1\n# a private line\n", encoding="utf-8")
    p = tmp_path / "project"
    p.mkdir()
    (p / "main.pen").write_text('dim t = 2\n  include "../outside.pen"\ninput x[t]\noutput x\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(p / "main.pen")
    e = info.value
    assert (e.file, e.line, e.col) == (str(p / "main.pen"), 2, 3)
    assert e.message == (
        f"cannot include '../outside.pen': it lies outside {p} "
        "(allow another folder with --include-path DIR or include_paths=[DIR])"
    )
    assert "private" not in e.render()
    # allowed by an include path
    assert penrose.load(p / "main.pen", include_paths=[tmp_path]).outputs[0][0] == "x"


def test_an_absolute_include_of_a_system_file_echoes_nothing(tmp_path, capsys):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd.pen").write_text("root:x:0:0:root:/root:/bin/bash\n", encoding="utf-8")
    p = tmp_path / "project"
    p.mkdir()
    main_pen = p / "main.pen"
    main_pen.write_text(f'dim t = 2\ninclude "{secret / "passwd.pen"}"\ninput x[t]\noutput x\n', encoding="utf-8")
    code, out, err = run(capsys, "check", main_pen)
    assert code == 1 and "root:x" not in err and "outside" in err
    # allowed, it is parsed, and its own syntax error shows its own line: the user said it may be read
    code, out, err = run(capsys, "check", main_pen, "--include-path", secret)
    assert code == 1 and f"{secret / 'passwd.pen'}:1:5: error:" in err and "included from here" in err
    # a file that is not .pen is never read as an include, wherever it is
    main_pen.write_text('dim t = 2\ninclude "/etc/passwd"\ninput x[t]\noutput x\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(main_pen, include_paths=["/"])
    assert info.value.message == "cannot include '/etc/passwd': an include names a .pen file"
    assert info.value.render().count("\n") == 2  # the include line and its caret, nothing else


def test_a_symlink_out_of_the_project_is_refused(tmp_path):
    (tmp_path / "elsewhere.pen").write_text("dim e = 3\n", encoding="utf-8")
    p = tmp_path / "project"
    p.mkdir()
    (p / "dims.pen").symlink_to(tmp_path / "elsewhere.pen")
    (p / "main.pen").write_text('include "dims.pen"\ninput x[e]\noutput x\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError, match="lies outside"):
        penrose.load(p / "main.pen")


def test_include_paths_are_searched_in_order(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "lib.pen").write_text(LIB, encoding="utf-8")
    p = tmp_path / "project"
    p.mkdir()
    (p / "main.pen").write_text(MAIN, encoding="utf-8")
    with pytest.raises(PenroseCheckError, match=r"cannot include 'lib.pen': no such file \(looked at "):
        penrose.load(p / "main.pen")
    assert penrose.load(p / "main.pen", include_paths=[shared]).outputs[0][0] == "y"
    assert run(capsys, "check", p / "main.pen", "--include-path", shared)[0] == 0
    with pytest.raises(PenroseError, match="is not a folder"):
        penrose.load(p / "main.pen", include_paths=[p / "main.pen"])


def test_includes_from_text_stay_in_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "lib.pen").write_text(LIB, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert penrose.load(text=MAIN).outputs[0][0] == "y"
    with pytest.raises(PenroseCheckError, match="lies outside"):
        penrose.load(text=MAIN.replace('"lib.pen"', '"../lib.pen"'))


def test_an_included_folder_empty_or_unreadable_file_is_reported_at_the_include(tmp_path):
    (tmp_path / "sub.pen").mkdir()
    (tmp_path / "empty.pen").write_text("", encoding="utf-8")
    main_pen = tmp_path / "main.pen"
    for target, message in [("sub.pen", f"cannot include 'sub.pen': {tmp_path / 'sub.pen'} is a directory"),
                            ("empty.pen", f"{tmp_path / 'empty.pen'} is empty; an included file holds dims or blocks")]:
        main_pen.write_text(f'dim t = 2\ninclude "{target}"\ninput x[t]\noutput x\n', encoding="utf-8")
        with pytest.raises(PenroseCheckError) as info:
            penrose.load(main_pen)
        assert info.value.message == message and (info.value.line, info.value.col) == (2, 1)


def test_an_include_cycle_through_a_symlinked_folder_ends(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path)  # loop/ is the folder itself
    (tmp_path / "a.pen").write_text('include "loop/a.pen"\ndim t = 2\n', encoding="utf-8")
    main_pen = tmp_path / "main.pen"
    main_pen.write_text('include "a.pen"\ninput x[t]\noutput x\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError, match="include cycle"):
        penrose.load(main_pen)


def test_the_zoo_still_loads_with_its_includes():
    c = penrose.load(ROOT / "zoo" / "steerling" / "steerling.pen")
    assert c.outputs


def test_a_name_with_a_nul_character_is_a_penrose_error():
    """Found by tests/interpreter/test_fuzz.py: a one-line string is a path, and os.stat raised ValueError
    ('embedded null byte') for '\\x00'."""
    with pytest.raises(penrose.PenroseError, match="holds no NUL character"):
        penrose.compile("\x00")


def test_a_folder_is_written_whole_or_not_at_all(tmp_path):
    """penrose.io.atomic_write_folder (penrose steerling init and planted): a new folder takes the
    old one's place at once; a failing writer leaves the old one as it was and nothing beside it."""
    out = tmp_path / "ck"
    out.mkdir()
    (out / "train.json").write_text("old")
    os.chmod(out, 0o750)
    with pytest.raises(PenroseError, match=r"ck exists and is not empty; give --force"):
        io.atomic_write_folder(out, lambda d: (d / "a").write_text("new"), hint="give --force")

    def fails(d):
        (d / "a").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(PenroseError, match="cannot write .*ck: No space left on device"):
        io.atomic_write_folder(out, fails, replace=True)
    assert [p.name for p in tmp_path.iterdir()] == ["ck"] and (out / "train.json").read_text() == "old"
    io.atomic_write_folder(out, lambda d: (d / "a").write_text("new"), replace=True)
    assert [p.name for p in out.iterdir()] == ["a"] and stat.S_IMODE(out.stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary or old folder left
    (tmp_path / "f").write_text("x")
    with pytest.raises(PenroseError, match="it is a file, not a folder"):
        io.atomic_write_folder(tmp_path / "f", lambda d: None)
