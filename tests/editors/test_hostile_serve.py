"""Hostile requests to `penrose serve` (docs/security.md): symlinks out of the served folder,
DNS-rebinding Host headers, foreign Origins, path tricks. Every refusal is a 403/404 that quotes
nothing of the file, and the server keeps answering afterwards."""

from __future__ import annotations

import http.client
import json
import os
from urllib.parse import quote, urlparse

import pytest

from penrose.errors import PenroseError
from penrose.serve import LiveServer

DIAGRAM = "dim t = 2, d = 3\ninput Z[t, d]\nparam W[d, t]\nq = einsum('td,de->te', Z, W)\noutput q\n"
SECRET = "root:x:0:0:TOP-SECRET-LINE:/root:/bin/bash\n"

needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="symlinks")


def _get(server, path, host=None, origin=None, timeout=10):
    """(status, body) of a GET with exactly the Host (and Origin) given; Host defaults to the bound one."""
    u = urlparse(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if host is not None else u.netloc)
        if origin is not None:
            conn.putheader("Origin", origin)
        conn.endheaders()
        r = conn.getresponse()
        body = r.read(200_000) if r.getheader("Content-Type", "").startswith("text/event-stream") is False else r.read(200)
        return r.status, body.decode("utf-8", "replace")
    finally:
        conn.close()


@pytest.fixture()
def served(tmp_path):
    """A served folder with a good diagram, links out (a passwd-like file, a .pen elsewhere), a
    link to a folder outside, and a link that stays inside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text(SECRET)
    (outside / "other.pen").write_text(DIAGRAM.replace("q =", "leaked_name =").replace("output q", "output leaked_name"))
    root = tmp_path / "site"
    root.mkdir()
    (root / "good.pen").write_text(DIAGRAM)
    if os.name != "nt":
        os.symlink(outside / "passwd", root / "passwd.pen")
        os.symlink(outside / "other.pen", root / "other.pen")
        os.symlink(outside, root / "linkdir")
        os.symlink(root / "good.pen", root / "alias.pen")  # inside: fine
    with LiveServer(root, port=0) as server:
        yield server, root, outside


@needs_symlinks
def test_symlink_to_a_passwd_like_file_is_not_served(served):
    server, _, _ = served
    status, body = _get(server, "/")
    assert status == 200 and "good.pen" in body and "alias.pen" in body
    assert "passwd.pen" not in body and "other.pen" not in body and "linkdir" not in body
    for path in ("/state?file=passwd.pen", "/?file=passwd.pen", "/events?file=passwd.pen",
                 "/state?file=other.pen", "/state?file=linkdir/other.pen", "/state?file=linkdir/passwd"):
        status, body = _get(server, path)
        assert status == 404, path
        assert "TOP-SECRET" not in body and "leaked_name" not in body
    status, body = _get(server, "/state?file=alias.pen")
    assert status == 200 and json.loads(body)["title"]


@needs_symlinks
def test_a_link_changed_while_serving_is_refused_on_the_next_request(served):
    server, root, outside = served
    assert _get(server, "/state?file=alias.pen")[0] == 200
    os.unlink(root / "alias.pen")
    os.symlink(outside / "other.pen", root / "alias.pen")
    status, body = _get(server, "/state?file=alias.pen")
    assert status == 404 and "leaked_name" not in body


@needs_symlinks
def test_a_single_served_file_serves_only_itself(tmp_path):
    (tmp_path / "m.pen").write_text(DIAGRAM)
    (tmp_path / "n.pen").write_text(DIAGRAM)
    with LiveServer(tmp_path / "m.pen", port=0) as server:
        assert _get(server, "/state")[0] == 200
        for other in ("n.pen", "../n.pen", str(tmp_path / "n.pen")):
            assert _get(server, "/state?file=" + quote(other))[0] == 404


def test_path_tricks_are_404(tmp_path):
    (tmp_path / "a.pen").write_text(DIAGRAM)
    secret = tmp_path.parent / f"{tmp_path.name}-secret.pen"
    secret.write_text(DIAGRAM.replace("q =", "leaked_name =").replace("output q", "output leaked_name"))
    try:
        with LiveServer(tmp_path, port=0) as server:
            tricks = ["../" + secret.name, "..%2F" + secret.name, "%2e%2e/" + secret.name, "%252e%252e%252f" + secret.name,
                      str(secret), quote(str(secret)), "a.pen%00", "a.pen/", "./a.pen", "a.pen/../a.pen", "A.PEN",
                      "%ff%fe", "x" * 10000, "", "a.pen&file=../" + secret.name]
            for t in tricks:
                status, body = _get(server, "/state?file=" + t)
                assert status in (400, 404) or (status == 200 and json.loads(body)["title"] != "leaked_name"), t
                assert "leaked_name" not in body, t
            for path in ("/../" + secret.name, "//etc/passwd", "/r/../../etc/passwd", "/equations/../../x", "/" + "a" * 5000):
                status, body = _get(server, path)
                assert status == 404 and "leaked_name" not in body, path
            assert _get(server, "/state?file=a.pen")[0] == 200  # still serving
    finally:
        secret.unlink()


HOSTS = [
    "evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", "localhost.evil.example:{port}",
    "127.0.0.1:{other}", "localhost", "127.0.0.1", "", "127.0.0.1:{port}@evil.example", "evil.example#@127.0.0.1:{port}",
    "127.0.0.1:{port} evil", "[::1", "127.0.0.1:abc", "127.0.0.2:{port}", "0.0.0.0:{port}",
]


def test_rebinding_style_host_headers_get_403(tmp_path):
    (tmp_path / "m.pen").write_text(DIAGRAM)
    with LiveServer(tmp_path / "m.pen", port=0) as server:
        port = urlparse(server.url).port
        for host in HOSTS:
            for path in ("/state", "/", "/events", "/r/x", "/equations/x.svg"):
                status, body = _get(server, path, host=host.format(port=port, other=port + 1 if port < 65535 else 1))
                assert status == 403 and "einsum" not in body, (host, path)
            assert _get(server, "/state")[0] == 200  # still serving


def test_loopback_names_with_the_port_are_answered(tmp_path):
    (tmp_path / "m.pen").write_text(DIAGRAM)
    with LiveServer(tmp_path / "m.pen", port=0) as server:
        port = urlparse(server.url).port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
            assert _get(server, "/state", host=host)[0] == 200, host


def test_a_request_without_host_gets_403(tmp_path):
    (tmp_path / "m.pen").write_text(DIAGRAM)
    with LiveServer(tmp_path / "m.pen", port=0) as server:
        u = urlparse(server.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        conn.putrequest("GET", "/state", skip_host=True)
        conn.endheaders()
        assert conn.getresponse().status == 403
        conn.close()
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)  # two Hosts: which one is meant?
        conn.putrequest("GET", "/state", skip_host=True)
        conn.putheader("Host", u.netloc)
        conn.putheader("Host", "evil.example")
        conn.endheaders()
        assert conn.getresponse().status == 403
        conn.close()


def test_foreign_origin_on_the_event_stream_gets_403(tmp_path):
    (tmp_path / "m.pen").write_text(DIAGRAM)
    with LiveServer(tmp_path / "m.pen", port=0) as server:
        port = urlparse(server.url).port
        for origin in ("http://evil.example", f"http://evil.example:{port}", "null", f"https://127.0.0.1:{port}",
                       f"http://127.0.0.1:{port}.evil.example"):
            status, _ = _get(server, "/events", origin=origin)
            assert status == 403, origin
            assert _get(server, "/state", origin=origin)[0] == 403, origin
        conn = http.client.HTTPConnection(u_host := "127.0.0.1", port, timeout=10)
        conn.request("GET", "/events", headers={"Origin": f"http://{u_host}:{port}"})
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
        assert b"event: update" in r.read1(4096)
        conn.close()


def test_a_wildcard_binding_answers_ip_literals_only():
    from penrose.serve import _Hosts

    hosts = _Hosts("0.0.0.0", 8123)
    assert "192.168.1.20:8123" in hosts and "[fe80::1]:8123" in hosts and "localhost:8123" in hosts
    assert "evil.example:8123" not in hosts and "192.168.1.20:8124" not in hosts
    other = _Hosts("192.168.1.20", 8000)
    assert "192.168.1.20:8000" in other and "127.0.0.1:8000" not in other and "evil.example:8000" not in other


def test_a_bad_port_is_a_clear_error(tmp_path):
    (tmp_path / "m.pen").write_text(DIAGRAM)
    for port in (-1, 70000, "80", 1.5, True):
        with pytest.raises(PenroseError, match="port"):
            LiveServer(tmp_path / "m.pen", port=port)
