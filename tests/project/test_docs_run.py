"""Every snippet of README.md and docs/ is executed or checked, so the docs cannot drift.

A fenced block says what it is by its language:
- `pen`: a diagram; it must check (`penrose.load`). Diagrams meant to fail say so.
- `python`: run, in order, with the doc's other python blocks (one namespace per doc), in a
  scratch folder that has the repository's `zoo/` and the doc's named diagrams.
- `ipython`: notebook cells, run in a real IPython shell (magics such as `%%pen`).
- `bash` / `console`: every command line is checked: `penrose ...` against the CLI's own
  argument parsers (the command and every option shown must exist), `python FILE`/`-m MODULE`
  against the file, `make TARGET` against the Makefile, `pip install -e ".[EXTRA]"` against
  pyproject.toml. Synopsis notation (`[--opt]`, `a|b`, `N`, `DIR`, `...`) is read as a user would.
- `text`, `toml`, `lua`, `elisp`, `json`: shown as they are (output, editor configuration).
An unlabelled block is an error: every block declares what it is.

An HTML comment right before a block changes how it is used (invisible when the docs render):
- `<!-- doc: file NAME -->` also saves the block as NAME for later blocks of the same doc;
- `<!-- doc: fragment -->` (pen) statements out of context: they must parse, not check;
- `<!-- doc: fails TEXT -->` the block must fail (a PenroseError, or a command's exit) with TEXT
  in its message;
- `<!-- doc: setup\nCODE\n-->` python run before the block (context the reader is assumed to have).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHOWN = {"text", "toml", "lua", "elisp", "json", "html", "latex", "tex", "yaml", "diff"}
KINDS = {"pen", "python", "ipython", "bash", "console"} | SHOWN

_BLOCK = re.compile(r"(?P<notes>(?:<!--\s*doc:.*?-->\s*\n)*)^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
_NOTE = re.compile(r"<!--\s*doc:\s*(?P<kind>\w+)\s*(?P<arg>.*?)-->", re.S)


@dataclass
class Block:
    doc: Path
    line: int
    lang: str
    body: str
    notes: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in _BLOCK.finditer(text):
        notes = {n["kind"]: n["arg"].strip() for n in _NOTE.finditer(m["notes"])}
        line = text[: m.start("lang")].count("\n") + 1
        out.append(Block(doc, line, m["lang"].strip().split()[0] if m["lang"].strip() else "", m["body"], notes))
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]


def _ids(items):
    return [b.where for b in items]


def test_every_block_declares_its_kind():
    bad = [f"{b.where} ```{b.lang}" for b in ALL if b.lang not in KINDS]
    assert not bad, f"blocks without a known language (one of {sorted(KINDS)}): {bad}"


def test_the_docs_have_snippets_of_each_kind():
    langs = {b.lang for b in ALL}
    assert {"pen", "python", "bash"} <= langs, langs


# ---------------------------------------------------------------- diagrams


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "pen"], ids=_ids([b for b in ALL if b.lang == "pen"]))
def test_pen_block(block, tmp_path, monkeypatch):
    import penrose

    _scratch(block.doc, tmp_path, monkeypatch)
    if "fragment" in block.notes:
        penrose.parse(block.body, file=block.where)
        return
    if "fails" in block.notes:
        with pytest.raises(penrose.PenroseError) as err:
            penrose.load(text=block.body + ("" if block.body.endswith("\n") else "\n"))
        assert block.notes["fails"] in str(err.value), f"{block.where}: failed otherwise: {err.value}"
        return
    penrose.load(text=block.body)


# ---------------------------------------------------------------- python


def _scratch(doc: Path, where: Path, monkeypatch) -> None:
    """A folder with the repository's zoo/ and the doc's diagrams saved by `doc: file`."""
    monkeypatch.chdir(where)
    if not (where / "zoo").exists():
        (where / "zoo").symlink_to(ROOT / "zoo")
    for b in blocks(doc):
        if "file" in b.notes:
            (where / b.notes["file"]).write_text(b.body, encoding="utf-8")


PY_DOCS = [doc for doc in DOCS if any(b.lang == "python" for b in blocks(doc))]


@pytest.mark.parametrize("doc", PY_DOCS, ids=[str(d.relative_to(ROOT)) for d in PY_DOCS])
def test_python_blocks_run(doc, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    _scratch(doc, tmp_path, monkeypatch)
    scope: dict = {"__name__": "__doc__"}
    for b in blocks(doc):
        if b.lang != "python":
            continue
        if "setup" in b.notes:
            exec(compile(b.notes["setup"], f"{b.where} (setup)", "exec"), scope)  # the doc's own text
        code = compile(b.body, b.where, "exec")
        if "fails" in b.notes:
            with pytest.raises(Exception) as err:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(code, scope)
            assert b.notes["fails"] in str(err.value), f"{b.where}: failed otherwise: {err.value!r}"
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, scope)  # the doc's own snippet: a failure here is the doc telling a lie


IPY = [b for b in ALL if b.lang == "ipython"]


@pytest.mark.skipif(not IPY, reason="no notebook cells in the docs")
def test_ipython_cells_run(tmp_path, monkeypatch):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        for b in IPY:
            _scratch(b.doc, tmp_path, monkeypatch)
            result = shell.run_cell(b.body)
            assert result.success, f"{b.where}: {result.error_in_exec or result.error_before_exec}"
    finally:
        InteractiveShell.clear_instance()  # the shell is a singleton: leave none for other tests


# ---------------------------------------------------------------- command lines


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from penrose.cli import _parser

    out = {None: _parser()}
    from penrose_zoo import cli as zoo_cli
    from penrose_zoo.steerling import cli as steerling_cli

    out["zoo"] = zoo_cli._parser()
    out["steerling"] = steerling_cli._parser()
    return out


_PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")


def _synopsis(tokens: list[str]) -> list[str]:
    """Read synopsis notation the way a user would: `[--x]` → `--x`, `a|b` and `(a | b)` → `a`,
    `...` dropped (placeholders such as `N` are tried as `1` by _check_penrose)."""
    out, skipping = [], False
    for tok in tokens:
        if skipping:  # the second alternative of `(a | b)`: the first one stands
            skipping = not tok.endswith(")")
            continue
        if tok == "|":
            skipping = True
            continue
        tok = tok.lstrip("[(").rstrip("])")
        if "|" in tok and "->" not in tok:
            tok = tok.split("|")[0]
        if not tok or tok == "\\" or tok.startswith("...") or tok.endswith("..."):
            continue
        out.append(tok)
    return out


def _command_lines(body: str) -> list[str]:
    lines, cur = [], ""
    for raw in body.splitlines():
        raw = raw.rstrip()
        if raw.startswith("$ "):
            raw = raw[2:]
        if raw.endswith("\\"):
            cur += raw[:-1] + " "
            continue
        cur += raw
        if cur.strip() and not cur.lstrip().startswith("#"):
            lines.append(cur.strip())
        cur = ""
    return lines


def _check_penrose(args: list[str], parsers, elided: bool = False) -> None:
    """The command and its options exist; placeholders are tried as written, then as `1`;
    a line that elides options (`...same options...`) may leave required ones out."""
    sub = args[0] if args and args[0] in ("zoo", "steerling") else None
    parser = parsers[sub]
    rest = args[1:] if sub else args
    errors = []
    for attempt in (rest, ["1" if _PLACEHOLDER.match(t) else t for t in rest]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                parser.parse_args(attempt)
                return
            except SystemExit as e:
                if e.code in (0, None):
                    return
        errors.append(err.getvalue().strip())
    if elided and all("the following arguments are required" in e for e in errors[-1:]):
        return
    raise AssertionError(f"penrose {' '.join(args)}: {errors[-1]}")


def _check_line(line: str, parsers, where: str) -> None:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as e:
        raise AssertionError(f"{where}: cannot read {line!r}: {e}") from None
    elided = "..." in line
    for i, tok in enumerate(tokens):  # output redirection is the shell's, not the command's
        if re.match(r"^\d?>>?", tok):
            tokens = tokens[:i]
            break
    tokens = _synopsis(tokens)
    while tokens and re.match(r"^\w+=", tokens[0]):  # VAR=value before the command
        tokens.pop(0)
    if not tokens:
        return
    head = tokens[0]
    if head in ("penrose", ".venv/bin/penrose"):
        _check_penrose(tokens[1:], parsers, elided)
    elif head == "torchrun" or (head in ("python", "python3", ".venv/bin/python") and "-m" in tokens):
        i = tokens.index("-m")
        module, rest = tokens[i + 1], tokens[i + 2:]
        if module in ("penrose.cli", "penrose"):
            _check_penrose(rest, parsers, elided)
        elif module == "pytest":
            pass
        else:
            path = ROOT / module.replace(".", "/").replace("penrose_zoo", "zoo", 1)
            assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), f"{where}: no module {module}"
            _options_in_source(path.with_suffix(".py"), rest, where)
    elif head in ("python", "python3", ".venv/bin/python"):
        script = ROOT / tokens[1]
        assert script.is_file(), f"{where}: no file {tokens[1]}"
        _options_in_source(script, tokens[2:], where)
    elif head == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        for t in tokens[1:]:
            assert "=" in t or t in targets, f"{where}: make has no target {t}"
    elif head == "pip" and "-e" in tokens:
        spec = tokens[tokens.index("-e") + 1]
        extras = re.findall(r"\[([\w,]+)\]", spec)
        py = (ROOT / "pyproject.toml").read_text()
        for extra in ",".join(extras).split(",") if extras else []:
            assert re.search(rf"^{extra}\s*=", py, re.M), f"{where}: no extra {extra!r} in pyproject.toml"
    elif head == "cd":
        assert (ROOT / tokens[1]).is_dir(), f"{where}: no folder {tokens[1]}"
    elif head == "source":
        assert tokens[1] == ".venv/bin/activate", f"{where}: {line}"
    # other programs (npm, torchrun's launcher options, editors) are shown, not ours to check


def _options_in_source(path: Path, rest: list[str], where: str) -> None:
    text = path.read_text(encoding="utf-8")
    for tok in rest:
        if tok.startswith("--"):
            opt = tok.split("=")[0]
            assert f'"{opt}"' in text or f"'{opt}'" in text, f"{where}: {path.name} has no option {opt}"


SHELL = [b for b in ALL if b.lang in ("bash", "console")]


@pytest.mark.parametrize("block", SHELL, ids=_ids(SHELL))
def test_command_lines_exist(block):
    parsers = _parsers()
    for line in _command_lines(block.body):
        _check_line(line, parsers, block.where)


def test_command_checker_catches_a_wrong_option():
    parsers = _parsers()
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        _check_line("penrose check x.pen --no-such-option", parsers, "here")
    with pytest.raises(AssertionError, match="invalid choice"):
        _check_line("penrose no-such-command x.pen", parsers, "here")
    with pytest.raises(AssertionError, match="no target"):
        _check_line("make no-such-target", parsers, "here")
    _check_line("penrose steerling train --preset tiny|small --steps N --out DIR [--epsilon]", parsers, "here")
