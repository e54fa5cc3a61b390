"""`penrose serve FILE|DIR`: a live page of a diagram that follows every save.

    penrose serve model.pen              # http://127.0.0.1:8000/
    penrose serve zoo/paper --port 0     # a folder: an index of its diagrams, one live page each

The page shows the figure (`penrose.render`), the errors and warnings with their carets
(`PenroseError.render()`), the Rosetta stone of the gallery (each statement's diagram, PyTorch
line, equation and reading; `penrose.rendering.gallery`'s own pieces), and the generated PyTorch
(`penrose.source`). A thread polls the stamps of the file and its includes every `POLL`
seconds (`penrose.workspace`, which also caches the parses and the checks); a change is checked
and drawn at once, the figure and the errors first, the Rosetta stone and the PyTorch right
after, and pushed to the page with server-sent events (`/events`). The page's one script is inline and fetches nothing but this server's own
`/state` and figures; without it, reloading the page shows the latest state.

Standard library only (`http.server`), bound to 127.0.0.1 unless `--host` says otherwise.
`LiveServer` runs it inside a program or a test (`with LiveServer(path, port=0) as s: s.url`).

What is served, and to whom (docs/security.md):

- only the `.pen` file given, or the `.pen` files under the folder given, whose *real* path
  (every symlink resolved, `os.path.realpath`) lies inside that file or folder; a link in the
  folder to `/etc/passwd` or to a `.pen` file elsewhere is neither listed nor served (404), and
  the check is made again on every request, so a link changed while serving is refused too.
  A diagram's includes follow the loader's rule (its folder and `--include-path`s, `penrose.load`);
- only to requests whose `Host` header names the address the server is bound to, with its port:
  `127.0.0.1`, `localhost` and `[::1]` for a loopback binding, the bound address itself for
  another, any IP literal for `0.0.0.0`/`::`. Any other name (a DNS-rebinding page's
  `evil.example`) gets 403, as does a request whose `Origin` (sent by browsers on the event
  stream and on cross-site requests) is not `http://` + such a host. Nothing but GET is answered.
"""

from __future__ import annotations

import html
import ipaddress
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse, urlsplit

from penrose.errors import PenroseError, PenroseRenderError, Span, warning_text

POLL = 0.1  # seconds between looks at the files' modification times
KEEPALIVE = 15.0  # seconds between comments on an idle event stream


@dataclass
class State:
    """What the page shows of one diagram at one moment (`version` counts the changes seen)."""

    version: int = 0
    phase: str = "checking"  # checking | drawn (figure and errors) | complete (Rosetta stone and PyTorch too)
    ok: bool = False
    title: str = ""
    errors: str = ""  # HTML
    figure: str = ""  # HTML (an inline SVG)
    rosetta: str = ""  # HTML
    source: str = ""  # HTML
    seconds: float = 0.0
    files: dict = field(default_factory=dict)  # URL path -> bytes of the figures this state's HTML names

    def public(self) -> dict:
        return {k: getattr(self, k) for k in ("version", "phase", "ok", "title", "errors", "figure", "rosetta", "source", "seconds")}


class Live:
    """One watched diagram: its current State, rebuilt when it or an include changes."""

    def __init__(self, path: Path, key: str, include_paths=(), sizes=None, equations=None, workspace=None):
        from penrose.workspace import Workspace

        self.path = path
        self.key = key  # the name in URLs (relative to the served folder)
        self.include_paths = tuple(include_paths)
        self.workspace = workspace if workspace is not None else Workspace(self.include_paths)  # parses, includes, stamps
        self.sizes = dict(sizes or {})
        self.equations = equations if equations is not None else {}  # file name -> LaTeX (shared)
        self.state = State(title=path.name)
        self.cond = threading.Condition()
        self.version = 0
        self.assets: dict = {}  # URL path -> (version, bytes): the figures of the last few versions' pages
        self.building = threading.Lock()  # one rebuild at a time (the watcher, a first request)

    # -- watching
    def watched(self) -> list[str]:
        """The diagram's file and the files it includes, transitively (as last read)."""
        return self.workspace.files(self.path)

    def poll(self) -> bool:
        """Rebuild if the diagram or an include changed since the last look; True if it did."""
        with self.building:
            if self.version and self.workspace.fresh(self.path, sizes=self.sizes):
                return False
            self.rebuild()
            return True

    # -- building
    def _publish(self, state: State):
        with self.cond:
            for url, data in state.files.items():
                self.assets.setdefault(url, (state.version, data))
            for url in [u for u, (v, _) in self.assets.items() if v < state.version - 3]:
                del self.assets[url]  # a page still showing a much older version reloads anyway
            self.state = state
            self.cond.notify_all()

    def asset(self, url: str) -> bytes | None:
        with self.cond:
            found = self.assets.get(url)
        return found[1] if found else None

    def rebuild(self):
        start = time.perf_counter()
        self.version += 1
        v = self.version
        state = State(version=v, phase="drawn", title=self.path.name)
        checked = None
        try:
            checked, warnings = self._check()
            state.ok = True
            state.title = checked.name
            state.errors = _warnings_html(warnings)
            state.figure = self._figure(checked)
            old = self.state  # until the new Rosetta stone is drawn, the last one stays
            state.rosetta, state.source = old.rosetta, old.source
        except PenroseError as e:
            state.errors = _error_html(e)
            old = self.state
            state.figure, state.rosetta, state.source = old.figure, old.rosetta, old.source
            if old.figure:
                state.figure = '<p class="stale">the last figure that checked:</p>' + _strip_stale(old.figure)
        state.seconds = time.perf_counter() - start
        if checked is None:
            state.phase = "complete"
            self._publish(state)
            return
        self._publish(state)
        full = State(**{**state.__dict__, "files": {}})
        try:
            full.rosetta, full.source, full.files = self._rosetta(checked, v)
        except PenroseError as e:
            full.rosetta = _error_html(e)
        except Exception as e:  # a back end failing on this diagram: the figure and the errors still stand
            full.rosetta = '<pre class="error">' + html.escape(f"cannot draw the Rosetta stone: {e!r}") + "</pre>"
        full.phase = "complete"
        full.seconds = time.perf_counter() - start
        self._publish(full)

    def _check(self):
        import warnings as _warnings

        with _warnings.catch_warnings():
            _warnings.simplefilter("ignore")
            checked = self.workspace.load(self.path, sizes=self.sizes)  # checked again only when a file it read changed
        return checked, list(checked.warnings)

    def _figure(self, checked) -> str:
        from penrose.rendering import render

        try:
            svg = render(checked)
        except PenroseError as e:
            return _error_html(e)
        svg = svg[svg.find("<svg") :] if "<svg" in svg else svg  # inline: no XML prolog or doctype
        return f'<div class="figure-view">{svg}</div>'

    def _rosetta(self, c, v: int):
        """(Rosetta stone HTML, PyTorch HTML, {URL path: figure bytes}), from the gallery's pieces."""
        from penrose.compiler import generate_source
        from penrose.fmt import format_stmt
        from penrose.rendering import gallery as g
        from penrose.rendering.explain import statement_latex, statement_readings
        from penrose.views import statements

        try:
            source, source_map = generate_source(c, with_map=True)
        except PenroseError as err:
            source, source_map = f"# cannot compile for the default sizes: {err.message}\n", []
        torch_code = g.statement_code(c, source, source_map)
        entry = g.Entry(self.path, self.key, "live", "live", checked=c)
        equations: dict = {}
        prefix = f"/r/{quote(self.key)}/{v}/"
        parts = [g.rosetta_table(entry, c, c, statements(c), torch_code, equations, prefix + "s", "statement", format_stmt,
                            statement_latex, statement_readings)]
        for name, blk in c.blocks.items():
            bslug = re.sub(r"[^A-Za-z0-9_]", "_", name)
            stmts = [s for s in statements(blk) if not g.plain_return(s)]
            if not stmts:
                continue
            parts.append(f'<h3 id="block-{html.escape(bslug)}">Block <code>{html.escape(name)}</code></h3>')
            parts.append(g.rosetta_table(entry, c, blk, stmts, torch_code, equations, f"{prefix}{bslug}-s", f"block:{name}:statement",
                                    format_stmt, statement_latex, statement_readings))
        names = sorted(entry.dots)
        files = dict(zip(names, g.lay_out([entry.dots[n] for n in names])))
        for latex, name in equations.items():
            self.equations.setdefault(name, latex)  # drawn when the page asks for it
        text = g.fill_sizes("\n".join(parts), files)
        text = text.replace('src="equations/', 'src="/equations/')
        return text, f'<pre class="source">{html.escape(source)}</pre>', files


def _strip_stale(figure: str) -> str:
    return figure.replace('<p class="stale">the last figure that checked:</p>', "")


def _error_html(e: PenroseError) -> str:
    return f'<pre class="error">{html.escape(e.render())}</pre>'


def _warnings_html(warnings) -> str:
    if not warnings:
        return ""
    rows = [warning_text(message, span) for message, span in warnings]  # as `penrose check` prints them
    return f'<pre class="warning">{html.escape(chr(10).join(rows))}</pre>'


# ---- the server --------------------------------------------------------------------------------


class LiveServer:
    """Serve a `.pen` file (or a folder of them) live; `start()` / `stop()`, or a `with` block."""

    def __init__(self, path, host: str = "127.0.0.1", port: int = 8000, include_paths=(), sizes=None, poll: float = POLL):
        from penrose.workspace import Workspace

        self.root = Path(path)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise PenroseError(f"cannot serve on port {port!r}: a port is an integer from 0 to 65535", Span(str(path)))
        if not self.root.exists():
            raise PenroseError(f"cannot serve {path}: no such file or folder", Span(str(path)))
        if self.root.is_file() and self.root.suffix != ".pen":
            raise PenroseError(f"cannot serve {path}: not a .pen file", Span(str(path)))
        self.single = self.root.is_file()
        self.include_paths = tuple(include_paths)
        self.sizes = dict(sizes or {})
        self.workspace = Workspace(self.include_paths)  # shared by the diagrams served: a library is parsed once
        self.poll_seconds = poll
        self.lives: dict[str, Live] = {}
        self.equations: dict[str, str] = {}  # file name -> LaTeX
        self.drawn: dict[str, bytes] = {}  # file name -> equation SVG
        self.drawing = threading.Lock()  # matplotlib draws one equation at a time
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.threads: list[threading.Thread] = []
        self.real_root = os.path.realpath(self.root)  # what every served file must resolve inside
        self.hosts = _Hosts(host, self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        assert isinstance(host, str), "an IP server's host is text (typeshed allows bytes)"
        return f"http://{host}:{port}/"

    def diagrams(self) -> list[str]:
        """The keys (relative paths) of the diagrams this server may show: regular `.pen` files
        whose real path lies inside the served file or folder."""
        if self.single:
            return [self.root.name] if self.contains(self.root) else []
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*.pen") if self.contains(p))

    def contains(self, path) -> bool:
        """Whether `path` resolves (through every symlink) to a regular file inside what is served."""
        real = os.path.realpath(path)
        if self.single:
            inside = real == self.real_root
        else:
            try:
                inside = os.path.commonpath([real, self.real_root]) == self.real_root
            except ValueError:  # another drive (Windows)
                inside = False
        return inside and os.path.isfile(real)

    def allowed(self, host: str | None, origin: str | None) -> bool:
        """Whether a request with these `Host` and `Origin` headers may be answered."""
        return host is not None and host in self.hosts and (origin is None or self.hosts.origin(origin))

    def live(self, key: str) -> Live | None:
        if not isinstance(key, str) or not key or "\x00" in key or len(key) > 4096:
            return None
        path = self.root if self.single else self.root / key
        with self.lock:
            if key not in self.lives and key not in self.diagrams():
                return None
            if not self.contains(path):  # again on every request: a link may have been changed
                return None
            if key in self.lives:
                return self.lives[key]
            lv = Live(path, key, self.include_paths, self.sizes, self.equations, self.workspace)
            self.lives[key] = lv
        lv.poll()
        return lv

    def equation(self, name: str) -> bytes | None:
        """An equation's SVG, drawn the first time a page asks for it."""
        latex = self.equations.get(name)
        if latex is None:
            return None
        with self.drawing:
            if name not in self.drawn:
                from penrose.rendering.equations import latex_to_svg

                try:
                    svg = latex_to_svg(latex)
                except ValueError:
                    return None
                self.drawn[name] = svg.encode("utf-8") if isinstance(svg, str) else svg
            return self.drawn[name]

    def _watch(self):
        while not self.stopping.wait(self.poll_seconds):
            for lv in list(self.lives.values()):
                try:
                    lv.poll()
                except Exception as e:  # keep watching: show the failure instead
                    lv._publish(State(version=lv.version, phase="complete", title=lv.path.name,
                                      errors=f'<pre class="error">{html.escape(f"internal error: {e!r}")}</pre>'))

    def start(self) -> "LiveServer":
        for target in (self.httpd.serve_forever, self._watch):
            t = threading.Thread(target=target, daemon=True, name=f"penrose-serve-{target.__name__}")
            t.start()
            self.threads.append(t)
        if self.single:
            self.live(self.root.name)
        return self

    def stop(self):
        self.stopping.set()
        for lv in list(self.lives.values()):
            with lv.cond:
                lv.cond.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def serve(path, host: str = "127.0.0.1", port: int = 8000, include_paths=(), sizes=None) -> int:
    """`penrose serve`: serve until Ctrl-C."""
    try:
        server = LiveServer(path, host, port, include_paths, sizes)
    except OSError as e:
        raise PenroseRenderError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.start()
    print(f"serving {path} at {server.url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


class _Hosts:
    """The `Host` header values a server bound to `host`:`port` answers: the bound address (all
    three loopback names for a loopback binding, any IP literal for a wildcard one), that port."""

    def __init__(self, host: str, port: int):
        self.port = port
        self.names = {host.lower().strip("[]")}
        ip = _ip(host)
        self.any_ip = ip is not None and ip.is_unspecified
        if host.lower() == "localhost" or (ip is not None and (ip.is_loopback or ip.is_unspecified)):
            self.names |= {"127.0.0.1", "localhost", "::1"}

    def __contains__(self, value) -> bool:
        if not isinstance(value, str) or not value.isascii() or any(c.isspace() for c in value.strip()):
            return False
        try:
            u = urlsplit("//" + value.strip())
            name, port = u.hostname, u.port
        except ValueError:  # a port that is not a number, an unbalanced bracket
            return False
        if not name or u.username is not None or u.password is not None or u.path or u.query or u.fragment:
            return False
        if (port if port is not None else 80) != self.port:
            return False
        return name in self.names or (self.any_ip and _ip(name) is not None)

    def origin(self, value: str) -> bool:
        return value.lower().startswith("http://") and value[len("http://"):] in self


def _ip(name: str):
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def _handler(server: LiveServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the terminal shows the serving line only
            pass

        def _send(self, code: int, body: bytes, ctype: str, cache: bool = False):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=3600, immutable" if cache else "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def _not_found(self):
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _refused(self) -> bool:
            """403 unless the Host (and any Origin) name this server: no DNS rebinding."""
            hosts, origins = self.headers.get_all("Host") or [], self.headers.get_all("Origin") or []
            if len(hosts) == 1 and len(origins) <= 1 and server.allowed(hosts[0], origins[0] if origins else None):
                return False
            self.close_connection = True
            self._send(403, b"forbidden: this server answers only requests addressed to its own address\n",
                       "text/plain; charset=utf-8")
            return True

        def do_GET(self):
            try:
                if self._refused():
                    return
                u = urlparse(self.path)
                q = parse_qs(u.query)
            except (BrokenPipeError, ConnectionResetError):
                return
            except ValueError:
                return self._send(400, b"bad request\n", "text/plain; charset=utf-8")
            key = q.get("file", [""])[0] or (server.root.name if server.single else "")
            try:
                if u.path == "/":
                    if not server.single and not q.get("file"):
                        return self._send(200, _index_page(server).encode("utf-8"), "text/html; charset=utf-8")
                    lv = server.live(key)
                    if lv is None:
                        return self._not_found()
                    return self._send(200, _page(lv).encode("utf-8"), "text/html; charset=utf-8")
                if u.path == "/state":
                    lv = server.live(key)
                    if lv is None:
                        return self._not_found()
                    return self._send(200, json.dumps(lv.state.public()).encode("utf-8"), "application/json")
                if u.path == "/events":
                    lv = server.live(key)
                    if lv is None:
                        return self._not_found()
                    return self._events(lv)
                if u.path == "/favicon.ico":
                    return self._send(204, b"", "image/x-icon")
                if u.path.startswith("/equations/"):
                    data = server.equation(u.path.rsplit("/", 1)[1])
                    return self._send(200, data, "image/svg+xml", cache=True) if data else self._not_found()
                if u.path.startswith("/r/"):
                    for lv in list(server.lives.values()):
                        data = lv.asset(u.path)
                        if data is not None:
                            return self._send(200, data, "image/svg+xml", cache=True)
                    return self._not_found()
                return self._not_found()
            except (BrokenPipeError, ConnectionResetError):
                return

        def _events(self, lv: Live):
            """Server-sent events: `update` with the state's version and phase at each change."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            seen = None
            try:
                while not server.stopping.is_set():
                    with lv.cond:
                        now = (lv.state.version, lv.state.phase)
                        if now == seen:
                            lv.cond.wait(KEEPALIVE)
                            now = (lv.state.version, lv.state.phase)
                    if now != seen:
                        seen = now
                        msg = f"event: update\ndata: {json.dumps({'version': now[0], 'phase': now[1]})}\n\n"
                    else:
                        msg = ": keep-alive\n\n"
                    self.wfile.write(msg.encode("utf-8"))
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, OSError):
                return

    return Handler


# ---- pages -------------------------------------------------------------------------------------

PAGE_STYLE = """
header.live { display: flex; align-items: baseline; gap: 1rem; flex-wrap: wrap; }
header.live .status { font-size: .85rem; padding: .1rem .5rem; border-radius: 3px; background: #eef5ee; color: #1f5f2a; }
header.live .status.error { background: #fbeaea; color: #8a1c1c; }
header.live .status.checking { background: #f3f3f3; color: #555; }
pre.error { background: #fff5f5; border: 1px solid #f0c8c8; color: #7a1010; padding: .8rem; overflow-x: auto; }
pre.warning { background: #fffbea; border: 1px solid #eadca0; color: #6b5200; padding: .6rem; overflow-x: auto; }
.figure-view { overflow: auto; border: 1px solid #eee; padding: .5rem; max-height: 80vh; }
.figure-view svg { max-width: 100%; height: auto; }
p.stale { color: #8a1c1c; font-size: .85rem; }
"""

LIVE_SCRIPT = """
(function () {
  "use strict";
  var file = document.body.getAttribute("data-file");
  var q = "?file=" + encodeURIComponent(file);
  var RANK = {checking: 0, drawn: 1, complete: 2};
  var shown = [+document.body.getAttribute("data-version"), RANK[document.body.getAttribute("data-phase")] || 0];
  var last = {};
  function newer(s) {
    var r = RANK[s.phase] || 0;
    return s.version > shown[0] || (s.version === shown[0] && r > shown[1]);
  }
  function apply(s) {
    if (!newer(s)) return;  /* answers may arrive out of order: never go back */
    shown = [s.version, RANK[s.phase] || 0];
    ["errors", "figure", "rosetta", "source"].forEach(function (k) {
      var el = document.getElementById(k);
      if (el && last[k] !== s[k]) { el.innerHTML = s[k]; last[k] = s[k]; }
    });
    var st = document.getElementById("status");
    st.textContent = s.ok ? (s.phase === "complete" ? "ok" : "ok, drawing the Rosetta stone") : "error";
    st.className = "status" + (s.ok ? "" : " error");
    document.getElementById("updated").textContent = "version " + s.version + " · " + new Date().toLocaleTimeString() +
      " · " + Math.round(s.seconds * 1000) + " ms";
    document.title = s.title + " — penrose serve";
    document.body.setAttribute("data-version", s.version);
    document.body.setAttribute("data-phase", s.phase);
  }
  function refresh() {
    fetch("/state" + q, {cache: "no-store"}).then(function (r) { return r.json(); }).then(apply)
      .catch(function () {});
  }
  if (window.EventSource) {
    var es = new EventSource("/events" + q);
    es.addEventListener("update", function (e) { if (newer(JSON.parse(e.data))) refresh(); });
  }
  refresh();
})();
""".strip()


def _style() -> str:
    from penrose.rendering.gallery import STYLE

    return STYLE + PAGE_STYLE


def _page(lv: Live) -> str:
    s = lv.state
    status = "ok" if s.ok else ("checking" if s.phase == "checking" else "error")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{html.escape(s.title)} — penrose serve</title>
<style>{_style()}</style>
</head>
<body data-file="{html.escape(lv.key)}" data-version="{s.version}" data-phase="{s.phase}">
<header class="live"><h1>{html.escape(s.title)}</h1>
<code>{html.escape(str(lv.path))}</code>
<span id="status" class="status {'' if s.ok else status}">{status}</span>
<span id="updated" class="meta">version {s.version}</span></header>
<section id="errors">{s.errors}</section>
<h2>Figure</h2>
<section id="figure">{s.figure}</section>
<h2>Rosetta stone</h2>
<p class="note">For every statement: its diagram, its line of PyTorch, its equation and its geometric reading.</p>
<section id="rosetta">{s.rosetta}</section>
<h2>Generated PyTorch module</h2>
<section id="source">{s.source}</section>
<footer>Served by <code>penrose serve</code>; the page follows every save of the file.</footer>
<script>{LIVE_SCRIPT}</script>
</body>
</html>
"""


def _index_page(server: LiveServer) -> str:
    rows = "".join(f'<li><a href="/?file={quote(k)}">{html.escape(k)}</a></li>' for k in server.diagrams())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>{html.escape(str(server.root))} — penrose serve</title>
<style>{_style()}</style></head>
<body><h1>{html.escape(str(server.root))}</h1><ul>{rows}</ul>
<footer>Served by <code>penrose serve</code>.</footer></body></html>
"""
