"""The language server's stdio transport: Content-Length framing that survives a broken client.

pygls reads stdin with `Content-Length: N` headers and stops making sense of the stream for
good after one bad header (a short or non-numeric length leaves it waiting for a body that never
ends), and answers nothing to a request whose params do not validate. `serve_stdio` replaces
that loop (the handlers stay pygls's):

- a header block is the lines up to a blank line; `Content-Length` (any case) must be ASCII
  digits, at most `MAX_BODY` bytes; other headers are ignored;
- a message whose framing is broken (no or a bad `Content-Length`, a body that is not JSON, a
  body cut short by the next message's header, a body that never arrives within `IDLE` seconds)
  is skipped up to the next `Content-Length` header: the stream resynchronises there. If the
  broken message shows a request id (it parses, or `"id": ...` can be read in its bytes), the
  request is answered with a JSON-RPC error (-32700 parse error, -32600 invalid request); a
  message with no id to answer is reported in the client's log (`window/logMessage`);
- a well-formed request whose params do not fit the protocol (a position of -1 or 2**40, a
  string where a number goes) is answered with -32602 `InvalidParams`;
- a request before `initialize` is answered -32002 (ServerNotInitialized), a notification dropped;
- none of this stops the server: it serves until `exit` or the end of stdin.

Edits queued faster than they are handled coalesce: a didChange followed at once by a didChange of
the same document that replaces its whole text is dropped (`superseded`).

Everything here is transport; `penrose.lsp` holds the analysis and the handlers.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import re
import select
import threading

MAX_BODY = 64 * 1024 * 1024  # bytes in one message (a document's text travels whole in didOpen/didChange)
MAX_HEADER = 8192  # bytes in one header block
IDLE = 1.0  # seconds without a byte after which a partial message counts as broken

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, SERVER_NOT_INITIALIZED = -32700, -32600, -32602, -32002

_HEADER_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}(?![\d.eE])|"(?:[^"\\\r\n]|\\.){0,256}")')

logger = logging.getLogger(__name__)


class Broken:
    """A message that could not be framed or decoded: why, and the request id to answer (if any)."""

    def __init__(self, code: int, reason: str, raw: bytes = b""):
        self.code, self.reason = code, reason
        self.id = _find_id(raw)

    def response(self) -> dict | None:
        if self.id is None:
            return None
        return {"jsonrpc": "2.0", "id": self.id, "error": {"code": self.code, "message": self.reason}}


def _find_id(raw: bytes):
    """The request id a broken message carries: read from it whole if it is JSON, else from its
    bytes (`"id": 7` or `"id": "abc"`); None when there is none."""
    text = raw.strip()
    if not text:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text.decode("utf-8"))
        if isinstance(obj, dict):
            mid = obj.get("id")
            return mid if _is_id(mid) else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        pass
    m = _ID.search(raw[:MAX_HEADER * 8])
    if not m:
        return None
    try:
        mid = json.loads(m.group(1))
    except ValueError:
        return None
    return mid if _is_id(mid) else None


def _is_id(value) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


class Framer:
    """Split a byte stream into messages (`Message`: bytes and JSON) and `Broken` reports; None at the end.

    `read(timeout)` gives the next chunk of bytes (b"" at the end of the stream) or None when
    nothing came within `timeout` seconds.
    """

    def __init__(self, read, idle: float = IDLE, max_body: int = MAX_BODY):
        self._read = read
        self.idle, self.max_body = idle, max_body
        self.buf = bytearray()
        self.eof = False

    def _more(self, timeout) -> bool:
        """Append what arrives within `timeout` (None: wait); False if nothing did."""
        if self.eof:
            return False
        chunk = self._read(timeout)
        if chunk is None:
            return False
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _resync(self, start: int, code: int, reason: str, json_at: int | None = None, broken_until: int | None = None,
                wait: bool = True, after: int | None = None):
        """Drop the broken message beginning at `start` up to the next Content-Length header
        after it (waiting up to IDLE for one), and report it. A broken message whose body (at
        `json_at`) is one whole JSON value ends there: no wait."""
        while True:
            m = _CONTENT_LENGTH.search(self.buf, start + 1 if after is None else after)
            if m:
                end = m.start()
                break
            if broken_until is not None and len(self.buf) >= broken_until:
                end = broken_until
                break
            whole = _json_end(self.buf, json_at) if json_at is not None and len(self.buf) - json_at < (1 << 20) else None
            if whole is not None:
                end = whole
                break
            if len(self.buf) - start > self.max_body + MAX_HEADER or not wait or not self._more(self.idle):
                end = len(self.buf)
                break
        raw = bytes(self.buf[start:end])
        del self.buf[:end]
        return Broken(code, reason, raw)

    def next(self):
        """The next `Message`, a `Broken` report, or None at the end of the stream."""
        while True:
            while self.buf[:1] == b"\n" or self.buf[:2] == b"\r\n":  # blank lines between messages
                del self.buf[: 1 if self.buf[:1] == b"\n" else 2]
            if not self.buf:
                if not self._more(None):
                    return None
                continue
            m = _HEADER_END.search(self.buf, 0, MAX_HEADER + 4)
            if m is None:
                if len(self.buf) > MAX_HEADER:
                    return self._resync(0, PARSE_ERROR, f"a header block longer than {MAX_HEADER} bytes", json_at=0)
                if self._more(self.idle):
                    continue
                if not self.eof and _CONTENT_LENGTH.match(self.buf):  # a header still arriving
                    self._more(None)
                    continue
                return self._resync(0, PARSE_ERROR, "bytes that are not a Content-Length framed message", json_at=0, wait=False)
            header, body_start = bytes(self.buf[: m.start()]), m.end()
            length, problem = _content_length(header)
            if problem:
                if not _CONTENT_LENGTH.match(self.buf) and _CONTENT_LENGTH.search(header):
                    return self._resync(0, PARSE_ERROR, "bytes before a Content-Length header", json_at=0)
                return self._resync(0, PARSE_ERROR, problem, json_at=body_start, after=body_start)
            while len(self.buf) < body_start + length:
                if not self._more(self.idle):
                    cut = len(self.buf) - body_start
                    return self._resync(body_start - 1, PARSE_ERROR,
                                        f"a body shorter than its Content-Length ({cut} of {length} bytes)", wait=False)
            body = bytes(self.buf[body_start : body_start + length])
            try:
                obj = json.loads(body)
            except (ValueError, RecursionError):
                end = body_start + length
                if _ends_in_header_start(body):  # the next header may begin inside: see all of it
                    while len(self.buf) < end + 16 and self._more(self.idle):
                        pass
                inner = _CONTENT_LENGTH.search(self.buf, body_start, end + 16)
                if inner is not None and inner.start() < end:  # cut short by the next message: frame from its header
                    return self._resync(body_start - 1, PARSE_ERROR, "a body shorter than its Content-Length",
                                        broken_until=inner.start())
                del self.buf[: body_start + length]
                return Broken(PARSE_ERROR, "the body is not JSON", body)
            del self.buf[: body_start + length]
            return Message(body, obj)


class Message:
    """A framed message: its bytes and the JSON they hold."""

    __slots__ = ("body", "obj")

    def __init__(self, body: bytes, obj):
        self.body, self.obj = body, obj


def _ends_in_header_start(body: bytes) -> bool:
    """Whether `body` ends with the first letters of `Content-Length:` (any case)."""
    tail = body[-15:].lower()
    return any(tail.endswith(b"content-length:"[:k]) for k in range(1, 16))


def _json_end(buf: bytearray, start: int):
    """The end of the one JSON value that begins (after blanks) at `start`, or None."""
    raw = bytes(buf[start:])
    text = raw.lstrip()
    if text[:1] not in (b"{", b"["):
        return None
    s = text.decode("utf-8", "surrogateescape")
    try:
        _, end = json.JSONDecoder().raw_decode(s)
    except (ValueError, RecursionError):
        return None
    return start + (len(raw) - len(text)) + len(s[:end].encode("utf-8", "surrogateescape"))


def _content_length(header: bytes):
    """(length, None) or (None, why the header block is refused)."""
    length = None
    for line in re.split(rb"\r?\n", header):
        name, sep, value = line.partition(b":")
        if not sep:
            return None, f"a header line without a colon: {line[:80]!r}"
        if name.strip().lower() == b"content-length":
            value = value.strip()
            if not value or not value.isdigit() or not value.isascii():
                return None, f"Content-Length is not a number of bytes: {value[:80]!r}"
            if len(value) > 12 or int(value) > MAX_BODY:
                return None, f"Content-Length {value[:20].decode('ascii')} is over the limit of {MAX_BODY} bytes"
            if length is not None and int(value) != length:
                return None, "two different Content-Length headers"
            length = int(value)
    if length is None:
        return None, "a message without a Content-Length header"
    return length, None


def _stdin_reader(stream):
    """read(timeout) over a binary stream: select on its descriptor where that works."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is None or os.name == "nt":
        read1 = getattr(stream, "read1", None) or stream.read
        return lambda timeout: read1(65536)

    def read(timeout):
        if timeout is not None:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
        try:
            return os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return None if timeout is not None else b""

    return read


def serve_stdio(ls, stdin=None, stdout=None) -> None:
    """Run pygls server `ls` over stdin/stdout with the framing above (`LanguageServer.start_io`
    with a transport that never gives up). A daemon thread frames; the event loop handles."""
    import sys

    from pygls.io_ import StdoutWriter

    stdin = stdin or sys.stdin.buffer
    ls._stop_event = threading.Event()
    ls.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    framer = Framer(_stdin_reader(stdin))
    try:
        asyncio.run(_loop(ls, framer))
    except BrokenPipeError:
        logger.error("the client closed the connection")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        ls.shutdown()


async def _loop(ls, framer: Framer):
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def frame():
        while True:
            try:
                item = framer.next()
            except Exception as e:  # report and end rather than hang
                logger.exception("cannot read stdin")
                item = None
                del e
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop has ended (exit)
                return
            if item is None:
                return

    threading.Thread(target=frame, daemon=True, name="penrose-lsp-stdin").start()
    waiting: collections.deque = collections.deque()  # messages framed, not yet handled
    while not ls._stop_event.is_set():
        if not waiting:
            waiting.append(await queue.get())
            while not queue.empty():
                waiting.append(queue.get_nowait())
        item = waiting.popleft()
        if item is None:
            break
        if isinstance(item, Broken):
            _report(ls.protocol, item)
        elif not superseded(item, waiting[0] if waiting else None):
            handle(ls.protocol, item)


def _change(message):
    """(uri, whether it replaces the whole text) of a well-formed didChange, else None."""
    obj = message.obj if isinstance(message, Message) else None
    if not isinstance(obj, dict) or obj.get("method") != "textDocument/didChange" or obj.get("jsonrpc") != "2.0" or "id" in obj:
        return None
    params = obj.get("params")
    doc = params.get("textDocument") if isinstance(params, dict) else None
    changes = params.get("contentChanges") if isinstance(params, dict) else None
    if not (isinstance(doc, dict) and isinstance(doc.get("uri"), str) and isinstance(doc.get("version"), int)
            and isinstance(changes, list) and changes and all(isinstance(c, dict) and isinstance(c.get("text"), str) for c in changes)
            and _mistyped(params) is None):
        return None
    return doc["uri"], "range" not in changes[0] and "rangeLength" not in changes[0]


def superseded(message, following) -> bool:
    """Whether `message` is a didChange that the message right after it makes moot: a didChange
    of the same document that replaces its whole text. A storm of edits is then handled as its
    last one (each would otherwise be decoded into pygls's types and applied, a millisecond each
    for a 60 kB document). Only neighbours: a request between two edits sees the first."""
    this, after = _change(message), _change(following)
    return this is not None and after is not None and after[1] and this[0] == after[0]


def handle(protocol, message) -> None:
    """Hand one framed message (a `Message`, or its bytes) to pygls; what pygls would drop is answered."""
    from pygls.exceptions import JsonRpcException

    if isinstance(message, Message):
        obj = message.obj
    else:
        try:
            obj = json.loads(message)
        except (ValueError, RecursionError):
            return _report(protocol, Broken(PARSE_ERROR, "the body is not JSON", message))
    if not isinstance(obj, dict):
        return _report(protocol, Broken(INVALID_REQUEST, "a message is a JSON object (batches are not part of LSP)"))
    mid = obj.get("id")
    has_id = "id" in obj and _is_id(mid)
    if obj.get("jsonrpc") != "2.0" or ("method" in obj and not isinstance(obj["method"], str)) or ("id" in obj and not _is_id(mid)):
        b = Broken(INVALID_REQUEST, 'not a JSON-RPC 2.0 message ("jsonrpc": "2.0", a string method, an integer or string id)')
        b.id = mid if has_id else None
        return _report(protocol, b)
    method = obj.get("method")
    if method == "initialize":
        protocol._penrose_initialized = True
    elif method is not None and method != "exit" and not getattr(protocol, "_penrose_initialized", False):
        if has_id:  # the protocol's answer to a request before initialize; a notification is dropped
            protocol._send_data({"jsonrpc": "2.0", "id": mid, "error": {"code": SERVER_NOT_INITIALIZED,
                                                                         "message": f"{method} before initialize"}})
        return None
    wrong = _mistyped(obj.get("params"))
    if wrong and "method" in obj:
        b = Broken(INVALID_PARAMS, f"invalid params for {obj['method']}: {wrong}")
        b.id = mid if has_id else None
        return _report(protocol, b)
    try:
        structured = protocol.structure_message(obj)
    except JsonRpcException as e:
        b = Broken(INVALID_PARAMS if "method" in obj else INVALID_REQUEST,
                   f"invalid params for {obj.get('method')!s}: {_validation_detail(e)}")
        b.id = mid if has_id and "method" in obj else None
        return _report(protocol, b)
    except Exception as e:  # noqa: BLE001 - a converter failing on odd input must not stop the server
        b = Broken(INVALID_PARAMS, f"cannot read the message: {e}")
        b.id = mid if has_id and "method" in obj else None
        return _report(protocol, b)
    try:
        protocol.handle_message(structured)
    except (SystemExit, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as e:
        logger.exception("cannot handle a message")
        if has_id and "method" in obj:
            protocol._send_data({"jsonrpc": "2.0", "id": mid, "error": {"code": -32603, "message": f"internal error: {e!r}"}})


_UINTEGER = ("line", "character")
_STRINGS = ("uri", "text", "languageId")


def _mistyped(params, path="params", depth=0) -> str | None:
    """What the protocol's converter would quietly coerce: a position that is not a non-negative
    integer below 2**31 (1.5, true, "3"), a uri or text that is not a string (5 -> "5")."""
    if depth > 64:
        return f"{path} is nested too deeply"
    items = params.items() if isinstance(params, dict) else enumerate(params) if isinstance(params, list) else ()
    for key, value in items:
        where = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
        if key in _UINTEGER and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31):
            return f"{where} must be an integer from 0 to 2**31-1, not {json.dumps(value)[:40]}"
        if key in _STRINGS and not isinstance(value, str):
            return f"{where} must be a string, not {json.dumps(value)[:40]}"
        if isinstance(value, (dict, list)):
            found = _mistyped(value, where, depth + 1)
            if found:
                return found
    return None


def _validation_detail(e) -> str:
    cause = e.__cause__
    if cause is None:
        return str(e) or type(e).__name__
    try:
        from cattrs import transform_error

        return "; ".join(transform_error(cause))[:500]
    except Exception:  # noqa: BLE001
        return str(cause)[:500]


def _report(protocol, broken: Broken) -> None:
    response = broken.response()
    logger.warning("broken message: %s", broken.reason)
    if response is not None:
        protocol._send_data(response)
    else:
        protocol._send_data({"jsonrpc": "2.0", "method": "window/logMessage",
                             "params": {"type": 1, "message": f"penrose lsp: skipped a broken message: {broken.reason}"}})
