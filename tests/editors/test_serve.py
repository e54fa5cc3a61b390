"""`penrose serve`: the live page follows the file. Over HTTP (state, figures, events) and in
headless Chromium: edit the file and the figure changes, break it and the error shows with its
caret, fix it and the error goes."""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from penrose.errors import PenroseError
from penrose.rendering.browser import Chromium, chromium_binary
from penrose.serve import LiveServer

ROOT = Path(__file__).resolve().parents[2]

needs_dot = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")

DIAGRAM = """\
# index legend: t token, d embedding, e attention dim
dim t = 6, d = 8, e = 4
input Z[t, d]
param W_q[d, e]
q = einsum('td,de->te', Z, W_q)
output q
"""


def _state(server, **query):
    url = server.url + "state" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _until(fn, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("timed out")


def _write(path: Path, text: str):
    """Write and make sure the modification time moves (a coarse clock may not tick between saves)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        import os

        os.utime(path, ns=(before + 10_000_000, before + 10_000_000))


@needs_dot
def test_state_figures_and_errors_over_http(tmp_path):
    f = tmp_path / "m.pen"
    f.write_text(DIAGRAM)
    with LiveServer(f, port=0) as server:
        assert urlparse(server.url).hostname == "127.0.0.1"
        s = _until(lambda: (st := _state(server))["phase"] == "complete" and st)
        assert s["ok"] and "<svg" in s["figure"] and "W_q" in s["figure"]
        assert "einsum" in s["rosetta"] and "torch" in s["source"]
        import re

        figures = re.findall(r'src="(/[^"]+)"', s["rosetta"])
        assert any(u.startswith("/r/") for u in figures) and any(u.startswith("/equations/") for u in figures)
        for u in figures:
            with urllib.request.urlopen(server.url.rstrip("/") + u, timeout=30) as r:
                assert r.status == 200 and r.read().lstrip().startswith(b"<")
        start = time.monotonic()
        _write(f, DIAGRAM.replace("W_q", "W_query"))
        s = _until(lambda: "W_query" in (st := _state(server))["figure"] and st)
        assert time.monotonic() - start < 1.0, "the figure should follow a save within a second"
        _write(f, DIAGRAM.replace("Z, W_q)", "Z, W_k)"))
        # wait for this error: a save in place can be read half-written (empty) first, then again
        s = _until(lambda: "W_k" in (st := _state(server))["errors"] and not st["ok"] and st)
        assert "unknown tensor &#x27;W_k&#x27;; did you mean &#x27;W_q&#x27;?" in s["errors"]
        assert "^~~" in s["errors"] and "m.pen:5:28" in s["errors"]
        assert "last figure that checked" in s["figure"]  # the old figure stays, marked
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(server.url + "state?file=../../etc/passwd", timeout=10)


@needs_dot
def test_a_half_written_save_is_read_again(tmp_path):
    """Regression: an in-place save can be read between its truncation and its write; the page
    then shows "is empty". The server must read the file again when the write lands, even when
    the clock did not tick (same mtime): the stamp holds the size too."""
    import os

    f = tmp_path / "m.pen"
    f.write_text(DIAGRAM)
    with LiveServer(f, port=0) as server:
        _until(lambda: _state(server)["ok"])
        mtime = f.stat().st_mtime_ns
        f.write_text("")
        os.utime(f, ns=(mtime + 10_000_000, mtime + 10_000_000))
        _until(lambda: "is empty" in _state(server)["errors"])
        f.write_text(DIAGRAM.replace("W_q", "W_again"))
        os.utime(f, ns=(mtime + 10_000_000, mtime + 10_000_000))  # the same mtime as the empty read
        s = _until(lambda: "W_again" in (st := _state(server))["figure"] and st)
        assert s["ok"] and not s["errors"]


@needs_dot
def test_includes_are_watched(tmp_path):
    (tmp_path / "lib.pen").write_text("# index legend: t token, d embedding\ndim t = 4, d = 3\n"
                                     "block f(x[t, d]) {\n  return relu(x)\n}\n")
    main = tmp_path / "main.pen"
    main.write_text('# index legend: t token, d embedding\ninclude "lib.pen"\ninput Z[t, d]\ny = f(Z)\noutput y\n')
    with LiveServer(main, port=0) as server:
        _until(lambda: _state(server)["ok"])
        _write(tmp_path / "lib.pen", (tmp_path / "lib.pen").read_text().replace("relu(x)", "relu(xx)"))
        s = _until(lambda: "unknown tensor" in (st := _state(server))["errors"] and st)
        assert "lib.pen:4:15" in s["errors"] and "unknown tensor" in s["errors"]


def test_a_folder_lists_its_diagrams_and_nothing_else(tmp_path):
    (tmp_path / "a.pen").write_text(DIAGRAM)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.pen").write_text(DIAGRAM)
    (tmp_path / "secret.txt").write_text("no")
    with LiveServer(tmp_path, port=0) as server:
        with urllib.request.urlopen(server.url, timeout=10) as r:
            page = r.read().decode()
        assert "a.pen" in page and "sub/b.pen" in page and "secret" not in page
        for bad in ("secret.txt", "../a.pen", "/etc/passwd"):
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(server.url + f"?file={bad}", timeout=10)


def test_refuses_what_it_cannot_serve(tmp_path):
    with pytest.raises(PenroseError, match="no such file"):
        LiveServer(tmp_path / "nope.pen", port=0)
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(PenroseError, match="not a .pen file"):
        LiveServer(tmp_path / "x.txt", port=0)


def test_the_cli_serves_until_interrupted(tmp_path):
    f = tmp_path / "m.pen"
    f.write_text(DIAGRAM)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "penrose.cli", "serve", str(f), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert "penrose serve" in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_dot
@pytest.mark.browser
@pytest.mark.skipif(chromium_binary() is None, reason="Chromium is not installed")
def test_the_page_follows_edits_in_a_browser(tmp_path):
    f = tmp_path / "m.pen"
    f.write_text(DIAGRAM)
    with LiveServer(f, port=0) as server, Chromium() as browser:
        _until(lambda: _state(server)["phase"] == "complete")
        report = browser.visit(server.url)
        origin = server.url.rstrip("/")
        assert report.console_errors == []
        assert all(u.startswith(origin) or u.startswith("data:") for u in report.requests), report.requests
        assert report.broken_images == []

        def page(expr):
            return browser.evaluate(expr)

        svg_text = "(document.querySelector('#figure svg') || {textContent: ''}).textContent"
        assert "W_q" in page(svg_text)
        assert page("document.getElementById('status').textContent") == "ok"

        # edit: the figure changes, without a reload
        page("window.__same_page = 1")
        start = time.monotonic()
        _write(f, DIAGRAM.replace("W_q", "W_query").replace("output q", "r = relu(q)\noutput r"))
        _until(lambda: "W_query" in page(svg_text) and "relu" in page(svg_text), timeout=10)
        assert time.monotonic() - start < 1.5
        assert page("window.__same_page") == 1

        # break it: the error shows, with its caret
        _write(f, DIAGRAM.replace("Z, W_q)", "Z, W_k)"))
        # regression: the page could be read between the truncation and the write of an in-place
        # save ("m.pen is empty"); the server reads it again when its stamp changes, so wait for it
        text = _until(lambda: "W_k" in (t := page("document.getElementById('errors').textContent")) and t, timeout=10)
        assert "unknown tensor 'W_k'; did you mean 'W_q'?" in text
        assert "    q = einsum('td,de->te', Z, W_k)\n                               ^~~" in text
        assert page("document.getElementById('status').textContent") == "error"

        # fix it: the error goes, the figure is the new one
        _write(f, DIAGRAM.replace("W_q", "W_fixed"))
        _until(lambda: "W_fixed" in page(svg_text) and not page("document.getElementById('errors').textContent"), timeout=10)
        _until(lambda: page("document.body.getAttribute('data-phase')") == "complete", timeout=20)
        # the Rosetta stone's figures and equations load from the server
        _until(lambda: page("Array.from(document.querySelectorAll('#rosetta img')).every(i => i.complete && i.naturalWidth > 0)"
                            " && document.querySelectorAll('#rosetta img').length > 0"), timeout=30)
        assert "W_fixed" in page("document.getElementById('source').textContent")
