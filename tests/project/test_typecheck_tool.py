"""tools/typecheck.py: the zoo is type-checked as `penrose_zoo` through a link, and the report
names the repository's files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def typecheck(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("typecheck_tool", ROOT / "tools" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "BUILD", tmp_path / "build" / "typecheck")
    monkeypatch.setattr(module, "LINK", tmp_path / "build" / "typecheck" / "penrose_zoo")
    return module


def test_the_report_names_the_zoo_by_its_folder(typecheck):
    report = (
        "build/typecheck/penrose_zoo/steerling/cli.py:12: error: x  [attr-defined]\n"
        "penrose/checker.py:3: note: see build/typecheck/penrose_zoo/core.py\n"
    )
    assert typecheck.repo_paths(report) == (
        "zoo/steerling/cli.py:12: error: x  [attr-defined]\n"
        "penrose/checker.py:3: note: see build/typecheck/penrose_zoo/core.py\n"  # only a line's own path
    )


def test_the_link_leads_to_the_zoo_and_is_remade_when_stale(typecheck):
    typecheck.link()
    assert typecheck.LINK.resolve() == (ROOT / "zoo").resolve()
    typecheck.LINK.unlink()
    typecheck.LINK.symlink_to(typecheck.BUILD)  # pointing elsewhere
    typecheck.link()
    assert (typecheck.LINK / "steerling" / "outputs.py").is_file()
