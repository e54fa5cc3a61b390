"""Hostile input to `penrose lsp` (docs/security.md), from a raw-stdio client: `python -m
penrose.cli lsp` in a subprocess, sent broken framing (bad, missing, non-numeric, huge
Content-Length; truncated bodies; invalid JSON; not JSON-RPC), invalid params, and requests for
files it must not read (/dev/zero, a file outside the workspace, an oversized include). After
every case a valid hover must still be answered. Every wait is bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pygls", reason="penrose lsp needs the editor extra (pip install pygls)")

from test_lsp import Rpc

ROOT = Path(__file__).resolve().parents[2]
TEXT = "dim t = 2, d = 3\ninput Z[t, d]\nparam W[d, t]\nq = einsum('td,dt->t', Z, W)\noutput q\n"
WAIT = 20  # seconds: the longest any answer may take


class Raw(Rpc):
    """The server over raw pipes: `write(bytes)` sends anything; answers and notifications are
    collected by test_lsp's reader (the server's own framing is trusted here). Its stderr goes
    nowhere: the warnings about broken messages must not fill a pipe nobody reads."""

    def __init__(self, root: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "penrose.cli", "lsp"], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.cond = threading.Condition()
        self.answers: dict = {}
        self.notes: list = []
        self.ids = 1000
        threading.Thread(target=self._read, daemon=True).start()
        self.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(), "capabilities": {}})
        self.notify("initialized", {})

    def write(self, data: bytes):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def answer(self, mid, timeout=WAIT):
        with self.cond:
            assert self.cond.wait_for(lambda: mid in self.answers, timeout), f"no answer to {mid!r}"
            return self.answers.pop(mid)


@pytest.fixture(scope="module")
def lsp(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    ws = base / "ws"
    ws.mkdir()
    (base / "secret.pen").write_text("dim SECRET_DIM = 7\n")
    (ws / "m.pen").write_text(TEXT)
    rpc = Raw(ws)
    rpc.base, rpc.ws, rpc.uri = base, ws, (ws / "m.pen").as_uri()
    rpc.notify("textDocument/didOpen", {"textDocument": {"uri": rpc.uri, "languageId": "pen", "version": 1, "text": TEXT}})
    yield rpc
    rpc.proc.stdin.close()
    try:
        rpc.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        rpc.proc.kill()
        rpc.proc.wait()


def _still_serving(lsp):
    """A valid hover on the open document is answered, with the tensor's description."""
    result = lsp.request("textDocument/hover", {"textDocument": {"uri": lsp.uri}, "position": {"line": 3, "character": 0}})
    assert result and "q" in json.dumps(result)
    assert lsp.proc.poll() is None


def _hover(mid, **position):
    return {"jsonrpc": "2.0", "id": mid, "method": "textDocument/hover",
            "params": {"textDocument": {"uri": "file:///x.pen"}, "position": position or {"line": 0, "character": 0}}}


def _body(msg) -> bytes:
    return json.dumps(msg).encode()


def test_a_valid_hover_is_answered(lsp):
    _still_serving(lsp)


@pytest.mark.parametrize("header", [b"Content-Length: abc", b"Content-Length: -5", b"Content-Length: 1e3",
                                    "Content-Length: \u0663\u0663".encode(), b"Content-Length: 99999999999999999999",
                                    b"Content-Length: 1099511627776", b"Content-Type: application/json",
                                    b"Content-Length 40", b"Content-Length: 10\r\nContent-Length: 20"])
def test_a_bad_or_missing_content_length_is_answered_and_the_stream_resynchronises(lsp, header):
    mid = f"bad-{hash(header)}"
    lsp.write(header + b"\r\n\r\n" + _body(_hover(mid)))
    answer = lsp.answer(mid)
    assert answer["error"]["code"] == -32700 and answer["error"]["message"]
    _still_serving(lsp)


def test_a_short_content_length_is_answered_and_the_stream_resynchronises(lsp):
    body = _body(_hover(51))
    lsp.write(b"Content-Length: 10\r\n\r\n" + body)
    _still_serving(lsp)  # the valid message that follows frames again
    assert lsp.answer(51)["error"]["code"] == -32700


def test_a_truncated_body_followed_by_a_message(lsp):
    body = _body(_hover(52))
    lsp.write(b"Content-Length: %d\r\n\r\n" % (len(body) + 40) + body[:-15])  # cut short, and too long a length
    _still_serving(lsp)
    assert lsp.answer(52)["error"]["code"] == -32700


def test_a_truncated_body_then_silence_is_answered(lsp):
    body = _body(_hover(53))
    start = time.monotonic()
    lsp.write(b"Content-Length: %d\r\n\r\n" % (len(body) + 100) + body[:-3])
    assert lsp.answer(53)["error"]["code"] == -32700
    assert time.monotonic() - start < 10
    _still_serving(lsp)


@pytest.mark.parametrize("body, code", [
    (b'{"jsonrpc": "2.0", "id": 61, "method": "textDocument/hover", "params": {,}}', -32700),
    (b'{"jsonrpc": "2.0", "id": 62, "method": "textDocument/hover", "params": \xff\xfe}', -32700),
    (b'{"jsonrpc": "1.0", "id": 63, "method": "textDocument/hover", "params": {}}', -32600),
    (b'{"id": 64, "method": "textDocument/hover", "params": {}}', -32600),
    (b'{"jsonrpc": "2.0", "id": 65, "method": 7, "params": {}}', -32600),
])
def test_invalid_json_or_not_json_rpc_is_answered(lsp, body, code):
    mid = int(body.split(b'"id": ')[1][:2])
    lsp.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert lsp.answer(mid)["error"]["code"] == code
    _still_serving(lsp)


@pytest.mark.parametrize("body", [b"[]", b"[1, 2]", b"42", b'"x"', b"null", b"{}", b"{" * 5000, b"[" * 100_000 + b"]" * 100_000,
                                  b"\x00\x01\x02", b"hello world"])
def test_messages_without_an_id_are_skipped_and_logged(lsp, body):
    since = lsp.mark()
    lsp.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    _still_serving(lsp)
    with lsp.cond:
        assert lsp.cond.wait_for(lambda: any(n["method"] == "window/logMessage" for n in lsp.notes[since:]), WAIT)


@pytest.mark.parametrize("cut", [1, 4, 9, 15, 20])
def test_a_length_that_ends_inside_the_next_header(lsp, cut):
    """The bad message's declared body runs `cut` bytes into the next message's header: that
    message is still framed and answered."""
    bad = b'{"jsonrpc": "2.0", "id": 130, "method": "textDocument/hover"'
    lsp.write(b"Content-Length: %d\r\n\r\n" % (len(bad) + cut) + bad)
    _still_serving(lsp)
    assert lsp.answer(130)["error"]["code"] == -32700


def test_seeded_garbage_then_a_valid_hover(lsp):
    """Random junk (header fragments, JSON fragments, bytes) between valid messages: each valid
    hover after it is answered."""
    import random

    rnd = random.Random(24)
    pieces = [b"Content-Length: ", b"\r\n", b"\r\n\r\n", b"{", b"}", b'"id": 3', b"abc", b"\xff\xfe", b"[", b"]",
              b"Content-Type: x", b"12", b":", b'"', b"\\", b" "]
    for _ in range(12):
        junk = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 12)))
        lsp.write(junk + b"\r\n\r\n")
        _still_serving(lsp)


def test_junk_without_any_header_is_skipped(lsp):
    lsp.write(b"hello, this is not LSP\r\n" + b"\x00" * 100 + b"\r\n")
    _still_serving(lsp)
    lsp.write(_body(_hover(71)))  # a body without its header: answered once the server sees it is whole
    assert lsp.answer(71)["error"]["code"] == -32700
    _still_serving(lsp)


@pytest.mark.parametrize("position", [{"line": -1, "character": 0}, {"line": 2 ** 40, "character": 0},
                                      {"line": 0, "character": -1}, {"line": "x", "character": 0}, {"line": 0},
                                      {"line": 1.5, "character": 0}, None])
def test_invalid_params_get_invalid_params(lsp, position):
    msg = _hover(81)
    msg["params"]["position"] = position
    lsp.send(msg)
    answer = lsp.answer(81)
    assert answer["error"]["code"] == -32602 and "hover" in answer["error"]["message"]
    _still_serving(lsp)


def test_other_bad_params_are_answered(lsp):
    for mid, params in enumerate([None, [], "x", {"textDocument": None}, {"textDocument": {"uri": 5}, "position": {"line": 0, "character": 0}}], 90):
        lsp.send({"jsonrpc": "2.0", "id": mid, "method": "textDocument/hover", "params": params})
        assert "error" in lsp.answer(mid)
    _still_serving(lsp)


def test_positions_past_the_end_of_the_document_are_answered(lsp):
    for mid, pos in enumerate([{"line": 2 ** 31 - 1, "character": 0}, {"line": 3, "character": 2 ** 31 - 1}], 100):
        lsp.send({"jsonrpc": "2.0", "id": mid, "method": "textDocument/hover",
                  "params": {"textDocument": {"uri": lsp.uri}, "position": pos}})
        assert "error" not in lsp.answer(mid)  # answered (clamped to the document), not an internal error
    _still_serving(lsp)


def test_dev_zero_and_files_outside_the_workspace_are_not_read(lsp):
    start = time.monotonic()
    for mid, uri in enumerate(["file:///dev/zero", "file:///dev/urandom", (lsp.base / "secret.pen").as_uri(),
                               "file:///etc/passwd", "file:///proc/self/mem"], 110):
        lsp.send({"jsonrpc": "2.0", "id": mid, "method": "textDocument/hover",
                  "params": {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 4}}})
        answer = lsp.answer(mid)
        assert answer.get("result") is None and "SECRET_DIM" not in json.dumps(answer)
    assert time.monotonic() - start < 10
    _still_serving(lsp)


def test_includes_outside_the_workspace_or_not_regular_or_too_large_get_a_diagnostic(lsp):
    ws = lsp.ws
    (ws / "big.pen").write_bytes(b"# " + b"x" * (9 * 1024 * 1024) + b"\n")
    if os.name != "nt":
        os.symlink("/dev/zero", ws / "zero.pen")
        os.symlink(lsp.base / "secret.pen", ws / "link.pen")
        os.mkfifo(ws / "fifo.pen")
    cases = {"../secret.pen": "outside", "big.pen": "over the limit"}
    if os.name != "nt":
        cases |= {"zero.pen": "outside", "link.pen": "outside", "fifo.pen": "not a regular file"}
    for i, (target, expected) in enumerate(cases.items()):
        text = f'include "{target}"\n' + TEXT
        uri = (ws / f"inc{i}.pen").as_uri()
        since = lsp.mark()
        lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "pen", "version": 1, "text": text}})
        diags = lsp.diagnostics(uri, since)
        assert any(expected in d["message"] and d["range"]["start"]["line"] == 0 for d in diags), (target, diags)
        assert "SECRET_DIM" not in json.dumps(diags)
    _still_serving(lsp)


def test_a_device_inside_the_workspace_is_refused_without_reading():
    from penrose.lsp import Analyzer

    a = Analyzer(roots=["/dev"])
    assert "not a regular file" in a.analyse("/dev/zero").diagnostics[0].message
    a = Analyzer(roots=["/nowhere"])
    assert "outside the workspace" in a.analyse("/dev/zero").diagnostics[0].message


def test_the_framer_alone():
    """The framing, byte by byte: each broken message becomes one report, the good ones pass."""
    from penrose.lsp_io import Broken, Framer, Message

    good = _body({"jsonrpc": "2.0", "id": 1, "method": "x"})
    stream = (b"Content-Length: x\r\n\r\n" + _body(_hover(2)) + b"Content-Length: %d\r\n\r\n" % len(good) + good
              + b"Content-Length: 5\r\n\r\n" + good + b"\r\n" + b"Content-Length: %d\r\n\r\n" % len(good) + good)
    chunks = [stream[i:i + 7] for i in range(0, len(stream), 7)]
    framer = Framer(lambda timeout: chunks.pop(0) if chunks else b"", idle=0.01)
    out = []
    while (item := framer.next()) is not None:
        out.append(item.body if isinstance(item, Message) else ("broken", item.id))
    assert out[0] == ("broken", 2) and out[1] == good and out[-1] == good
    assert all(isinstance(x, bytes) or x[0] == "broken" for x in out) and len([x for x in out if x == good]) == 2
    assert isinstance(Broken(-32700, "x", b'{"id": "a\\"b"'), Broken) and Broken(-32700, "x", b'{"id": "a\\"b"').id == 'a"b'


def test_requests_before_initialize_are_answered_not_initialized():
    rpc = Raw.__new__(Raw)
    rpc.proc = subprocess.Popen([sys.executable, "-m", "penrose.cli", "lsp"], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    rpc.cond, rpc.answers, rpc.notes, rpc.ids = threading.Condition(), {}, [], 0
    threading.Thread(target=rpc._read, daemon=True).start()
    try:
        rpc.send({"jsonrpc": "2.0", "id": 1, "method": "textDocument/hover",
                  "params": {"textDocument": {"uri": "file:///dev/zero"}, "position": {"line": 0, "character": 0}}})
        assert rpc.answer(1)["error"]["code"] == -32002
        rpc.send({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}})
        assert "capabilities" in rpc.answer(2)["result"]
    finally:
        rpc.proc.kill()
        rpc.proc.wait()
