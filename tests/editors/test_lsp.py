"""`penrose lsp` through a real exchange: `python -m penrose.cli lsp` in a subprocess, spoken to
in JSON-RPC with Content-Length framing by the small client below (nothing of pygls on this
side). initialize, didOpen, didChange, diagnostics with their exact ranges, hints and related
locations, hover, definition, completion, formatting, symbols, code actions, includes followed
and re-checked, shutdown and exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("pygls", reason="penrose lsp needs the editor extra (pip install pygls)")

from penrose.fmt import format_diagram  # noqa: E402
from penrose.parser import parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

ATTENTION = (ROOT / "zoo" / "paper" / "self_attention.pen").read_text()


class Rpc:
    """JSON-RPC 2.0 over the server's stdin/stdout, framed by Content-Length headers."""

    def __init__(self, *extra):
        self.proc = subprocess.Popen([sys.executable, "-m", "penrose.cli", "lsp", *extra], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.cond = threading.Condition()
        self.answers: dict = {}
        self.notes: list = []
        self.ids = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if not line.strip():
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            msg = json.loads(out.read(length).decode("utf-8"))
            with self.cond:
                if "method" in msg:
                    self.notes.append(msg)
                    if "id" in msg:  # a request of the server's (client/registerCapability): accept
                        self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
                else:
                    self.answers[msg["id"]] = msg
                self.cond.notify_all()

    def send(self, msg):
        body = json.dumps(msg).encode("utf-8")
        self.proc.stdin.write(f"Content-Length: {len(body)}\r\n\r\n".encode("ascii") + body)
        self.proc.stdin.flush()

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method, params, timeout=60):
        with self.cond:
            self.ids += 1
            mid = self.ids
        self.send({"jsonrpc": "2.0", "id": mid, "method": method, "params": params})
        with self.cond:
            assert self.cond.wait_for(lambda: mid in self.answers, timeout), f"{method}: no answer"
            msg = self.answers.pop(mid)
        assert "error" not in msg, msg
        return msg["result"]

    def mark(self):
        with self.cond:
            return len(self.notes)

    def diagnostics(self, uri, since, timeout=60):
        """The first publishDiagnostics for `uri` after notification number `since`."""
        def find():
            return next((n["params"]["diagnostics"] for n in self.notes[since:]
                         if n["method"] == "textDocument/publishDiagnostics" and n["params"]["uri"] == uri), None)

        with self.cond:
            assert self.cond.wait_for(lambda: find() is not None, timeout), f"no diagnostics for {uri}"
            return find()


@pytest.fixture(scope="module")
def lsp(tmp_path_factory):
    root = tmp_path_factory.mktemp("ws")
    rpc = Rpc()
    init = rpc.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(),
                                      "capabilities": {"textDocument": {"hover": {"contentFormat": ["markdown"]}},
                                                       "workspace": {"didChangeWatchedFiles": {"dynamicRegistration": True}}}})
    rpc.notify("initialized", {})
    rpc.root, rpc.init = root, init
    rpc.version = 1
    yield rpc
    if rpc.proc.poll() is None:
        rpc.proc.kill()
        rpc.proc.wait()


def _open(lsp, name, text):
    path = lsp.root / name
    path.write_text(text)
    uri = path.as_uri()
    since = lsp.mark()
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "pen", "version": 1, "text": text}})
    return uri, lsp.diagnostics(uri, since)


def _change(lsp, uri, text, watch=None):
    lsp.version += 1
    since = lsp.mark()
    lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": lsp.version}, "contentChanges": [{"text": text}]})
    return lsp.diagnostics(watch or uri, since)


def _at(text, needle, offset=0):
    """The (line, character) of `needle` in `text` (plus `offset` characters), 0-based."""
    i = text.index(needle) + offset
    line = text.count("\n", 0, i)
    return {"line": line, "character": i - (text.rfind("\n", 0, i) + 1)}


def _save(path: Path, text: str):
    """Write a file as editors save one: whole, by renaming a finished copy over it."""
    tmp = path.with_suffix(".pen~")
    tmp.write_text(text)
    os.replace(tmp, path)


def _range(l0, c0, l1, c1):
    return {"start": {"line": l0, "character": c0}, "end": {"line": l1, "character": c1}}


def test_capabilities(lsp):
    caps = lsp.init["capabilities"]
    for key in ("hoverProvider", "definitionProvider", "completionProvider", "documentFormattingProvider",
                "documentSymbolProvider", "codeActionProvider", "textDocumentSync"):
        assert caps.get(key), key
    assert lsp.init["serverInfo"]["name"] == "penrose"
    with lsp.cond:  # the server asks to hear of .pen files changed on disk
        assert lsp.cond.wait_for(lambda: any(n["method"] == "client/registerCapability" for n in lsp.notes), 30)
        (reg,) = next(n for n in lsp.notes if n["method"] == "client/registerCapability")["params"]["registrations"]
    assert reg["method"] == "workspace/didChangeWatchedFiles"
    assert reg["registerOptions"]["watchers"] == [{"globPattern": "**/*.pen"}]


def test_diagnostics_on_open_and_change_with_exact_ranges_and_hints(lsp):
    uri, diags = _open(lsp, "attention.pen", ATTENTION)
    assert diags == []
    broken = ATTENTION.replace("k = einsum('pd,de->pe', Z, W_k)", "k = einsum('pd,de->pe', Z, W_kk)")
    (diag,) = _change(lsp, uri, broken)
    pos = _at(broken, "W_kk)")
    assert diag["range"] == _range(pos["line"], pos["character"], pos["line"], pos["character"] + 4)
    assert diag["severity"] == 1 and diag["source"] == "penrose"
    assert diag["message"] == "unknown tensor 'W_kk'; did you mean 'W_k'?"
    assert diag["data"] == {"suggestion": "W_k"}
    (fix,) = lsp.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": diag["range"],
                                                     "context": {"diagnostics": [diag]}})
    assert fix["kind"] == "quickfix" and fix["edit"]["changes"][uri] == [{"range": diag["range"], "newText": "W_k"}]
    assert _change(lsp, uri, ATTENTION) == []


def test_notes_become_related_locations_and_warnings_are_reported(lsp):
    text = "# index legend: e embedding\ndim e = 2\ndim e = 3\ninput x[e]\noutput x\n"
    uri, (diag,) = _open(lsp, "twice.pen", text)
    assert diag["message"] == "dim 'e' is declared twice" and diag["range"]["start"] == {"line": 2, "character": 4}
    (rel,) = diag["relatedInformation"]
    assert rel["message"] == "first declared here" and rel["location"]["uri"] == uri
    assert rel["location"]["range"]["start"] == {"line": 1, "character": 4}

    text = "# index legend: e embedding\ndim e = 2, f = 3\ninput x[e]\ninput unused[e]\noutput x\n"
    diags = _change(lsp, uri, text)
    assert [d["severity"] for d in diags] == [2, 2]
    legend, unused = diags
    assert "dim 'f' is not in the index legend" in legend["message"] and legend["range"]["start"] == {"line": 1, "character": 11}
    assert unused["message"] == "input 'unused' is never used" and unused["range"]["start"]["line"] == 3


def test_legs_aligned_by_position_are_a_warning(lsp):
    """Issue 23: legs of different names aligned by position are reported, with both legs."""
    text = "# index legend: t token, e embedding, d hidden\ndim t = 2, e = 3, d = 3\ninput Z[t, e]\ninput h[t, d]\nZ = Z + h\noutput Z\n"
    uri, diags = _open(lsp, "paper_form.pen", text)
    (d,) = [d for d in diags if "by position" in d["message"]]
    assert d["severity"] == 2 and "leg 'd' of 'h' with leg 'e' of 'Z'" in d["message"]
    assert d["range"]["start"] == {"line": 4, "character": 8}


def test_ranges_count_utf16_code_units(lsp):
    text = "# index legend: t token, d embedding, e attention dim\ndim t = 6, d = 8, e = 4\ninput Z[t, d]\n" \
           "param W[d, e]\nq = einsum('t\U0001F600,de->te', Z, W)\noutput q\n"
    uri, (diag,) = _open(lsp, "emoji.pen", text)
    assert diag["range"] == _range(4, 13, 4, 15)  # the emoji: one code point, two UTF-16 units


def test_hover(lsp):
    uri, _ = _open(lsp, "hover.pen", ATTENTION)

    def hover(needle, offset=0):
        got = lsp.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _at(ATTENTION, needle, offset)})
        assert got is not None, needle
        assert got["contents"]["kind"] == "markdown"
        return got["contents"]["value"]

    text = hover("W_q[d, e]")
    assert "**param** `W_q[d, e]`" in text and "d = 8, e = 4" in text and "32 entries" in text
    text = hover("q = einsum")
    assert "`q[..., t, e]`" in text and "t = 6, e = 4" in text and "free leg(s) t" in text
    text = hover("dim t", 4)
    assert "**dim** `t` = 6" in text and "query token" in text
    text = hover("einsum('te,pe->tp'", 8)  # inside the spec
    assert "einsum[t, p] = Σ_{e} q[t, e] · k[p, e]" in text  # inside `/ sqrt(e)`: the einsum's own result
    assert "288 FLOPs" in text  # 2 · t · p · e = 2 · 6 · 6 · 4
    assert "\\frac{\\sum_{e} q_{te}" in text  # the statement's equation, as LaTeX
    text = hover("h = einsum", 4)
    assert "h[t, e] = Σ_{p} probs[t, p] · v[p, e]" in text
    text = hover("softmax")
    assert "softmax(x, leg" in text and "normalise exp(x)" in text


def test_definition_and_includes(lsp):
    lib = "# index legend: t token, e embedding\ndim t = 4, e = 3\nblock mlp(x[t, e]) {\n  param W[e, e]\n  return einsum('te,ef->tf', x, W)\n}\n"
    main = "# index legend: t token, e embedding\ninclude \"lib.pen\"\ninput Z[t, e]\ny = mlp(Z)\nz = y * 2\noutput z\n"
    (lsp.root / "lib.pen").write_text(lib)
    uri, diags = _open(lsp, "main.pen", main)
    assert diags == []
    lib_uri = (lsp.root / "lib.pen").as_uri()

    def definition(needle, offset=0, text=main, where=uri):
        return lsp.request("textDocument/definition", {"textDocument": {"uri": where}, "position": _at(text, needle, offset)})

    assert definition("mlp(Z)") == {"uri": lib_uri, "range": _range(2, 6, 2, 9)}
    assert definition("Z[t") == {"uri": uri, "range": _range(2, 6, 2, 7)}
    assert definition("y * 2") == {"uri": uri, "range": _range(3, 0, 3, 1)}
    assert definition("Z[t, e]", 2) == {"uri": lib_uri, "range": _range(1, 4, 1, 5)}  # the dim t
    assert definition('lib.pen"') == {"uri": lib_uri, "range": _range(0, 0, 0, 0)}

    # an included file open in the editor: its unsaved text is what the includer is checked with
    since = lsp.mark()
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": lib_uri, "languageId": "pen", "version": 1, "text": lib}})
    assert lsp.diagnostics(lib_uri, since) == []
    assert lsp.diagnostics(uri, since) == []  # main.pen is checked again with the open text (on the check thread: wait for it)
    assert definition("x, W)", 3, lib, lib_uri) == {"uri": lib_uri, "range": _range(3, 8, 3, 9)}
    broken = lib.replace("x, W)", "x, Wx)")
    since = lsp.mark()
    lsp.version += 1
    lsp.notify("textDocument/didChange", {"textDocument": {"uri": lib_uri, "version": lsp.version}, "contentChanges": [{"text": broken}]})
    (in_lib,) = lsp.diagnostics(lib_uri, since)
    assert in_lib["range"] == _range(4, 32, 4, 34) and "unknown tensor 'Wx'" in in_lib["message"]
    (in_main,) = lsp.diagnostics(uri, since)
    assert in_main["range"]["start"] == {"line": 1, "character": 0} and in_main["message"].startswith("in lib.pen: unknown tensor 'Wx'")
    assert in_main["relatedInformation"][0]["location"] == {"uri": lib_uri, "range": _range(4, 32, 4, 34)}
    since = lsp.mark()
    lsp.notify("textDocument/didChange", {"textDocument": {"uri": lib_uri, "version": lsp.version + 1}, "contentChanges": [{"text": lib}]})
    assert lsp.diagnostics(uri, since) == [] and lsp.diagnostics(lib_uri, since) == []
    since = lsp.mark()
    lsp.notify("textDocument/didClose", {"textDocument": {"uri": lib_uri}})
    assert lsp.diagnostics(lib_uri, since) == []
    # closing lib.pen re-checks main.pen against the disk; wait for it, so that its check cannot
    # read the disk while the edits below are being written (regression: CI of stop 19 read a
    # half-written lib.pen and reported it empty)
    assert lsp.diagnostics(uri, since) == []

    # a change on disk (another program; the client's file watcher says so)
    _save(lsp.root / "lib.pen", lib.replace("param W[e, e]", "param W[e, e, e]"))
    since = lsp.mark()
    lsp.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": lib_uri, "type": 2}]})
    (diag,) = lsp.diagnostics(uri, since)
    assert diag["message"].startswith("in lib.pen:") and diag["range"]["start"]["line"] == 1
    _save(lsp.root / "lib.pen", lib)
    since = lsp.mark()
    lsp.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": lib_uri, "type": 2}]})
    assert lsp.diagnostics(uri, since) == []


def test_completion(lsp):
    text = ATTENTION + "z = \n"
    uri, _ = _open(lsp, "complete.pen", ATTENTION)
    _change(lsp, uri, text)
    got = lsp.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": text.count("\n") - 1, "character": 4}})
    items = {(i["label"], i["kind"]) for i in got["items"]}
    assert {("W_q", 6), ("probs", 6), ("t", 25), ("einsum", 3), ("softmax", 3), ("rearrange", 3)} <= items
    labels = {i["label"] for i in got["items"]}
    assert "output" not in labels  # keywords where a statement starts, not inside an expression
    got = lsp.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": text.count("\n") - 1, "character": 0}})
    assert {"output", "param", "dim", "block", "include"} <= {i["label"] for i in got["items"]}
    init = "param V[d, e] ~ "
    _change(lsp, uri, ATTENTION + init + "\n")
    got = lsp.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": ATTENTION.count("\n"), "character": len(init)}})
    assert {i["label"] for i in got["items"]} == {"normal", "zeros", "ones", "constant", "uniform", "xavier", "fan_in", "eye",
                                                 "causal", "arange", "rotary", "rotary_cos", "rotary_sin"}
    inside = "param V[d, "
    _change(lsp, uri, ATTENTION + inside + "\n")
    got = lsp.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": ATTENTION.count("\n"), "character": len(inside)}})
    assert {i["label"] for i in got["items"]} == {"t", "d", "e"}


def test_formatting_is_penrose_fmt(lsp):
    messy = "dim   e=3,f = 2\ninput x[ e ]\n\n\ny=x*2  # twice\noutput y\n"
    uri, _ = _open(lsp, "messy.pen", messy)
    (edit,) = lsp.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}})
    assert edit["range"]["start"] == {"line": 0, "character": 0}
    assert edit["newText"] == format_diagram(parse(messy))
    _change(lsp, uri, edit["newText"])
    assert lsp.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}}) == []


def test_document_symbols(lsp):
    text = "# index legend: t token, e embedding, f hidden\ndim t = 4, e = 3, f = 5\n" \
           "block mlp(x[t, e]) {\n  param W1[e, f]\n  h = relu(einsum('te,ef->tf', x, W1))\n  return h\n}\n" \
           "input Z[t, e]\ny = mlp(Z)\noutput y\n"
    uri, _ = _open(lsp, "symbols.pen", text)
    syms = lsp.request("textDocument/documentSymbol", {"textDocument": {"uri": uri}})
    top = [(s["name"], s["kind"]) for s in syms]
    assert top == [("t", 26), ("e", 26), ("f", 26), ("mlp", 12), ("Z", 13), ("y", 13)]
    block = syms[3]
    assert [c["name"] for c in block["children"]] == ["x", "W1", "h"]
    assert block["range"] == _range(2, 0, 6, 1) and block["selectionRange"] == _range(2, 6, 2, 9)


def test_shutdown_and_exit():
    rpc = Rpc()
    rpc.request("initialize", {"processId": os.getpid(), "rootUri": None, "capabilities": {}})
    rpc.notify("initialized", {})
    assert rpc.request("shutdown", None) is None
    rpc.notify("exit", None)
    assert rpc.proc.wait(timeout=30) == 0


def test_without_pygls_the_command_says_what_to_install(tmp_path):
    blocker = tmp_path / "pygls"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no pygls here')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "lsp"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert run.returncode == 1 and "pip install 'penrose-diagrams[editor]'" in run.stderr and "Traceback" not in run.stderr


def test_the_bench_runs():
    run = subprocess.run([sys.executable, "bench/lsp.py", "--small"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "didChange -> publishDiagnostics" in run.stdout and "Steerling set re-check" in run.stdout


def test_consts_and_initialisers_hover():
    from penrose.lsp import Analyzer

    text = ("# index legend: e embedding, r rank\ndim e = 4, r = 8\nconst alpha = 16\nconst scale = alpha / r\n"
            "input x[e]\nparam A[e, r] ~ normal(std=0.02)\ny = einsum('e,er->r', x, A) * scale\noutput y\n")
    a = Analyzer()
    a.set_text("/tmp/penrose-lsp-consts.pen", text)
    hover, _ = a.hover("/tmp/penrose-lsp-consts.pen", 6, text.splitlines()[6].index("scale"))
    assert hover.startswith("**const** `scale` = `alpha / r` = 2")
    hover, _ = a.hover("/tmp/penrose-lsp-consts.pen", 5, text.splitlines()[5].index("normal"))
    assert hover.startswith("**init** `normal(mean=0.0, std=0.02)`")


def test_checks_coalesce_and_say_when_a_running_check_is_outdated():
    """penrose.lsp.Checks alone: a path queued again while its check runs is stale (its result is
    dropped) and is checked once more, once, however often it was queued meanwhile."""
    import threading

    from penrose.lsp import Checks

    started, release = threading.Event(), threading.Event()
    calls: list = []

    def work(path):
        calls.append(path)
        if len(calls) == 1:
            started.set()
            assert release.wait(10)
            calls.append(("stale", checks.stale(path)))

    checks = Checks(work, settle=0.0)
    checks.schedule(["a.pen"])
    assert started.wait(10)
    for _ in range(50):
        checks.schedule(["a.pen", "b.pen"])
    release.set()
    assert checks.wait(10)
    assert calls == ["a.pen", ("stale", True), "a.pen", "b.pen"]


def test_the_storm_bench_runs():
    run = subprocess.run([sys.executable, "bench/lsp_storm.py", "--small", "--statements", "200", "--edits", "20"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "storm of 20 edits, then a hover: answered in median" in run.stdout and "target < 2.0 s" in run.stdout
    assert "WRONG" not in run.stdout and run.stdout.rstrip().splitlines()[-1].startswith("targets: ")
