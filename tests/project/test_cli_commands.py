"""Commands other packages add through the `penrose.commands` entry points (the zoo, Steerling):
discovered by the CLI, listed in its help, given their arguments untouched."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from penrose import cli
from penrose.cli import main


def test_the_zoo_and_steerling_are_discovered():
    found = cli._discovered()
    assert found["zoo"].value == "penrose_zoo.cli:main"
    assert found["steerling"].value == "penrose_zoo.steerling.cli:main"


def test_help_lists_discovered_commands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "check" in out and "penrose_zoo.cli:main" in out and "penrose_zoo.steerling.cli:main" in out
    assert main([]) == 2 and "penrose_zoo.steerling.cli:main" in capsys.readouterr().out


def test_steerling_help_lists_its_subcommands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["steerling", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: penrose steerling")
    for sub in ("generate", "init", "info", "train", "explain", "steer", "evaluate"):
        assert f"    {sub} " in out, sub


def test_zoo_without_a_subcommand_prints_its_help(capsys):
    assert main(["zoo"]) == 2
    assert capsys.readouterr().out.startswith("usage: penrose zoo")


def test_unknown_zoo_subcommand_is_the_zoo_parsers_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["zoo", "frobnicate"])
    assert info.value.code == 2
    assert "usage: penrose zoo" in capsys.readouterr().err


def test_built_in_commands_scan_no_entry_points(tmp_path, monkeypatch, capsys):
    """`penrose check` answers without reading every installed package's metadata."""
    def refuse():
        raise AssertionError("entry points scanned for a built-in command")

    monkeypatch.setattr(cli, "_discovered", refuse)
    (tmp_path / "x.pen").write_text("dim e = 2\ninput x[e]\noutput x\n", encoding="utf-8")
    assert main(["check", str(tmp_path / "x.pen")]) == 0
    assert "ok" in capsys.readouterr().out


def test_a_command_gets_its_arguments_untouched(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_discovered", lambda: {"echo": _entry("echo", "tests.test_cli_commands:_echo")})
    monkeypatch.setattr(EntryPoint, "load", lambda self: lambda argv: seen.append(argv) or 3)
    assert main(["echo", "--help", "-o", "x", "--size", "e=2"]) == 3
    assert seen == [["--help", "-o", "x", "--size", "e=2"]]


def test_a_command_that_cannot_load_is_an_error(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_discovered", lambda: {"gone": _entry("gone", "no_such_package_xyz.cli:main")})
    assert main(["gone", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: command 'gone' (no_such_package_xyz.cli:main) cannot be loaded: ")
    assert "No module named 'no_such_package_xyz'" in err


def test_a_built_in_command_wins_over_a_discovered_one_of_its_name(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "_discovered", lambda: {"check": _entry("check", "no_such_package_xyz:main")})
    (tmp_path / "x.pen").write_text("dim e = 2\ninput x[e]\noutput x\n", encoding="utf-8")
    assert main(["check", str(tmp_path / "x.pen")]) == 0
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "no_such_package_xyz" not in capsys.readouterr().out


def _entry(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=cli.COMMANDS)
