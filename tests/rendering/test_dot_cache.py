"""The cache of Graphviz's output (`penrose.rendering.cache`): exact (a warm build is byte for
byte the cold one, and runs no `dot`), keyed by the input, the arguments and `dot -V` (a change
to any misses), entries written whole (parallel writers never leave half an entry to read), a
bad entry recomputed, a failure never cached, off when asked, bounded in size."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from penrose.errors import PenroseRenderError
from penrose.rendering import cache, figure
from penrose.rendering.crossings import layout
from penrose.rendering.gallery import build_files
from penrose.rendering.graphviz import dot_binary, run_dot, run_dot_many

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")

TEXT = "digraph { a -> b; b -> c; a -> c }"


@pytest.fixture
def dots(monkeypatch, tmp_path):
    """The cache in a fresh folder; the list of `dot` runs made (their arguments)."""
    monkeypatch.setenv("PENROSE_CACHE", str(tmp_path / "cache"))
    made: list = []
    real = subprocess.run

    def counting(args, *a, **k):
        if args[1:] != ["-V"]:
            made.append(args[1:])
        return real(args, *a, **k)

    monkeypatch.setattr(subprocess, "run", counting)
    monkeypatch.setattr(cache, "_versions", {})
    return made


def _files(root: Path) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file())


def fake_equation(latex):
    return b"<svg/>"


def test_a_gallery_built_warm_is_byte_identical_to_cold_and_runs_no_dot(dots, tmp_path, monkeypatch):
    # switch_moe: laid out in a batch (run_dot_many), then untangled (`dot -Tjson` layouts)
    pen = ROOT / "bench" / "figures" / "switch_moe.pen"
    monkeypatch.setattr(figure, "_untangled", {})  # the untangling's choices are remembered in-process
    cold = build_files([pen], equation_svg=fake_equation)
    assert ["-Tjson"] in dots and ["-Tsvg"] in dots
    stored = len(_files(tmp_path / "cache"))
    assert stored > 0
    dots.clear()
    monkeypatch.setattr(figure, "_untangled", {})
    warm = build_files([pen], equation_svg=fake_equation)
    assert warm == cold
    assert dots == []  # every layout came from the cache
    assert len(_files(tmp_path / "cache")) == stored
    monkeypatch.setenv("PENROSE_CACHE", "off")
    monkeypatch.setattr(figure, "_untangled", {})
    assert build_files([pen], equation_svg=fake_equation) == cold  # as without a cache


def test_a_changed_input_arguments_or_dot_version_misses(dots, tmp_path):
    first = run_dot(TEXT, "json")
    assert run_dot(TEXT, "json") == first and len(dots) == 1
    changed = run_dot(TEXT.replace("a -> c", "a -> c; c -> d"), "json")
    assert len(dots) == 2 and changed != first
    run_dot(TEXT, "svg")  # other arguments
    run_dot(TEXT, "png", graph_attrs={"size": "1,1"})
    assert len(dots) == 4
    cache._versions[dot_binary()] = "dot - graphviz version 99.0.0 (0)"  # an upgraded Graphviz
    assert run_dot(TEXT, "json") == first
    assert len(dots) == 5
    exe = dot_binary()
    assert cache.key(["-Tjson"], b"x", "1") not in (cache.key(["-Tjson"], b"x", "2"), cache.key(["-Tjso", "n"], b"x", "1"),
                                                    cache.key(["-Tjson", ""], b"x", "1"), cache.key(["-Tjson"], b"y", "1"))
    assert cache.lookup(exe, ["-Tjson"], TEXT.encode())[1] == first  # under the version of now


def test_the_version_is_dot_minus_v():
    version = cache.dot_version(dot_binary())
    assert "graphviz" in version.lower() and "version" in version.lower()


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty", "folder"])
def test_a_damaged_entry_is_recomputed_never_trusted(dots, tmp_path, damage):
    good = run_dot(TEXT, "json")
    (entry,) = _files(tmp_path / "cache")
    raw = entry.read_bytes()
    if damage == "truncated":
        entry.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":  # the content altered, its checksum not
        entry.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "garbage":
        entry.write_bytes(b"\x00" * 300)
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # unreadable: a folder where the entry should be
        entry.unlink()
        entry.mkdir()
    assert run_dot(TEXT, "json") == good
    assert len(dots) == 2  # laid out again
    if damage != "folder":  # rewritten whole, so the next run is a hit
        assert run_dot(TEXT, "json") == good and len(dots) == 2


def test_an_altered_payload_with_a_matching_checksum_is_what_the_cache_holds(dots, tmp_path):
    # the checksum guards against damage, not against a different layout: a hit is the bytes stored
    good = run_dot(TEXT, "json")
    name, hit = cache.lookup(dot_binary(), ["-Tjson"], TEXT.encode())
    assert hit == good
    cache.write(name, b'{"edited": true}')
    assert cache.read(name) == b'{"edited": true}'


def test_a_failure_is_not_cached(dots, tmp_path):
    for _ in range(2):
        with pytest.raises(PenroseRenderError, match="Graphviz failed"):
            run_dot("digraph { a -> ", "svg")
    assert len(dots) == 2 and _files(tmp_path / "cache") == []


def test_a_batch_reuses_what_it_laid_out_before_and_lays_out_only_the_new(dots):
    texts = [f"digraph g{i} {{ n{i} -> m{i} }}" for i in range(5)]
    first = run_dot_many(texts[:3], chunk=2)
    assert len(dots) == 2
    both = run_dot_many(texts, chunk=2)
    assert both[:3] == first and len(dots) == 3  # one batch, of the two new
    assert dots[-1] == ["-Tsvg"]
    assert both == [run_dot(t, "svg") for t in texts]  # as each laid out alone


def test_an_unnamed_graph_of_a_batch_is_not_cached(dots, tmp_path):
    # its title is its number in the batch ('%7'): what it is depends on the graphs before it
    texts = ["digraph { a -> b }", "digraph { a -> c }"]
    svgs = run_dot_many(texts)
    assert _files(tmp_path / "cache") == []
    assert run_dot_many(texts[1:]) != svgs[1:] and len(dots) == 2


def test_off_writes_nothing_and_still_lays_out(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for off in ("off", "0", "OFF", "false"):
        monkeypatch.setenv("PENROSE_CACHE", off)
        assert cache.folder() is None
        assert layout(TEXT).nodes.keys() == {"a", "b", "c"}
    assert _files(tmp_path) == []


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.delenv("PENROSE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.folder() == tmp_path / "xdg" / "penrose" / "dot"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.folder() == tmp_path / "home" / ".cache" / "penrose" / "dot"
    monkeypatch.setenv("PENROSE_CACHE", str(tmp_path / "mine"))
    assert cache.folder() == tmp_path / "mine" / "dot"


def test_an_unwritable_folder_only_costs_the_speed_up(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file, not a folder")
    monkeypatch.setenv("PENROSE_CACHE", str(blocked))
    assert run_dot(TEXT, "json") == run_dot(TEXT, "json")


def test_the_cache_is_kept_within_its_bound_oldest_first(monkeypatch, tmp_path):
    monkeypatch.setenv("PENROSE_CACHE", str(tmp_path))
    for i in range(6):
        cache.write(f"{i:02d}" + "ab" * 31, bytes(range(256)) * 40)
        os.utime(cache._path(tmp_path / "dot", f"{i:02d}" + "ab" * 31), (1000 + i, 1000 + i))
    sizes = [size for _, size, _ in cache.entries()]
    assert len(sizes) == 6
    left = tmp_path / "dot" / "ab"
    left.mkdir()
    (left / ".tmp-killed").write_bytes(b"half")
    os.utime(left / ".tmp-killed", (0, 0))
    assert cache.prune(limit=sum(sizes[:2])) == 5  # the 4 used longest ago, and the killed writer's file
    assert [p.name[:2] for p, *_ in cache.entries()] == ["ab", "ab"]
    assert sorted(p.parent.name for p, *_ in cache.entries()) == ["04", "05"]
    assert cache.clear() == 2 and cache.entries() == []


def test_the_bound_comes_from_penrose_cache_mb(monkeypatch, tmp_path):
    monkeypatch.setenv("PENROSE_CACHE_MB", "2")
    assert cache.limit_bytes() == 2 * 2**20
    monkeypatch.setenv("PENROSE_CACHE_MB", "lots")
    assert cache.limit_bytes() == 512 * 2**20


def _hammer(args):
    """Write one entry again and again while reading it: each read is None or a whole payload."""
    folder, which, rounds = args
    os.environ["PENROSE_CACHE"] = folder
    payloads = {bytes([n]) * (200_000 + n) for n in range(3)}
    mine = bytes([which]) * (200_000 + which)
    bad = 0
    for _ in range(rounds):
        cache.write("ff" + "0" * 62, mine)
        got = cache.read("ff" + "0" * 62)
        bad += got is not None and got not in payloads
    return bad


def test_parallel_writers_never_leave_half_an_entry_to_read(tmp_path):
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    if ctx is None:
        pytest.skip("needs fork")
    with ctx.Pool(3) as pool:
        bad = pool.map(_hammer, [(str(tmp_path), n, 60) for n in range(3)])
    assert bad == [0, 0, 0]
    assert [p.name for p in (tmp_path / "dot" / "ff").iterdir()] == ["0" * 62]  # no temporary file left


# ---- the untangling's choice (figure.to_dot), kept beside the layouts it was chosen from ------


def _retention():
    from penrose.checker import check
    from penrose.parser import parse_file

    return figure.build_figure(check(parse_file(ROOT / "bench" / "figures" / "retention.pen")))


def test_the_untangling_is_searched_once_and_its_choice_comes_back_exact(dots, monkeypatch):
    fig = _retention()
    monkeypatch.setattr(figure, "_untangled", {})
    cold = figure.to_dot(fig)
    assert cold != figure.to_dot(fig, untangle=False)  # its search moved a wire
    assert ["-Tjson"] in dots
    dots.clear()
    monkeypatch.setattr(figure, "_untangled", {})
    searched: list = []
    real = figure._untangle
    monkeypatch.setattr(figure, "_untangle", lambda *a: searched.append(1) or real(*a))
    assert figure.to_dot(fig) == cold
    assert searched == [] and dots == []
    monkeypatch.setattr(figure, "_untangled", {})
    monkeypatch.setattr(cache, "_code", ["another penrose"])  # penrose's source changed: searched again
    assert figure.to_dot(fig) == cold and searched == [1]


@pytest.mark.parametrize("choice", [(), ("mclimit=4", 3, {"a->b": "reverse", "c->d": "minlen=2"}, None),
                                    ("", 4, None, {"where": ("mask", "false", "true"), "w2": ("true",)})])
def test_every_kind_of_choice_comes_back_as_it_was(dots, monkeypatch, choice):
    fig = _retention()
    text = figure._dot_text(fig)
    searched: list = []
    monkeypatch.setattr(figure, "_untangle", lambda *a: searched.append(1) or choice)
    assert figure._untangle_cached(fig, text) == choice
    assert figure._untangle_cached(fig, text) == choice and searched == [1]
    other = _retention()
    other.edges[0].label = "another label"  # another figure, even with the same DOT text: searched again
    assert figure._untangle_cached(other, text) == choice and searched == [1, 1]


def test_a_search_cut_short_is_not_kept_and_an_unreadable_choice_is_searched_again(dots, monkeypatch, tmp_path):
    fig = _retention()
    text = figure._dot_text(fig)
    answers = iter([None, ("", 1, None, None), ("", 2, None, None)])
    monkeypatch.setattr(figure, "_untangle", lambda *a: next(answers))
    assert figure._untangle_cached(fig, text) == ()  # no Graphviz, or a layout too slow: as it is
    assert _files(tmp_path / "cache") == []
    assert figure._untangle_cached(fig, text) == ("", 1, None, None)
    (entry,) = _files(tmp_path / "cache")
    name = entry.parent.name + entry.name
    cache.write(name, b'{"not": "a choice"}')  # whole, but not a choice this version reads
    assert figure._untangle_cached(fig, text) == ("", 2, None, None)
    assert figure._untangle_cached(fig, text) == ("", 2, None, None)


def test_the_cache_command_shows_and_clears_it(dots, tmp_path, monkeypatch, capsys):
    from penrose.cli import main

    run_dot(TEXT, "json")
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "cache" / "dot") in out and "1 entries" in out
    assert main(["cache", "--clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out and _files(tmp_path / "cache") == []
    monkeypatch.setenv("PENROSE_CACHE", "off")
    assert main(["cache"]) == 0 and "off" in capsys.readouterr().out
