"""Editor support: the TextMate grammar (grammar/penrose.tmLanguage.json, run by a small
TextMate-style tokenizer over its regexes, every one of which Python's `re` compiles), the VS Code
extension's files, and the Pygments lexer on every zoo diagram."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from penrose.ops import FUNCTIONS
from penrose.tables import INITS, PEN_KEYWORDS

ROOT = Path(__file__).resolve().parents[2]
EDITORS = ROOT / "editors"
TEXTMATE = ROOT / "grammar" / "penrose.tmLanguage.json"
GRAMMAR = json.loads(TEXTMATE.read_text(encoding="utf-8"))
ZOO = sorted((ROOT / "zoo").rglob("*.pen"))


# ---- a TextMate-style tokenizer ------------------------------------------------------------------


class Tokenizer:
    """Enough of TextMate's rules for this grammar: `match` with `captures`, `begin`/`end` with
    `beginCaptures`/`endCaptures` and inner `patterns`, `include` of repository rules. At each
    place the rule matching earliest wins, the first listed among equals, an `end` before the
    patterns; a begin/end rule may span lines."""

    def __init__(self, grammar: dict):
        self.g = grammar
        self.cache: dict = {}

    def rx(self, text: str):
        if text not in self.cache:
            self.cache[text] = re.compile(text)
        return self.cache[text]

    def expand(self, patterns) -> list:
        out = []
        for p in patterns:
            if "include" in p:
                ref = self.g["repository"][p["include"].lstrip("#")]
                out += self.expand(ref["patterns"]) if "patterns" in ref and "match" not in ref and "begin" not in ref else [ref]
            else:
                out.append(p)
        return out

    def tokenize(self, text: str) -> list[tuple[str, tuple]]:
        """(character, scopes) for every character of `text` (newlines included, unscoped)."""
        out: list = []
        stack: list = []  # open begin/end rules
        for line in text.split("\n"):
            pos = 0
            while pos <= len(line):
                scopes = tuple(r["name"] for r in stack if "name" in r)
                patterns = self.expand(stack[-1]["patterns"] if stack else self.g["patterns"])
                best = None
                if stack:
                    m = self.rx(stack[-1]["end"]).search(line, pos)
                    if m:
                        best = (m.start(), -1, m, None)
                for i, p in enumerate(patterns):
                    m = self.rx(p.get("match") or p["begin"]).search(line, pos)
                    if m and (best is None or m.start() < best[0]) and m.end() >= m.start():
                        best = (m.start(), i, m, p)
                if best is None:
                    out += [(ch, scopes) for ch in line[pos:]]
                    break
                start, _, m, p = best
                out += [(ch, scopes) for ch in line[pos:start]]
                if p is None:  # the end of the open rule
                    rule = stack.pop()
                    out += self._captured(m, scopes, rule.get("endCaptures", {}))
                elif "match" in p:
                    inner = scopes + ((p["name"],) if "name" in p else ())
                    out += self._captured(m, inner, p.get("captures", {}))
                else:
                    stack.append(p)
                    inner = scopes + ((p["name"],) if "name" in p else ())
                    out += self._captured(m, inner, p.get("beginCaptures", {}))
                if m.end() == m.start():
                    if m.start() >= len(line):
                        break
                    out.append((line[m.start()], scopes))  # an empty match: step over a character
                    pos = m.start() + 1
                else:
                    pos = m.end()
            out.append(("\n", ()))
        return out[:-1]

    @staticmethod
    def _captured(m, scopes, captures) -> list:
        chars = []
        for i in range(m.start(), m.end()):
            extra = tuple(captures[str(g)]["name"] for g in range(len(m.groups()) + 1)
                          if str(g) in captures and m.start(g) <= i < m.end(g) and m.start(g) >= 0)
            chars.append((m.string[i], scopes + extra))
        return chars


TM = Tokenizer(GRAMMAR)


def scopes_of(text: str, needle: str, nth: int = 0) -> set:
    """The scopes every character of the `nth` `needle` in `text` carries (their intersection)."""
    toks = TM.tokenize(text)
    word = re.escape(needle)
    if needle[0].isalnum() or needle[0] == "_":  # a whole word
        word = r"(?<![A-Za-z0-9_])" + word + r"(?![A-Za-z0-9_])"
    start = [m.start() for m in re.finditer(word, text)][nth]
    found = [set(s) for _, s in toks[start : start + len(needle)]]
    return set.intersection(*found)


def _regexes(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("match", "begin", "end"):
                yield v
            else:
                yield from _regexes(v)
    elif isinstance(node, list):
        for v in node:
            yield from _regexes(v)


# ---- the grammar -----------------------------------------------------------------------------------


def test_the_generated_lists_of_functions_are_up_to_date():
    """The grammars and the language reference's element-wise table are written from the table of
    operations (tools/gen_tables.py): a new row without rerunning it fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_tables", ROOT / "tools" / "gen_tables.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for path, text in gen.expected().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.relative_to(ROOT)} drifted: run python tools/gen_tables.py"
    assert "`mish(x)`" in gen.elementwise_table() and "`clamp_min(x, min)`" in gen.elementwise_table()


def test_every_regex_compiles_with_python_re():
    found = list(_regexes(GRAMMAR))
    assert len(found) > 30
    for rx in found:
        re.compile(rx)


def test_the_grammar_names_every_function_and_keyword_of_the_language():
    builtin = next(p for p in GRAMMAR["repository"]["functions"]["patterns"] if p["name"] == "support.function.builtin.pen")
    names = set(re.match(r"\\b\((.*?)\)", builtin["match"]).group(1).split("|"))
    assert names == set(FUNCTIONS)
    inits = re.search(r"\\b\((.*?)\)\\b", GRAMMAR["repository"]["inits"]["match"]).group(1).split("|")
    assert set(inits) == set(INITS)
    text = json.dumps(GRAMMAR["repository"]["keywords"]) + json.dumps(GRAMMAR["repository"]["declarations"])
    for kw in PEN_KEYWORDS:
        assert re.search(rf"\b{kw}\b", text), kw


CORPUS = '''\
# index legend: t token, e embedding, d head dim
#   h head
# 1) Project. Yields: q.
dim t = 16, e = 32, d = 8
dim hd = 4 * d
const alpha = 1e-5, beta = .5
input Z[..., t, e]
input ids[t] : int
param W[e, d] ~ normal(std=0.02)
buffer M[t, t] ~ zeros
include "lib/blocks.pen"
label Z "token embeddings"
block mlp(x[t, e]) {
  param W1[e, e]
  return relu(einsum('te,ef->tf', x, W1))
}
q = einsum('te,ed->td', Z, W) / sqrt(d)   # a note
w = einsum('tok emb, emb hd -> tok hd', Z, W)
r = rearrange(q, 't (h d) -> h t d')
s = reduce(q, '... d -> d', 'mean')
y = mlp(Z) repeat 4 as layers
v = mlp(Z) as net.0
z = x.detach() ** 2 - -inf
m = where(causal(t, t), q, 0)
u = repeat(q, 'h d -> h k d')
k = Z.shape[1]
y2 = mlp(y) repeat 3 shared as tied
g[t, d] = arange(t) * q
output y, z
'''


@pytest.mark.parametrize("needle,scope,nth", [
    ("# index legend: t token, e embedding, d head dim", "comment.line.number-sign.legend.pen", 0),
    ("#   h head", "comment.line.number-sign.pen", 0),
    ("# 1) Project. Yields: q.", "comment.line.number-sign.step.pen", 0),
    ("# a note", "comment.line.number-sign.pen", 0),
    ("dim", "storage.type.dim.pen", 1),
    ("t", "entity.name.constant.pen", 1),  # dim t
    ("hd", "entity.name.constant.pen", 0),
    ("const", "storage.type.dim.pen", 0),
    ("alpha", "entity.name.constant.pen", 0),
    ("1e-5", "constant.numeric.float.pen", 0),
    (".5", "constant.numeric.float.pen", 0),
    ("16", "constant.numeric.integer.pen", 0),
    ("input", "storage.type.tensor.pen", 0),
    ("param", "storage.type.tensor.pen", 0),
    ("buffer", "storage.type.tensor.pen", 0),
    ("W1", "variable.other.declaration.pen", 0),
    ("...", "keyword.operator.ellipsis.pen", 0),
    ("int", "storage.type.dtype.pen", 0),
    ("~", "keyword.operator.init.pen", 0),
    ("normal", "support.function.init.pen", 0),
    ("zeros", "support.function.init.pen", 0),
    ("include", "keyword.control.import.include.pen", 0),
    ('"lib/blocks.pen"', "string.quoted.double.pen", 0),
    ("label", "storage.type.label.pen", 0),
    ("block", "storage.type.block.pen", 0),
    ("mlp", "entity.name.function.block.pen", 0),
    ("return", "keyword.control.pen", 0),
    ("relu", "support.function.builtin.pen", 0),
    ("einsum", "support.function.builtin.pen", 0),
    ("'te,ef->tf'", "string.quoted.single.pen", 0),
    ("->", "keyword.operator.arrow.spec.pen", 0),
    ("tok", "variable.parameter.index.spec.pen", 0),
    ("(h d)", "string.quoted.single.pen", 0),
    ("...", "keyword.operator.ellipsis.spec.pen", 1),
    ("'mean'", "string.quoted.single.pen", 0),
    ("rearrange", "support.function.builtin.pen", 0),
    ("reduce", "support.function.builtin.pen", 0),
    ("sqrt", "support.function.builtin.pen", 0),
    ("/", "keyword.operator.arithmetic.pen", 1),
    ("**", "keyword.operator.arithmetic.pen", 0),
    ("mlp", "entity.name.function.call.pen", 1),
    ("repeat", "keyword.control.pen", 0),
    ("layers", "entity.name.instance.pen", 0),
    ("shared", "keyword.control.pen", 0),  # repeat N shared: one instance, applied N times
    ("tied", "entity.name.instance.pen", 0),
    ("arange", "support.function.builtin.pen", 0),
    ("net.0", "entity.name.instance.pen", 0),  # a dotted path is one instance name
    ("detach", "support.function.method.pen", 0),
    ("inf", "constant.language.infinity.pen", 0),
    ("where", "support.function.builtin.pen", 0),
    ("causal", "support.function.builtin.pen", 0),
    ("repeat", "support.function.builtin.pen", 1),  # the einops function, not the keyword
    ("shape", "support.function.method.pen", 0),
    ("output", "keyword.control.pen", 0),
    ("=", "keyword.operator.assignment.pen", 0),
    ("[", "punctuation.section.brackets.pen", 0),
    ("{", "punctuation.section.block.pen", 0),
    ("q", "variable.other.pen", 2),
])
def test_the_grammar_scopes_every_construct(needle, scope, nth):
    assert scope in scopes_of(CORPUS, needle, nth), (needle, scope)


def test_a_keyword_inside_a_string_or_comment_is_no_keyword():
    text = "x = einsum('dim output', a)  # param block\n"
    assert "storage.type.dim.pen" not in scopes_of(text, "dim")
    assert scopes_of(text, "param") == {"comment.line.number-sign.pen"}


def test_an_unclosed_string_ends_with_its_line():
    toks = TM.tokenize("x = einsum('td,de\ny = relu(x)\n")
    line2 = [s for ch, s in toks[18:]]
    assert all("string.quoted.single.pen" not in s for s in line2)


@pytest.mark.parametrize("path", ZOO, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_grammar_scopes_every_character_of_the_zoo(path):
    text = path.read_text(encoding="utf-8")
    bare = [(i, ch) for i, (ch, s) in enumerate(TM.tokenize(text)) if not s and not ch.isspace()]
    assert bare == [], f"characters no rule scopes: {bare[:10]}"


# ---- the VS Code extension ----------------------------------------------------------------------


def test_the_vscode_extension_is_wired():
    folder = EDITORS / "vscode"
    pkg = json.loads((folder / "package.json").read_text(encoding="utf-8"))
    (lang,) = pkg["contributes"]["languages"]
    (grammar,) = pkg["contributes"]["grammars"]
    assert lang["id"] == grammar["language"] == "pen" and ".pen" in lang["extensions"]
    assert grammar["scopeName"] == GRAMMAR["scopeName"] == "source.pen"
    for rel in (pkg["main"], lang["configuration"]):
        assert (folder / rel).is_file(), rel
    json.loads((folder / lang["configuration"]).read_text(encoding="utf-8"))
    assert "onLanguage:pen" in pkg["activationEvents"] and "vscode-languageclient" in pkg["dependencies"]
    assert pkg["contributes"]["configuration"]["properties"]["penrose.server.command"]["default"] == ["penrose", "lsp"]
    js = (folder / pkg["main"]).read_text(encoding="utf-8")
    assert 'require("vscode-languageclient/node")' in js and "LanguageClient" in js and '"lsp"' in js
    if shutil.which("node"):
        run = subprocess.run(["node", "--check", str(folder / pkg["main"])], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr


def test_the_vscode_extension_copies_the_grammar_when_built(tmp_path):
    """The extension's grammar is grammar/penrose.tmLanguage.json, copied into it (an extension
    packs only its own folder) by `npm install` and `vsce package`: git holds one copy."""
    folder = EDITORS / "vscode"
    pkg = json.loads((folder / "package.json").read_text(encoding="utf-8"))
    (grammar,) = pkg["contributes"]["grammars"]
    target = grammar["path"].removeprefix("./")
    assert {"npm run grammar"} == {pkg["scripts"]["prepare"], pkg["scripts"]["vscode:prepublish"]}
    assert f"'../../grammar/{TEXTMATE.name}', '{target}'" in pkg["scripts"]["grammar"]
    ignored = subprocess.run(["git", "check-ignore", "-q", f"editors/vscode/{target}"], cwd=ROOT)
    assert ignored.returncode == 0, f"editors/vscode/{target} is a build output: .gitignore must name it"
    npm = shutil.which("npm")
    if npm:  # run the script on a copy of the two folders
        shutil.copytree(folder, tmp_path / "editors" / "vscode", ignore=shutil.ignore_patterns("node_modules", "syntaxes"))
        shutil.copytree(TEXTMATE.parent, tmp_path / "grammar")
        run = subprocess.run([npm, "run", "--silent", "grammar"], cwd=tmp_path / "editors" / "vscode", capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert (tmp_path / "editors" / "vscode" / target).read_bytes() == TEXTMATE.read_bytes()


# ---- the Pygments lexer -------------------------------------------------------------------------


def test_the_lexer_is_registered_with_pygments():
    from pygments.lexers import get_lexer_by_name, get_lexer_for_filename

    from penrose.pygments_lexer import PenroseLexer

    assert isinstance(get_lexer_by_name("pen"), PenroseLexer)
    assert isinstance(get_lexer_by_name("penrose"), PenroseLexer)
    assert isinstance(get_lexer_for_filename("model.pen"), PenroseLexer)


@pytest.mark.parametrize("path", ZOO, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_lexer_reads_every_zoo_diagram_without_errors(path):
    from pygments import lex
    from pygments.token import Error

    from penrose.pygments_lexer import PenroseLexer

    text = path.read_text(encoding="utf-8")
    tokens = list(lex(text, PenroseLexer()))
    assert "".join(v for _, v in tokens) == text
    assert [(t, v) for t, v in tokens if t in Error] == []


def test_the_lexer_tells_constructs_apart():
    from pygments import lex
    from pygments.token import Comment, Error, Keyword, Name, Number, String

    from penrose.pygments_lexer import PenroseLexer

    toks = [(t, v) for t, v in lex(CORPUS, PenroseLexer()) if v.strip()]

    def kind(value, nth=0):
        return [t for t, v in toks if v == value][nth]

    assert kind("dim") in Keyword and kind("block") in Keyword and kind("output") in Keyword
    assert kind("einsum") in Name.Builtin and kind("repeat", 1) in Name.Builtin and kind("repeat") in Keyword
    assert kind("shared") in Keyword and kind("arange") in Name.Builtin
    assert kind("normal") in Name.Builtin and kind("int") in Keyword.Type
    assert kind("->") in String and kind("1e-5") in Number and kind("mlp") in Name.Function
    assert kind("# index legend: t token, e embedding, d head dim") in Comment
    assert [t for t, v in lex("x = $\n", PenroseLexer()) if t in Error]  # and what is no .pen is an error


@pytest.mark.parametrize("module", ["penrose.pygments_lexer", "penrose.lsp"])
def test_docstring_examples(module):
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module(module)).failed == 0
