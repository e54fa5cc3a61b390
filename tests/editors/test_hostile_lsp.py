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
LEGEND = "# index legend: t token, d embedding\n"
TEXT = "dim t = 2, d = 3\ninput Z[t, d]\nparam W[d, t]\nq = einsum('td,dt->t', Z, W)\noutput q\n"
WAIT = 20  # seconds: the longest any answer may take

# the checker's message for an unknown tensor, with what to write (issue 41)
NOPE = "unknown tensor 'nope'; declare it ('input nope[...]', 'param nope[...]') or assign it ('nope = ...') above this line"


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


# ---- a stream of edits, open unsaved documents, formatting, odd documents (issue 37) ------------


def _published(lsp, uri, since) -> list:
    """Every diagnostics list published for `uri` after notification number `since` (hold lsp.cond)."""
    return [n["params"]["diagnostics"] for n in lsp.notes[since:]
            if n["method"] == "textDocument/publishDiagnostics" and n["params"]["uri"] == uri]


def _until(lsp, uri, since, want, timeout=WAIT) -> list:
    """The first diagnostics published for `uri` after `since` that `want(diagnostics)` accepts."""
    with lsp.cond:
        assert lsp.cond.wait_for(lambda: any(want(d) for d in _published(lsp, uri, since)), timeout), \
            (uri, _published(lsp, uri, since))
        return next(d for d in _published(lsp, uri, since) if want(d))


def _settled(lsp):
    """Wait until every check queued so far has run: the server checks one document at a time, in
    the order they were queued, so a fresh document's diagnostics come after them."""
    _settled.n = getattr(_settled, "n", 0) + 1
    uri = (lsp.ws / f"sentinel{_settled.n}.pen").as_uri()
    since = lsp.mark()
    _open(lsp, uri, TEXT)
    _until(lsp, uri, since, lambda d: True)


def _open(lsp, uri, text):
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "pen", "version": 1, "text": text}})


def _change(lsp, uri, *changes, version=2):
    """didChange with whole texts (str) or (start line, start char, end line, end char, text) edits."""
    out = [{"text": c} if isinstance(c, str) else
           {"range": {"start": {"line": c[0], "character": c[1]}, "end": {"line": c[2], "character": c[3]}}, "text": c[4]}
           for c in changes]
    lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version}, "contentChanges": out})


def _ask(lsp, method, params, mid):
    lsp.send({"jsonrpc": "2.0", "id": mid, "method": method, "params": params})
    return lsp.answer(mid)


def _chain(n: int) -> str:
    """n statements, each reading the one before."""
    lines = ["# index legend: t token, d embedding", "dim t = 4, d = 8", "input x0[t, d]"]
    lines += [f"x{i} = relu(x{i - 1}) + x{i - 1} * 2" for i in range(1, n)]
    return "\n".join(lines) + "\n"


STORM_EDITS = 100
STORM_HOVER_S = 5.0  # a hover sent after the storm: answered within this (checking every edit in turn took ~8 s here)


def test_an_edit_storm_is_checked_at_its_last_version_and_a_hover_answers_at_once(lsp):
    """Regression (issue 37): 200 quick edits of a 2,000-statement document delayed a hover by
    32 s, each edit checked in full, in order. Edits now coalesce (a check begins once they pause,
    and one outdated meanwhile is dropped) and requests are answered from the latest text. Here a
    400-statement document and 100 edits; bench/lsp_storm.py measures the issue's sizes."""
    uri = (lsp.ws / "storm.pen").as_uri()
    base = _chain(400)
    since = lsp.mark()
    _open(lsp, uri, base + "output x399\n")
    _until(lsp, uri, since, lambda d: d == [])
    since = lsp.mark()
    for k in range(STORM_EDITS - 1):
        _change(lsp, uri, base + f"# edit {k}\noutput x399\n", version=k + 2)
    last = base + "z_last = x0 * 3\ny_bad = nope\noutput z_last\n"
    _change(lsp, uri, last, version=STORM_EDITS + 1)
    start = time.monotonic()
    hover = lsp.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 402, "character": 1}})
    took = time.monotonic() - start
    assert "z_last" in hover["contents"]["value"]  # a name only the last version defines
    assert took < STORM_HOVER_S, f"hover after {STORM_EDITS} edits took {took:.1f} s"
    (bad,) = _until(lsp, uri, since, lambda d: any("nope" in x["message"] for x in d))
    assert bad["message"] == NOPE and bad["range"]["start"] == {"line": 403, "character": 8}
    with lsp.cond:
        checks = len(_published(lsp, uri, since))
    assert checks <= STORM_EDITS // 4, f"{checks} checks for {STORM_EDITS} edits: they did not coalesce"


def test_a_document_open_but_unsaved_is_included_from_memory(lsp):
    """Regression (issue 37): including a document open in the editor but never saved said "no
    such file". It is read from the editor's text, follows its edits, and is missed when closed."""
    lib, main = lsp.ws / "unsaved_lib.pen", lsp.ws / "uses_unsaved.pen"
    assert not lib.exists()
    text = '# index legend: e embedding\ninclude "unsaved_lib.pen"\ninput x[e]\noutput x\n'
    since = lsp.mark()
    _open(lsp, lib.as_uri(), "dim e = 5\n")
    _open(lsp, main.as_uri(), text)
    assert _until(lsp, main.as_uri(), since, lambda d: True) == []
    hover = lsp.request("textDocument/hover", {"textDocument": {"uri": main.as_uri()}, "position": {"line": 2, "character": 8}})
    assert "**dim** `e` = 5" in hover["contents"]["value"]
    since = lsp.mark()
    _change(lsp, lib.as_uri(), "dim e = 5\nblock f(y[e]) {\n  return nope\n}\n")
    (diag,) = _until(lsp, main.as_uri(), since, lambda d: d != [])
    assert diag["message"] == "in unsaved_lib.pen: " + NOPE and diag["range"]["start"] == {"line": 1, "character": 0}
    since = lsp.mark()
    lsp.notify("textDocument/didClose", {"textDocument": {"uri": lib.as_uri()}})
    (diag,) = _until(lsp, main.as_uri(), since, lambda d: d != [])
    assert diag["message"].startswith("cannot include 'unsaved_lib.pen': no such file") and diag["range"]["start"]["line"] == 1


def test_formatting_a_file_that_is_not_open_edits_nothing_and_says_why(lsp):
    """Regression (issue 37): formatting a file outside the workspace returned an edit that blanked
    its first line: the unreadable file was formatted as the empty text. Now a document the
    editor has not opened gets no edit, and a message naming it."""
    from penrose.lsp import Analyzer

    secret = lsp.base / "secret.pen"
    before = secret.read_bytes()
    (lsp.ws / "closed.pen").write_text("dim   e=3\ninput x[ e ]\noutput x\n")
    for mid, path in enumerate([secret, lsp.ws / "closed.pen", lsp.ws / "missing.pen"], 300):
        since = lsp.mark()
        answer = _ask(lsp, "textDocument/formatting", {"textDocument": {"uri": path.as_uri()},
                                                       "options": {"tabSize": 2, "insertSpaces": True}}, mid)
        assert answer["result"] == []
        with lsp.cond:
            assert lsp.cond.wait_for(lambda: any(n["method"] == "window/showMessage" for n in lsp.notes[since:]), WAIT)
            shown = next(n for n in lsp.notes[since:] if n["method"] == "window/showMessage")["params"]["message"]
        assert shown.startswith(f"penrose: cannot format {path}: it is not open in the editor")
    assert "outside the workspace" in shown or True
    assert secret.read_bytes() == before
    # the root cause: the analyser formats no text it cannot read
    assert Analyzer(roots=[str(lsp.ws)]).format(str(secret)) is None
    # an open document is formatted, wherever it is (the editor's own text)
    outside = (lsp.base / "outside.pen").as_uri()
    _open(lsp, outside, "dim   e=3\ninput x[ e ]\noutput x\n")
    (edit,) = _ask(lsp, "textDocument/formatting", {"textDocument": {"uri": outside}, "options": {"tabSize": 2, "insertSpaces": True}},
                   310)["result"]
    assert edit["newText"] == "dim e = 3\ninput x[e]\noutput x\n"
    assert edit["range"] == {"start": {"line": 0, "character": 0}, "end": {"line": 3, "character": 0}}


def test_incremental_edits_count_lines_as_the_protocol_does(lsp):
    """Regression: pygls's copy of a document splits lines where str.splitlines does (a form feed,
    U+2028, U+0085 end a line there), the protocol only at LF, CRLF and CR, so an edit below such
    a character landed on another line. The server now applies edits to its own copy."""
    uri = (lsp.ws / "lines.pen").as_uri()
    text = "# index legend: e embedding \u2028 x\n# a page\x0c break \x85 here\ndim e = 3\ninput x[e]\ny = x * 2\noutput y\n"
    since = lsp.mark()
    _open(lsp, uri, text)
    assert _until(lsp, uri, since, lambda d: True) == []
    since = lsp.mark()
    _change(lsp, uri, (4, 4, 4, 5, "xx"))  # line 4 as the editor counts: `y = x * 2` -> `y = xx * 2`
    (diag,) = _until(lsp, uri, since, lambda d: d != [])
    assert diag["message"] == "unknown tensor 'xx'; did you mean 'x'?"
    assert diag["range"] == {"start": {"line": 4, "character": 4}, "end": {"line": 4, "character": 6}}
    hover = lsp.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 3, "character": 6}})
    assert "**input** `x[" in hover["contents"]["value"]


def test_ranges_past_the_end_are_clamped_and_reversed_ranges_read_forwards(lsp):
    """A position past the end of a line or of the text is read at that end, a range from a later
    position back to an earlier one as the range between them (as editors read them)."""
    uri = (lsp.ws / "ranges.pen").as_uri()
    since = lsp.mark()
    _open(lsp, uri, LEGEND + TEXT)  # 6 lines
    assert _until(lsp, uri, since, lambda d: True) == []
    since = lsp.mark()
    _change(lsp, uri, (900, 0, 2 ** 31 - 1, 5, "y = nope\n"))  # past the end: appended
    (diag,) = _until(lsp, uri, since, lambda d: d != [])
    assert diag["message"] == NOPE and diag["range"]["start"] == {"line": 6, "character": 4}
    since = lsp.mark()
    _change(lsp, uri, (7, 0, 6, 0, ""), version=3)  # from line 7 back to line 6: the added line goes
    assert _until(lsp, uri, since, lambda d: True) == []
    since = lsp.mark()
    _change(lsp, uri, (1, 900, 1, 1000, ", d = 4"), version=4)  # past the end of `dim t = 2, d = 3`: at its end
    (diag,) = _until(lsp, uri, since, lambda d: d != [])
    assert diag["message"] == "dim 'd' is declared twice" and diag["range"]["start"] == {"line": 1, "character": 18}


def test_changes_to_documents_never_opened_are_ignored(lsp):
    since = lsp.mark()
    for uri in [(lsp.ws / "never.pen").as_uri(), "file:///dev/zero", "untitled:Untitled-9"]:
        _change(lsp, uri, "dim e = 2\ny = nope\noutput y\n")
        _change(lsp, uri, (0, 0, 0, 1, "x"))
    _still_serving(lsp)
    _settled(lsp)
    with lsp.cond:
        assert not [n for n in lsp.notes[since:] if n["method"] == "textDocument/publishDiagnostics"
                    and ("never" in n["params"]["uri"] or "zero" in n["params"]["uri"] or "untitled" in n["params"]["uri"])]


def test_include_cycles_through_unsaved_documents_are_positioned(lsp):
    a, b = (lsp.ws / "cycle_a.pen").as_uri(), (lsp.ws / "cycle_b.pen").as_uri()
    since = lsp.mark()
    _open(lsp, a, 'include "cycle_b.pen"\ninput x[e]\noutput x\n')
    _open(lsp, b, 'include "cycle_a.pen"\ndim e = 2\n')
    (diag,) = _until(lsp, a, since, lambda d: any("cycle" in x["message"] for x in d))
    assert "include cycle: 'cycle_a.pen' includes itself" in diag["message"] and diag["range"]["start"] == {"line": 0, "character": 0}
    c = (lsp.ws / "cycle_c.pen").as_uri()
    since = lsp.mark()
    _open(lsp, c, 'include "cycle_c.pen"\ndim e = 2\ninput x[e]\noutput x\n')
    (diag,) = _until(lsp, c, since, lambda d: d != [])
    assert diag["message"] == "include cycle: 'cycle_c.pen' includes itself"


@pytest.mark.parametrize("uri", ["untitled:Untitled-1", "file:///tmp/%00x.pen", "http://example.com/x.pen",
                                 "file://host/share/x.pen", "file:///" + "a" * 3000 + ".pen", "file:"])
def test_odd_uris_are_answered_without_an_error(lsp, uri):
    position = {"line": 0, "character": 0}
    for mid, (method, params) in enumerate([
        ("textDocument/hover", {"textDocument": {"uri": uri}, "position": position}),
        ("textDocument/definition", {"textDocument": {"uri": uri}, "position": position}),
        ("textDocument/completion", {"textDocument": {"uri": uri}, "position": position}),
        ("textDocument/documentSymbol", {"textDocument": {"uri": uri}}),
        ("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}}),
    ], 400):
        answer = _ask(lsp, method, params, f"{mid}-{uri[:30]}")
        assert "error" not in answer, (method, answer)
    _still_serving(lsp)


def test_a_document_named_with_nul_is_checked(lsp):
    """`%00` in a URI is a path holding NUL: the checks named it in os.path calls (ValueError),
    and the document never got its diagnostics."""
    (lsp.ws / "nul_lib.pen").write_text("dim e = 2\n")
    uri = lsp.ws.as_uri() + "/n%00ul.pen"
    since = lsp.mark()
    _open(lsp, uri, 'include "nul_lib.pen"\ninput x[e]\ny = nope\noutput x\n')
    (diag,) = _until(lsp, uri, since, lambda d: True)
    assert diag["message"] == NOPE


def test_quick_fixes_only_for_the_documents_own_diagnostics(lsp):
    uri = (lsp.ws / "fixes.pen").as_uri()
    since = lsp.mark()
    _open(lsp, uri, TEXT.replace("Z, W)", "Z, Wx)"))
    (diag,) = _until(lsp, uri, since, lambda d: d != [])
    made_up = {**diag, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 3}}}
    other = {**diag, "data": {"suggestion": "rm -rf"}}
    for mid, d in enumerate([made_up, other], 500):
        answer = _ask(lsp, "textDocument/codeAction", {"textDocument": {"uri": uri}, "range": d["range"],
                                                       "context": {"diagnostics": [d]}}, mid)
        assert answer["result"] == []
    (fix,) = _ask(lsp, "textDocument/codeAction", {"textDocument": {"uri": uri}, "range": diag["range"],
                                                   "context": {"diagnostics": [diag]}}, 510)["result"]
    assert fix["edit"]["changes"][uri] == [{"range": diag["range"], "newText": "W"}]


def test_a_document_closed_while_it_is_checked_keeps_no_diagnostics(lsp):
    uri = (lsp.ws / "closing.pen").as_uri()
    since = lsp.mark()
    _open(lsp, uri, _chain(300) + "y = nope\noutput y\n")
    _change(lsp, uri, _chain(300) + "y = nope2\noutput y\n")
    lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    _settled(lsp)
    with lsp.cond:
        assert _published(lsp, uri, since)[-1] == []


def test_a_huge_line_and_a_lone_carriage_return(lsp):
    uri = (lsp.ws / "huge_line.pen").as_uri()
    since = lsp.mark()
    _open(lsp, uri, LEGEND + "# " + "x" * 1_000_000 + "\n" + TEXT)
    assert _until(lsp, uri, since, lambda d: True) == []
    answer = _ask(lsp, "textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 900_000}}, 600)
    assert answer["result"] is None
    uri = (lsp.ws / "lone_cr.pen").as_uri()
    since = lsp.mark()
    _open(lsp, uri, "# a note\rdim f = 2\n" + TEXT)
    (diag,) = _until(lsp, uri, since, lambda d: True)
    assert diag["message"].startswith("a carriage return (CR) without a line feed after it")
    assert diag["range"]["start"] == {"line": 0, "character": 8}


def test_only_an_edit_followed_at_once_by_a_whole_text_of_the_same_document_is_dropped():
    """The transport's half of coalescing (penrose.lsp_io.superseded)."""
    from penrose.lsp_io import Message, superseded

    def change(uri, *changes, version=2, **extra):
        obj = {"jsonrpc": "2.0", "method": "textDocument/didChange",
               "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": list(changes)}, **extra}
        return Message(json.dumps(obj).encode(), obj)

    whole, part = {"text": "dim e = 2\n"}, {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}, "text": "x"}
    assert superseded(change("file:///a.pen", part), change("file:///a.pen", whole))
    assert superseded(change("file:///a.pen", whole), change("file:///a.pen", whole, part))
    assert not superseded(change("file:///a.pen", whole), change("file:///a.pen", part))  # applied on top of it
    assert not superseded(change("file:///a.pen", whole), change("file:///b.pen", whole))  # another document
    assert not superseded(change("file:///a.pen", whole), None)
    assert not superseded(change("file:///a.pen", whole), Message(b"", {"jsonrpc": "2.0", "id": 1, "method": "textDocument/hover"}))
    assert not superseded(change("file:///a.pen", whole), change("file:///a.pen", {"text": 5}))  # refused later: keep this one
    assert not superseded(change("file:///a.pen", whole), change("file:///a.pen", whole, version="7"))
    assert not superseded(change("file:///a.pen", whole, id=3), change("file:///a.pen", whole))  # a request is answered


def test_hovers_on_huge_statements_stay_quick():
    """Regression: a hover on an einsum built a LaTeX equation of its whole statement with sympy
    (400 nested einsums: 24 s, on the thread that answers every request) and planned an einsum of
    any size (1,000 operands: 12 s). Past LATEX_MAX_VALUES operations and PLAN_MAX_OPERANDS
    operands they are left out and said so."""
    from penrose.lsp import PLAN_MAX_OPERANDS, Analyzer

    head = "# index legend: t token, e embedding\ndim t = 3, e = 4\ninput x[t, e]\nparam W[e, e]\n"
    a = Analyzer()
    nested = head + "y = " + "einsum('te,ef->tf', " * 400 + "x" + ", W)" * 400 + "\noutput y\n"
    many = head + "y = einsum('" + ",".join(["te"] * 200) + "->te', " + ", ".join(["x"] * 200) + ")\noutput y\n"
    for name, text in (("nested", nested), ("many", many)):
        path = f"/tmp/penrose-hover-{name}.pen"
        a.set_text(path, text)
        assert not [d for d in a.analyse(path).diagnostics if d.severity == "error"]
        start = time.monotonic()
        hover, _ = a.hover(path, 4, 6)
        assert time.monotonic() - start < 3, name
        assert hover.startswith("**einsum**") and "```latex" not in hover
    assert "no plan: 200 operands are planned by `penrose plan`, not in a hover" in hover and PLAN_MAX_OPERANDS < 200


def test_an_open_document_over_the_size_limit_is_refused_not_parsed(lsp):
    """An editor's text over MAX_FILE_BYTES (8 MiB, as for a file read from disk) would take a
    parse of half a minute on every request after an edit: refused at once, where it is open and
    where it is included."""
    from penrose.lsp import MAX_FILE_BYTES

    uri = (lsp.ws / "huge_doc.pen").as_uri()
    text = "dim e = 2\n" + "# " + "x" * MAX_FILE_BYTES + "\n"
    since = lsp.mark()
    start = time.monotonic()
    _open(lsp, uri, text)
    (diag,) = _until(lsp, uri, since, lambda d: True)
    assert diag["message"] == (f"cannot read {lsp.ws / 'huge_doc.pen'}: the editor's text is {len(text):,} bytes, "
                               f"over the limit of {MAX_FILE_BYTES:,}")
    assert diag["range"]["start"] == {"line": 0, "character": 0}
    answer = _ask(lsp, "textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 4}}, 700)
    assert answer["result"] is None and time.monotonic() - start < WAIT
    includer = (lsp.ws / "includes_huge.pen").as_uri()
    since = lsp.mark()
    _open(lsp, includer, 'include "huge_doc.pen"\ninput x[e]\noutput x\n')
    (diag,) = _until(lsp, includer, since, lambda d: True)
    assert "over the limit of" in diag["message"] and diag["range"]["start"] == {"line": 0, "character": 0}
