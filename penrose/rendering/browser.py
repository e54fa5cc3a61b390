"""Looking at pages in a real browser: headless Chromium driven over the DevTools protocol.

A test helper (the gallery's browser tests use it), written with the standard library only: a
minimal WebSocket client and a handful of DevTools commands.

    with Chromium() as browser:
        report = browser.visit("file:///.../gallery/index.html", screenshot="index.png")
    report.broken_images, report.console_errors, report.requests

`visit` loads a page, waits for its load event, then lists every <img> that did not load, every
console error or uncaught exception, and every URL the page requested (an offline site requests
only file: and data: URLs), and optionally saves a full-page PNG screenshot.

Real input for the page's scripts (the gallery's pan and zoom), as a person would give it:

    browser.drag((400, 300), (250, 280))           # left button down, move, up
    browser.wheel(400, 300, -240, ctrl=True)       # Ctrl + wheel (a trackpad pinch reads the same)
    browser.key("+")                               # to the focused element
    browser.scripts(False)                         # the next pages load without JavaScript
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
)


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        exe = shutil.which(name)
        if exe:
            return exe
    return None


@dataclass
class PageReport:
    url: str
    title: str = ""
    images: list = field(default_factory=list)  # (src, loaded, natural width)
    console_errors: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    screenshot: str | None = None

    @property
    def broken_images(self) -> list:
        return [src for src, ok, width in self.images if not ok or not width]

    @property
    def remote_requests(self) -> list:
        return [u for u in self.requests if urlparse(u).scheme not in ("file", "data", "about", "chrome", "devtools")]


class _WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol (text frames, client masking)."""

    def __init__(self, url: str, timeout: float):
        u = urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = u.path + (f"?{u.query}" if u.query else "")
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the browser closed the DevTools connection during the handshake")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(f"DevTools handshake failed: {status.decode(errors='replace')}")
        self.buffer = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str):
        data = text.encode()
        header = bytearray([0x81])
        n = len(data)
        if n < 126:
            header.append(0x80 | n)
        elif n < 65536:
            header.append(0x80 | 126)
            header += struct.pack(">H", n)
        else:
            header.append(0x80 | 127)
            header += struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(bytes(header) + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the browser closed the DevTools connection")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            opcode, length = b0 & 0x0F, b1 & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(length)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 8:
                raise ConnectionError("the browser closed the DevTools connection")
            if opcode in (9, 10):  # ping / pong: not used by Chromium here
                continue
            message += payload
            if b0 & 0x80:
                return message.decode("utf-8", "replace")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Chromium:
    """A headless Chromium for the duration of a `with` block."""

    def __init__(self, binary: str | None = None, timeout: float = 30.0, width: int = 1280, height: int = 900):
        self.binary = binary or chromium_binary()
        if self.binary is None:
            raise FileNotFoundError("no Chromium found (Debian: apt-get install chromium)")
        self.timeout = timeout
        self.width, self.height = width, height
        self.proc: subprocess.Popen[bytes] | None = None
        self.ws: _WebSocket | None = None
        self.next_id = 0
        self.events: list[dict] = []

    def __enter__(self):
        self.profile = tempfile.mkdtemp(prefix="penrose-chromium-")
        args = [self.binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                f"--window-size={self.width},{self.height}", "about:blank"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError("Chromium did not start its DevTools server")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = []
        while not targets:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=self.timeout) as r:
                targets = [t for t in json.load(r) if t.get("type") == "page"]
            if not targets:
                time.sleep(0.05)
        self.ws = _WebSocket(targets[0]["webSocketDebuggerUrl"], self.timeout)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        return self

    def __exit__(self, *exc):
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(getattr(self, "profile", ""), ignore_errors=True)
        return False

    def _socket(self) -> _WebSocket:
        if self.ws is None:
            raise RuntimeError("Chromium is not running: use it inside `with Chromium() as browser:`")
        return self.ws

    def call(self, method: str, params: dict | None = None) -> dict:
        """Send one DevTools command and wait for its answer; events seen meanwhile are kept."""
        ws = self._socket()
        self.next_id += 1
        mid = self.next_id
        ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"{method} got no answer in {self.timeout:.0f} s")

    def wait_for(self, event: str) -> dict:
        ws = self._socket()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for i, e in enumerate(self.events):
                if e["method"] == event:
                    return self.events.pop(i)
            msg = json.loads(ws.recv())
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"no {event} in {self.timeout:.0f} s")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def visit(self, url: str, screenshot: str | None = None) -> PageReport:
        """Load `url`, wait for it, and report its images, console errors and requests."""
        self.events.clear()
        self.call("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")
        # images decode asynchronously: wait until every one is complete
        self.evaluate("Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null)))")
        report = PageReport(url)
        report.title = self.evaluate("document.title") or ""
        report.images = self.evaluate(
            "Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"
        ) or []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                report.console_errors.append(p.get("exceptionDetails", {}).get("text", "exception"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                report.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                entry = p["entry"]
                report.console_errors.append(f"{entry.get('text', '')} {entry.get('url', '')}".strip())
            elif m == "Network.requestWillBeSent":
                report.requests.append(p.get("request", {}).get("url", ""))
        if screenshot:
            size = self.call("Page.getLayoutMetrics").get("cssContentSize") or {}
            width = max(self.width, int(size.get("width", self.width)))
            height = min(int(size.get("height", self.height)), 12000)
            shot = self.call("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": max(height, 1), "scale": 1},
            })
            Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            report.screenshot = screenshot
        return report

    # ---- input, as a person gives it (CSS pixels of the viewport) -------------------------------

    def mouse(self, kind: str, x: float, y: float, button: str = "left", buttons: int = 0, clicks: int = 0,
              modifiers: int = 0) -> None:
        """One mouse event: kind is mousePressed, mouseReleased or mouseMoved."""
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": button, "buttons": buttons,
                                               "clickCount": clicks, "modifiers": modifiers})

    def click(self, x: float, y: float, clicks: int = 1) -> None:
        for n in range(1, clicks + 1):
            self.mouse("mousePressed", x, y, buttons=1, clicks=n)
            self.mouse("mouseReleased", x, y, clicks=n)

    def drag(self, start: tuple, end: tuple, steps: int = 8) -> None:
        """Press the left button at `start`, move to `end` in `steps`, release."""
        (x0, y0), (x1, y1) = start, end
        self.mouse("mouseMoved", x0, y0)
        self.mouse("mousePressed", x0, y0, buttons=1, clicks=1)
        for i in range(1, steps + 1):
            t = i / steps
            self.mouse("mouseMoved", x0 + (x1 - x0) * t, y0 + (y1 - y0) * t, buttons=1)
        self.mouse("mouseReleased", x1, y1, clicks=1)

    def wheel(self, x: float, y: float, delta_y: float, ctrl: bool = False) -> None:
        """A wheel turn over (x, y): a negative delta scrolls up (zooms in with Ctrl)."""
        self.call("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y, "deltaX": 0, "deltaY": delta_y,
                                               "modifiers": 2 if ctrl else 0})
        self.settle()

    def settle(self, frames: int = 3) -> None:
        """Wait a few animation frames: a wheel reaches the page asynchronously, after its command returns."""
        self.evaluate("new Promise(r => { let n = %d; const f = () => --n > 0 ? requestAnimationFrame(f) : r(1); "
                      "requestAnimationFrame(f); })" % max(1, frames))

    _KEY_CODES = {"ArrowLeft": 37, "ArrowUp": 38, "ArrowRight": 39, "ArrowDown": 40, "Tab": 9, "Enter": 13, " ": 32,
                  "+": 187, "=": 187, "-": 189, "_": 189, "0": 48, "1": 49}

    def key(self, key: str, shift: bool = False) -> None:
        """Press and release one key, sent to the focused element."""
        code = self._KEY_CODES.get(key, ord(key.upper()[0]) if len(key) == 1 else 0)
        text = key if len(key) == 1 else ""
        base = {"key": key, "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code, "modifiers": 8 if shift else 0}
        self.call("Input.dispatchKeyEvent", {**base, "type": "keyDown" if text else "rawKeyDown", "text": text})
        self.call("Input.dispatchKeyEvent", {**base, "type": "keyUp"})

    def resize(self, width: int | None = None, height: int | None = None) -> None:
        """Make the window `width` × `height` CSS pixels (no arguments: back to the window's own)."""
        if width is None:
            self.call("Emulation.clearDeviceMetricsOverride")
        else:
            self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height or self.height,
                                                              "deviceScaleFactor": 1, "mobile": False})
        self.settle()

    def scripts(self, enabled: bool) -> None:
        """Turn the page's JavaScript off (or back on) for the pages visited next."""
        self.call("Emulation.setScriptExecutionDisabled", {"value": not enabled})
